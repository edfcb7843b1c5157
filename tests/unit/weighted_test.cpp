// weighted_logprobs: L = sum_t w_t log p(token_t) under every engine and layout equals the
// loss written out on full logits (float64), and w = dL/dlogp of a built-in objective's loss
// reproduces that objective's gradient (the client-side custom loss of the SDKs).
#include <gtest/gtest.h>

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

// Sequences with weights of both signs, some zero, and loss masks (masked tokens count for
// nothing whatever their weight).
std::vector<Sequence> Weighted(int64_t vocab, uint64_t seed) {
  auto seqs = testing::RandomSequences({5, 9, 3, 7}, vocab, seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.5, 1.5);
  for (auto& s : seqs) {
    s.token_weights.assign(s.tokens.size(), 0.0);
    for (size_t t = 1; t < s.tokens.size(); ++t) s.token_weights[t] = (t % 4 == 2) ? 0.0 : u(rng);
  }
  return seqs;
}

// sum over targets of w * log p, from full logits (the batch's weight tensor is not used:
// weights are read from the sequences, by position).
torch::Tensor DirectWeighted(const torch::Tensor& logits, const Batch& batch, double temperature) {
  auto logp = DirectTokenLogprobs(logits, batch, temperature).to(torch::kFloat64);
  auto w = torch::zeros_like(logp);
  auto seq = batch.sequence_ids;
  for (int64_t r = 0; r < batch.rows(); ++r) {
    for (int64_t t = 0; t + 1 < batch.length(); ++t) {
      const int64_t i = seq[r][t].item<int64_t>();
      if (i < 0 || seq[r][t + 1].item<int64_t>() != i) continue;
      const int64_t pos = batch.position_ids[r][t + 1].item<int64_t>();
      const auto& s = batch.sequences[i];
      const bool counted = s.loss_mask.empty() || s.loss_mask[pos] != 0;  // masked tokens carry no weight
      w[r][t] = counted ? s.token_weights[pos] : 0.0;
    }
  }
  return (w * logp).sum();
}

class WeightedExactness : public ::testing::TestWithParam<std::tuple<std::string, Layout>> {};

TEST_P(WeightedExactness, EveryEngineMatchesTheDirectLoss) {
  RegisterBuiltinObjectives();
  const auto& [family, layout] = GetParam();
  auto config = testing::TinyConfig(family);
  auto model = testing::RandomModel(config, 5, torch::kFloat64);
  for (double temperature : {1.0, 0.7}) {
    auto batch = MakeBatch(Weighted(config.vocab_size, 11), layout, layout == Layout::kPacked ? 16 : 0);
    auto direct = DirectLossAndGrads(model, batch, [&](const torch::Tensor& l) { return DirectWeighted(l, batch, temperature); });
    for (auto kind : {EngineKind::kStream, EngineKind::kCheckpoint, EngineKind::kFull}) {
      auto objective = CreateObjective("weighted_logprobs", {{"temperature", temperature}});
      ZeroGradients(*model);
      auto r = ForwardBackward(model, batch, *objective, {kind, 3, 4, false, 2});
      objective->finish();
      EXPECT_NEAR(r.loss, direct.loss, 1e-12 * std::max(1.0, std::abs(direct.loss))) << EngineName(kind);
      auto diff = CompareGradients(direct.grads, CollectGradients(*model));
      EXPECT_LE(diff.max_relative, 1e-10) << EngineName(kind) << " T=" << temperature << " " << diff.worst;
    }
  }
  ZeroGradients(*model);
}

INSTANTIATE_TEST_SUITE_P(Families, WeightedExactness,
                         ::testing::Combine(::testing::Values("llama", "qwen3", "qwen2"),
                                            ::testing::Values(Layout::kRightPad, Layout::kLeftPad, Layout::kPacked)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + LayoutName(std::get<1>(info.param));
                         });

// The SFT loss is -sum(mask logp)/N: its dL/dlogp is -mask/N, and those weights train exactly
// what sft trains.
TEST(Weighted, SftWeightsGiveTheSftGradient) {
  RegisterBuiltinObjectives();
  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 9, torch::kFloat64);
  auto seqs = testing::RandomSequences({6, 4, 8}, config.vocab_size, 3);
  seqs[1].loss_mask = {0, 0, 1, 1};
  int64_t targets = 0;
  for (const auto& s : seqs) targets += s.num_targets();
  auto weighted = seqs;
  for (auto& s : weighted) {
    s.token_weights.assign(s.tokens.size(), 0.0);
    for (size_t t = 1; t < s.tokens.size(); ++t) {
      if (s.loss_mask.empty() || s.loss_mask[t]) s.token_weights[t] = -1.0 / static_cast<double>(targets);
    }
    s.loss_mask.clear();
  }
  auto sft = MakeSftObjective({});
  ZeroGradients(*model);
  auto a = ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *sft, {EngineKind::kStream, 2, 3, false, 2});
  auto sft_grads = CollectGradients(*model);
  auto w = CreateObjective("weighted_logprobs", nlohmann::json::object());
  ZeroGradients(*model);
  auto b = ForwardBackward(model, MakeBatch(weighted, Layout::kPacked, 18), *w, {EngineKind::kStream, 2, 3, false, 2});
  EXPECT_NEAR(a.loss, b.loss, 1e-13);
  auto diff = CompareGradients(sft_grads, CollectGradients(*model));
  EXPECT_LE(diff.max_relative, 1e-10) << diff.worst;
  ZeroGradients(*model);
}

TEST(Weighted, BadInputIsAClearError) {
  RegisterBuiltinObjectives();
  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 1, torch::kFloat64);
  auto seqs = testing::RandomSequences({4}, config.vocab_size, 1);
  auto objective = CreateObjective("weighted_logprobs", nlohmann::json::object());
  try {
    ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *objective, {EngineKind::kStream, 2, 2, false, 2});
    FAIL() << "no weights accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has no token weights"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CreateObjective("weighted_logprobs", {{"temperature", 0.0}}), InvalidArgument);
  EXPECT_THROW(CreateObjective("weighted_logprobs", {{"beta", 1.0}}), InvalidArgument);
  EXPECT_EQ(ObjectiveBatchKind("weighted_logprobs"), "weighted");
  seqs[0].token_weights = {0, 1, std::nan(""), 1};
  EXPECT_THROW(ValidateSequences(seqs, config.vocab_size), InvalidArgument);
  // JSONL: one fewer weight than tokens.
  EXPECT_THROW(ParseWeightedExample(nlohmann::json{{"tokens", {1, 2, 3}}, {"weights", {1.0}}}, "w:1"), InvalidArgument);
  auto s = ParseWeightedExample(nlohmann::json{{"tokens", {1, 2, 3}}, {"weights", {0.5, -2.0}}}, "w:1");
  EXPECT_EQ(s.token_weights, (std::vector<double>{0.0, 0.5, -2.0}));
}

}  // namespace
}  // namespace streambp
