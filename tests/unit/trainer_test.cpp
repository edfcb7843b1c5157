// Trainer: the optimizers against LibTorch's own, exact gradient accumulation, schedules,
// clipping, non-finite steps, bad input, reference log-probs, and a demo that learns.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <numbers>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/optimizer.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"
#include "test_util/trainer_fixtures.h"

namespace streambp {
namespace {

CausalLM CloneModel(const CausalLMImpl& model) {
  CausalLM copy(model.config());
  copy->to(model.named_hf_parameters().front().second.scalar_type());
  copy->load_hf_tensors(model.hf_tensors());
  return copy;
}

// Every tensor of `a` equals the one of `b` bit for bit (NaN == NaN).
void ExpectSameTensors(const TensorMap& a, const TensorMap& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    const auto& u = b.at(name);
    ASSERT_EQ(t.scalar_type(), u.scalar_type()) << what << ": " << name;
    EXPECT_TRUE(t.is_floating_point() ? torch::allclose(t, u, 0, 0, /*equal_nan=*/true) : torch::equal(t, u))
        << what << ": " << name;
  }
}

bool AllGradientsCleared(const CausalLMImpl& model) {
  for (const auto& p : model.parameters()) {
    if (p.grad().defined()) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Optimizers against torch::optim (an independent implementation of the same math).

// Parameters with gradients set from a generator, as torch::optim sees them.
std::vector<torch::Tensor> MakeParams(torch::Dtype dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<torch::Tensor> out;
  for (auto shape : {std::vector<int64_t>{7, 5}, std::vector<int64_t>{13}, std::vector<int64_t>{3, 4, 2}}) {
    out.push_back(at::normal(0.0, 1.0, shape, gen, torch::TensorOptions().dtype(torch::kFloat64))
                      .to(dtype)
                      .requires_grad_(true));
  }
  return out;
}

void SetGradients(std::vector<torch::Tensor>& params, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  for (auto& p : params) {
    p.mutable_grad() = at::normal(0.0, 0.5, p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64))
                           .to(p.scalar_type());
  }
}

NamedParameters Named(const std::vector<torch::Tensor>& params) {
  NamedParameters out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(std::string(1, 'p').append(std::to_string(i)), params[i]);
  return out;
}

TEST(Optimizer, AdamWMatchesLibTorchBitForBit) {
  auto ours = MakeParams(torch::kFloat64);
  std::vector<torch::Tensor> theirs;
  for (const auto& p : ours) theirs.push_back(p.detach().clone().requires_grad_(true));
  OptimizerOptions o;
  o.lr = 3e-2;
  o.betas = {0.8, 0.95};
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  Optimizer optimizer(o, Named(ours));
  torch::optim::AdamW reference(
      theirs, torch::optim::AdamWOptions(o.lr).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1));
  for (int step = 0; step < 5; ++step) {
    SetGradients(ours, step);
    SetGradients(theirs, step);
    optimizer.step(o.lr);
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << "step " << step << " param " << i << " max diff "
                                                    << (ours[i] - theirs[i]).abs().max().item<double>();
    }
  }
  const auto state = optimizer.state();
  EXPECT_EQ(state.at("step/p0").item<int64_t>(), 5);
  EXPECT_TRUE(state.count("exp_avg/p2") && state.count("exp_avg_sq/p2"));
}

TEST(Optimizer, SgdWithMomentumAndDecayMatchesLibTorchBitForBit) {
  auto ours = MakeParams(torch::kFloat64);
  std::vector<torch::Tensor> theirs;
  for (const auto& p : ours) theirs.push_back(p.detach().clone().requires_grad_(true));
  OptimizerOptions o;
  o.name = "sgd";
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  Optimizer optimizer(o, Named(ours));
  torch::optim::SGD reference(theirs, torch::optim::SGDOptions(o.lr).momentum(0.9).weight_decay(0.01));
  for (int step = 0; step < 5; ++step) {
    SetGradients(ours, step);
    SetGradients(theirs, step);
    optimizer.step(o.lr);
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << "step " << step << " param " << i;
    }
  }
}

TEST(Optimizer, ReducedPrecisionParametersFollowFloat32Masters) {
  // bfloat16 parameters: the update runs on float32 masters with the float32 gradient; the
  // parameters are the rounded masters. Reference: LibTorch's AdamW on float32 copies.
  auto ours = MakeParams(torch::kBFloat16);
  std::vector<torch::Tensor> theirs;
  for (const auto& p : ours) theirs.push_back(p.detach().to(torch::kFloat32).requires_grad_(true));
  OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  Optimizer optimizer(o, Named(ours));
  torch::optim::AdamW reference(theirs, torch::optim::AdamWOptions(o.lr).weight_decay(0.05));
  for (int step = 0; step < 4; ++step) {
    SetGradients(ours, step);
    for (size_t i = 0; i < ours.size(); ++i) theirs[i].mutable_grad() = ours[i].grad().to(torch::kFloat32);
    optimizer.step(o.lr);
    reference.step();
  }
  const auto state = optimizer.state();
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto& master = state.at("master/p" + std::to_string(i));
    EXPECT_EQ(master.scalar_type(), torch::kFloat32);
    EXPECT_EQ(state.at("exp_avg/p" + std::to_string(i)).scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(master, theirs[i].detach())) << i;
    EXPECT_TRUE(torch::equal(ours[i].detach(), theirs[i].detach().to(torch::kBFloat16))) << i;
  }
}

// The whole loop: Trainer (AdamW) against ForwardBackward + torch::optim::AdamW on a clone.
TEST(Trainer, AdamWStepsMatchLibTorchOnAModel) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 3, torch::kFloat64);
  auto clone = CloneModel(*model);
  TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.max_grad_norm = 0;
  o.engine = {EngineKind::kStream, 4, 3};
  o.reference.use_reference_model = false;
  auto trainer = Trainer::Create(model, o);
  torch::optim::AdamW reference(clone->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  for (int step = 0; step < 3; ++step) {
    auto seqs = testing::RandomSequences({9, 6, 12}, config.vocab_size, 20 + step);
    auto sft = MakeSftObjective({});
    const auto r = trainer->train_step(seqs, *sft);
    EXPECT_FALSE(r.optim.skipped);
    EXPECT_EQ(r.optim.step, step + 1);
    reference.zero_grad();
    auto sft2 = MakeSftObjective({});
    const auto r2 = ForwardBackward(clone, MakeBatch(seqs, Layout::kPacked), *sft2, o.engine);
    sft2->finish();
    reference.step();
    EXPECT_EQ(r.forward.loss, r2.loss) << step;
  }
  ExpectSameTensors(trainer->model()->hf_tensors(), clone->hf_tensors(), "weights after 3 steps");
  EXPECT_EQ(trainer->policy_version(), 3);
}

TEST(Trainer, SgdLrOneStepSubtractsTheGradientExactly) {
  auto config = testing::TinyConfig("llama_bias");
  auto trainer =
      Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), testing::ExactTrainerOptions());
  auto before = trainer->model()->hf_tensors();
  auto sft = MakeSftObjective({});
  trainer->forward_backward(testing::RandomSequences({10, 7}, config.vocab_size, 1), *sft);
  auto grads = CollectGradients(*trainer->model());
  const auto r = trainer->optim_step();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.lr, 1.0);
  const auto after = trainer->model()->hf_tensors();
  for (const auto& [name, p] : before) {
    EXPECT_TRUE(torch::equal(after.at(name), p - grads.at(name))) << name;
  }
  EXPECT_TRUE(AllGradientsCleared(*trainer->model()));
  EXPECT_FALSE(trainer->has_pending_gradients());
}

// ---------------------------------------------------------------------------------------
// Gradient accumulation.

TEST(Trainer, AccumulationAcrossCallsWithStepNormalizerIsExact) {
  auto config = testing::TinyConfig("qwen3");
  auto trainer =
      Trainer::Create(testing::RandomModel(config, 7, torch::kFloat64), testing::ExactTrainerOptions());
  const auto seqs = testing::RandomSequences({9, 14, 5, 11, 8, 13}, config.vocab_size, 4);
  int64_t targets = 0;
  for (const auto& s : seqs) targets += s.num_targets();
  double whole_loss = 0, split_loss = 0;
  const auto whole = testing::AccumulatedGradients(
      *trainer, {seqs}, [] { return MakeSftObjective({}); }, &whole_loss);
  const auto parts = testing::SplitIntoParts(seqs, 3);
  ASSERT_EQ(parts.size(), 3u);
  const auto split = testing::AccumulatedGradients(
      *trainer, parts, [&] { return MakeSftObjective({static_cast<double>(targets)}); }, &split_loss);
  EXPECT_NEAR(split_loss, whole_loss, 1e-12 * std::abs(whole_loss));
  const auto diff = CompareGradients(whole, split);
  EXPECT_LE(diff.max_relative, 1e-12) << diff.worst;
}

TEST(Trainer, MicroBatchesGiveTheGradientsOfOneBatch) {
  auto config = testing::TinyConfig("mistral_window");
  const auto seqs = testing::RandomSequences({9, 14, 5, 11, 8, 13, 6}, config.vocab_size, 9);
  auto options = testing::ExactTrainerOptions();
  auto one = Trainer::Create(testing::RandomModel(config, 8, torch::kFloat64), options);
  double loss_one = 0, loss_many = 0;
  const auto expected = testing::AccumulatedGradients(
      *one, {seqs}, [] { return MakeSftObjective({}); }, &loss_one);
  options.micro_batch_tokens = 28;  // rows of 14 tokens: at most 2 per micro-batch
  ASSERT_GE(SplitMicroBatches(seqs, options.layout, options.micro_batch_tokens).size(), 3u);
  auto many = Trainer::Create(testing::RandomModel(config, 8, torch::kFloat64), options);
  const auto got = testing::AccumulatedGradients(
      *many, {seqs}, [] { return MakeSftObjective({}); }, &loss_many);
  EXPECT_NEAR(loss_many, loss_one, 1e-12 * std::abs(loss_one));
  const auto diff = CompareGradients(expected, got);
  EXPECT_LE(diff.max_relative, 1e-12) << diff.worst;
}

// A plan made once (what the server's admission hands the step) runs the step as planned:
// the same gradients bit for bit as the trainer's own walk. A plan of other sequences is
// refused before anything runs.
TEST(Trainer, AGivenPlanIsTheStepsOwnWalk) {
  auto config = testing::TinyConfig("mistral_window");
  const auto seqs = testing::RandomSequences({9, 14, 5, 11, 8, 13, 6}, config.vocab_size, 9);
  auto options = testing::ExactTrainerOptions();
  options.micro_batch_tokens = 28;
  const auto plan = PlanStep(seqs, config.vocab_size, options);
  EXPECT_EQ(plan.micro_batches, SplitMicroBatches(seqs, options.layout, options.micro_batch_tokens));
  EXPECT_EQ(plan.sequences, seqs.size());
  EXPECT_EQ(plan.tokens, 9 + 14 + 5 + 11 + 8 + 13 + 6);
  EXPECT_EQ(plan.longest, 14);
  auto own = Trainer::Create(testing::RandomModel(config, 8, torch::kFloat64), options);
  auto planned = Trainer::Create(testing::RandomModel(config, 8, torch::kFloat64), options);
  auto a = MakeSftObjective({});
  auto b = MakeSftObjective({});
  const auto r_own = own->forward_backward(seqs, *a);
  const auto r_planned = planned->forward_backward(seqs, *b, nullptr, &plan);
  EXPECT_EQ(r_own.loss, r_planned.loss);
  ExpectSameTensors(CollectGradients(*own->model()), CollectGradients(*planned->model()), "gradients");

  auto fresh = Trainer::Create(testing::RandomModel(config, 8, torch::kFloat64), options);
  const std::vector<Sequence> fewer(seqs.begin(), seqs.begin() + 3);
  auto c = MakeSftObjective({});
  try {
    fresh->forward_backward(fewer, *c, nullptr, &plan);
    ADD_FAILURE() << "a plan of 7 sequences ran a step of 3";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the step plan was made for 7 sequences but the step has 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fresh->has_pending_gradients());
  EXPECT_TRUE(AllGradientsCleared(*fresh->model()));
  // PlanStep validates as the step does.
  auto bad = seqs;
  bad[4].tokens[2] = -1;
  EXPECT_THROW(PlanStep(bad, config.vocab_size, options), InvalidArgument);
}

// ---------------------------------------------------------------------------------------
// Schedules: the Hugging Face formulas, written out here.

double HfLambda(const std::string& type, int64_t s, int64_t warmup, int64_t total, double min_ratio) {
  if (s < warmup) return double(s) / double(std::max<int64_t>(1, warmup));
  if (type == "constant") return 1.0;
  if (type == "linear")
    return std::max(0.0, double(total - s) / double(std::max<int64_t>(1, total - warmup)));
  const double progress = double(s - warmup) / double(std::max<int64_t>(1, total - warmup));
  const double f = 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress));
  return std::max(0.0, f * (1 - min_ratio) + min_ratio);
}

TEST(Schedule, MultipliersEqualTheHuggingFaceFormulas) {
  for (const std::string type : {"constant", "linear", "cosine"}) {
    for (double min_ratio : {0.0, 0.1}) {
      ScheduleOptions s{type, 4, 20, type == "cosine" ? min_ratio : 0.0};
      s.Validate();
      for (int64_t step : {0, 1, 3, 4, 5, 10, 17, 19, 20}) {
        EXPECT_DOUBLE_EQ(LrMultiplier(s, step), HfLambda(type, step, 4, 20, s.min_lr_ratio))
            << type << " step " << step;
      }
    }
  }
  // Past the end the multiplier stays at its final value (HF's cosine would rise again).
  EXPECT_EQ(LrMultiplier({"linear", 2, 10, 0}, 15), 0.0);
  EXPECT_DOUBLE_EQ(LrMultiplier({"cosine", 2, 10, 0.1}, 15), 0.1);
  EXPECT_THROW(ScheduleOptions({"linear", 0, 0, 0}).Validate(), InvalidArgument);
}

TEST(Schedule, TrainerUsesTheScheduleAtEachStep) {
  auto config = testing::TinyConfig("llama");
  auto options = testing::ExactTrainerOptions();
  options.optimizer.lr = 1e-3;
  options.schedule = {"cosine", 2, 6, 0.2};
  auto trainer = Trainer::Create(testing::RandomModel(config, 1, torch::kFloat64), options);
  const auto seqs = testing::RandomSequences({8, 5}, config.vocab_size, 2);
  for (int64_t step = 0; step < 4; ++step) {
    EXPECT_DOUBLE_EQ(trainer->current_lr(), 1e-3 * HfLambda("cosine", step, 2, 6, 0.2));
    auto sft = MakeSftObjective({});
    const auto r = trainer->train_step(seqs, *sft);
    EXPECT_DOUBLE_EQ(r.optim.lr, 1e-3 * HfLambda("cosine", step, 2, 6, 0.2)) << step;
  }
}

// ---------------------------------------------------------------------------------------
// Clipping and non-finite steps.

TEST(Trainer, ClippingReportsTheNormAndAppliesTheClippedGradient) {
  auto config = testing::TinyConfig("qwen2");
  auto options = testing::ExactTrainerOptions();
  auto probe = Trainer::Create(testing::RandomModel(config, 4, torch::kFloat64), options);
  const auto seqs = testing::RandomSequences({12, 9}, config.vocab_size, 6);
  auto sft = MakeSftObjective({});
  const auto grads = testing::AccumulatedGradients(*probe, {seqs}, [] { return MakeSftObjective({}); });
  double sum_sq = 0;
  for (const auto& [name, g] : grads) sum_sq += g.pow(2).sum().item<double>();
  const double direct_norm = std::sqrt(sum_sq);

  options.max_grad_norm = direct_norm / 4;
  auto trainer = Trainer::Create(testing::RandomModel(config, 4, torch::kFloat64), options);
  const auto before = trainer->model()->hf_tensors();
  trainer->forward_backward(seqs, *sft);
  const auto r = trainer->optim_step();
  EXPECT_NEAR(r.grad_norm, direct_norm, 1e-12 * direct_norm);
  const double coef = options.max_grad_norm / (r.grad_norm + 1e-6);
  ASSERT_LT(coef, 1.0);
  const auto after = trainer->model()->hf_tensors();
  for (const auto& [name, p] : before) {
    EXPECT_TRUE(torch::equal(after.at(name), p - grads.at(name).mul(coef))) << name;
  }

  // A norm under the limit is left alone.
  options.max_grad_norm = direct_norm * 2;
  auto unclipped = Trainer::Create(testing::RandomModel(config, 4, torch::kFloat64), options);
  unclipped->forward_backward(seqs, *sft);
  unclipped->optim_step();
  for (const auto& [name, p] : before) {
    EXPECT_TRUE(torch::equal(unclipped->model()->hf_tensors().at(name), p - grads.at(name))) << name;
  }
}

TEST(Trainer, NonFiniteLossSkipsTheStepAndChangesNothing) {
  auto config = testing::TinyConfig("llama");
  TrainerOptions options;
  options.optimizer.lr = 1e-2;
  options.reference.use_reference_model = false;
  auto trainer = Trainer::Create(testing::RandomModel(config, 2, torch::kFloat32), options);
  const auto seqs = testing::RandomSequences({10, 8}, config.vocab_size, 3);
  auto sft = MakeSftObjective({});
  ASSERT_FALSE(trainer->train_step(seqs, *sft).optim.skipped);  // some optimizer state exists
  {
    torch::NoGradGuard no_grad;
    trainer->model()->layer_list[1]->projections().at(5).second->weight[3][5].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  const auto weights = trainer->model()->hf_tensors();
  const auto state = trainer->optimizer().state();
  const auto fb = trainer->forward_backward(seqs, *sft);
  EXPECT_TRUE(std::isnan(fb.loss));
  EXPECT_TRUE(trainer->has_pending_gradients());
  const auto r = trainer->optim_step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.reason, "non-finite loss");
  EXPECT_EQ(r.step, 1);
  EXPECT_EQ(trainer->step(), 1);
  EXPECT_EQ(trainer->policy_version(), 1);
  ExpectSameTensors(trainer->model()->hf_tensors(), weights, "weights");
  ExpectSameTensors(trainer->optimizer().state(), state, "optimizer state");
  EXPECT_TRUE(AllGradientsCleared(*trainer->model()));
  EXPECT_FALSE(trainer->has_pending_gradients());
}

TEST(Trainer, HugeButFiniteGradientsAreClippedNotSkipped) {
  // float32 gradients around 1e20: their squares overflow float32, not the float64 norm.
  auto config = testing::TinyConfig("qwen3");
  TrainerOptions options;
  options.optimizer.name = "sgd";
  options.optimizer.lr = 1e-2;
  options.reference.use_reference_model = false;
  auto trainer = Trainer::Create(testing::RandomModel(config, 2, torch::kFloat32), options);
  auto sft = MakeSftObjective({1e-20});
  const auto r = trainer->train_step(testing::RandomSequences({10, 8}, config.vocab_size, 3), *sft);
  EXPECT_TRUE(std::isfinite(r.forward.loss));
  EXPECT_FALSE(r.optim.skipped) << r.optim.reason;
  EXPECT_TRUE(std::isfinite(r.optim.grad_norm));
  EXPECT_GT(r.optim.grad_norm, 1e18);
  for (const auto& [name, p] : trainer->model()->hf_tensors()) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>()) << name;
  }
}

// ---------------------------------------------------------------------------------------
// Bad input never changes anything.

TEST(Trainer, BadInputIsRefusedAndChangesNothing) {
  auto config = testing::TinyConfig("qwen3");
  auto trainer =
      Trainer::Create(testing::RandomModel(config, 2, torch::kFloat64), testing::ExactTrainerOptions());
  const auto weights = trainer->model()->hf_tensors();
  auto sft = MakeSftObjective({});

  try {
    trainer->optim_step();
    FAIL() << "optim_step without gradients";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("no accumulated gradients"), std::string::npos) << e.what();
  }

  // Pending gradients of a good call survive a bad one.
  const auto good = testing::RandomSequences({9, 7}, config.vocab_size, 5);
  trainer->forward_backward(good, *sft);
  const auto pending = CollectGradients(*trainer->model());

  auto bad = good;
  bad[1].tokens[3] = config.vocab_size;
  try {
    trainer->forward_backward(bad, *sft);
    FAIL() << "token id >= vocab";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sequence 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokens[3]"), std::string::npos) << e.what();
  }
  try {
    trainer->forward_backward({}, *sft);
    FAIL() << "empty batch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("batch is empty"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(trainer->has_pending_gradients());
  ExpectSameTensors(CollectGradients(*trainer->model()), pending, "pending gradients");
  ExpectSameTensors(trainer->model()->hf_tensors(), weights, "weights");
  EXPECT_EQ(trainer->step(), 0);
}

TEST(Trainer, BadOptionsAreRefused) {
  auto config = testing::TinyConfig("llama");
  const auto create = [&](const nlohmann::json& j) {
    return Trainer::Create(testing::RandomModel(config, 1, torch::kFloat32), TrainerOptions::FromJson(j));
  };
  const auto expect_error = [&](const nlohmann::json& j, const std::string& want) {
    try {
      create(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error({{"optimizer", {{"betass", 1}}}}, "unknown key 'optimizer.betass'");
  expect_error({{"max_grad_nrom", 1}}, "unknown key 'max_grad_nrom'");
  expect_error({{"schedule", {{"type", "linear"}}}}, "schedule.total_steps must be > 0");
  expect_error({{"optimizer", {{"name", "adam"}}}}, "unknown optimizer 'adam'");
  expect_error({{"optimizer", {{"lr", "big"}}}}, "'optimizer.lr' must be a number");
  expect_error({{"optimizer", {{"momentum", 0.9}}}}, "momentum applies to sgd only");
  expect_error({{"engine", {{"kind", "fast"}}}}, "unknown engine 'fast'");
  expect_error({{"layout", "diagonal"}}, "unknown layout 'diagonal'");
  expect_error({{"micro_batch_tokens", -1}}, "micro_batch_tokens must be >= 0");

  // A round trip keeps every field.
  TrainerOptions o;
  o.optimizer = {"sgd", 0.125, {0.5, 0.25}, 1e-7, 0.01, 0.9};
  o.schedule = {"cosine", 3, 30, 0.1};
  o.max_grad_norm = 0.5;
  o.engine = {EngineKind::kCheckpoint, 7, 9, true};
  o.layout = Layout::kLeftPad;
  o.micro_batch_tokens = 100;
  o.max_sequence_length = 64;
  o.reference = {false, "/some/dir"};
  o.seed = 42;
  EXPECT_EQ(TrainerOptions::FromJson(o.ToJson()).ToJson(), o.ToJson());
}

// ---------------------------------------------------------------------------------------
// Reference log-probs.

// SFT that asks for reference log-probs and keeps the sequences of its micro-batches.
class RecordingObjective final : public Objective {
 public:
  std::string name() const override { return "recording"; }
  void prepare(const std::vector<Sequence>& step) override { sft_->prepare(step); }
  void begin(const Batch& batch) override {
    seen.insert(seen.end(), batch.sequences.begin(), batch.sequences.end());
    sft_->begin(batch);
  }
  torch::Tensor chunk_loss(const LogitsChunk& chunk) override { return sft_->chunk_loss(chunk); }
  bool needs_reference(const std::vector<Sequence>& step) const override {
    for (const auto& s : step) {
      if (s.ref_logprobs.empty()) return true;
    }
    return false;
  }
  Metrics finish() override { return sft_->finish(); }
  std::vector<Sequence> seen;

 private:
  std::unique_ptr<Objective> sft_ = MakeSftObjective({});
};

TEST(Trainer, ReferenceLogprobsComeFromTheFrozenInitialWeights) {
  auto config = testing::TinyConfig("qwen3_tied");
  auto options = testing::ExactTrainerOptions();
  options.optimizer.lr = 0.5;
  options.micro_batch_tokens = 24;  // several micro-batches for the reference pass too
  options.engine.logits_chunk = 4;
  options.reference.use_reference_model = true;
  auto initial = testing::RandomModel(config, 12, torch::kFloat64);
  auto trainer = Trainer::Create(CloneModel(*initial), options);
  const auto seqs = testing::RandomSequences({9, 12, 5, 7}, config.vocab_size, 13);
  for (int step = 0; step < 2; ++step) {  // the policy moves; the reference must not
    RecordingObjective objective;
    trainer->train_step(seqs, objective);
    ASSERT_EQ(objective.seen.size(), seqs.size());
    for (size_t i = 0; i < objective.seen.size(); ++i) {
      const auto& tokens = objective.seen[i].tokens;
      const auto logp = torch::log_softmax(testing::ReferenceLogits(*initial, tokens), -1);
      const auto& got = objective.seen[i].ref_logprobs;
      ASSERT_EQ(got.size(), tokens.size());
      EXPECT_EQ(got[0], 0.0);
      for (size_t t = 1; t < tokens.size(); ++t) {
        EXPECT_NEAR(got[t], logp[t - 1][tokens[t]].item<double>(), 1e-10) << "seq " << i << " token " << t;
      }
    }
  }
  ExpectSameTensors(trainer->reference_model()->hf_tensors(), initial->hf_tensors(), "reference weights");
  for (const auto& p : trainer->reference_model()->parameters()) EXPECT_FALSE(p.requires_grad());
}

TEST(Trainer, NeedingReferenceWithoutAReferenceModelIsAClearError) {
  auto config = testing::TinyConfig("llama");
  auto trainer =
      Trainer::Create(testing::RandomModel(config, 1, torch::kFloat64), testing::ExactTrainerOptions());
  RecordingObjective objective;
  try {
    trainer->forward_backward(testing::RandomSequences({6, 5}, config.vocab_size, 1), objective);
    FAIL() << "no reference model";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs reference log-probs: give them in the input or enable the "
                                         "reference model"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(trainer->has_pending_gradients());
}

// ---------------------------------------------------------------------------------------
// Demo: the embedded tiny preset learns a repeating pattern.

TEST(TrainerDemo, TinyPresetLearnsARepeatingPattern) {
  auto model = InitModel(PresetConfig("tiny"), 0, torch::kFloat32);
  TrainerOptions options;
  options.optimizer.lr = 3e-3;
  options.reference.use_reference_model = false;
  auto trainer = Trainer::Create(model, options);
  std::vector<Sequence> seqs(8);
  for (int i = 0; i < 8; ++i) {
    for (int t = 0; t < 32; ++t) seqs[i].tokens.push_back(10 + (i + t) % 16);
  }
  auto sft = MakeSftObjective({});
  double first = 0, last = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < 50; ++step) {
    const auto r = trainer->train_step(seqs, *sft);
    ASSERT_FALSE(r.optim.skipped) << r.optim.reason;
    if (step == 0) first = r.forward.loss;
    last = r.forward.loss;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("demo: loss %.4f -> %.4f (fell %.1f%%) in 50 steps, %.1f ms/step\n", first, last,
              100 * (1 - last / first), 1000 * secs / 50);
  EXPECT_LT(last, 0.2 * first);
}

}  // namespace
}  // namespace streambp
