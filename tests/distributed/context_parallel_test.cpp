// Context-parallel StreamBP over c10d Gloo on loopback: P ranks (threads of this process,
// each with its own process group and model) split every sequence's positions; the sum of
// their gradients equals one process on the whole batch and the float64 reference written
// from the Hugging Face definitions, for every family, layout, objective and adapter.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <random>

#include "streambp/context_parallel.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/trainer.h"
#include "ranks.h"
#include "test_util/fixtures.h"
#include "test_util/top_k.h"

namespace streambp {
namespace {

using testing::ErrorOf;
using testing::RunRanks;

// Chunks of 5 query positions, logits chunks of 7, key tiles of 3: a shard spans several
// chunks, and chunks and tiles straddle the shard boundaries and windows.
EngineOptions Chunked() { return EngineOptions{EngineKind::kStream, 5, 7, false, 3}; }

// Sequences with every side input an objective may read (GSPO's take rewards, not per-token
// advantages).
std::vector<Sequence> Sequences(const ModelConfig& config, const std::string& objective = "") {
  auto seqs = testing::RandomSequences({13, 8, 21, 11}, config.vocab_size, 9);
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto& s = seqs[i];
    if (config.pad_token_id) s.tokens[3] = *config.pad_token_id;
    s.loss_mask.assign(s.tokens.size(), 1);
    s.loss_mask[1] = 0;  // a position that is not a target
    s.group = static_cast<int64_t>(i / 2);
    s.role = static_cast<int>(i % 2);  // DPO: chosen, rejected
    s.reward = u(rng);
    s.ref_logp = -3.0 * static_cast<double>(s.tokens.size()) + u(rng);
    const size_t n = s.tokens.size();
    s.token_weights.resize(n);
    s.sampler_logprobs.resize(n);
    s.advantages.resize(n);
    s.ref_logprobs.resize(n);
    for (size_t t = 0; t < n; ++t) {
      s.token_weights[t] = u(rng);
      s.sampler_logprobs[t] = -4.6 + 0.5 * u(rng);
      s.advantages[t] = u(rng);
      s.ref_logprobs[t] = -4.6 + 0.5 * u(rng);
    }
    if (objective.starts_with("gspo")) s.advantages.clear();
  }
  if (objective == "cross_entropy_top_k") testing::AddTopK(seqs, config.vocab_size, 3);
  return seqs;
}

// Objectives by label: "gspo" is grpo at the sequence level (a sequence pass) against the
// sampler's log-probs, with the KL to the reference; "gspo_tis" the same against the current
// log-probs, where truncated importance sampling weights each completion's mass.
std::string ObjectiveName(const std::string& label) {
  if (label == "cross_entropy_top_k") return "cross_entropy";  // 2-D targets on half the sequences
  return label.starts_with("gspo") ? "grpo" : label;
}
nlohmann::json ObjectiveOptions(const std::string& label) {
  if (label == "grpo") return {{"loss_type", "grpo"}, {"old_logprobs", "sampler"}};
  if (label == "gspo") {
    return {{"importance_sampling_level", "sequence"}, {"old_logprobs", "sampler"}, {"beta", 0.04}};
  }
  if (label == "gspo_tis") {
    return {{"importance_sampling_level", "sequence"}, {"old_logprobs", "current"}, {"tis_cap", 1.02}};
  }
  if (label == "dpo_ipo") return {{"loss_type", "ipo"}};
  return nlohmann::json::object();
}
std::unique_ptr<Objective> MakeObjective(const std::string& label) {
  return CreateObjective(label == "dpo_ipo" ? "dpo" : ObjectiveName(label), ObjectiveOptions(label));
}

struct Run {
  StepResult result;
  TensorMap grads;
};

// One process: ForwardBackward of the stream engine on the whole batch.
Run OneProcess(CausalLM& model, const Batch& batch, const std::string& objective, const EngineOptions& options,
               const std::shared_ptr<LoraAdapter>& adapter = nullptr) {
  auto obj = MakeObjective(objective);
  Run run;
  run.result = ForwardBackward(model, batch, *obj, options);
  run.grads = adapter ? CollectGradients(adapter->named_parameters()) : CollectGradients(*model);
  return run;
}

// The base frozen, the adapter trained.
void Attach(CausalLM& model, const std::shared_ptr<LoraAdapter>& adapter) {
  for (auto& p : model->parameters()) p.requires_grad_(false);
  for (auto& [name, t] : adapter->named_parameters()) t.requires_grad_(true);
  model->set_adapter(adapter);
}

// P ranks, each with its own copy of the model (and adapter): every rank's gradients after
// the sum over the group, its result and its communication.
struct RankRun : Run {
  ContextParallelStats stats;
};
std::vector<RankRun> ContextParallelRanks(int P, const std::function<CausalLM()>& make_model,
                                          const std::function<std::shared_ptr<LoraAdapter>()>& make_adapter,
                                          const Batch& batch, const std::string& objective,
                                          const EngineOptions& options) {
  const int port = FreeLoopbackPort();
  std::vector<RankRun> runs(static_cast<size_t>(P));
  RunRanks(P, [&](int rank) {
    auto model = make_model();
    auto adapter = make_adapter ? make_adapter() : nullptr;
    if (adapter) Attach(model, adapter);
    auto group = Communicator::Create(testing::LoopbackRank(rank, P, port));
    auto obj = MakeObjective(objective);
    auto& run = runs[static_cast<size_t>(rank)];
    run.result = ContextParallelForwardBackward(model, batch, *obj, options, *group, &run.stats);
    std::vector<torch::Tensor> params;
    if (adapter) {
      for (auto& [name, p] : adapter->named_parameters()) params.push_back(p);
    } else {
      params = model->parameters();
    }
    SumGradients(params, *group);
    run.grads = adapter ? CollectGradients(adapter->named_parameters()) : CollectGradients(*model);
  });
  return runs;
}

void ExpectEqualRuns(const Run& expected, const std::vector<RankRun>& ranks, const std::string& what) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& run = ranks[r];
    EXPECT_NEAR(run.result.loss, expected.result.loss, 1e-12 * std::max(1.0, std::abs(expected.result.loss)))
        << what << " rank " << r;
    EXPECT_EQ(run.result.targets, expected.result.targets) << what;
    EXPECT_EQ(run.result.tokens, expected.result.tokens) << what;
    const auto diff = CompareGradients(expected.grads, run.grads);
    EXPECT_LE(diff.max_relative, 1e-10) << what << " rank " << r << ": worst " << diff.worst;
  }
}

using Exchange = EngineOptions::ContextExchange;

struct FamilyCase {
  std::string family;
  Layout layout;
  int ranks;
  Exchange exchange = Exchange::kAuto;  // heads where they split over the ranks, else K/V
};

void PrintTo(const FamilyCase& c, std::ostream* os) {
  *os << c.family << " " << LayoutName(c.layout) << " " << c.ranks << " ranks"
      << (c.exchange == Exchange::kKeysValues ? " keys/values" : "");
}

class ContextParallelFamilies : public ::testing::TestWithParam<FamilyCase> {};

// SFT (with the load-balancing loss on mixture-of-experts models): the ranks' summed
// gradients equal one process and the reference autograd to 1e-10, on every rank.
TEST_P(ContextParallelFamilies, RanksSumToOneProcessAndTheReference) {
  RegisterBuiltinObjectives();
  const auto& p = GetParam();
  const auto config = testing::TinyConfig(p.family);
  auto seqs = Sequences(config);
  for (auto& s : seqs) s.token_weights.clear(), s.sampler_logprobs.clear(), s.advantages.clear();
  const double aux = config.num_experts > 0 ? 0.05 : 0.0;
  auto options = Chunked();
  options.router_aux_loss_coef = aux;
  auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
  auto model = make();
  const auto [ref_loss, ref_grads] = testing::ReferenceSft(*model, seqs, nullptr, aux);
  const auto batch = MakeBatch(seqs, p.layout, p.layout == Layout::kPacked ? 24 : 0);
  const auto single = OneProcess(model, batch, "sft", options);
  EXPECT_NEAR(single.result.loss, ref_loss, 1e-12 * ref_loss);
  options.context_exchange = p.exchange;
  const auto ranks = ContextParallelRanks(p.ranks, make, nullptr, batch, "sft", options);
  // Which exchange ran: the heads' traffic is there or not.
  const bool heads = ContextExchangesHeads(config, p.ranks, p.exchange);
  EXPECT_EQ(heads, p.exchange != Exchange::kKeysValues && p.ranks != 3) << p.family;
  for (const auto& run : ranks) EXPECT_EQ(run.stats.head_bytes > 0, heads) << p.family;
  ExpectEqualRuns(single, ranks, p.family);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto diff = CompareGradients(ref_grads, ranks[r].grads);
    EXPECT_LE(diff.max_relative, 1e-10) << p.family << " rank " << r << " vs reference: worst " << diff.worst;
    if (aux > 0) {
      EXPECT_NEAR(ranks[r].result.router_aux_loss, single.result.router_aux_loss, 1e-13);
    }
  }
}

std::vector<FamilyCase> FamilyCases() {
  std::vector<FamilyCase> out;
  for (const auto& f : testing::TinyFamilies()) out.push_back({f, Layout::kRightPad, 2});
  for (const auto& f : {"llama3_tied", "qwen3", "gemma3", "mistral_window", "qwen3_moe"}) {
    out.push_back({f, Layout::kPacked, 3});
  }
  out.push_back({"qwen3", Layout::kRightPad, 4});  // 4 ranks, 2 kv heads: each on 2 ranks
  out.push_back({"llama_bias", Layout::kLeftPad, 4});  // 1 kv head on all 4 ranks
  // The whole sequence's K/V gathered where heads would split too.
  for (const auto& f : {"llama_bias", "qwen3", "gemma3", "qwen3_moe"}) {
    out.push_back({f, Layout::kPacked, 2, Exchange::kKeysValues});
  }
  out.push_back({"llama_bias", Layout::kLeftPad, 4, Exchange::kKeysValues});
  return out;
}

INSTANTIATE_TEST_SUITE_P(FamiliesLayoutsRanks, ContextParallelFamilies, ::testing::ValuesIn(FamilyCases()),
                         [](const auto& info) {
                           return info.param.family + "_" + LayoutName(info.param.layout) + "_" +
                                  std::to_string(info.param.ranks) +
                                  (info.param.exchange == Exchange::kKeysValues ? "_kv" : "");
                         });

// The reference log-probs of a context-parallel step, split over the ranks as the step is:
// every rank's result equals one process's TokenLogprobs (float64, 1e-12), for every family
// and layout, at temperature 0.7, a mixture of experts replaying recorded routes included.
TEST(ContextParallel, TokenLogprobsSplitOverTheRanksEqualOneProcess) {
  std::vector<FamilyCase> cases;
  for (const auto& f : testing::TinyFamilies()) cases.push_back({f, Layout::kRightPad, 2});
  cases.push_back({"gemma3", Layout::kPacked, 3});
  cases.push_back({"qwen3_moe", Layout::kPacked, 3});
  cases.push_back({"llama_bias", Layout::kLeftPad, 4});
  for (const auto& c : cases) {
    const auto config = testing::TinyConfig(c.family);
    auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
    auto model = make();
    auto seqs = Sequences(config);
    const int64_t row = c.layout == Layout::kPacked ? 24 : 0;
    if (config.num_experts > 0) {  // replay the routes the router takes
      const auto routes = RecordRouting(model, MakeBatch(seqs, c.layout, row));
      for (size_t i = 0; i < seqs.size(); ++i) seqs[i].routed_experts = routes[i];
    }
    const auto batch = MakeBatch(seqs, c.layout, row);
    const auto expected = TokenLogprobs(model, batch, 5, 0.7);
    const int port = FreeLoopbackPort();
    std::vector<torch::Tensor> got(static_cast<size_t>(c.ranks));
    RunRanks(c.ranks, [&](int rank) {
      auto local = make();
      auto group = Communicator::Create(testing::LoopbackRank(rank, c.ranks, port));
      got[static_cast<size_t>(rank)] = ContextParallelTokenLogprobs(local, batch, 5, 0.7, *group);
    });
    for (int r = 0; r < c.ranks; ++r) {
      const auto& g = got[static_cast<size_t>(r)];
      ASSERT_EQ(g.sizes(), expected.sizes()) << c.family;
      EXPECT_LE((g - expected).abs().max().item<double>(), 1e-12) << c.family << " rank " << r;
    }
    EXPECT_GT(expected.abs().max().item<double>(), 0.1) << c.family;  // not all zeros
  }
}

class ContextParallelObjectives : public ::testing::TestWithParam<std::string> {};

// Every objective: DPO and GSPO (whose sequence pass sums each rank's chunks over the
// group), token-level GRPO with sampler log-probs, the client-weighted loss and Tinker's
// losses give one process's loss and gradients.
TEST_P(ContextParallelObjectives, RanksSumToOneProcess) {
  RegisterBuiltinObjectives();
  const auto& objective = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  const auto batch = MakeBatch(Sequences(config, objective), Layout::kPacked, 24);
  auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
  auto model = make();
  const auto single = OneProcess(model, batch, objective, Chunked());
  ExpectEqualRuns(single, ContextParallelRanks(2, make, nullptr, batch, objective, Chunked()), objective);
}

INSTANTIATE_TEST_SUITE_P(Objectives, ContextParallelObjectives,
                         ::testing::Values("dpo", "dpo_ipo", "gspo", "gspo_tis", "grpo", "weighted_logprobs", "ppo", "cispo",
                                           "cross_entropy", "cross_entropy_top_k"));

// LoRA with nonzero B on every projection (the lm_head too): the adapter's gradients,
// summed over the ranks, are one process's, heads exchanged or K/V gathered; the base takes
// no gradient.
TEST(ContextParallel, LoraAdapterGradientsEqualOneProcess) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen2");
  const auto batch = MakeBatch(Sequences(config), Layout::kRightPad);
  auto make_adapter = [&] {
    LoraConfig lc;
    lc.r = 4;
    lc.target_modules.push_back("lm_head");
    auto adapter = LoraAdapter::Create(config, lc, torch::kFloat64);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : adapter->named_parameters()) {
      auto p = t;
      p.copy_(at::normal(0.0, 0.3, p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64)));
    }
    return adapter;
  };
  auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
  auto model = make();
  auto adapter = make_adapter();
  Attach(model, adapter);
  const auto single = OneProcess(model, batch, "sft", Chunked(), adapter);
  // 2 ranks exchange heads, 3 gather K/V (4 query heads do not split over 3).
  for (const int P : {2, 3}) {
    const auto ranks = ContextParallelRanks(P, make, make_adapter, batch, "sft", Chunked());
    ExpectEqualRuns(single, ranks, "lora over " + std::to_string(P) + " ranks");
    EXPECT_EQ(ranks[0].stats.head_bytes > 0, P == 2);
  }
  for (const auto& [name, g] : single.grads) EXPECT_GT(g.abs().max().item<double>(), 0) << name;
}

// Layer inputs offloaded to a scratch file on each rank: bit-identical to kept in memory.
TEST(ContextParallel, OffloadedLayerInputsAreBitIdentical) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("llama");
  const auto batch = MakeBatch(Sequences(config), Layout::kPacked, 24);
  auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
  auto offloaded = Chunked();
  offloaded.offload_layer_inputs = true;
  const auto kept = ContextParallelRanks(2, make, nullptr, batch, "sft", Chunked());
  const auto off = ContextParallelRanks(2, make, nullptr, batch, "sft", offloaded);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(kept[r].result.loss, off[r].result.loss);
    EXPECT_GT(off[r].result.offloaded_bytes, 0);
    for (const auto& [name, g] : kept[r].grads) EXPECT_TRUE(torch::equal(g, off[r].grads.at(name))) << name;
  }
}

// The communication is what the formula says. K/V gathered: per layer, K/V in the forward
// and in the backward (2 B T kv_dim values each, in the model's dtype) and dK/dV reduced
// once. Heads exchanged: what ContextParallelStats' comment says, per rank.
TEST(ContextParallel, CommunicationPerLayerMatchesTheFormula) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  const auto batch = MakeBatch(Sequences(config), Layout::kRightPad);
  auto make = [&] { return testing::RandomModel(config, 31, torch::kFloat64); };
  auto gathered = Chunked();
  gathered.context_exchange = Exchange::kKeysValues;
  const int64_t L = config.num_hidden_layers, B = batch.rows(), T = batch.length();
  const int64_t per_kv = B * T * config.kv_dim() * 8;
  for (const auto& run : ContextParallelRanks(2, make, nullptr, batch, "sft", gathered)) {
    EXPECT_EQ(run.stats.layers, L);
    EXPECT_EQ(run.stats.kv_bytes, L * 2 * 2 * per_kv);
    EXPECT_EQ(run.stats.grad_kv_bytes, L * 2 * per_kv);
    EXPECT_EQ(run.stats.head_bytes, 0);
    EXPECT_EQ(run.stats.collectives, L * 3 * 2 + 1);  // per layer 3 exchanges of 2 collectives; the sums
    EXPECT_GE(run.stats.seconds, 0.0);
  }
  // Heads, over 2 and over 4 ranks (2 kv heads: each on two ranks, R = 2).
  for (const int P : {2, 4}) {
    const auto ranks = ContextParallelRanks(P, make, nullptr, batch, "sft", Chunked());
    const int64_t R = std::max<int64_t>(1, P / config.num_key_value_heads), chunk = Chunked().chunk;
    const int64_t chunks = ((T + P - 1) / P + chunk - 1) / chunk;
    for (int r = 0; r < P; ++r) {
      const auto& stats = ranks[static_cast<size_t>(r)].stats;
      const auto [s, e] = ContextShardRange(T, r, P);
      EXPECT_EQ(stats.kv_bytes, L * 2 * 2 * B * (e - s) * config.kv_dim() * R * 8) << P << " ranks, rank " << r;
      EXPECT_EQ(stats.grad_kv_bytes, L * 2 * B * T * config.kv_dim() * R / P * 8) << P << " ranks, rank " << r;
      EXPECT_EQ(stats.head_bytes, L * 3 * B * ((e - s) * config.q_dim() + T * config.q_dim() / P) * 8) << P << " ranks, rank " << r;
      // Per layer: K/V twice and dK/dV once; every chunk's queries and outputs in the forward,
      // and in the backward with their gradients. Then the step's sums.
      EXPECT_EQ(stats.collectives, L * (3 + 6 * chunks) + 1) << P << " ranks, rank " << r;
    }
  }
}

// Heads asked for where they do not split over the group: refused on every rank before any
// collective, naming the head counts, with nothing accumulated.
TEST(ContextParallel, HeadsThatDoNotSplitAreRefused) {
  RegisterBuiltinObjectives();
  auto config = testing::TinyConfig("qwen3");
  config.num_attention_heads = 3;  // 3 query heads over 1 kv head do not split over 2 ranks
  config.num_key_value_heads = 1;
  const auto batch = MakeBatch(Sequences(config), Layout::kRightPad);
  const int port = FreeLoopbackPort();
  std::vector<std::string> errors(2);
  std::vector<char> untouched(2, 0);  // not vector<bool>: ranks write at once
  RunRanks(2, [&](int rank) {
    auto model = testing::RandomModel(config, 31, torch::kFloat64);
    auto group = Communicator::Create(testing::LoopbackRank(rank, 2, port));
    auto heads = Chunked();
    heads.context_exchange = Exchange::kHeads;
    errors[static_cast<size_t>(rank)] = ErrorOf([&] {
      auto sft = CreateObjective("sft", nlohmann::json::object());
      ContextParallelForwardBackward(model, batch, *sft, heads, *group);
    });
    bool none = true;
    for (const auto& p : model->parameters()) none = none && !p.grad().defined();
    untouched[static_cast<size_t>(rank)] = none;
    // Auto falls back to the K/V exchange and runs.
    auto sft = CreateObjective("sft", nlohmann::json::object());
    ContextParallelStats stats;
    ContextParallelForwardBackward(model, batch, *sft, Chunked(), *group, &stats);
    EXPECT_EQ(stats.head_bytes, 0);
    EXPECT_GT(stats.kv_bytes, 0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("needs the 3 query heads divisible by the 2 ranks and the 1 kv heads dividing or "
                             "divided by them"),
              std::string::npos)
        << errors[r];
    EXPECT_TRUE(untouched[r]) << "rank " << r;
  }
}

// Refused before any collective, on every rank alike, with nothing accumulated: the
// recompute ablation, another engine, a batch shorter than the group.
TEST(ContextParallel, RefusedRequestsNameTheReasonAndLeaveNoGradient) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  const auto batch = MakeBatch(Sequences(config), Layout::kRightPad);
  const auto one = MakeBatch({Sequence{{5}, {1}}}, Layout::kRightPad);
  const int port = FreeLoopbackPort();
  std::vector<std::vector<std::string>> errors(2);
  std::vector<char> untouched(2, 0);  // not vector<bool>: ranks write at once
  RunRanks(2, [&](int rank) {
    auto model = testing::RandomModel(config, 31, torch::kFloat64);
    auto group = Communicator::Create(testing::LoopbackRank(rank, 2, port));
    auto& e = errors[static_cast<size_t>(rank)];
    e.push_back(ErrorOf([&] {
      auto sft = CreateObjective("sft", nlohmann::json::object());
      auto ablation = Chunked();
      ablation.recompute_kv_per_chunk = true;
      ContextParallelForwardBackward(model, batch, *sft, ablation, *group);
    }));
    e.push_back(ErrorOf([&] {
      auto sft = CreateObjective("sft", nlohmann::json::object());
      ContextParallelForwardBackward(model, batch, *sft, EngineOptions{EngineKind::kCheckpoint}, *group);
    }));
    e.push_back(ErrorOf([&] {
      auto sft = CreateObjective("sft", nlohmann::json::object());
      ContextParallelForwardBackward(model, one, *sft, Chunked(), *group);
    }));
    bool none = true;
    for (const auto& p : model->parameters()) none = none && !p.grad().defined();
    untouched[static_cast<size_t>(rank)] = none;
    group->barrier();  // the group is still in step: nothing was left half done
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r][0].find("recompute_kv_per_chunk (the ablation) does not run context parallel"),
              std::string::npos)
        << errors[r][0];
    EXPECT_NE(errors[r][1].find("stream engine only (engine checkpoint)"), std::string::npos) << errors[r][1];
    EXPECT_NE(errors[r][2].find("needs batches of at least 2 positions, got 1"), std::string::npos) << errors[r][2];
    EXPECT_TRUE(untouched[r]) << "rank " << r;
  }
}

// The Trainer with a context-parallel group: AdamW with clipping over three steps of two
// micro-batches each, SFT on the whole model, and DPO with the reference model's log-probs
// (split over the ranks too) on a LoRA adapter (the base with it off) and on the whole model
// (a frozen copy): every rank ends with the same weights, equal to one process's (1e-10).
struct TrainerCase {
  std::string objective;
  bool lora;
};
void PrintTo(const TrainerCase& c, std::ostream* os) { *os << c.objective << (c.lora ? " lora" : ""); }
class ContextParallelTrainer : public ::testing::TestWithParam<TrainerCase> {};

TEST_P(ContextParallelTrainer, RanksApplyTheOneProcessUpdate) {
  RegisterBuiltinObjectives();
  const auto& p = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  auto seqs = Sequences(config, p.objective);
  if (p.objective == "dpo") {
    for (auto& s : seqs) s.ref_logp.reset(), s.ref_logprobs.clear();  // from the reference model
  }
  TrainerOptions o;
  o.optimizer.name = "adamw";
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.max_grad_norm = 0.5;
  o.engine = Chunked();
  o.layout = Layout::kPacked;
  o.micro_batch_tokens = 32;  // two micro-batches
  o.reference.use_reference_model = p.objective == "dpo";
  auto make = [&] {
    std::shared_ptr<LoraAdapter> adapter;
    if (p.lora) {
      LoraConfig lc;
      lc.r = 4;
      lc.seed = 3;
      adapter = LoraAdapter::Create(config, lc, torch::kFloat64);
    }
    return Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), o, adapter);
  };
  auto weights = [&](Trainer& t) { return p.lora ? t.adapter()->peft_tensors() : t.model()->hf_tensors(); };
  auto single = make();
  std::vector<double> single_losses;
  std::vector<std::map<std::string, double>> single_metrics;
  for (int i = 0; i < 3; ++i) {
    const auto r = single->train_step(seqs, *MakeObjective(p.objective));
    single_losses.push_back(r.forward.loss);
    single_metrics.push_back(r.forward.metrics);
  }
  const auto expected = weights(*single);
  const int port = FreeLoopbackPort();
  std::vector<TensorMap> got(2);
  std::vector<std::vector<double>> losses(2);
  std::vector<std::vector<std::map<std::string, double>>> metrics(2);
  RunRanks(2, [&](int rank) {
    auto trainer = make();
    trainer->set_context_parallel(Communicator::Create(testing::LoopbackRank(rank, 2, port)));
    for (int i = 0; i < 3; ++i) {
      const auto r = trainer->train_step(seqs, *MakeObjective(p.objective));
      losses[rank].push_back(r.forward.loss);
      metrics[rank].push_back(r.forward.metrics);
    }
    got[rank] = weights(*trainer);
  });
  // The step's exchange is in its metrics: K/V bytes per layer and the time in the collectives
  // (the bytes against the formula: the bench's --check). The objective's metrics are the
  // whole step's on every rank (each rank's parts added up), not its own positions'.
  EXPECT_EQ(single_metrics[0].count("context_parallel_kv_bytes_per_layer"), 0u);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(metrics[rank].back().count("context_parallel_kv_bytes_per_layer"), 1u) << rank;
    EXPECT_GT(metrics[rank].back().at("context_parallel_kv_bytes_per_layer"), 0.0);
    // 2 ranks of the tiny models' 4 query and 2 kv heads: heads exchanged.
    EXPECT_GT(metrics[rank].back().at("context_parallel_head_bytes_per_layer"), 0.0);
    EXPECT_GE(metrics[rank].back().at("context_parallel_seconds"), 0.0);
    for (int i = 0; i < 3; ++i) {
      testing::ExpectWholeStepMetrics(single_metrics[i], metrics[rank][i],
                                      "rank " + std::to_string(rank) + " step " + std::to_string(i));
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(losses[0][i], single_losses[i], 1e-12 * std::max(1.0, std::abs(single_losses[i]))) << i;
    EXPECT_EQ(losses[0][i], losses[1][i]) << i;
  }
  const auto initial = weights(*make());
  for (const auto& [name, t] : expected) {
    EXPECT_TRUE(torch::equal(got[0].at(name), got[1].at(name))) << "ranks differ on " << name;
    EXPECT_FALSE(torch::equal(t, initial.at(name))) << name << " did not train";
  }
  EXPECT_LE(CompareGradients(expected, got[0]).max_relative, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(Objectives, ContextParallelTrainer,
                         ::testing::Values(TrainerCase{"sft", false}, TrainerCase{"dpo", true},
                                           TrainerCase{"dpo", false}, TrainerCase{"gspo", false}),
                         [](const auto& info) { return info.param.objective + (info.param.lora ? "_lora" : ""); });

// A rank that dies mid-step (here: its step is abandoned in the backward of the top layer,
// as a cancelled caller abandons it) makes the other fail within the collective timeout,
// naming the collective; each Trainer is left with no gradient and unchanged weights.
TEST(ContextParallel, ARankThatDiesMidStepFailsThePeerWithinTheTimeoutAndNothingIsApplied) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  const auto seqs = Sequences(config);
  TrainerOptions o;
  o.engine = Chunked();
  const int port = FreeLoopbackPort();
  std::vector<std::string> errors(2);
  std::vector<char> unchanged(2, 0), no_grads(2, 0);  // not vector<bool>: ranks write at once
  const auto start = std::chrono::steady_clock::now();
  RunRanks(2, [&](int rank) {
    auto options = o;
    if (rank == 1) {
      options.engine.on_progress = [](const EngineProgress& p) {
        if (p.phase == EngineProgress::Phase::kBackward) throw Error(ErrorCode::kCancelled, "rank 1 stops");
      };
    }
    auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), options);
    const auto before = trainer->model()->hf_tensors();
    trainer->set_context_parallel(Communicator::Create(testing::LoopbackRank(rank, 2, port, 0, 3)));
    errors[rank] = ErrorOf([&] { trainer->train_step(seqs, *MakeObjective("sft")); });
    bool none = true;
    for (const auto& p : trainer->model()->parameters()) none = none && !p.grad().defined();
    no_grads[rank] = none;
    unchanged[rank] = CompareGradients(before, trainer->model()->hf_tensors()).max_abs == 0;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(errors[1].find("rank 1 stops"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("a peer died or timed out"), std::string::npos) << errors[0];
  EXPECT_LT(seconds, 30.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(no_grads[r]) << "rank " << r;
    EXPECT_TRUE(unchanged[r]) << "rank " << r;
  }
}

// An objective from elsewhere (RegisterObjective) that context parallel cannot run exactly:
// a sequence pass without its sums, or a loss other than its chunk terms' sum without a
// sequence pass. Every rank refuses at the same point (none waits in a collective).
class PlainSum : public Objective {
 public:
  PlainSum(bool pass, bool own_loss) : pass_(pass), own_loss_(own_loss) {}
  std::string name() const override { return pass_ ? "pass_without_sums" : "own_loss"; }
  void prepare(const std::vector<Sequence>&) override {}
  void begin(const Batch&) override {}
  bool needs_sequence_pass() const override { return pass_; }
  torch::Tensor chunk_loss(const LogitsChunk& c) override { return c.logits.logsumexp(-1).sum(); }
  std::optional<double> batch_loss() const override { return own_loss_ ? std::optional<double>(1.0) : std::nullopt; }
  Metrics finish() override { return {}; }

 private:
  bool pass_, own_loss_;
};

TEST(ContextParallel, ObjectivesItCannotRunExactlyAreRefusedOnEveryRank) {
  const auto config = testing::TinyConfig("qwen3");
  const auto batch = MakeBatch(Sequences(config), Layout::kRightPad);
  const int port = FreeLoopbackPort();
  std::vector<std::vector<std::string>> errors(2);
  RunRanks(2, [&](int rank) {
    auto model = testing::RandomModel(config, 31, torch::kFloat64);
    auto group = Communicator::Create(testing::LoopbackRank(rank, 2, port, 0, 20));
    for (bool pass : {true, false}) {
      PlainSum objective(pass, !pass);
      errors[rank].push_back(ErrorOf([&] { ContextParallelForwardBackward(model, batch, objective, Chunked(), *group); }));
    }
    group->barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r][0].find("'pass_without_sums' has a sequence pass but does not give its sums"),
              std::string::npos)
        << errors[r][0];
    EXPECT_NE(errors[r][1].find("'own_loss' reports a loss other than the sum of its chunk terms"), std::string::npos)
        << errors[r][1];
  }
}

}  // namespace
}  // namespace streambp
