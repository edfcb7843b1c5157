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
#include "test_util/top_k.h"

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

// Calls fn(row, position, token, sequence) for every target token: `position` predicts token
// `token` of `sequence` (its loss mask selects it).
void ForEachTarget(const Batch& batch, const std::function<void(int64_t, int64_t, int64_t, const Sequence&)>& fn) {
  auto seq = batch.sequence_ids;
  for (int64_t r = 0; r < batch.rows(); ++r) {
    for (int64_t t = 0; t + 1 < batch.length(); ++t) {
      const int64_t i = seq[r][t].item<int64_t>();
      if (i < 0 || seq[r][t + 1].item<int64_t>() != i) continue;
      const int64_t pos = batch.position_ids[r][t + 1].item<int64_t>();
      const auto& s = batch.sequences[i];
      if (!s.loss_mask.empty() && s.loss_mask[pos] == 0) continue;
      fn(r, t, pos, s);
    }
  }
}

// The loss per Tinker's definitions, token by token from full logits.
torch::Tensor DirectLoss(const std::string& loss, const nlohmann::json& config, const torch::Tensor& logits,
                         const Batch& batch) {
  auto logp = DirectTokenLogprobs(logits, batch).to(torch::kFloat64);
  torch::Tensor total = torch::zeros({}, torch::kFloat64);
  const double lo = config.value("clip_low_threshold", loss == "ppo" ? 0.8 : 0.0);
  const double hi = config.value("clip_high_threshold", loss == "ppo" ? 1.2 : 4.0);
  const double beta = config.value("beta", 0.05);
  ForEachTarget(batch, [&](int64_t r, int64_t t, int64_t pos, const Sequence& s) {
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
  });
  return total;
}

// cross_entropy with 2-D targets, written out from full logits: per target position,
// -sum_j w_j log_softmax(logits)[candidate_j] for a sequence with top-k candidates, -w lp of
// the next token for one with 1-D weights.
torch::Tensor DirectTopKLoss(const torch::Tensor& logits, const Batch& batch) {
  auto logsm = torch::log_softmax(logits.to(torch::kFloat64), -1);
  torch::Tensor total = torch::zeros({}, torch::kFloat64);
  ForEachTarget(batch, [&](int64_t r, int64_t t, int64_t pos, const Sequence& s) {
    for (int64_t j = 0; j < s.top_k; ++j) {
      const size_t e = pos * s.top_k + j;
      total = total - s.top_k_weights[e] * logsm[r][t][s.top_k_targets[e]];
    }
    if (!s.token_weights.empty()) total = total - s.token_weights[pos] * logsm[r][t][s.tokens[pos]];
  });
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
  // 2-D targets (a teacher's top-k): half the sequences with 3 candidates per token, the
  // others with 1-D weights, in one batch.
  auto top_k_seqs = RlSequences(config.vocab_size, 12);
  testing::AddTopK(top_k_seqs, config.vocab_size, 3);
  auto top_k_batch = MakeBatch(top_k_seqs, layout, layout == Layout::kPacked ? 16 : 0);
  ASSERT_EQ(top_k_batch.top_k_targets.size(2), 3);
  auto direct = DirectLossAndGrads(model, top_k_batch, [&](const torch::Tensor& l) { return DirectTopKLoss(l, top_k_batch); });
  EXPECT_GT(std::abs(direct.loss), 1.0);
  for (auto kind : {EngineKind::kStream, EngineKind::kCheckpoint, EngineKind::kFull}) {
    auto objective = CreateObjective("cross_entropy", nlohmann::json::object());
    ZeroGradients(*model);
    auto r = ForwardBackward(model, top_k_batch, *objective, {kind, 3, 4, false, 2});
    objective->finish();
    EXPECT_NEAR(r.loss, direct.loss, 1e-12 * std::max(1.0, std::abs(direct.loss))) << "top-k " << EngineName(kind);
    auto diff = CompareGradients(direct.grads, CollectGradients(*model));
    EXPECT_LE(diff.max_relative, 1e-10) << "top-k " << EngineName(kind) << " " << diff.worst;
  }
  ZeroGradients(*model);
}

// One candidate per token, the next token itself, is the 1-D loss: the same loss and gradient.
TEST(PolicyLoss, TopKOfTheNextTokenIsTheOneDimensionalCrossEntropy) {
  RegisterBuiltinObjectives();
  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 8, torch::kFloat64);
  auto one_d = RlSequences(config.vocab_size, 9);
  auto two_d = one_d;
  for (auto& s : two_d) {
    s.top_k = 1;
    s.top_k_targets = s.tokens;
    s.top_k_weights = s.token_weights;
    s.token_weights.clear();
  }
  auto run = [&](const std::vector<Sequence>& seqs) {
    auto objective = CreateObjective("cross_entropy", nlohmann::json::object());
    ZeroGradients(*model);
    auto r = ForwardBackward(model, MakeBatch(seqs, Layout::kPacked, 16), *objective, {EngineKind::kStream, 2, 3, false, 2});
    return std::make_pair(r.loss, CollectGradients(*model));
  };
  const auto [loss_1d, grads_1d] = run(one_d);
  const auto [loss_2d, grads_2d] = run(two_d);
  EXPECT_NEAR(loss_2d, loss_1d, 1e-12 * std::abs(loss_1d));
  EXPECT_LE(CompareGradients(grads_1d, grads_2d).max_relative, 1e-12);
  ZeroGradients(*model);
}

TEST(PolicyLoss, BadTopKTargetsAreClearErrors) {
  auto seqs = testing::RandomSequences({4, 6}, 50, 3);
  testing::AddTopK(seqs, 50, 2);
  EXPECT_NO_THROW(ValidateSequences(seqs, 50));
  auto expect = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  auto outside = seqs;
  outside[0].top_k_targets[5] = 50;
  expect([&] { ValidateSequences(outside, 50); }, "sequence 0: top_k_targets[2][1] = 50 is outside the vocabulary");
  auto nan = seqs;
  nan[0].top_k_weights[3] = std::nan("");
  expect([&] { ValidateSequences(nan, 50); }, "top_k_weights[1][1] is not finite");
  auto short_weights = seqs;
  short_weights[0].top_k_weights.pop_back();
  expect([&] { ValidateSequences(short_weights, 50); }, "need tokens x top_k = 8 entries each, got 8 and 7");
  expect([&] { MakeBatch(short_weights, Layout::kRightPad); }, "top_k_targets and top_k_weights need tokens x top_k");
  // weighted_logprobs takes one target per token.
  RegisterBuiltinObjectives();
  expect([&] { CreateObjective("weighted_logprobs", nlohmann::json::object())->prepare(seqs); },
         "weighted_logprobs: sequence 0 has 2-D targets");
  // MakeBatch puts token t's candidates at position t - 1 (packed after another sequence too).
  auto batch = MakeBatch(seqs, Layout::kPacked, 10);
  ASSERT_EQ(batch.rows(), 1);
  EXPECT_EQ(batch.top_k_targets[0][2][1].item<int64_t>(), seqs[0].top_k_targets[3 * 2 + 1]);
  EXPECT_EQ(batch.top_k_weights[0][0][0].item<double>(), seqs[0].top_k_weights[2]);
  EXPECT_EQ(batch.top_k_weights[0][3].abs().sum().item<double>(), 0.0);  // the sequence's last token predicts nothing
  EXPECT_EQ(batch.top_k_weights[0].slice(0, 4).abs().sum().item<double>(), 0.0);  // sequence 1: 1-D

  // JSONL rows: a row of K candidates and K weights per token after the first.
  auto row = ParseWeightedExample(
      nlohmann::json{{"tokens", {1, 2, 3}}, {"target_tokens", {{2, 5}, {3, 4}}}, {"weights", {{1.0, 0.5}, {0.25, -1.0}}}},
      "ce:1");
  EXPECT_EQ(row.top_k, 2);
  EXPECT_EQ(row.top_k_targets, (std::vector<int64_t>{0, 0, 2, 5, 3, 4}));
  EXPECT_EQ(row.top_k_weights, (std::vector<double>{0, 0, 1.0, 0.5, 0.25, -1.0}));
  EXPECT_TRUE(row.token_weights.empty());
  expect([] { ParseWeightedExample(nlohmann::json{{"tokens", {1, 2, 3}}, {"target_tokens", {{2, 5}, {3}}}, {"weights", {{1.0, 0.5}, {0.25, -1.0}}}}, "ce:2"); },
         "ce:2: target_tokens[1] must be a list of 2 entries");
  expect([] { ParseWeightedExample(nlohmann::json{{"tokens", {1, 2, 3}}, {"target_tokens", {{2}, {3}}}, {"weights", {1.0, 0.5}}}, "ce:3"); },
         "ce:3: weights[0] must be a list of 1 entries");
  expect([] { ParseWeightedExample(nlohmann::json{{"tokens", {1, 2, 3}}, {"target_tokens", {{2}}}, {"weights", {{1.0}}}}, "ce:4"); },
         "ce:4: with 2-D targets, 'target_tokens' needs 2 rows");
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
