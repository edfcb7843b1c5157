// dpo: every loss type, chunked and exact, against a direct computation on full logits.
#include <gtest/gtest.h>

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
using testing::SequenceTargetMask;

// Pairs with shared prompts, chosen/rejected of different lengths, reference sums given.
std::vector<Sequence> Pairs(int64_t vocab, uint64_t seed, bool with_ref) {
  auto raw = testing::RandomSequences({4, 6, 3, 5, 7, 2, 3, 4, 2}, vocab, seed);
  std::vector<Sequence> out;
  for (int p = 0; p < 3; ++p) {
    nlohmann::json j{{"prompt", raw[3 * p].tokens}, {"chosen", raw[3 * p + 1].tokens},
                     {"rejected", raw[3 * p + 2].tokens}};
    if (with_ref) {
      j["ref_chosen_logp"] = -10.0 - p;
      j["ref_rejected_logp"] = -12.5 + 0.7 * p;
    }
    for (auto& s : ParseDpoExample(j, "pair", p)) out.push_back(s);
  }
  return out;
}

// The DPO loss written out directly: per pair, from the full logits.
torch::Tensor DirectDpo(const torch::Tensor& logits, const Batch& batch, const DpoOptions& o) {
  auto logp = DirectTokenLogprobs(logits, batch).to(torch::kFloat64);
  torch::Tensor total = torch::zeros({}, torch::kFloat64);
  const int64_t pairs = batch.num_sequences / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    torch::Tensor s[2];
    double ref[2], len[2];
    for (int role = 0; role < 2; ++role) {
      const int64_t i = 2 * p + role;
      auto m = SequenceTargetMask(batch, i);
      s[role] = (logp * m).sum();
      ref[role] = *batch.sequences[i].ref_logp;
      len[role] = m.sum().item<double>();
    }
    if (o.loss_type == "ipo") {
      for (int r = 0; r < 2; ++r) {
        s[r] = s[r] / len[r];
        ref[r] /= len[r];
      }
    }
    auto z = (s[0] - s[1]) - (ref[0] - ref[1]);
    const double b = o.beta, ls = o.label_smoothing;
    auto log_sig = [](const torch::Tensor& x) { return -torch::log1p(torch::exp(-x)); };
    torch::Tensor l;
    if (o.loss_type == "sigmoid") l = -(1 - ls) * log_sig(b * z) - ls * log_sig(-b * z);
    if (o.loss_type == "ipo") l = (z - 1.0 / (2 * b)) * (z - 1.0 / (2 * b));
    if (o.loss_type == "hinge") l = torch::clamp_min(1 - b * z, 0);
    if (o.loss_type == "robust") l = ((ls - 1) * log_sig(b * z) + ls * log_sig(-b * z)) / (1 - 2 * ls);
    total = total + l;
  }
  return total / pairs;
}

struct DpoCase {
  std::string loss_type;
  double label_smoothing;
  Layout layout;
};

class DpoExactness : public ::testing::TestWithParam<DpoCase> {};

TEST_P(DpoExactness, StreamAndCheckpointMatchDirectComputation) {
  const auto& c = GetParam();
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 31, torch::kFloat64);
  DpoOptions o;
  o.loss_type = c.loss_type;
  o.label_smoothing = c.label_smoothing;
  o.beta = 0.5;  // large enough that the hinge is active for some pairs and not others
  auto batch = MakeBatch(Pairs(config.vocab_size, 3, true), c.layout, c.layout == Layout::kPacked ? 12 : 0);
  auto direct = DirectLossAndGrads(model, batch, [&](const torch::Tensor& l) { return DirectDpo(l, batch, o); });
  for (const auto& [name, options] : testing::EngineVariants(3, 4, 2)) {
    auto objective = MakeDpoObjective(o);
    ZeroGradients(*model);
    auto r = ForwardBackward(model, batch, *objective, options);
    auto metrics = objective->finish();
    EXPECT_NEAR(r.loss, direct.loss, 1e-12 * std::max(1.0, std::abs(direct.loss))) << name;
    auto diff = CompareGradients(direct.grads, CollectGradients(*model));
    EXPECT_LE(diff.max_relative, 1e-10) << name << " " << diff.worst;
    EXPECT_TRUE(metrics.count("rewards/margins"));
    EXPECT_GE(metrics.at("rewards/accuracies"), 0.0);
    EXPECT_LE(metrics.at("rewards/accuracies"), 1.0);
  }
  ZeroGradients(*model);
}

INSTANTIATE_TEST_SUITE_P(
    LossTypes, DpoExactness,
    ::testing::Values(DpoCase{"sigmoid", 0.0, Layout::kRightPad}, DpoCase{"sigmoid", 0.1, Layout::kPacked},
                      DpoCase{"ipo", 0.0, Layout::kLeftPad}, DpoCase{"hinge", 0.0, Layout::kPacked},
                      DpoCase{"robust", 0.2, Layout::kRightPad}),
    [](const auto& info) {
      return info.param.loss_type + "_ls" + std::to_string(static_cast<int>(info.param.label_smoothing * 10)) +
             "_" + LayoutName(info.param.layout);
    });

TEST(Dpo, MetricsAreTheImplicitRewards) {
  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 4, torch::kFloat64);
  auto seqs = Pairs(config.vocab_size, 5, true);
  auto batch = MakeBatch(seqs, Layout::kRightPad);
  auto logp = TokenLogprobs(model, batch, 3);
  double chosen = 0, rejected = 0, acc = 0;
  for (int p = 0; p < 3; ++p) {
    double s[2];
    for (int r = 0; r < 2; ++r) {
      s[r] = (logp * SequenceTargetMask(batch, 2 * p + r)).sum().item<double>() - *seqs[2 * p + r].ref_logp;
    }
    chosen += 0.1 * s[0] / 3;
    rejected += 0.1 * s[1] / 3;
    acc += (s[0] > s[1]) / 3.0;
  }
  auto objective = MakeDpoObjective({});
  ForwardBackward(model, batch, *objective, {EngineKind::kStream, 4, 4});
  auto m = objective->finish();
  EXPECT_NEAR(m.at("rewards/chosen"), chosen, 1e-12);
  EXPECT_NEAR(m.at("rewards/rejected"), rejected, 1e-12);
  EXPECT_NEAR(m.at("rewards/margins"), chosen - rejected, 1e-12);
  EXPECT_NEAR(m.at("rewards/accuracies"), acc, 1e-12);
  ZeroGradients(*model);
}

// Micro-batches of whole pairs with the step prepared once equal the whole batch.
TEST(Dpo, MicroBatchesEqualWholeBatch) {
  auto config = testing::TinyConfig("qwen2");
  auto model = testing::RandomModel(config, 8, torch::kFloat64);
  auto seqs = Pairs(config.vocab_size, 9, true);
  auto whole_obj = MakeDpoObjective({});
  auto whole = ForwardBackward(model, MakeBatch(seqs, Layout::kPacked), *whole_obj, {EngineKind::kStream, 4, 4});
  auto expected = CollectGradients(*model);
  ZeroGradients(*model);
  auto obj = MakeDpoObjective({});
  obj->prepare(seqs);
  double loss = 0;
  for (const auto& idx : SplitMicroBatches(seqs, Layout::kRightPad, 20)) {
    std::vector<Sequence> part;
    for (size_t i : idx) part.push_back(seqs[i]);
    ASSERT_EQ(part.size() % 2, 0u);  // pairs are never split
    loss += ForwardBackward(model, MakeBatch(part, Layout::kRightPad), *obj, {EngineKind::kStream, 3, 2}).loss;
  }
  obj->finish();
  EXPECT_NEAR(loss, whole.loss, 1e-12);
  EXPECT_LE(CompareGradients(expected, CollectGradients(*model)).max_relative, 1e-10);
  ZeroGradients(*model);
}

TEST(Dpo, BadInputsAreClearErrors) {
  auto check = [](const nlohmann::json& j, const std::string& want) {
    try {
      ParseDpoExample(j, "f.jsonl:3", 0);
      ADD_FAILURE() << "expected an error for " << j.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  check({{"prompt", {1, 2}}, {"chosen", nlohmann::json::array()}, {"rejected", {3}}}, "f.jsonl:3: field 'chosen' is empty");
  check({{"prompt", {1, 2}}, {"chosen", {4}}, {"rejected", {3}}, {"ref_chosen_logp", -1.0}}, "give both");
  check({{"prompt", {1, 2}}, {"chosen", {4}}}, "missing field 'rejected'");
  check({{"prompt", {1, 2}}, {"chosen", {4}}, {"rejected", {3}}, {"extra", 1}}, "unknown field 'extra'");
  RegisterBuiltinObjectives();
  EXPECT_THROW(CreateObjective("dpo", {{"loss_type", "kto"}}), InvalidArgument);
  EXPECT_THROW(CreateObjective("dpo", {{"beta", -1}}), InvalidArgument);
  EXPECT_THROW(CreateObjective("dpo", {{"label_smoothing", 0.5}}), InvalidArgument);
  // A lone chosen sequence, and a missing reference, are refused before anything runs.
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 1, torch::kFloat64);
  auto seqs = Pairs(config.vocab_size, 2, false);
  auto obj = MakeDpoObjective({});
  EXPECT_TRUE(obj->needs_reference(seqs));
  EXPECT_THROW(ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *obj, {EngineKind::kStream}),
               InvalidArgument);
  seqs = Pairs(config.vocab_size, 2, true);
  seqs.pop_back();
  auto obj2 = MakeDpoObjective({});
  try {
    ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *obj2, {EngineKind::kStream});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lacks its rejected sequence"), std::string::npos) << e.what();
  }
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace streambp
