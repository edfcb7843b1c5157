// Per-step Adam parameters (OptimStep's adam_params, Tinker's AdamParams): each step with them
// equals LibTorch's AdamW run with those options for that step, the configuration and its
// schedule come back for later steps, clipping uses the step's norm, and bad parameters are
// refused before anything changes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/optimizer.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

struct Pair {
  std::unique_ptr<Trainer> trainer;
  CausalLM clone;  // the same weights, trained by LibTorch
  TrainerOptions options;
};

// A float64 trainer (AdamW, lr 1e-2, weight decay 0.01, a warmup-then-linear schedule, no
// clipping) and a copy of its model for the reference.
Pair MakePair() {
  const auto config = testing::TinyConfig("qwen3");
  Pair p{nullptr, nullptr, {}};
  auto model = testing::RandomModel(config, 3, torch::kFloat64);
  p.clone = CausalLM(model->config());
  p.clone->to(torch::kFloat64);
  p.clone->load_hf_tensors(model->hf_tensors());
  p.options.optimizer.lr = 1e-2;
  p.options.optimizer.weight_decay = 0.01;
  p.options.schedule.type = "linear";
  p.options.schedule.warmup_steps = 2;
  p.options.schedule.total_steps = 10;
  p.options.max_grad_norm = 0;
  p.options.engine = {EngineKind::kStream, 4, 3};
  p.options.reference.use_reference_model = false;
  p.trainer = Trainer::Create(model, p.options);
  return p;
}

torch::optim::AdamWOptions& GroupOptions(torch::optim::AdamW& adamw) {
  return static_cast<torch::optim::AdamWOptions&>(adamw.param_groups()[0].options());
}

void ExpectSameWeights(const CausalLMImpl& a, const CausalLMImpl& b, const std::string& what) {
  const auto x = a.hf_tensors(), y = b.hf_tensors();
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, t] : x) EXPECT_TRUE(torch::equal(t, y.at(name))) << what << ": " << name;
}

TEST(AdamParams, EachStepEqualsLibTorchAdamWWithThatStepsOptions) {
  auto p = MakePair();
  const ModelConfig& config = p.trainer->model()->config();
  torch::optim::AdamW reference(p.clone->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  AdamStepParams custom;
  custom.lr = 3e-3;
  custom.beta1 = 0.8;
  custom.beta2 = 0.95;
  custom.eps = 1e-12;
  custom.weight_decay = 0.1;
  const AdamStepParams tinker;  // Tinker's defaults: 1e-4, 0.9, 0.95, 1e-12, 0, no clipping
  // Steps 0 and 3 use the configuration (its schedule at steps 0 and 3: warmup 0, then
  // linear), 1 and 2 their own parameters.
  const std::vector<const AdamStepParams*> plan = {nullptr, &custom, &tinker, nullptr};
  for (size_t step = 0; step < plan.size(); ++step) {
    const auto seqs = testing::RandomSequences({9, 6, 12}, config.vocab_size, 40 + step);
    auto sft = MakeSftObjective({});
    p.trainer->forward_backward(seqs, *sft);
    const OptimResult r = p.trainer->optim_step(plan[step]);
    ASSERT_FALSE(r.skipped);
    const AdamStepParams* a = plan[step];
    const double lr = a ? a->lr : 1e-2 * LrMultiplier(p.options.schedule, static_cast<int64_t>(step));
    EXPECT_EQ(r.lr, lr) << step;
    GroupOptions(reference)
        .lr(lr)
        .betas({a ? a->beta1 : 0.9, a ? a->beta2 : 0.999})
        .eps(a ? a->eps : 1e-8)
        .weight_decay(a ? a->weight_decay : 0.01);
    reference.zero_grad();
    auto sft2 = MakeSftObjective({});
    ForwardBackward(p.clone, MakeBatch(seqs, Layout::kPacked), *sft2, p.options.engine);
    sft2->finish();
    reference.step();
    ExpectSameWeights(*p.trainer->model(), *p.clone, "step " + std::to_string(step));
  }
  EXPECT_GT(LrMultiplier(p.options.schedule, 3), 0.0);
  // The configuration is what it was.
  EXPECT_EQ(p.trainer->options().optimizer.ToJson(), p.options.optimizer.ToJson());
  EXPECT_EQ(p.trainer->step(), 4);
}

TEST(AdamParams, GradClipNormClipsThisStepOnly) {
  auto p = MakePair();
  const ModelConfig& config = p.trainer->model()->config();
  torch::optim::AdamW reference(p.clone->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  const auto seqs = testing::RandomSequences({11, 8}, config.vocab_size, 7);
  auto sft = MakeSftObjective({});
  p.trainer->forward_backward(seqs, *sft);
  auto sft2 = MakeSftObjective({});
  ForwardBackward(p.clone, MakeBatch(seqs, Layout::kPacked), *sft2, p.options.engine);
  sft2->finish();
  // The global norm as torch.nn.utils.clip_grad_norm_ takes it, from the reference's gradients.
  std::vector<torch::Tensor> norms;
  for (const auto& q : p.clone->parameters()) norms.push_back(q.grad().norm());
  const double norm = torch::stack(norms).norm().item<double>();
  AdamStepParams clipped;
  clipped.lr = 5e-3;
  clipped.grad_clip_norm = norm / 4;
  const OptimResult r = p.trainer->optim_step(&clipped);
  EXPECT_NEAR(r.grad_norm, norm, 1e-12 * norm);
  const double coef = clipped.grad_clip_norm / (r.grad_norm + 1e-6);
  ASSERT_LT(coef, 1.0);
  for (auto& q : p.clone->parameters()) q.mutable_grad().mul_(coef);
  GroupOptions(reference).lr(5e-3).betas({0.9, 0.95}).eps(1e-12).weight_decay(0.0);
  reference.step();
  ExpectSameWeights(*p.trainer->model(), *p.clone, "clipped step");
}

TEST(AdamParams, BadParametersAreRefusedAndChangeNothing) {
  auto p = MakePair();
  const ModelConfig& config = p.trainer->model()->config();
  auto sft = MakeSftObjective({});
  p.trainer->forward_backward(testing::RandomSequences({10, 7}, config.vocab_size, 2), *sft);
  const auto before = p.trainer->model()->hf_tensors();
  const auto expect_refused = [&](AdamStepParams a, const std::string& message) {
    try {
      p.trainer->optim_step(&a);
      ADD_FAILURE() << "accepted: " << a.ToJson().dump();
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
    EXPECT_TRUE(p.trainer->has_pending_gradients()) << message;
    EXPECT_EQ(p.trainer->step(), 0);
    for (const auto& [name, t] : p.trainer->model()->hf_tensors()) EXPECT_TRUE(torch::equal(t, before.at(name))) << name;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  AdamStepParams a;
  a.beta1 = 1;
  expect_refused(a, "adam_params.beta1 must be in [0, 1), got 1");
  a = {};
  a.beta2 = -0.5;
  expect_refused(a, "adam_params.beta2 must be in [0, 1), got -0.5");
  a = {};
  a.lr = -1e-3;
  expect_refused(a, "adam_params.learning_rate must be a finite number >= 0, got -0.001");
  a = {};
  a.eps = 0;
  expect_refused(a, "adam_params.eps must be a finite number > 0, got 0");
  a = {};
  a.weight_decay = nan;
  expect_refused(a, "adam_params.weight_decay must be a finite number >= 0, got nan");
  a = {};
  a.grad_clip_norm = -1;
  expect_refused(a, "adam_params.grad_clip_norm must be a finite number >= 0 (0 = no clipping), got -1");
  // The gradients are still there: a plain step applies them.
  EXPECT_FALSE(p.trainer->optim_step().skipped);
  EXPECT_EQ(p.trainer->step(), 1);

  // An SGD trainer has no moments to take betas for.
  TrainerOptions sgd;
  sgd.optimizer.name = "sgd";
  sgd.reference.use_reference_model = false;
  auto trainer = Trainer::Create(testing::RandomModel(config, 4, torch::kFloat64), sgd);
  trainer->forward_backward(testing::RandomSequences({6}, config.vocab_size, 3), *sft);
  const AdamStepParams defaults;
  EXPECT_THROW(trainer->optim_step(&defaults), FailedPrecondition);
  EXPECT_TRUE(trainer->has_pending_gradients());
}

// The moments a step with adam_params leaves are in the checkpoint: a trainer restored from it
// takes the next step (with the same parameters) to the same weights, bit for bit, and has the
// session's configuration, not the step's.
TEST(AdamParams, ACheckpointAfterSuchAStepResumesBitExactly) {
  auto p = MakePair();
  const ModelConfig& config = p.trainer->model()->config();
  AdamStepParams a;
  a.lr = 4e-3;
  a.beta2 = 0.9;
  a.weight_decay = 0.02;
  auto step = [&](Trainer& t, uint64_t seed) {
    auto sft = MakeSftObjective({});
    t.forward_backward(testing::RandomSequences({8, 5}, config.vocab_size, seed), *sft);
    ASSERT_FALSE(t.optim_step(&a).skipped);
  };
  step(*p.trainer, 1);
  const std::string dir = testing::TempDir("adam-params-ckpt");
  p.trainer->save_checkpoint(dir);
  auto restored = Trainer::LoadCheckpoint(dir);
  EXPECT_EQ(restored->options().optimizer.ToJson(), p.options.optimizer.ToJson());
  step(*p.trainer, 2);
  step(*restored, 2);
  const auto x = p.trainer->model()->hf_tensors(), y = restored->model()->hf_tensors();
  for (const auto& [name, t] : x) EXPECT_TRUE(torch::equal(t, y.at(name))) << name;
}

// What the ranks of a data-parallel run receive: every field, and only known ones.
TEST(AdamParams, JsonCarriesEveryFieldAndRefusesUnknownOnes) {
  AdamStepParams a;
  a.lr = 2e-5;
  a.beta1 = 0.85;
  a.beta2 = 0.98;
  a.eps = 1e-10;
  a.weight_decay = 0.05;
  a.grad_clip_norm = 1.5;
  EXPECT_EQ(AdamStepParams::FromJson(a.ToJson()).ToJson(), a.ToJson());
  const AdamStepParams partial = AdamStepParams::FromJson({{"learning_rate", 3e-4}});
  EXPECT_EQ(partial.lr, 3e-4);
  EXPECT_EQ(partial.beta2, 0.95);  // Tinker's default
  EXPECT_EQ(partial.eps, 1e-12);
  try {
    AdamStepParams::FromJson({{"lr", 1e-4}});
    ADD_FAILURE() << "accepted an unknown field";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "adam_params: unknown field 'lr'");
  }
  EXPECT_THROW(AdamStepParams::FromJson({{"beta1", "high"}}), InvalidArgument);
}

}  // namespace
}  // namespace streambp
