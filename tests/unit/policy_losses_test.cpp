// Tinker's built-in losses (importance_sampling, ppo, cispo, dro, cross_entropy) under every
// engine and layout equal the loss written out per token on full logits in float64, from
// Tinker's definitions (sum over target tokens; r = exp(logp - sampler logp)); options and
// bad input are refused with the field named.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "test_util/direct.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::DirectLossAndGrads;
using testing::DirectTokenLogprobs;

// Sequences with sampler log-probs around the random model's (so ratios fall on both sides
// of every clip), advantages of both signs, weights, and a loss mask on one of them.
std::vector<Sequence> RlSequences(int64_t vocab, uint64_t seed) {
  auto seqs = testing::RandomSequences({5, 9, 3, 7}, vocab, seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const double typical = -std::log(static_cast<double>(vocab));
  for (auto& s : seqs) {
    const size_t n = s.tokens.size();
    s.sampler_logprobs.assign(n, 0.0);
    s.advantages.assign(n, 0.0);
    s.token_weights.assign(n, 0.0);
    for (size_t t = 1; t < n; ++t) {
      s.sampler_logprobs[t] = typical + 0.8 * u(rng);
      s.advantages[t] = u(rng);
      s.token_weights[t] = u(rng);
    }
  }
  seqs[1].loss_mask.assign(seqs[1].tokens.size(), 1);
  seqs[1].loss_mask[2] = seqs[1].loss_mask[3] = 0;
  return seqs;
}

// The loss per Tinker's definitions, token by token from full logits.
torch::Tensor DirectLoss(const std::string& loss, const nlohmann::json& config, const torch::Tensor& logits,
                         const Batch& batch) {
  auto logp = DirectTokenLogprobs(logits, batch).to(torch::kFloat64);
  torch::Tensor total = torch::zeros({}, torch::kFloat64);
  const double lo = config.value("clip_low_threshold", loss == "ppo" ? 0.8 : 0.0);
  const double hi = config.value("clip_high_threshold", loss == "ppo" ? 1.2 : 4.0);
  const double beta = config.value("beta", 0.05);
  auto seq = batch.sequence_ids;
  for (int64_t r = 0; r < batch.rows(); ++r) {
    for (int64_t t = 0; t + 1 < batch.length(); ++t) {
      const int64_t i = seq[r][t].item<int64_t>();
      if (i < 0 || seq[r][t + 1].item<int64_t>() != i) continue;
      const int64_t pos = batch.position_ids[r][t + 1].item<int64_t>();
      const auto& s = batch.sequences[i];
      if (!s.loss_mask.empty() && s.loss_mask[pos] == 0) continue;
      const auto lp = logp[r][t];
      const double q = s.sampler_logprobs[pos], a = s.advantages[pos];
      const auto ratio = torch::exp(lp - q);
      torch::Tensor term;
      if (loss == "importance_sampling") {
        term = ratio * a;
      } else if (loss == "ppo") {
        term = torch::min(ratio * a, torch::clamp(ratio, lo, hi) * a);
      } else if (loss == "cispo") {
        term = torch::clamp(ratio, lo, hi).detach() * lp * a;
      } else if (loss == "dro") {
        term = lp * a - 0.5 * beta * (lp - q) * (lp - q);
      } else {
        term = s.token_weights[pos] * lp;
      }
      total = total - term;
    }
  }
  return total;
}

struct Case {
  std::string loss;
  nlohmann::json config;
};

class PolicyLossExactness : public ::testing::TestWithParam<std::tuple<std::string, Layout>> {};

TEST_P(PolicyLossExactness, EveryEngineMatchesTinkersDefinitionOnFullLogits) {
  RegisterBuiltinObjectives();
  const auto& [family, layout] = GetParam();
  auto config = testing::TinyConfig(family);
  auto model = testing::RandomModel(config, 5, torch::kFloat64);
  auto batch = MakeBatch(RlSequences(config.vocab_size, 11), layout, layout == Layout::kPacked ? 16 : 0);
  const std::vector<Case> cases = {{"importance_sampling", nlohmann::json::object()},
                                   {"ppo", nlohmann::json::object()},
                                   {"ppo", {{"clip_low_threshold", 0.7}, {"clip_high_threshold", 1.5}}},
                                   {"cispo", nlohmann::json::object()},
                                   {"cispo", {{"clip_low_threshold", 0.6}, {"clip_high_threshold", 1.3}}},
                                   {"dro", {{"beta", 0.3}}},
                                   {"cross_entropy", nlohmann::json::object()}};
  for (const auto& c : cases) {
    auto direct = DirectLossAndGrads(model, batch, [&](const torch::Tensor& l) { return DirectLoss(c.loss, c.config, l, batch); });
    for (auto kind : {EngineKind::kStream, EngineKind::kCheckpoint, EngineKind::kFull}) {
      auto objective = CreateObjective(c.loss, c.config);
      ZeroGradients(*model);
      auto r = ForwardBackward(model, batch, *objective, {kind, 3, 4, false, 2});
      const auto metrics = objective->finish();
      const std::string what = c.loss + " " + c.config.dump() + " " + EngineName(kind);
      EXPECT_NEAR(r.loss, direct.loss, 1e-12 * std::max(1.0, std::abs(direct.loss))) << what;
      auto diff = CompareGradients(direct.grads, CollectGradients(*model));
      EXPECT_LE(diff.max_relative, 1e-10) << what << " " << diff.worst;
      if (c.loss != "cross_entropy") {
        EXPECT_GT(metrics.at("ratio_max"), metrics.at("ratio_mean")) << what;
        EXPECT_GT(metrics.at("sampler_kl_k3"), 0.0) << what;
      }
      if (c.loss == "ppo" || c.loss == "cispo") {
        // These clips leave some tokens outside and some inside.
        if (!c.config.empty()) {
          EXPECT_GT(metrics.at("clip_fraction"), 0.0) << what;
          EXPECT_LT(metrics.at("clip_fraction"), 1.0) << what;
        }
      }
    }
  }
  ZeroGradients(*model);
}

INSTANTIATE_TEST_SUITE_P(Families, PolicyLossExactness,
                         ::testing::Combine(::testing::Values("llama", "qwen3", "qwen2"),
                                            ::testing::Values(Layout::kRightPad, Layout::kLeftPad, Layout::kPacked)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + LayoutName(std::get<1>(info.param));
                         });

// The mismatch metrics are what they say: with the sampler's log-probs equal to the policy's
// own, every ratio is 1, the k3 KL 0 and nothing is clipped; importance_sampling's loss is then
// -sum A and ppo's the same.
TEST(PolicyLoss, OnPolicyTheRatioIsOneAndTheLossIsMinusTheAdvantageSum) {
  RegisterBuiltinObjectives();
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 3, torch::kFloat64);
  auto seqs = RlSequences(config.vocab_size, 4);
  auto batch = MakeBatch(seqs, Layout::kRightPad);
  auto logp = TokenLogprobs(model, batch);
  double advantage_sum = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t t = 1; t < seqs[i].tokens.size(); ++t) {
      seqs[i].sampler_logprobs[t] = logp[static_cast<int64_t>(i)][static_cast<int64_t>(t) - 1].item<double>();
      if (seqs[i].loss_mask.empty() || seqs[i].loss_mask[t]) advantage_sum += seqs[i].advantages[t];
    }
  }
  batch = MakeBatch(seqs, Layout::kRightPad);
  for (const char* loss : {"importance_sampling", "ppo"}) {
    auto objective = CreateObjective(loss, nlohmann::json::object());
    ZeroGradients(*model);
    auto r = ForwardBackward(model, batch, *objective, {EngineKind::kStream, 3, 4, false, 2});
    const auto m = objective->finish();
    EXPECT_NEAR(r.loss, -advantage_sum, 1e-12) << loss;
    EXPECT_NEAR(m.at("ratio_mean"), 1.0, 1e-12) << loss;
    EXPECT_NEAR(m.at("ratio_max"), 1.0, 1e-12) << loss;
    EXPECT_NEAR(m.at("sampler_kl_k3"), 0.0, 1e-12) << loss;
    if (std::string(loss) == "ppo") {
      EXPECT_EQ(m.at("clip_fraction"), 0.0);
    }
  }
  ZeroGradients(*model);
}

TEST(PolicyLoss, BadInputAndOptionsAreClearErrors) {
  RegisterBuiltinObjectives();
  auto expect_error = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error with: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([] { CreateObjective("ppo", {{"beta", 0.1}}); }, "beta");
  expect_error([] { CreateObjective("ppo", {{"clip_low_threshold", 1.5}}); }, "0 <= low <= high");
  expect_error([] { CreateObjective("cispo", {{"clip_high_threshold", -1.0}}); }, "0 <= low <= high");
  expect_error([] { CreateObjective("dro", {{"beta", -1.0}}); }, "beta must be");
  expect_error([] { CreateObjective("importance_sampling", {{"clip_low_threshold", 0.5}}); }, "clip_low_threshold");
  EXPECT_EQ(ObjectiveBatchKind("ppo"), "grpo");
  EXPECT_EQ(ObjectiveBatchKind("cross_entropy"), "weighted");
  const auto ppo = ObjectiveOptionSchema("ppo");
  ASSERT_EQ(ppo.size(), 2u);
  EXPECT_EQ(ppo[0].default_value, "0.8");
  EXPECT_EQ(ppo[1].default_value, "1.2");
  EXPECT_EQ(ObjectiveOptionSchema("cispo")[1].default_value, "4");
  EXPECT_EQ(ObjectiveOptionSchema("dro")[0].default_value, "0.05");

  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 1, torch::kFloat64);
  auto seqs = RlSequences(config.vocab_size, 2);
  auto missing = seqs;
  missing[2].advantages.clear();
  expect_error(
      [&] {
        auto o = CreateObjective("ppo", nlohmann::json::object());
        ForwardBackward(model, MakeBatch(missing, Layout::kRightPad), *o, {EngineKind::kStream, 2, 2, false, 2});
      },
      "sequence 2 has 0 advantages");
  auto positive = seqs;
  positive[0].sampler_logprobs[3] = 0.5;
  expect_error(
      [&] {
        auto o = CreateObjective("dro", nlohmann::json::object());
        ForwardBackward(model, MakeBatch(positive, Layout::kRightPad), *o, {EngineKind::kStream, 2, 2, false, 2});
      },
      "positive sampler log-prob");
  for (auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined() && p.grad().abs().sum().item<double>() != 0);

  // JSONL rows: one value per token after the first.
  auto row = ParsePolicyExample(
      nlohmann::json{{"tokens", {1, 2, 3}}, {"logprobs", {-0.5, -1.5}}, {"advantages", {1.0, -1.0}}}, "p:1");
  EXPECT_EQ(row.sampler_logprobs, (std::vector<double>{0.0, -0.5, -1.5}));
  EXPECT_EQ(row.advantages, (std::vector<double>{0.0, 1.0, -1.0}));
  expect_error([] { ParsePolicyExample(nlohmann::json{{"tokens", {1, 2, 3}}, {"logprobs", {-0.5}}, {"advantages", {1.0, 2.0}}}, "p:2"); },
               "p:2: logprobs has 1 entries; it needs 2");
  expect_error([] { ParsePolicyExample(nlohmann::json{{"tokens", {1, 2}}, {"logprobs", {-0.5}}}, "p:3"); },
               "p:3: missing field 'advantages'");
  expect_error([] { ParsePolicyExample(nlohmann::json{{"tokens", {1, 2}}, {"logprobs", {-0.5}}, {"advantages", {1.0}}, {"rewards", 1}}, "p:4"); },
               "unknown field 'rewards'");
  EXPECT_TRUE(IsPolicyLoss("cispo"));
  EXPECT_FALSE(IsPolicyLoss("cross_entropy"));
}

}  // namespace
}  // namespace streambp
