// sft: the chunked objective equals a direct computation on fully materialized logits.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

// Direct computation, written independently of the objective: log_softmax over the full
// logits of each unpadded sequence (the reference decoder), gather, masked mean.
double DirectSftLoss(const CausalLMImpl& model, const std::vector<Sequence>& seqs, double normalizer) {
  double total = 0;
  int64_t count = 0;
  for (const auto& s : seqs) {
    auto logp = torch::log_softmax(testing::ReferenceLogits(model, s.tokens), -1);
    for (size_t t = 1; t < s.tokens.size(); ++t) {
      if (!s.loss_mask.empty() && !s.loss_mask[t]) continue;
      total -= logp[t - 1][s.tokens[t]].item<double>();
      ++count;
    }
  }
  return total / (normalizer > 0 ? normalizer : count);
}

TEST(Sft, ChunkedLossEqualsDirectComputationInEveryLayout) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 4, torch::kFloat64);
  auto seqs = testing::RandomSequences({9, 14, 5}, config.vocab_size, 8);
  const double expected = DirectSftLoss(*model, seqs, 0);
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 20 : 0);
    auto objective = MakeSftObjective({});
    auto r = ForwardBackward(model, batch, *objective, {EngineKind::kStream, 4, 3});
    EXPECT_NEAR(r.loss, expected, 1e-12) << LayoutName(layout);
    ZeroGradients(*model);
  }
}

// The token accuracy: the share of the selected targets that are their position's argmax over
// the full logits of the reference decoder, in every layout.
TEST(Sft, TokenAccuracyIsTheShareOfTargetsThatAreTheArgmax) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 4, torch::kFloat64);
  auto seqs = testing::RandomSequences({9, 14, 5}, config.vocab_size, 8);
  // The second sequence greedy from its fourth token on, so that some targets are the argmax.
  auto& greedy = seqs[1].tokens;
  for (size_t t = 3; t < greedy.size(); ++t) {
    const auto logits = testing::ReferenceLogits(*model, std::vector<int64_t>(greedy.begin(), greedy.begin() + t));
    greedy[t] = logits[t - 1].argmax().item<int64_t>();
  }
  int64_t hits = 0, count = 0;
  for (const auto& s : seqs) {
    const auto logits = testing::ReferenceLogits(*model, s.tokens);
    for (size_t t = 1; t < s.tokens.size(); ++t) {
      if (!s.loss_mask.empty() && !s.loss_mask[t]) continue;
      hits += logits[t - 1].argmax().item<int64_t>() == s.tokens[t] ? 1 : 0;
      ++count;
    }
  }
  ASSERT_GT(hits, 0);
  ASSERT_LT(hits, count);
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 20 : 0);
    auto objective = MakeSftObjective({});
    ForwardBackward(model, batch, *objective, {EngineKind::kStream, 4, 3});
    const auto metrics = objective->finish();
    EXPECT_DOUBLE_EQ(metrics.at("token_accuracy"), static_cast<double>(hits) / static_cast<double>(count))
        << LayoutName(layout);
    ZeroGradients(*model);
  }
}

// Micro-batches with the step's normalizer add up to the whole batch exactly.
TEST(Sft, MicroBatchesWithStepNormalizerEqualWholeBatch) {
  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 2, torch::kFloat64);
  auto seqs = testing::RandomSequences({9, 14, 5, 11}, config.vocab_size, 3);
  auto whole = MakeBatch(seqs, Layout::kRightPad);
  auto obj = MakeSftObjective({});
  auto r = ForwardBackward(model, whole, *obj, {EngineKind::kStream, 4, 4});
  auto expected = CollectGradients(*model);
  ZeroGradients(*model);
  const double normalizer = static_cast<double>(whole.num_targets());
  double loss = 0;
  for (size_t i = 0; i < seqs.size(); i += 2) {
    auto part = MakeBatch({seqs[i], seqs[i + 1]}, Layout::kPacked, 32);
    auto o = MakeSftObjective({normalizer});
    loss += ForwardBackward(model, part, *o, {EngineKind::kStream, 3, 5}).loss;
  }
  EXPECT_NEAR(loss, r.loss, 1e-12);
  EXPECT_LE(CompareGradients(expected, CollectGradients(*model)).max_relative, 1e-10);
  ZeroGradients(*model);
}

TEST(Sft, GradientMatchesFiniteDifference) {
  // An independent check of the backward: central differences on a few weights.
  auto config = testing::TinyConfig("qwen2");
  auto model = testing::RandomModel(config, 6, torch::kFloat64);
  auto batch = MakeBatch(testing::RandomSequences({8, 6}, config.vocab_size, 4), Layout::kRightPad);
  auto obj = MakeSftObjective({});
  ForwardBackward(model, batch, *obj, {EngineKind::kStream, 3, 2});
  auto grads = CollectGradients(*model);
  ZeroGradients(*model);
  const double h = 1e-6;
  for (const char* name : {"model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight",
                           "model.layers.0.self_attn.v_proj.bias", "model.embed_tokens.weight"}) {
    torch::Tensor p;
    for (auto& [n, t] : model->named_hf_parameters()) if (n == name) p = t;
    ASSERT_TRUE(p.defined()) << name;
    auto flat = p.view(-1);
    for (int64_t idx : {int64_t{0}, flat.numel() / 2 + 1}) {
      torch::NoGradGuard no_grad;
      const double orig = flat[idx].item<double>();
      auto loss_at = [&](double v) {
        flat[idx] = v;
        auto o = MakeSftObjective({});
        return ForwardOnly(model, batch, *o, 3).loss;
      };
      const double numeric = (loss_at(orig + h) - loss_at(orig - h)) / (2 * h);
      flat[idx] = orig;
      const double analytic = grads.at(name).view(-1)[idx].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-7 + 1e-5 * std::abs(numeric)) << name << "[" << idx << "]";
    }
  }
}

TEST(Sft, NoSelectedTargetsIsAClearError) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 1, torch::kFloat64);
  Sequence s{{1, 2, 3}, {0, 0, 0}};
  auto batch = MakeBatch({s}, Layout::kRightPad);
  auto obj = MakeSftObjective({});
  try {
    ForwardBackward(model, batch, *obj, {EngineKind::kStream});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no target tokens"), std::string::npos);
  }
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(ObjectiveRegistry, CreatesByNameAndRejectsUnknown) {
  RegisterBuiltinObjectives();
  EXPECT_EQ(CreateObjective("sft", nlohmann::json::object())->name(), "sft");
  try {
    CreateObjective("ppo-magic", nlohmann::json::object());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown objective 'ppo-magic'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("sft"), std::string::npos);
  }
  EXPECT_THROW(CreateObjective("sft", {{"normaliser", 3}}), InvalidArgument);
}

}  // namespace
}  // namespace streambp
