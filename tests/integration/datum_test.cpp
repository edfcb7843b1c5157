// Losses as data (issue 28 item 1) and top-k log-probs (item 3): a data batch (Tinker's Datum: model input + named per-token
// tensors) and loss_fn_config over a real gRPC server. A loss registered in this test binary only
// (one registration, no proto, edge or client change) is called by name; Tinker's ppo with its
// clip thresholds from loss_fn_config equals PPO written out by hand in float64; bad data is
// refused naming the field, with nothing changed.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "integration/server_fixture.h"
#include "integration/wire.h"
#include "streambp/error.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::TestConfig;
using testing::Wire;

server::ServerConfig SgdF64() {
  auto c = TestConfig();
  c.trainer.optimizer.name = "sgd";
  c.trainer.optimizer.lr = 0.5;
  return c;
}

// A loss nothing else knows, with an input nothing else knows: L = -factor * sum_t scale_t lp_t
// (+ offset_t lp_t when the optional input is given), reading Batch::inputs by name.
class ScaledLogprobLoss final : public Objective {
 public:
  explicit ScaledLogprobLoss(double factor) : factor_(factor) {}
  std::string name() const override { return "test_scaled_logprob"; }
  void prepare(const std::vector<Sequence>&) override {}
  void begin(const Batch& batch) override {
    if (!batch.inputs.count("scale")) throw InvalidArgument("test_scaled_logprob: no scale");
    scale_ = batch.inputs.at("scale");
    offset_ = batch.inputs.count("offset") ? batch.inputs.at("offset") : torch::zeros_like(scale_);
  }
  torch::Tensor chunk_loss(const LogitsChunk& chunk) override {
    const auto lp = torch::log_softmax(chunk.logits, -1).gather(-1, chunk.targets.unsqueeze(-1)).squeeze(-1);
    const auto w = (factor_ * scale_.slice(1, chunk.start, chunk.end) + offset_.slice(1, chunk.start, chunk.end))
                       .to(lp.scalar_type());
    return -torch::where(chunk.target_mask, w * lp, torch::zeros_like(lp)).sum();
  }
  Metrics finish() override { return {}; }

 private:
  double factor_;
  torch::Tensor scale_, offset_;
};

std::unique_ptr<Objective> CreateScaled(const nlohmann::json& options) {
  double factor = 1.0;
  for (const auto& [key, value] : options.items()) {
    if (key != "factor" || !value.is_number()) {
      throw InvalidArgument("test_scaled_logprob: unknown option '" + key + "' (known: factor, a number)");
    }
    factor = value.get<double>();
  }
  return std::make_unique<ScaledLogprobLoss>(factor);
}

void RegisterTestLoss() {
  RegisterObjective("test_scaled_logprob", &CreateScaled,
                    {ObjectiveOption{"factor", ObjectiveOption::Type::kNumber, {}, "1", "multiplies scale"}}, "weighted",
                    {{"scale", ObjectiveInput::Target::kNamed, true, "per-token scale"},
                     {"offset", ObjectiveInput::Target::kNamed, false, "added to the weight"}});
}

std::vector<std::vector<int32_t>> Sequences() {
  std::vector<std::vector<int32_t>> out;
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> t;
    for (int i = 0; i < 7 + 4 * s; ++i) t.push_back((29 * s + 13 * i + 3) % 256);
    out.push_back(t);
  }
  return out;
}

v1::TensorData Floats(const std::vector<double>& v) {
  v1::TensorData t;
  t.mutable_float_data()->Add(v.begin(), v.end());
  t.add_shape(static_cast<int64_t>(v.size()));
  return t;
}

// A datum of a whole sequence: input = all but the last token, targets = all but the first.
v1::Datum MakeDatum(const std::vector<int32_t>& seq, const std::map<std::string, std::vector<double>>& inputs) {
  v1::Datum d;
  d.mutable_model_input()->mutable_tokens()->Add(seq.begin(), seq.end() - 1);
  auto& targets = (*d.mutable_loss_fn_inputs())["target_tokens"];
  for (size_t i = 1; i < seq.size(); ++i) targets.add_int_data(seq[i]);
  for (const auto& [name, v] : inputs) (*d.mutable_loss_fn_inputs())[name] = Floats(v);
  return d;
}

v1::ConfigValue Number(double v) {
  v1::ConfigValue c;
  c.set_number(v);
  return c;
}

std::vector<std::vector<double>> PolicyLogprobs(Wire& w, const std::vector<std::vector<int32_t>>& seqs) {
  v1::ComputeLogprobsRequest req;
  req.set_fp64(true);
  for (const auto& s : seqs) req.add_sequences()->mutable_tokens()->Add(s.begin(), s.end());
  v1::ComputeLogprobsResponse out;
  EXPECT_TRUE(w.stub->ComputeLogprobs(Wire::ctx().get(), req, &out).ok());
  std::vector<std::vector<double>> lp;
  for (const auto& s : out.sequences()) lp.emplace_back(s.logprobs_fp64().begin(), s.logprobs_fp64().end());
  return lp;
}

// The update of one SGD step from the initial tiny model, per tensor.
TensorMap Update(const client::Client& c) {
  const auto base = InitModel(PresetConfig("tiny"), 0, torch::kFloat64)->hf_tensors();
  auto now = testing::ExportedTensors(c);
  for (auto& [name, t] : now) t = t - base.at(name);
  return now;
}

void ExpectSameUpdate(const TensorMap& a, const TensorMap& b) {
  double worst = 0, largest = 0;
  for (const auto& [name, t] : a) {
    largest = std::max(largest, t.abs().max().item<double>());
    worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(largest, 0);
  EXPECT_LE(worst, 1e-10 * largest);
}

// weighted_logprobs with w per target token (entry t: the token position t predicts), trained by
// one ForwardBackward + OptimStep on `c`.
void TrainWeighted(const client::Client& c, const std::vector<std::vector<int32_t>>& seqs,
                   const std::vector<std::vector<double>>& w) {
  v1::ForwardBackwardRequest fb;
  fb.set_objective("weighted_logprobs");
  for (size_t k = 0; k < seqs.size(); ++k) {
    auto* s = fb.mutable_batch()->mutable_weighted()->add_sequences();
    s->mutable_tokens()->Add(seqs[k].begin(), seqs[k].end());
    s->mutable_weights()->Add(w[k].begin(), w[k].end());
  }
  const auto done = c.ForwardBackward(fb);
  ASSERT_TRUE(done.ok()) << done.status().error_message();
  ASSERT_TRUE(c.OptimStep().ok());
}

TEST(Datum, ALossRegisteredInTheTestBinaryIsCalledByNameWithItsOwnInputs) {
  RegisterTestLoss();
  const auto seqs = Sequences();
  auto a = testing::StartServer(SgdF64());
  Wire wa(a.target);
  // GetInfo lists it with its option and inputs.
  v1::GetInfoResponse info;
  ASSERT_TRUE(wa.stub->GetInfo(Wire::ctx().get(), v1::GetInfoRequest(), &info).ok());
  bool listed = false;
  for (const auto& o : info.objectives()) {
    if (o.name() != "test_scaled_logprob") continue;
    listed = true;
    ASSERT_EQ(o.options_size(), 1);
    EXPECT_EQ(o.options(0), "factor");
    ASSERT_EQ(o.inputs_size(), 1);
    EXPECT_EQ(o.inputs(0), "scale");
    ASSERT_EQ(o.optional_inputs_size(), 1);
    EXPECT_EQ(o.optional_inputs(0), "offset");
  }
  EXPECT_TRUE(listed);

  v1::TrainStepRequest step;
  step.set_objective("test_scaled_logprob");
  (*step.mutable_loss_fn_config())["factor"] = Number(1.5);
  std::vector<std::vector<double>> w;
  for (size_t k = 0; k < seqs.size(); ++k) {
    std::vector<double> scale, offset;
    for (size_t t = 0; t + 1 < seqs[k].size(); ++t) {
      scale.push_back(0.25 * static_cast<double>((k + 3 * t) % 5) - 0.5);
      offset.push_back(k == 1 ? 0.125 * static_cast<double>(t % 3) : 0.0);
    }
    std::map<std::string, std::vector<double>> inputs{{"scale", scale}};
    if (k == 1) inputs["offset"] = offset;  // optional: one datum has it
    *step.mutable_batch()->mutable_data()->add_data() = MakeDatum(seqs[k], inputs);
    std::vector<double> wk;
    for (size_t t = 0; t < scale.size(); ++t) wk.push_back(-(1.5 * scale[t] + offset[t]));  // L = sum w lp
    w.push_back(wk);
  }
  const auto lp = PolicyLogprobs(wa, seqs);
  double loss = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    for (size_t t = 0; t < w[k].size(); ++t) loss += w[k][t] * lp[k][t];
  }
  const auto trained = a.client->TrainStep(step);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  EXPECT_NEAR(trained->stats().loss(), loss, 1e-12 * std::abs(loss));

  auto b = testing::StartServer(SgdF64());
  TrainWeighted(*b.client, seqs, w);
  ExpectSameUpdate(Update(*a.client), Update(*b.client));

  // Its option by name: an unknown key is refused by the loss's own reader.
  v1::TrainStepRequest bad = step;
  (*bad.mutable_loss_fn_config())["factr"] = Number(2);
  const auto refused = a.client->TrainStep(bad);
  EXPECT_EQ(refused.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status().error_message().find("factr"), std::string::npos) << refused.status().error_message();
}

TEST(Datum, PpoFromLossFnConfigIsPpoWrittenOutByHandAndEqualsTheGrpoBatch) {
  const auto seqs = Sequences();
  auto a = testing::StartServer(SgdF64());
  Wire wa(a.target);
  const auto lp = PolicyLogprobs(wa, seqs);
  const double lo = 0.9, hi = 1.15;
  double loss = 0;
  int clipped = 0, tokens = 0;
  std::vector<std::vector<double>> q(seqs.size()), adv(seqs.size()), dlp(seqs.size());
  for (size_t k = 0; k < seqs.size(); ++k) {
    for (size_t t = 0; t < lp[k].size(); ++t) {
      // float64 on the wire: no rounding between this and what the server reads.
      const double sampler = lp[k][t] - (-0.3 + 0.6 * static_cast<double>((5 * k + 3 * t) % 7) / 6.0);
      const double A = (k + t) % 3 == 0 ? -0.6 : 1.1;
      q[k].push_back(sampler);
      adv[k].push_back(A);
      const double r = std::exp(lp[k][t] - sampler);
      const double clip = std::min(std::max(r, lo), hi);
      loss -= std::min(r * A, clip * A);
      dlp[k].push_back(r * A <= clip * A ? -r * A : 0.0);
      clipped += r < lo || r > hi;
      ++tokens;
    }
  }
  ASSERT_GT(clipped, 0);
  ASSERT_LT(clipped, tokens);

  v1::TrainStepRequest step;
  step.set_objective("ppo");
  (*step.mutable_loss_fn_config())["clip_low_threshold"] = Number(lo);
  (*step.mutable_loss_fn_config())["clip_high_threshold"] = Number(hi);
  for (size_t k = 0; k < seqs.size(); ++k) {
    *step.mutable_batch()->mutable_data()->add_data() = MakeDatum(seqs[k], {{"logprobs", q[k]}, {"advantages", adv[k]}});
  }
  const auto trained = a.client->TrainStep(step);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  EXPECT_NEAR(trained->stats().loss(), loss, 1e-12 * std::abs(loss));
  ASSERT_TRUE(trained->stats().metrics().count("clip_fraction"));
  EXPECT_NEAR(trained->stats().metrics().at("clip_fraction"), static_cast<double>(clipped) / tokens, 1e-12);
  EXPECT_EQ(trained->stats().targets(), tokens);

  auto b = testing::StartServer(SgdF64());
  TrainWeighted(*b.client, seqs, dlp);
  ExpectSameUpdate(Update(*a.client), Update(*b.client));

  // The same loss_fn_config on a typed GRPO batch (one prompt token, the rest the completion;
  // the completion's side inputs as float, so compare at float precision): accepted, the
  // options reach ppo (a typed options message could not carry them).
  auto c = testing::StartServer(SgdF64());
  v1::ForwardBackwardRequest grpo;
  grpo.set_objective("ppo");
  grpo.mutable_loss_fn_config()->insert(step.loss_fn_config().begin(), step.loss_fn_config().end());
  auto* g = grpo.mutable_batch()->mutable_grpo()->add_groups();
  g->add_prompt(seqs[0][0]);
  auto* comp = g->add_completions();
  comp->mutable_tokens()->Add(seqs[0].begin() + 1, seqs[0].end());
  comp->mutable_logprobs()->Add(q[0].begin(), q[0].end());
  comp->mutable_advantages()->Add(adv[0].begin(), adv[0].end());
  v1::ForwardBackwardRequest data;
  data.set_objective("ppo");
  data.mutable_loss_fn_config()->insert(step.loss_fn_config().begin(), step.loss_fn_config().end());
  *data.mutable_batch()->mutable_data()->add_data() = MakeDatum(seqs[0], {{"logprobs", q[0]}, {"advantages", adv[0]}});
  const auto from_grpo = c.client->ForwardBackward(grpo);
  ASSERT_TRUE(from_grpo.ok()) << from_grpo.status().error_message();
  const auto from_data = c.client->ForwardBackward(data);
  ASSERT_TRUE(from_data.ok()) << from_data.status().error_message();
  EXPECT_NEAR(from_grpo->stats().loss(), from_data->stats().loss(), 1e-6 * std::abs(from_data->stats().loss()));
  EXPECT_EQ(from_grpo->stats().metrics().at("clip_fraction"), from_data->stats().metrics().at("clip_fraction"));
}

// Bad data: the right code, a message naming the field, and nothing trained.
TEST(Datum, BadDataIsRefusedNamingTheFieldAndChangesNothing) {
  RegisterTestLoss();
  auto s = testing::StartServer(SgdF64());
  Wire w(s.target);
  const std::vector<int32_t> seq = {4, 9, 16, 25, 36, 49};
  const std::vector<double> q = {-1.0, -2.0, -0.5, -3.0, -1.5}, a = {1, -1, 0.5, 0, 2};
  v1::TrainStepRequest good;
  good.set_objective("ppo");
  *good.mutable_batch()->mutable_data()->add_data() = MakeDatum(seq, {{"logprobs", q}, {"advantages", a}});
  auto datum = [](v1::TrainStepRequest& r) { return r.mutable_batch()->mutable_data()->mutable_data(0); };
  auto input = [&](v1::TrainStepRequest& r, const std::string& name) {
    return &(*datum(r)->mutable_loss_fn_inputs())[name];
  };
  const auto before = testing::ExportedTensors(*s.client);
  v1::GetInfoResponse info_before;
  ASSERT_TRUE(w.stub->GetInfo(Wire::ctx().get(), v1::GetInfoRequest(), &info_before).ok());

  struct Case {
    std::string what;
    std::function<void(v1::TrainStepRequest&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing input", [&](auto& r) { datum(r)->mutable_loss_fn_inputs()->erase("advantages"); },
       "batch.data.data[0].loss_fn_inputs[advantages] is missing"},
      {"missing targets", [&](auto& r) { datum(r)->mutable_loss_fn_inputs()->erase("target_tokens"); },
       "loss_fn_inputs[target_tokens] is missing"},
      {"short input", [&](auto& r) { input(r, "logprobs")->mutable_float_data()->RemoveLast(); },
       "loss_fn_inputs[logprobs].shape [5] does not match its 4 values"},
      {"short input, no shape", [&](auto& r) {
         input(r, "logprobs")->mutable_float_data()->RemoveLast();
         input(r, "logprobs")->clear_shape();
       }, "loss_fn_inputs[logprobs] has 4 values but model_input has 5 tokens"},
      {"2-D", [&](auto& r) { input(r, "advantages")->add_shape(1); }, "loss_fn_inputs[advantages].shape has 2 dimensions"},
      {"unknown input", [&](auto& r) { (*datum(r)->mutable_loss_fn_inputs())["weights"] = Floats(a); },
       "unknown input 'weights' for objective 'ppo' (it takes target_tokens, logprobs, advantages)"},
      {"non-finite", [&](auto& r) { input(r, "advantages")->set_float_data(2, std::nan("")); },
       "loss_fn_inputs[advantages][2] is not finite"},
      {"infinite", [&](auto& r) { input(r, "logprobs")->set_float_data(1, -INFINITY); },
       "loss_fn_inputs[logprobs][1] is not finite"},
      {"positive log-prob", [&](auto& r) { input(r, "logprobs")->set_float_data(0, 0.5); },
       "loss_fn_inputs[logprobs][0] = 0.500000 is positive"},
      {"targets not shifted", [&](auto& r) { input(r, "target_tokens")->set_int_data(2, 7); },
       "loss_fn_inputs[target_tokens][2] = 7 is not the next input token 25"},
      {"last target outside the vocabulary", [&](auto& r) { input(r, "target_tokens")->set_int_data(4, 100000); },
       "loss_fn_inputs[target_tokens][4] = 100000 is outside the vocabulary"},
      {"targets as floats", [&](auto& r) { input(r, "target_tokens")->add_float_data(1.0); }, "give them as int_data"},
      {"numbers as ints", [&](auto& r) { input(r, "advantages")->add_int_data(1); }, "give them as float_data"},
      {"input token outside the vocabulary", [&](auto& r) { datum(r)->mutable_model_input()->set_tokens(1, -3); },
       "batch.data.data[0].model_input.tokens[1] = -3 is outside the vocabulary"},
      {"empty input", [&](auto& r) { datum(r)->mutable_model_input()->clear_tokens(); }, "model_input.tokens is empty"},
      {"no data", [&](auto& r) { r.mutable_batch()->mutable_data()->clear_data(); }, "batch.data.data is empty"},
      {"unknown loss", [&](auto& r) { r.set_objective("ppo2"); }, "unknown objective 'ppo2'"},
      {"no loss", [&](auto& r) { r.set_objective(""); }, "a data batch needs the loss function by name"},
      {"a loss without inputs", [&](auto& r) { r.set_objective("dpo"); }, "objective 'dpo' takes no data batch"},
      {"unknown config key", [&](auto& r) { (*r.mutable_loss_fn_config())["clip_low"] = Number(0.9); },
       "clip_low_threshold"},
      {"config of the wrong type", [&](auto& r) { (*r.mutable_loss_fn_config())["clip_low_threshold"].set_text("x"); },
       "clip_low_threshold"},
      {"config without a value", [&](auto& r) { (*r.mutable_loss_fn_config())["clip_low_threshold"]; },
       "loss_fn_config[clip_low_threshold] has no value"},
      {"bad config value", [&](auto& r) { (*r.mutable_loss_fn_config())["clip_low_threshold"] = Number(2.0); },
       "clip_low_threshold and clip_high_threshold must be finite with 0 <= low <= high"},
      {"options message on data", [&](auto& r) { r.mutable_grpo()->set_beta(0.1); },
       "options.grpo given for a data batch: give its options as loss_fn_config"},
      {"the custom loss without its input", [&](auto& r) {
         r.set_objective("test_scaled_logprob");
         datum(r)->mutable_loss_fn_inputs()->erase("logprobs");
         datum(r)->mutable_loss_fn_inputs()->erase("advantages");
       }, "loss_fn_inputs[scale] is missing (objective 'test_scaled_logprob' needs it)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = good;
    c.edit(r);
    const auto refused = s.client->TrainStep(r);
    EXPECT_EQ(refused.code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(refused.status().error_message().find(c.message), std::string::npos)
        << refused.status().error_message();
  }
  // Both loss_fn_config and an options message on a typed batch.
  v1::TrainStepRequest both;
  both.set_objective("ppo");
  auto* g = both.mutable_batch()->mutable_grpo()->add_groups();
  g->add_prompt(4);
  auto* comp = g->add_completions();
  comp->add_tokens(9);
  comp->add_logprobs(-1);
  comp->add_advantages(1);
  (*both.mutable_loss_fn_config())["clip_low_threshold"] = Number(0.9);
  both.mutable_grpo()->set_beta(0.1);
  const auto refused = s.client->TrainStep(both);
  EXPECT_EQ(refused.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status().error_message().find("loss_fn_config and options.grpo are both given"), std::string::npos)
      << refused.status().error_message();

  // Nothing trained: the weights bit for bit, the step and the policy version.
  testing::ExpectSameTensors(before, testing::ExportedTensors(*s.client));
  v1::GetInfoResponse info_after;
  ASSERT_TRUE(w.stub->GetInfo(Wire::ctx().get(), v1::GetInfoRequest(), &info_after).ok());
  EXPECT_EQ(info_after.step(), info_before.step());
  EXPECT_EQ(info_after.policy_version(), info_before.policy_version());
  // And the good request trains.
  const auto trained = s.client->TrainStep(good);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  EXPECT_EQ(trained->optim().step(), info_before.step() + 1);
}

// return_logprobs (Tinker's loss_fn_outputs): each sequence's log-probs at the weights of the
// gradients, in the batch's order, equal to the HF-formula float64 reference and to the loss
// the engine computed on its own path.
TEST(Datum, ForwardBackwardReturnsEachSequencesLogprobsAtTheWeightsOfItsGradients) {
  const auto seqs = Sequences();
  auto s = testing::StartServer(SgdF64());
  Wire w(s.target);
  const auto model = InitModel(PresetConfig("tiny"), 0, torch::kFloat64);
  auto reference = [&](const std::vector<int32_t>& seq) {
    const std::vector<int64_t> tokens(seq.begin(), seq.end());
    const auto lp = torch::log_softmax(testing::ReferenceLogits(*model, tokens), -1);
    std::vector<double> out;
    for (size_t t = 0; t + 1 < tokens.size(); ++t) out.push_back(lp[t][tokens[t + 1]].item<double>());
    return out;
  };
  v1::ForwardBackwardRequest fb;
  fb.set_objective("cross_entropy");
  fb.set_return_logprobs(true);
  fb.set_request_id("fb-logprobs");
  std::vector<std::vector<double>> weights;
  for (const auto& seq : seqs) {
    std::vector<double> wt;
    for (size_t t = 0; t + 1 < seq.size(); ++t) wt.push_back(t < 2 ? 0.0 : 0.25 * static_cast<double>(t % 4));
    *fb.mutable_batch()->mutable_data()->add_data() = MakeDatum(seq, {{"weights", wt}});
    weights.push_back(wt);
  }
  v1::ForwardBackwardResponse r;
  ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), fb, &r).ok());
  ASSERT_EQ(r.logprobs_size(), 3);
  double loss = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    const auto want = reference(seqs[k]);
    const auto& got = r.logprobs(static_cast<int>(k));
    ASSERT_EQ(got.logprobs_fp64_size(), static_cast<int>(want.size())) << "datum " << k << ": one per input token";
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_NEAR(got.logprobs_fp64(static_cast<int>(t)), want[t], 1e-10) << k << " " << t;
      EXPECT_EQ(got.logprobs(static_cast<int>(t)), static_cast<float>(got.logprobs_fp64(static_cast<int>(t))));
      loss -= weights[k][t] * got.logprobs_fp64(static_cast<int>(t));
    }
  }
  EXPECT_NEAR(r.stats().loss(), loss, 1e-10 * std::abs(loss)) << "loss:sum = -sum w lp of the returned log-probs";
  // A retry under the same id gets the first answer, log-probs included, and applies nothing again.
  v1::ForwardBackwardResponse again;
  ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), fb, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), r.SerializeAsString());
  ASSERT_TRUE(s.client->OptimStep().ok());

  // Typed batches too, one per sequence in the batch's order: a DPO pair is chosen, then rejected.
  v1::ForwardBackwardRequest dpo;
  dpo.set_return_logprobs(true);
  auto* pair = dpo.mutable_batch()->mutable_dpo()->add_pairs();
  for (int t : {5, 17, 29}) pair->add_prompt(t);
  for (int t : {41, 53}) pair->add_chosen(t);
  for (int t : {67, 79, 91}) pair->add_rejected(t);
  pair->set_ref_chosen_logp(-9.0);
  pair->set_ref_rejected_logp(-14.0);
  v1::ForwardBackwardResponse d;
  const auto st = w.stub->ForwardBackward(Wire::ctx().get(), dpo, &d);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const auto now = PolicyLogprobs(w, {{5, 17, 29, 41, 53}, {5, 17, 29, 67, 79, 91}});
  ASSERT_EQ(d.logprobs_size(), 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(std::vector<double>(d.logprobs(k).logprobs_fp64().begin(), d.logprobs(k).logprobs_fp64().end()), now[k])
        << "at the new weights, as ComputeLogprobs reads them";
  }
  EXPECT_NE(now[0][0], reference({5, 17, 29, 41, 53})[0]) << "the step moved the weights";
  // Not asked for: none.
  dpo.set_return_logprobs(false);
  v1::ForwardBackwardResponse plain;
  ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), dpo, &plain).ok());
  EXPECT_EQ(plain.logprobs_size(), 0);
}

}  // namespace
}  // namespace streambp

namespace streambp {
namespace {

// ComputeLogprobs' top_k (Tinker's topk_prompt_logprobs): at a position, the k ids are the k
// largest of the whole next-token distribution, which the test reads independently by scoring
// every vocabulary id as the next token (one sequence each); bad values are refused.
TEST(TopKLogprobs, TheKMostLikelyNextTokensOfTheWholeDistribution) {
  auto s = testing::StartServer(SgdF64());
  Wire w(s.target);
  v1::GetInfoResponse info;
  ASSERT_TRUE(w.stub->GetInfo(Wire::ctx().get(), v1::GetInfoRequest(), &info).ok());
  const int64_t vocab = info.vocab_size();
  const std::vector<std::vector<int32_t>> seqs = {{5, 17, 33, 2, 90}, {7, 7, 8}};
  const int k = 5;
  v1::ComputeLogprobsRequest req;
  req.set_fp64(true);
  req.set_top_k(k);
  for (const auto& q : seqs) req.add_sequences()->mutable_tokens()->Add(q.begin(), q.end());
  v1::ComputeLogprobsResponse out;
  const auto status = w.stub->ComputeLogprobs(Wire::ctx().get(), req, &out);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(out.sequences_size(), 2);
  int checked = 0;
  for (size_t q = 0; q < seqs.size(); ++q) {
    const auto& got = out.sequences(static_cast<int>(q));
    const size_t positions = seqs[q].size() - 1;
    ASSERT_EQ(got.top_ids_size(), static_cast<int>(positions * k));
    ASSERT_EQ(got.top_logprobs_size(), static_cast<int>(positions * k));
    for (size_t i = 0; i < positions; ++i) {
      // The whole distribution at position i: every id as the next token.
      v1::ComputeLogprobsRequest all;
      all.set_fp64(true);
      for (int64_t v = 0; v < vocab; ++v) {
        auto* t = all.add_sequences()->mutable_tokens();
        t->Add(seqs[q].begin(), seqs[q].begin() + static_cast<int64_t>(i) + 1);
        t->Add(static_cast<int32_t>(v));
      }
      v1::ComputeLogprobsResponse dist;
      ASSERT_TRUE(w.stub->ComputeLogprobs(Wire::ctx().get(), all, &dist).ok());
      std::vector<std::pair<double, int64_t>> ranked;
      for (int64_t v = 0; v < vocab; ++v) {
        const auto& lp = dist.sequences(static_cast<int>(v)).logprobs_fp64();
        ranked.emplace_back(lp[lp.size() - 1], v);
      }
      std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      for (int j = 0; j < k; ++j) {
        const int e = static_cast<int>(i) * k + j;
        EXPECT_EQ(got.top_ids(e), ranked[j].second) << "sequence " << q << " position " << i << " rank " << j;
        EXPECT_NEAR(got.top_logprobs(e), ranked[j].first, 1e-12);
        ++checked;
      }
      // The token that follows is scored the same way as in logprobs_fp64.
      EXPECT_NEAR(got.logprobs_fp64(static_cast<int>(i)),
                  dist.sequences(seqs[q][i + 1]).logprobs_fp64(static_cast<int>(i)), 1e-12);
    }
  }
  EXPECT_EQ(checked, 6 * k);
  // Without top_k: none.
  req.set_top_k(0);
  ASSERT_TRUE(w.stub->ComputeLogprobs(Wire::ctx().get(), req, &out).ok());
  EXPECT_EQ(out.sequences(0).top_ids_size(), 0);

  auto refused = [&](v1::ComputeLogprobsRequest r, grpc::StatusCode code, const std::string& words) {
    v1::ComputeLogprobsResponse o;
    const auto st = w.stub->ComputeLogprobs(Wire::ctx().get(), r, &o);
    EXPECT_EQ(st.error_code(), code) << words;
    EXPECT_NE(st.error_message().find(words), std::string::npos) << st.error_message();
  };
  auto bad = req;
  bad.set_top_k(21);
  refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "top_k = 21 must be in [0, 20]");
  bad.set_top_k(-1);
  refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "top_k = -1 must be in [0, 20]");
  bad.set_top_k(3);
  bad.set_reference(true);
  refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "top_k is for the policy");
  // tokens x top_k over limits.max_tokens_per_request: refused before any work.
  const int64_t limit = info.max_tokens_per_request(), longest = info.max_sequence_length();
  v1::ComputeLogprobsRequest big;
  big.set_top_k(20);
  for (int64_t left = limit / 20 + 1; left > 0; left -= longest) {
    auto* t = big.add_sequences()->mutable_tokens();
    for (int64_t i = 0; i < std::min(left, longest); ++i) t->Add(static_cast<int32_t>(i % vocab));
  }
  refused(big, grpc::StatusCode::RESOURCE_EXHAUSTED, "tokens x top_k");
}

}  // namespace
}  // namespace streambp
