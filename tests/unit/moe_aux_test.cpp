// The router's load-balancing loss of mixture-of-experts models (docs/architecture.md: Models):
// every engine's loss and gradients with it equal an independent float64 reference written
// from HF's load_balancing_loss_func (tests/test_util: the router logits of every token and
// sparse layer concatenated, softmax, top-k, one-hot means), for SFT and, as the difference it
// makes, for DPO, GRPO and weighted log-probs; a step split into micro-batches weights each
// part's loss by its share of the step's tokens; the coefficient comes from config.json
// (output_router_logits, router_aux_loss_coef) or the request.
#include <cmath>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"
#include "test_util/trainer_fixtures.h"

namespace streambp {
namespace {

using testing::ErrorOf;

constexpr double kCoef = 0.3;  // large, so that the aux term moves every router's gradient visibly

// ref + scale * aux, parameter by parameter.
TensorMap Plus(const TensorMap& ref, const TensorMap& aux, double scale) {
  TensorMap out;
  for (const auto& [name, g] : ref) out[name] = g + scale * aux.at(name);
  return out;
}

// The largest relative change the aux term makes to the gate (router) gradients: the tests
// below would not notice a missing aux gradient if it were tiny.
double GateChange(const TensorMap& without, const TensorMap& with) {
  double change = 0;
  for (const auto& [name, g] : without) {
    if (name.find("mlp.gate.weight") == std::string::npos) continue;
    change = std::max(change, ((with.at(name) - g).norm() / g.norm()).item<double>());
  }
  return change;
}

class RouterAuxLoss : public ::testing::TestWithParam<testing::FamilyLayout> {};

// config.json's output_router_logits: every engine's loss is the SFT loss + coef x HF's aux
// loss and its gradients the reference's, at odd chunk, logits chunk and key tile sizes.
TEST_P(RouterAuxLoss, EveryEngineMatchesHfLoadBalancingLoss) {
  const auto& [family, layout] = GetParam();
  auto config = testing::TinyConfig(family);
  config.output_router_logits = true;
  config.router_aux_loss_coef = kCoef;
  auto model = testing::RandomModel(config, 31, torch::kFloat64);
  const auto seqs = testing::RandomSequences({13, 8, 21}, config.vocab_size, 9);
  double gap = 1.0;
  const auto [ref_loss, ref_grads] = testing::ReferenceSft(*model, seqs, &gap, kCoef);
  const auto [plain_loss, plain_grads] = testing::ReferenceSft(*model, seqs, &gap);
  const auto [aux_value, aux_grads] = testing::ReferenceRouterAux(*model, seqs);
  std::printf("%s: smallest top-k router margin %.6g, aux %.6g, gate gradients move %.3g\n", family.c_str(), gap,
              aux_value, GateChange(plain_grads, ref_grads));
  EXPECT_GT(gap, 1e-6);
  EXPECT_GT(GateChange(plain_grads, ref_grads), 1e-3);
  EXPECT_NEAR(ref_loss, plain_loss + kCoef * aux_value, 1e-12);
  const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 24 : 0);
  for (const auto& [name, options] : testing::EngineVariants(5, 7, 3)) {
    ZeroGradients(*model);
    auto objective = MakeSftObjective({});
    const auto r = ForwardBackward(model, batch, *objective, options);
    const auto diff = CompareGradients(ref_grads, CollectGradients(*model));
    EXPECT_LE(diff.max_relative, 1e-10) << family << " " << name << " worst " << diff.worst;
    EXPECT_NEAR(r.loss, ref_loss, 1e-12 * std::abs(ref_loss)) << family << " " << name;
    EXPECT_NEAR(r.router_aux_loss, aux_value, 1e-12 * aux_value) << family << " " << name;
  }
  ZeroGradients(*model);
}

INSTANTIATE_TEST_SUITE_P(Families, RouterAuxLoss, ::testing::ValuesIn(testing::MoeFamilyLayouts()),
                         [](const auto& info) { return testing::FamilyLayoutName(info.param); });

// The request's coefficient wins over config.json's: 0 turns the loss off on a model whose
// config asks for it; a positive one turns it on for a model whose config does not.
TEST(RouterAuxLossOptions, TheRequestsCoefficientOverridesTheConfig) {
  auto config = testing::TinyConfig("qwen3_moe_mixed");
  auto model = testing::RandomModel(config, 3, torch::kFloat64);
  const auto seqs = testing::RandomSequences({9, 14}, config.vocab_size, 2);
  const auto batch = MakeBatch(seqs, Layout::kRightPad);
  const auto [plain_loss, plain_grads] = testing::ReferenceSft(*model, seqs);
  const auto [aux_loss, aux_grads] = testing::ReferenceSft(*model, seqs, nullptr, 0.05);
  auto run = [&](CausalLM m, double coef) {
    ZeroGradients(*m);
    EngineOptions options{EngineKind::kStream, 4, 3, false, 5};
    options.router_aux_loss_coef = coef;
    auto objective = MakeSftObjective({});
    const auto r = ForwardBackward(m, batch, *objective, options);
    auto grads = CollectGradients(*m);
    ZeroGradients(*m);
    return std::make_pair(r, grads);
  };
  // config.json without output_router_logits: none by default, 0.05 when asked.
  auto [r0, g0] = run(model, -1);
  EXPECT_LE(CompareGradients(plain_grads, g0).max_relative, 1e-10);
  EXPECT_EQ(r0.router_aux_loss, 0.0);
  auto [r1, g1] = run(model, 0.05);
  EXPECT_LE(CompareGradients(aux_grads, g1).max_relative, 1e-10);
  EXPECT_NEAR(r1.loss, aux_loss, 1e-12 * aux_loss);
  // config.json with it (coefficient 0.05): on by default, off with 0.
  config.output_router_logits = true;
  config.router_aux_loss_coef = 0.05;
  auto with_config = testing::RandomModel(config, 3, torch::kFloat64);
  auto [r2, g2] = run(with_config, -1);
  EXPECT_LE(CompareGradients(aux_grads, g2).max_relative, 1e-10);
  auto [r3, g3] = run(with_config, 0);
  EXPECT_LE(CompareGradients(plain_grads, g3).max_relative, 1e-10);
  EXPECT_NEAR(r3.loss, plain_loss, 1e-12 * plain_loss);
  // A dense model has no such loss, whatever is asked.
  auto dense = testing::RandomModel(testing::TinyConfig("qwen3"), 3, torch::kFloat64);
  auto [r4, g4] = run(dense, 0.5);
  EXPECT_EQ(r4.router_aux_loss, 0.0);
  // Bad coefficients and step sizes are refused before anything runs.
  for (const auto& [coef, step_tokens, expected] :
       std::vector<std::tuple<double, int64_t, std::string>>{
           {-0.5, 0, "router_aux_loss_coef must be -1 (the model's) or a finite number >= 0, got -0.5"},
           {std::nan(""), 0, "router_aux_loss_coef must be -1"},
           {0.05, 3, "aux_loss_step_tokens (3) must be 0 or at least the batch's 23 tokens"}}) {
    EngineOptions options{EngineKind::kStream};
    options.router_aux_loss_coef = coef;
    options.aux_loss_step_tokens = step_tokens;
    const auto error = ErrorOf([&] {
      auto objective = MakeSftObjective({});
      ForwardBackward(model, batch, *objective, options);
    });
    EXPECT_NE(error.find(expected), std::string::npos) << "expected '" << expected << "', got '" << error << "'";
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined() && p.grad().abs().max().item<double>() > 0);
  }
}

// Sequences for the objectives other than SFT: two DPO pairs, a GRPO group of three, and
// client weights of both signs.
std::vector<Sequence> ObjectiveSequences(const std::string& kind, int64_t vocab) {
  auto raw = testing::RandomSequences({4, 6, 3, 5, 7, 2}, vocab, 12);
  std::vector<Sequence> out;
  if (kind == "dpo") {
    for (int p = 0; p < 2; ++p) {
      nlohmann::json j{{"prompt", raw[3 * p].tokens}, {"chosen", raw[3 * p + 1].tokens},
                       {"rejected", raw[3 * p + 2].tokens}, {"ref_chosen_logp", -10.0 - p},
                       {"ref_rejected_logp", -12.5 + 0.7 * p}};
      for (auto& s : ParseDpoExample(j, "pair", p)) out.push_back(s);
    }
  } else if (kind == "grpo") {
    for (int c = 0; c < 3; ++c) {
      Sequence s;
      s.tokens = raw[0].tokens;
      s.tokens.insert(s.tokens.end(), raw[c + 1].tokens.begin(), raw[c + 1].tokens.end());
      s.loss_mask.assign(raw[0].tokens.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      s.group = 0;
      s.reward = std::sin(1.3 * (c + 1));
      out.push_back(s);
    }
  } else {
    out = raw;
    for (auto& s : out) {
      s.token_weights.assign(s.tokens.size(), 0.0);
      for (size_t t = 1; t < s.tokens.size(); ++t) s.token_weights[t] = 0.3 * std::sin(double(t));
    }
  }
  return out;
}

std::unique_ptr<Objective> ObjectiveOf(const std::string& kind) {
  if (kind == "dpo") return MakeDpoObjective({});
  if (kind == "grpo") return MakeGrpoObjective({});
  return MakeWeightedLogprobsObjective({});
}

// The aux term is the same whatever the objective: with it, every engine's gradients are those
// without it plus coef x the reference's aux gradients (DPO's two passes and GRPO's surrogate
// included), and the loss grows by coef x the reference's aux value.
TEST(RouterAuxLossObjectives, TheAuxTermAddsToEveryObjective) {
  auto config = testing::TinyConfig("qwen3_moe_mixed");
  auto model = testing::RandomModel(config, 8, torch::kFloat64);
  for (const std::string kind : {"dpo", "grpo", "weighted"}) {
    const auto seqs = ObjectiveSequences(kind, config.vocab_size);
    const auto [aux_value, aux_grads] = testing::ReferenceRouterAux(*model, seqs);
    const auto batch = MakeBatch(seqs, Layout::kPacked, 16);
    for (const auto& [name, options] : testing::EngineVariants(3, 5, 2)) {
      auto run = [&](double coef) {
        ZeroGradients(*model);
        auto with = options;
        with.router_aux_loss_coef = coef;
        auto objective = ObjectiveOf(kind);
        const auto r = ForwardBackward(model, batch, *objective, with);
        objective->finish();
        return std::make_pair(r, CollectGradients(*model));
      };
      const auto [without, g0] = run(0);
      const auto [with, g1] = run(kCoef);
      const auto diff = CompareGradients(Plus(g0, aux_grads, kCoef), g1);
      EXPECT_LE(diff.max_relative, 1e-10) << kind << " " << name << " worst " << diff.worst;
      EXPECT_NEAR(with.loss - without.loss, kCoef * aux_value, 1e-12) << kind << " " << name;
      EXPECT_NEAR(with.router_aux_loss, aux_value, 1e-12 * aux_value) << kind << " " << name;
    }
  }
  ZeroGradients(*model);
}

// A trainer step split into micro-batches adds each part's aux loss weighted by its share of
// the step's tokens (as gradient accumulation averages HF's per-forward losses): the gradient
// is the SFT step's plus coef x sum_m (N_m / N) x the reference's aux gradient of part m, and
// the metric router_aux_loss the same weighted sum.
TEST(RouterAuxLossOptions, MicroBatchesAddTheirPartsWeightedByTokens) {
  auto config = testing::TinyConfig("qwen3_moe");
  config.output_router_logits = true;
  config.router_aux_loss_coef = kCoef;
  auto options = testing::ExactTrainerOptions();
  options.layout = Layout::kRightPad;
  options.micro_batch_tokens = 24;
  auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), options);
  const auto seqs = testing::RandomSequences({11, 9, 13, 7}, config.vocab_size, 6);
  const auto parts = SplitMicroBatches(seqs, options.layout, options.micro_batch_tokens);
  ASSERT_GE(parts.size(), 3u);
  auto [expected_loss, expected] = testing::ReferenceSft(*trainer->model(), seqs);
  double expected_aux = 0, total = 0;
  for (const auto& s : seqs) total += static_cast<double>(s.tokens.size());
  for (const auto& indices : parts) {
    std::vector<Sequence> part;
    double tokens = 0;
    for (size_t i : indices) {
      part.push_back(seqs[i]);
      tokens += static_cast<double>(seqs[i].tokens.size());
    }
    const auto [aux, grads] = testing::ReferenceRouterAux(*trainer->model(), part);
    expected = Plus(expected, grads, kCoef * tokens / total);
    expected_aux += aux * tokens / total;
  }
  auto sft = MakeSftObjective({});
  const auto r = trainer->forward_backward(seqs, *sft);
  const auto diff = CompareGradients(expected, CollectGradients(*trainer->model()));
  EXPECT_LE(diff.max_relative, 1e-10) << "worst " << diff.worst;
  EXPECT_NEAR(r.metrics.at("router_aux_loss"), expected_aux, 1e-12 * expected_aux);
  EXPECT_NEAR(r.loss, expected_loss + kCoef * expected_aux, 1e-12 * r.loss);
  trainer->zero_gradients();
  // Without the loss, no metric.
  auto dense_options = options;
  dense_options.engine.router_aux_loss_coef = 0;
  auto off = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), dense_options);
  EXPECT_EQ(off->forward_backward(seqs, *sft).metrics.count("router_aux_loss"), 0u);
}

// config.json: output_router_logits and router_aux_loss_coef are read and written back.
TEST(RouterAuxLossOptions, ConfigJsonRoundTrips) {
  auto j = testing::TinyConfig("qwen3_moe").ToJson();
  EXPECT_EQ(j.at("output_router_logits"), false);
  j["output_router_logits"] = true;
  j["router_aux_loss_coef"] = 0.02;
  const auto c = ModelConfig::FromJson(j);
  EXPECT_TRUE(c.output_router_logits);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.02);
  EXPECT_EQ(c.ToJson().at("output_router_logits"), true);
  EXPECT_DOUBLE_EQ(RouterAuxCoefficient(EngineOptions{}, c), 0.02);
}

}  // namespace
}  // namespace streambp
