// Data parallel x context parallel in one job (docs/architecture.md: Context parallel): a
// world of D x P ranks (threads of this process, on loopback) split by SplitParallelGroups;
// each data rank computes its share of the step's sequences, split over its P context ranks.
// The update every rank applies equals one process's on the whole step; bad layouts and a
// dead rank fail every rank alike. Also the pieces every parallel group shares: joining from
// rank 0's weights, merging metrics, and the shards of the positions.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <random>

#include "streambp/context_parallel.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/trainer.h"
#include "ranks.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::ErrorOf;
using testing::RunRanks;

// Three groups (DPO pairs, GRPO groups of two) of uneven lengths: the data ranks' shards
// differ in size and the packed micro-batches of 32 tokens in number.
std::vector<Sequence> GroupedSequences(const ModelConfig& config, const std::vector<int64_t>& lengths) {
  auto seqs = testing::RandomSequences(lengths, config.vocab_size, 11);
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto& s = seqs[i];
    s.loss_mask.assign(s.tokens.size(), 1);
    s.loss_mask[0] = 0;
    s.group = static_cast<int64_t>(i / 2);
    s.role = static_cast<int>(i % 2);  // DPO: chosen, rejected
    s.reward = u(rng);
    s.sampler_logprobs.resize(s.tokens.size());
    for (auto& q : s.sampler_logprobs) q = -4.6 + 0.5 * u(rng);
  }
  return seqs;
}

std::unique_ptr<Objective> MakeObjective(const std::string& label) {
  if (label == "gspo") {
    return CreateObjective("grpo", {{"importance_sampling_level", "sequence"}, {"old_logprobs", "sampler"}});
  }
  return CreateObjective(label, nlohmann::json::object());
}

struct GridCase {
  std::string objective;
  bool lora = false;
  bool overlap = true;  // the data-parallel sum started by the backward
  int zero_stage = 0;   // ZeRO over the data group
};
void PrintTo(const GridCase& c, std::ostream* os) {
  *os << c.objective << (c.lora ? " lora" : "") << (c.overlap ? "" : " no overlap") << " zero " << c.zero_stage;
}
class DataTimesContextParallel : public ::testing::TestWithParam<GridCase> {};

TEST_P(DataTimesContextParallel, FourRanksApplyTheOneProcessUpdate) {
  RegisterBuiltinObjectives();
  const auto& p = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  const auto seqs = GroupedSequences(config, {13, 8, 21, 11, 9, 14});
  TrainerOptions o;
  o.optimizer.name = "adamw";
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.max_grad_norm = 0.5;
  o.engine = EngineOptions{EngineKind::kStream, 5, 7, false, 3};
  o.layout = Layout::kPacked;
  o.micro_batch_tokens = 32;
  o.overlap_grad_reduce = p.overlap;
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
  constexpr int kSteps = 2;
  auto single = make();
  std::vector<StepResult> expected_steps;
  for (int i = 0; i < kSteps; ++i) expected_steps.push_back(single->train_step(seqs, *MakeObjective(p.objective)).forward);
  const auto expected = weights(*single);

  constexpr int kData = 2, kContext = 2, kWorld = kData * kContext;
  const int port = FreeLoopbackPort();
  std::vector<TensorMap> got(kWorld);
  std::vector<std::vector<StepResult>> steps(kWorld);
  std::vector<int64_t> reduced_bytes(kWorld, 0), state_bytes(kWorld, 0);
  std::vector<std::pair<int, int>> coordinates(kWorld);
  RunRanks(kWorld, [&](int rank) {
    auto world = Communicator::Create(testing::LoopbackRank(rank, kWorld, port, p.zero_stage));
    const auto groups = SplitParallelGroups(world, kContext);
    coordinates[rank] = {groups.data->rank(), groups.context->rank()};
    EXPECT_EQ(groups.data->options().zero_stage, p.zero_stage);
    EXPECT_EQ(groups.context->options().zero_stage, 0);
    auto trainer = make();
    trainer->set_communicator(groups.data);
    trainer->set_context_parallel(groups.context);
    for (int i = 0; i < kSteps; ++i) steps[rank].push_back(trainer->train_step(seqs, *MakeObjective(p.objective)).forward);
    reduced_bytes[rank] = trainer->last_grad_reduce().bytes;
    state_bytes[rank] = trainer->optimizer_state_bytes();
    got[rank] = weights(*trainer);
  });
  // ZeRO: each data rank keeps its share of the optimizer state (about half of it here), the
  // same on the ranks of its context group.
  const int64_t whole_state = single->optimizer_state_bytes();
  if (p.zero_stage > 0) {
    for (int rank = 0; rank < kWorld; ++rank) {
      EXPECT_LT(state_bytes[rank], whole_state * 3 / 4) << rank;
      EXPECT_EQ(state_bytes[rank], state_bytes[rank / kContext * kContext]) << rank;
    }
    EXPECT_GE(state_bytes[0] + state_bytes[kContext], whole_state);
  } else {
    for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(state_bytes[rank], whole_state) << rank;
  }
  // rank = d x P + c.
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(coordinates[rank], std::make_pair(rank / kContext, rank % kContext)) << rank;
    EXPECT_GT(reduced_bytes[rank], 0) << "rank " << rank << " summed nothing over its data group";
    for (int i = 0; i < kSteps; ++i) {
      const std::string where = "rank " + std::to_string(rank) + " step " + std::to_string(i);
      const auto& want = expected_steps[i];
      const auto& r = steps[rank][i];
      EXPECT_NEAR(r.loss, want.loss, 1e-12 * std::max(1.0, std::abs(want.loss))) << where;
      EXPECT_EQ(r.targets, want.targets) << where;
      EXPECT_EQ(r.tokens, want.tokens) << where;
      ASSERT_EQ(r.metrics.count("context_parallel_kv_bytes_per_layer"), 1u) << where;
      EXPECT_GT(r.metrics.at("context_parallel_kv_bytes_per_layer"), 0.0) << where;
      testing::ExpectWholeStepMetrics(want.metrics, r.metrics, where);
    }
  }
  const auto initial = weights(*make());
  for (const auto& [name, t] : expected) {
    for (int rank = 1; rank < kWorld; ++rank) {
      EXPECT_TRUE(torch::equal(got[0].at(name), got[rank].at(name))) << "rank " << rank << " differs on " << name;
    }
    EXPECT_FALSE(torch::equal(t, initial.at(name))) << name << " did not train";
  }
  EXPECT_LE(CompareGradients(expected, got[0]).max_relative, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(Objectives, DataTimesContextParallel,
                         ::testing::Values(GridCase{"sft"}, GridCase{"sft", false, false}, GridCase{"dpo"},
                                           GridCase{"dpo", true}, GridCase{"gspo"}, GridCase{"sft", false, true, 1},
                                           GridCase{"dpo", false, true, 2}, GridCase{"sft", true, false, 2}),
                         [](const auto& info) {
                           const auto& c = info.param;
                           return c.objective + (c.lora ? "_lora" : "") + (c.overlap ? "" : "_no_overlap") +
                                  (c.zero_stage > 0 ? "_zero" + std::to_string(c.zero_stage) : "");
                         });

// The layout SplitParallelGroups refuses, on every rank alike: P that does not divide the
// world. One kind alone keeps the world.
TEST(ParallelGroups, ContextParallelMustDivideTheWorld) {
  const int port = FreeLoopbackPort();
  std::vector<std::string> divide(4);
  RunRanks(4, [&](int rank) {
    auto world = Communicator::Create(testing::LoopbackRank(rank, 4, port, /*zero_stage=*/1));
    divide[rank] = ErrorOf([&] { SplitParallelGroups(world, 3); });
    // One kind alone keeps the world: ZeRO for data parallel, the world as the context group.
    const auto data = SplitParallelGroups(world, 1);
    EXPECT_EQ(data.data.get(), world.get());
    EXPECT_EQ(data.context, nullptr);
    const auto context = SplitParallelGroups(world, 4);
    EXPECT_EQ(context.context.get(), world.get());
    EXPECT_EQ(context.data, nullptr);
  });
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(divide[rank].find("context parallel 3 does not divide the 4 ranks"), std::string::npos) << divide[rank];
  }
}

// A step that fails on a 2-D grid of kWorld threads (P context ranks each): per rank, the
// error, and whether the trainer was left with no gradient and its weights unchanged.
// Flags are chars, not std::vector<bool>: its bits share words, and ranks are threads that
// write their own entries at the same time.
struct FailedStep {
  std::vector<std::string> errors;
  std::vector<char> no_grads, unchanged;
};
FailedStep RunFailingStep(int world_size, int context, double timeout_seconds, const std::vector<Sequence>& seqs,
                          const std::function<void(int, TrainerOptions&)>& adjust) {
  const auto config = testing::TinyConfig("qwen3");
  const int port = FreeLoopbackPort();
  FailedStep out{std::vector<std::string>(world_size), std::vector<char>(world_size, 0),
                 std::vector<char>(world_size, 0)};
  RunRanks(world_size, [&](int rank) {
    auto world = Communicator::Create(testing::LoopbackRank(rank, world_size, port, 0, timeout_seconds));
    const auto groups = SplitParallelGroups(world, context);
    TrainerOptions o;
    o.engine = EngineOptions{EngineKind::kStream, 5, 7, false, 3};
    adjust(rank, o);
    auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), o);
    trainer->set_communicator(groups.data);
    trainer->set_context_parallel(groups.context);
    const auto before = trainer->model()->hf_tensors();
    out.errors[rank] = ErrorOf([&] { trainer->train_step(seqs, *MakeObjective("sft")); });
    bool none = true;
    for (const auto& t : trainer->model()->parameters()) none = none && !t.grad().defined();
    out.no_grads[rank] = none;
    out.unchanged[rank] = CompareGradients(before, trainer->model()->hf_tensors()).max_abs == 0;
  });
  return out;
}

// A data rank whose micro-batch is shorter than its context group is refused on every rank
// before anything runs (a context group refusing alone would leave the others waiting in
// their next collective): the same error everywhere, no gradient, the weights unchanged.
TEST(ParallelGroups, AShardShorterThanTheContextGroupIsRefusedOnEveryRank) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  // Data rank 0 computes the long pair, data rank 1 the pair of 2-token sequences.
  const auto seqs = GroupedSequences(config, {30, 28, 2, 2});
  constexpr int kWorld = 6;
  const auto r = RunFailingStep(kWorld, 3, 60, seqs, [](int, TrainerOptions&) {});
  const auto& errors = r.errors;
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(errors[rank], errors[0]) << rank;
    EXPECT_NE(errors[rank].find("a micro-batch of data-parallel rank 1 is 2 positions long, fewer than the 3 "
                                "context-parallel ranks"),
              std::string::npos)
        << errors[rank];
    EXPECT_TRUE(r.no_grads[rank]) << rank;
    EXPECT_TRUE(r.unchanged[rank]) << rank;
  }
}

// A rank that dies mid-step (its step abandoned in the backward, as a cancelled caller
// abandons it) makes every other rank fail within the collective timeout: its context
// partner in the layer's exchange, the other data group in the sums after the backward.
// Nothing is applied anywhere.
TEST(ParallelGroups, ARankThatDiesMidStepFailsEveryRankWithinTheTimeoutAndNothingIsApplied) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  const auto seqs = GroupedSequences(config, {13, 8, 21, 11});
  constexpr int kWorld = 4;
  const auto start = std::chrono::steady_clock::now();
  const auto r = RunFailingStep(kWorld, 2, 3, seqs, [](int rank, TrainerOptions& o) {
    if (rank != 3) return;
    o.engine.on_progress = [](const EngineProgress& p) {
      if (p.phase == EngineProgress::Phase::kBackward) throw Error(ErrorCode::kCancelled, "rank 3 stops");
    };
  });
  const auto& errors = r.errors;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(errors[3].find("rank 3 stops"), std::string::npos) << errors[3];
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(errors[rank].find("a peer died or timed out"), std::string::npos) << rank << ": " << errors[rank];
  }
  EXPECT_LT(seconds, 30.0);
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_TRUE(r.no_grads[rank]) << rank << ": " << errors[rank];
    EXPECT_TRUE(r.unchanged[rank]) << rank << ": " << errors[rank];
  }
}

// Joining a group makes every rank start from rank 0's weights (as joining a data-parallel
// group does), so ranks built from different seeds still train one model.
TEST(ContextParallel, EveryRankStartsFromRankZerosWeights) {
  const auto config = testing::TinyConfig("qwen3");
  const auto expected = testing::RandomModel(config, 5, torch::kFloat64)->hf_tensors();
  const int port = FreeLoopbackPort();
  std::vector<TensorMap> got(2);
  RunRanks(2, [&](int rank) {
    auto trainer = Trainer::Create(testing::RandomModel(config, 5 + 10 * rank, torch::kFloat64), TrainerOptions{});
    trainer->set_context_parallel(Communicator::Create(testing::LoopbackRank(rank, 2, port)));
    for (const auto& [name, t] : trainer->model()->hf_tensors()) got[rank][name] = t.clone();
  });
  for (const auto& [name, t] : expected) {
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(got[r].at(name), t)) << "rank " << r << ": " << name;
  }
}

// The ranks' metric parts are added up over the union of their names: a rank whose share
// had no target for a metric (no name) takes part with nothing; maxima are the largest.
TEST(ContextParallel, MetricPartsAreAddedUpOverTheUnionOfTheRanksNames) {
  const int port = FreeLoopbackPort();
  std::vector<MetricParts> got(2);
  RunRanks(2, [&](int rank) {
    auto group = Communicator::Create(testing::LoopbackRank(rank, 2, port));
    MetricParts parts;
    if (rank == 0) {
      parts.means["a"] = {1.0, 2.0};
      parts.means["both"] = {3.0, 4.0};
      parts.maxima["m"] = -2.0;
    } else {
      parts.means["both"] = {5.0, 6.0};
      parts.means["b"] = {4.0, 1.0};
      parts.totals["t"] = 5.0;
      parts.maxima["m"] = -7.0;
      parts.maxima["only1"] = 9.0;
    }
    MergeMetricsOver(*group)(parts);
    got[rank] = parts;
  });
  for (int r = 0; r < 2; ++r) {
    const auto& p = got[r];
    EXPECT_EQ(p.means.size(), 3u) << r;
    EXPECT_EQ(p.means.at("a"), std::make_pair(1.0, 2.0)) << r;
    EXPECT_EQ(p.means.at("b"), std::make_pair(4.0, 1.0)) << r;
    EXPECT_EQ(p.means.at("both"), std::make_pair(8.0, 10.0)) << r;
    EXPECT_EQ(p.totals.size(), 1u) << r;
    EXPECT_EQ(p.totals.at("t"), 5.0) << r;
    EXPECT_EQ(p.maxima.size(), 2u) << r;
    EXPECT_EQ(p.maxima.at("m"), -2.0) << r;
    EXPECT_EQ(p.maxima.at("only1"), 9.0) << r;
  }
}

TEST(ContextParallel, ShardsAreContiguousAndBalanced) {
  int64_t covered = 0;
  for (int r = 0; r < 3; ++r) {
    const auto [s, e] = ContextShardRange(11, r, 3);
    EXPECT_EQ(s, covered);
    EXPECT_TRUE(e - s == 3 || e - s == 4) << r;
    covered = e;
  }
  EXPECT_EQ(covered, 11);
}

}  // namespace
}  // namespace streambp
