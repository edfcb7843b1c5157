// grpo: every loss type and option, chunked and exact, against a direct computation on
// full logits written here from the published formulas.
#include <fstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/trainer.h"
#include "test_util/direct.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::DirectLossAndGrads;
using testing::DirectTokenLogprobs;
using testing::SequenceTargetMask;

// Two groups (3 and 4 completions) of different lengths; sampler log-probs near the
// model's own (so ratios straddle the clip range) and reference log-probs when asked.
std::vector<Sequence> Groups(CausalLM& model, uint64_t seed, bool sampler, bool ref, bool token_advantages) {
  const int64_t vocab = model->config().vocab_size;
  auto raw = testing::RandomSequences({3, 4, 6, 2, 5, 2, 3, 7, 4}, vocab, seed);
  std::vector<Sequence> out;
  int64_t next = 0;
  for (int g = 0; g < 2; ++g) {
    const auto prompt = raw[next++].tokens;
    const int count = g == 0 ? 3 : 4;
    for (int c = 0; c < count; ++c) {
      Sequence s;
      s.tokens = prompt;
      const auto& comp = raw[next++ % raw.size()].tokens;
      s.tokens.insert(s.tokens.end(), comp.begin(), comp.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      s.group = g;
      s.reward = std::sin(1.7 * (c + 1) + g) + 0.3 * c;
      out.push_back(s);
    }
  }
  auto batch = MakeBatch(out, Layout::kRightPad);
  auto logp = TokenLogprobs(model, batch, 64);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  for (size_t i = 0; i < out.size(); ++i) {
    auto where = (batch.sequence_ids == static_cast<int64_t>(i)).nonzero();
    const int64_t row = where[0][0].item<int64_t>();
    const size_t n = out[i].tokens.size();
    auto noise = at::normal(0.0, 0.3, {static_cast<int64_t>(n)}, gen, torch::TensorOptions().dtype(torch::kFloat64));
    std::vector<double> per_token(n, 0.0), ref_tokens(n, 0.0), adv(n, 0.0);
    for (size_t t = 1; t < n; ++t) {
      const double own = logp[row][t - 1].item<double>();  // log p of token t
      per_token[t] = own + noise[t].item<double>();
      ref_tokens[t] = own - 0.2 * noise[t].item<double>() - 0.05;
      adv[t] = noise[t].item<double>() * 2;
    }
    if (sampler) out[i].sampler_logprobs = per_token;
    if (ref) out[i].ref_logprobs = ref_tokens;
    if (token_advantages) out[i].advantages = adv;
  }
  return out;
}

double UnbiasedStd(const std::vector<double>& v) {
  return torch::tensor(v, torch::kFloat64).std(/*unbiased=*/true).item<double>();
}

// GRPO written out directly, sequence by sequence.
torch::Tensor DirectGrpo(const torch::Tensor& logits, const Batch& batch, const GrpoOptions& o) {
  auto logp = DirectTokenLogprobs(logits, batch, o.temperature).to(torch::kFloat64);
  const auto& seqs = batch.sequences;
  const int64_t n = seqs.size();
  std::vector<double> all_rewards;
  for (const auto& s : seqs) all_rewards.push_back(s.reward);
  double total_tokens = 0, longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double len = SequenceTargetMask(batch, i).sum().item<double>();
    total_tokens += len;
    longest = std::max(longest, len);
  }
  auto loss = torch::zeros({}, torch::kFloat64);
  for (int64_t i = 0; i < n; ++i) {
    auto m = SequenceTargetMask(batch, i);
    const double len = m.sum().item<double>();
    torch::Tensor adv;
    if (batch.advantages.defined()) {
      adv = batch.advantages;
    } else {
      std::vector<double> group;
      for (const auto& s : seqs) if (s.group == seqs[i].group) group.push_back(s.reward);
      double mean = 0;
      for (double r : group) mean += r / group.size();
      double a = seqs[i].reward - mean;
      if (o.scale_rewards == "group") a /= UnbiasedStd(group) + 1e-4;
      if (o.scale_rewards == "batch") a /= UnbiasedStd(all_rewards) + 1e-4;
      adv = torch::full_like(logp, a);
    }
    auto old = o.old_logprobs == "sampler" ? batch.sampler_logprobs : logp.detach();
    torch::Tensor coef1;
    if (o.importance_sampling_level == "sequence") {
      coef1 = torch::exp(((logp - old) * m).sum() / len) * torch::ones_like(logp);
    } else {
      coef1 = torch::exp(logp - old);
    }
    auto coef2 = torch::clamp(coef1, 1 - o.epsilon_low, 1 + o.epsilon_high);
    auto per_token = -torch::min(coef1 * adv, coef2 * adv);
    if (batch.sampler_logprobs.defined() && o.old_logprobs == "current" && o.tis_cap > 0) {
      per_token = per_token * torch::clamp_max(torch::exp(logp.detach() - batch.sampler_logprobs), o.tis_cap);
    }
    if (o.beta != 0) {
      auto d = batch.ref_logprobs - logp;
      per_token = per_token + o.beta * (torch::exp(d) - d - 1);
    }
    auto summed = (per_token * m).sum();
    if (o.loss_type == "grpo") loss = loss + summed / len / n;
    if (o.loss_type == "bnpo" || o.loss_type == "dapo") loss = loss + summed / total_tokens;
    if (o.loss_type == "dr_grpo") {
      const double max_len = o.max_completion_length > 0 ? o.max_completion_length : longest;
      loss = loss + summed / (n * max_len);
    }
  }
  return loss;
}

struct GrpoCase {
  std::string name;
  GrpoOptions options;
  bool sampler = false, ref = false, token_advantages = false;
  Layout layout = Layout::kRightPad;
};

GrpoOptions With(std::function<void(GrpoOptions&)> f) {
  GrpoOptions o;
  f(o);
  return o;
}

std::vector<GrpoCase> Cases() {
  return {
      {"dapo_default", {}, false, false, false, Layout::kRightPad},
      {"grpo_group", With([](auto& o) { o.loss_type = "grpo"; }), false, false, false, Layout::kPacked},
      {"bnpo_batch", With([](auto& o) { o.loss_type = "bnpo"; o.scale_rewards = "batch"; }), false, false, false,
       Layout::kLeftPad},
      {"dr_grpo_none", With([](auto& o) { o.loss_type = "dr_grpo"; o.scale_rewards = "none"; }), false, false,
       false, Layout::kRightPad},
      {"dr_grpo_fixed_len", With([](auto& o) { o.loss_type = "dr_grpo"; o.max_completion_length = 16; }), false,
       false, false, Layout::kPacked},
      {"kl_beta", With([](auto& o) { o.beta = 0.04; }), false, true, false, Layout::kPacked},
      {"sampler_old_clipped", With([](auto& o) { o.old_logprobs = "sampler"; o.epsilon_low = 0.1; }), true, false,
       false, Layout::kRightPad},
      {"tis_correction", With([](auto& o) { o.tis_cap = 1.3; o.loss_type = "grpo"; }), true, false, false,
       Layout::kLeftPad},
      {"temperature", With([](auto& o) { o.temperature = 0.7; o.old_logprobs = "sampler"; }), true, false, false,
       Layout::kPacked},
      {"gspo_sequence", With([](auto& o) { o.importance_sampling_level = "sequence"; o.old_logprobs = "sampler"; }),
       true, false, false, Layout::kRightPad},
      {"gspo_current_tis_kl",
       With([](auto& o) { o.importance_sampling_level = "sequence"; o.beta = 0.1; o.loss_type = "grpo"; }), true,
       true, false, Layout::kPacked},
      {"token_advantages", With([](auto& o) { o.old_logprobs = "sampler"; }), true, false, true, Layout::kPacked},
  };
}

class GrpoExactness : public ::testing::TestWithParam<GrpoCase> {};

TEST_P(GrpoExactness, EnginesMatchDirectComputation) {
  const auto& c = GetParam();
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 41, torch::kFloat64);
  auto seqs = Groups(model, 7, c.sampler, c.ref, c.token_advantages);
  auto batch = MakeBatch(seqs, c.layout, c.layout == Layout::kPacked ? 14 : 0);
  auto direct = DirectLossAndGrads(model, batch, [&](const torch::Tensor& l) { return DirectGrpo(l, batch, c.options); });
  ASSERT_TRUE(std::isfinite(direct.loss));
  for (const auto& [name, options] : testing::EngineVariants(3, 5, 2)) {
    auto objective = MakeGrpoObjective(c.options);
    ZeroGradients(*model);
    auto r = ForwardBackward(model, batch, *objective, options);
    auto metrics = objective->finish();
    EXPECT_NEAR(r.loss, direct.loss, 1e-12 * std::max(1.0, std::abs(direct.loss))) << name;
    auto diff = CompareGradients(direct.grads, CollectGradients(*model));
    EXPECT_LE(diff.max_relative, 1e-10) << name << " " << diff.worst;
    EXPECT_TRUE(metrics.count("entropy"));
    EXPECT_TRUE(metrics.count("clip_ratio/region_mean"));
    if (c.options.beta != 0) {
      EXPECT_GT(metrics.at("kl"), 0.0);
    }
  }
  ZeroGradients(*model);
}

INSTANTIATE_TEST_SUITE_P(Options, GrpoExactness, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Grpo, ClippingIsActiveInTheSamplerCase) {
  // The exactness case above must exercise clipping, or it would not test it.
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 41, torch::kFloat64);
  auto seqs = Groups(model, 7, true, false, false);
  GrpoOptions o;
  o.old_logprobs = "sampler";
  o.epsilon_low = 0.1;
  auto objective = MakeGrpoObjective(o);
  ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *objective, {EngineKind::kStream, 3, 5});
  auto m = objective->finish();
  EXPECT_GT(m.at("clip_ratio/low_mean"), 0.0);
  EXPECT_GT(m.at("clip_ratio/high_mean"), 0.0);
  EXPECT_LT(m.at("clip_ratio/region_mean"), 1.0);
  ZeroGradients(*model);
}

// The token metrics are what their names say, over the target tokens of the whole batch,
// however the head is chunked (they are summed on the device chunk by chunk and read once;
// chunks without a target add nothing): is_ratio mean/max of min(exp(lp - q), cap) and
// exp(lp - q), kl the mean k3 estimator, from TokenLogprobs in float64.
TEST(Grpo, TokenMetricsAreTheirDefinitions) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 43, torch::kFloat64);
  auto seqs = Groups(model, 9, true, true, false);
  const auto batch = MakeBatch(seqs, Layout::kRightPad);
  torch::Tensor lp;
  {
    torch::NoGradGuard no_grad;
    lp = TokenLogprobs(model, batch);
  }
  const auto mask = batch.target_mask;
  auto ratio = torch::exp(lp - batch.sampler_logprobs).masked_select(mask);
  auto d = (batch.ref_logprobs - lp).masked_select(mask);
  GrpoOptions o;
  o.beta = 0.05;
  o.tis_cap = 1.1;  // some ratios above it, some below
  ASSERT_GT((ratio > o.tis_cap).sum().item<int64_t>(), 0);
  ASSERT_GT((ratio < o.tis_cap).sum().item<int64_t>(), 0);
  const std::map<std::string, double> expected{{"is_ratio/mean", ratio.clamp_max(o.tis_cap).mean().item<double>()},
                                               {"is_ratio/max", ratio.max().item<double>()},
                                               {"kl", (torch::exp(d) - d - 1).mean().item<double>()}};
  for (int64_t logits_chunk : {int64_t{0}, int64_t{1}, int64_t{3}}) {
    auto objective = MakeGrpoObjective(o);
    ForwardBackward(model, batch, *objective, {EngineKind::kStream, 4, logits_chunk});
    const auto m = objective->finish();
    for (const auto& [name, value] : expected) {
      ASSERT_TRUE(m.count(name)) << name;
      EXPECT_NEAR(m.at(name), value, 1e-12 * std::abs(value)) << name << ", logits chunk " << logits_chunk;
    }
    ZeroGradients(*model);
  }
}

TEST(Grpo, MicroBatchesEqualWholeBatch) {
  auto config = testing::TinyConfig("llama");
  auto model = testing::RandomModel(config, 5, torch::kFloat64);
  for (const char* loss_type : {"grpo", "dapo", "dr_grpo"}) {
    for (const char* scale : {"group", "batch"}) {
      GrpoOptions o;
      o.loss_type = loss_type;
      o.scale_rewards = scale;
      o.beta = 0.02;
      auto seqs = Groups(model, 3, true, true, false);
      auto whole_obj = MakeGrpoObjective(o);
      auto whole = ForwardBackward(model, MakeBatch(seqs, Layout::kPacked), *whole_obj, {EngineKind::kStream, 4, 4});
      whole_obj->finish();
      auto expected = CollectGradients(*model);
      ZeroGradients(*model);
      auto obj = MakeGrpoObjective(o);
      obj->prepare(seqs);
      double loss = 0;
      auto parts = SplitMicroBatches(seqs, Layout::kRightPad, 40);
      ASSERT_GE(parts.size(), 2u);
      for (const auto& idx : parts) {
        std::vector<Sequence> part;
        for (size_t i : idx) part.push_back(seqs[i]);
        loss += ForwardBackward(model, MakeBatch(part, Layout::kRightPad), *obj, {EngineKind::kStream, 3, 2}).loss;
      }
      obj->finish();
      EXPECT_NEAR(loss, whole.loss, 1e-12) << loss_type << " " << scale;
      EXPECT_LE(CompareGradients(expected, CollectGradients(*model)).max_relative, 1e-10) << loss_type << " " << scale;
      ZeroGradients(*model);
    }
  }
}

TEST(Grpo, BetaZeroNeedsNoReferenceAndWorks) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 2, torch::kFloat64);
  auto seqs = Groups(model, 1, false, false, false);
  auto obj = MakeGrpoObjective({});
  EXPECT_FALSE(obj->needs_reference(seqs));
  auto r = ForwardBackward(model, MakeBatch(seqs, Layout::kPacked), *obj, {EngineKind::kStream});
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_EQ(obj->finish().count("kl"), 0u);
  GrpoOptions with_kl;
  with_kl.beta = 0.1;
  EXPECT_TRUE(MakeGrpoObjective(with_kl)->needs_reference(seqs));
  ZeroGradients(*model);
}

TEST(Grpo, BadInputsAreClearErrorsAndChangeNothing) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 2, torch::kFloat64);
  auto expect_error = [&](std::vector<Sequence> seqs, const GrpoOptions& o, const std::string& want) {
    auto obj = MakeGrpoObjective(o);
    try {
      ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *obj, {EngineKind::kStream});
      ADD_FAILURE() << "expected: " << want;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  };
  auto seqs = Groups(model, 1, false, false, false);
  expect_error({seqs[0]}, {}, "alone in its group");
  GrpoOptions sampler;
  sampler.old_logprobs = "sampler";
  expect_error(seqs, sampler, "old_logprobs=sampler needs");
  GrpoOptions kl;
  kl.beta = 0.1;
  expect_error(seqs, kl, "needs reference log-probs");
  auto mixed = Groups(model, 1, true, false, false);
  mixed[2].sampler_logprobs.clear();
  expect_error(mixed, {}, "give them for all or none");
  // JSONL level: non-finite reward, logprobs length mismatch, empty group.
  auto check = [](const std::string& line, const std::string& want) {
    try {
      ParseGrpoExample(nlohmann::json::parse(line), "g.jsonl:7", 0);
      ADD_FAILURE() << "expected an error for " << line;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  {
    auto path = testing::TempDir("grpo-jsonl") + "/g.jsonl";
    std::ofstream(path) << R"({"prompt":[1,2],"completions":[{"tokens":[3,4],"reward":1}]})" << "\n"
                        << R"({"prompt":[1,2],"completions":[{"tokens":[3,4],"reward":1e999}]})" << "\n";
    try {
      ReadExamples(path, "grpo");
      ADD_FAILURE() << "expected an error for a reward of 1e999";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("g.jsonl:2"), std::string::npos) << e.what();
    }
  }
  check(R"({"prompt":[1,2],"completions":[{"tokens":[3,4],"reward":1,"logprobs":[-1]}]})",
        "completions[0]: logprobs has 1 entries but the completion has 2 tokens");
  check(R"({"prompt":[1,2],"completions":[]})", "field 'completions' is empty");
  check(R"({"prompt":[1,2],"completions":[{"tokens":[3]}]})", "missing field 'reward'");
  Sequence nan_reward = seqs[0];
  nan_reward.reward = std::nan("");
  EXPECT_THROW(ValidateSequences({nan_reward}, config.vocab_size), InvalidArgument);
  RegisterBuiltinObjectives();
  EXPECT_THROW(CreateObjective("grpo", {{"loss_type", "ppo"}}), InvalidArgument);
  EXPECT_THROW(CreateObjective("grpo", {{"scale_reward", "group"}}), InvalidArgument);
  EXPECT_NO_THROW(CreateObjective("grpo", {{"loss_type", "dr_grpo"}, {"beta", 0.0}}));
}

// The reference is compared at the policy's temperature: before any update (policy ==
// reference) the KL is exactly 0 at temperature 0.7 too.
TEST(Grpo, ReferenceLogprobsUseTheSamplingTemperature) {
  auto config = testing::TinyConfig("qwen3");
  TrainerOptions options;
  options.reference.use_reference_model = true;
  auto trainer = Trainer::Create(testing::RandomModel(config, 2, torch::kFloat64), options);
  auto seqs = Groups(trainer->model(), 1, false, false, false);
  GrpoOptions o;
  o.beta = 0.1;
  o.temperature = 0.7;
  auto objective = MakeGrpoObjective(o);
  EXPECT_DOUBLE_EQ(objective->reference_temperature(), 0.7);
  auto r = trainer->forward_backward(seqs, *objective);
  EXPECT_NEAR(r.metrics.at("kl"), 0.0, 1e-12);
  trainer->zero_gradients();
}

TEST(TokenLogprobs, EqualLogSoftmaxOfReferenceLogits) {
  auto config = testing::TinyConfig("mistral_window");
  auto model = testing::RandomModel(config, 9, torch::kFloat64);
  auto seqs = testing::RandomSequences({9, 4}, config.vocab_size, 3);
  auto batch = MakeBatch(seqs, Layout::kPacked, 16);
  for (double temperature : {1.0, 0.6}) {
    auto logp = TokenLogprobs(model, batch, 5, temperature);
    for (int64_t i = 0; i < 2; ++i) {
      auto ref = torch::log_softmax(testing::ReferenceLogits(*model, seqs[i].tokens) / temperature, -1);
      auto where = (batch.sequence_ids == i).nonzero();
      const int64_t row = where[0][0].item<int64_t>(), start = where[0][1].item<int64_t>();
      for (size_t t = 0; t + 1 < seqs[i].tokens.size(); ++t) {
        EXPECT_NEAR(logp[row][start + t].item<double>(), ref[t][seqs[i].tokens[t + 1]].item<double>(), 1e-12);
      }
      EXPECT_EQ(logp[row][start + seqs[i].tokens.size() - 1].item<double>(), 0.0);  // no next token
    }
  }
}

}  // namespace
}  // namespace streambp
