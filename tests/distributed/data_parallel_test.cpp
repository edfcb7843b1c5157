// Data-parallel StreamBP over c10d Gloo on loopback: 2 ranks (threads of this process, each
// with its own process group and model) give the update of one process on the whole batch,
// for every objective and ZeRO stage.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/trainer.h"
#include "ranks.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::RunRanks;

std::vector<Sequence> Step(const std::string& kind, int64_t vocab) {
  auto raw = testing::RandomSequences({5, 7, 3, 9, 4, 6, 8, 2, 5, 7, 3, 6}, vocab, 17);
  std::vector<Sequence> out;
  for (int g = 0; g < 4; ++g) {
    const auto& prompt = raw[3 * g].tokens;
    for (int k = 0; k < (kind == "sft" ? 1 : 2); ++k) {
      Sequence s;
      s.tokens = prompt;
      const auto& c = raw[3 * g + 1 + k].tokens;
      s.tokens.insert(s.tokens.end(), c.begin(), c.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      if (kind != "sft") s.group = g;
      s.role = k;
      s.reward = 0.3 * g + k;
      out.push_back(s);
    }
  }
  return out;
}

TrainerOptions Options(const std::string& kind) {
  TrainerOptions o;
  o.optimizer.name = "adamw";
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.max_grad_norm = 0.5;  // the clip uses the global norm
  o.engine = EngineOptions{EngineKind::kStream, 3, 4};
  o.reference.use_reference_model = kind == "dpo";
  return o;
}

nlohmann::json ObjectiveOptions(const std::string& kind) {
  if (kind == "grpo") return {{"loss_type", "grpo"}};
  return nlohmann::json::object();
}

struct Case {
  std::string kind;
  int zero;
};

class DataParallel : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallel, TwoRanksEqualOneProcessOnTheWholeBatch) {
  RegisterBuiltinObjectives();
  const auto [kind, zero] = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  const auto step = Step(kind, config.vocab_size);
  constexpr int kSteps = 3;

  auto single = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), Options(kind));
  std::vector<double> single_losses;
  std::vector<std::map<std::string, double>> single_metrics;
  for (int i = 0; i < kSteps; ++i) {
    auto obj = CreateObjective(kind, ObjectiveOptions(kind));
    const auto r = single->train_step(step, *obj);
    single_losses.push_back(r.forward.loss);
    single_metrics.push_back(r.forward.metrics);
  }
  const auto expected = single->model()->hf_tensors();

  const int port = FreeLoopbackPort();
  std::vector<TensorMap> weights(2);
  std::vector<std::vector<double>> losses(2);
  std::vector<std::vector<std::map<std::string, double>>> metrics(2);
  std::vector<int64_t> state_bytes(2);
  const std::string ckpt = testing::TempDir("dp-ckpt-" + kind + std::to_string(zero)) + "/ckpt";
  RunRanks(2, [&](int rank) {
    auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), Options(kind));
    trainer->set_communicator(Communicator::Create(testing::LoopbackRank(rank, 2, port, zero)));
    for (int i = 0; i < kSteps; ++i) {
      auto obj = CreateObjective(kind, ObjectiveOptions(kind));
      const auto r = trainer->train_step(step, *obj);
      losses[rank].push_back(r.forward.loss);
      metrics[rank].push_back(r.forward.metrics);
    }
    weights[rank] = trainer->model()->hf_tensors();
    state_bytes[rank] = trainer->optimizer_state_bytes();
    trainer->save_checkpoint(ckpt);  // a collective with ZeRO (the state is gathered)
  });
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(losses[0][i], single_losses[i], 1e-12 * std::max(1.0, std::abs(single_losses[i]))) << i;
    EXPECT_EQ(losses[0][i], losses[1][i]);
    // The objective's metrics are the whole batch's on every rank (each rank's shard's parts
    // added up), not rank 0's shard's.
    for (int r = 0; r < 2; ++r) {
      testing::ExpectWholeStepMetrics(single_metrics[i], metrics[r][i],
                                      "rank " + std::to_string(r) + " step " + std::to_string(i));
    }
  }
  for (const auto& [name, t] : expected) {
    EXPECT_TRUE(torch::equal(weights[0].at(name), weights[1].at(name))) << "ranks differ on " << name;
  }
  EXPECT_LE(CompareGradients(expected, weights[0]).max_relative, 1e-10);
  const int64_t full = single->optimizer_state_bytes();
  if (zero >= 1) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_LT(state_bytes[r], full * 6 / 10) << "rank " << r;
      EXPECT_GT(state_bytes[r], full * 4 / 10) << "rank " << r;
    }
  } else {
    EXPECT_EQ(state_bytes[0], full);
  }
  // The checkpoint of the sharded run loads into one process and holds the whole state.
  auto loaded = Trainer::LoadCheckpoint(ckpt);
  EXPECT_EQ(loaded->step(), kSteps);
  EXPECT_LE(CompareGradients(single->optimizer().state(), loaded->optimizer().state()).max_relative, 1e-10);
  EXPECT_LE(CompareGradients(expected, loaded->model()->hf_tensors()).max_relative, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(ObjectivesAndZeroStages, DataParallel,
                         ::testing::Values(Case{"sft", 0}, Case{"dpo", 0}, Case{"grpo", 0}, Case{"sft", 1},
                                           Case{"dpo", 1}, Case{"grpo", 2}, Case{"sft", 2}),
                         [](const auto& info) { return info.param.kind + "_zero" + std::to_string(info.param.zero); });

// LoRA: each rank holds the same frozen base and adapter; a step sums only the adapter's
// gradients, and 2 ranks give the adapter of one process (DPO with the reference from the
// base with the adapter off; ZeRO 0 and 2). The base never changes.
class DataParallelLora : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelLora, TwoRanksEqualOneProcess) {
  RegisterBuiltinObjectives();
  const auto [kind, zero] = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  const auto step = Step(kind, config.vocab_size);
  LoraConfig lora;
  lora.r = 4;
  lora.seed = 3;
  auto make = [&] {
    return Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), Options(kind),
                           LoraAdapter::Create(config, lora, torch::kFloat64));
  };
  auto single = make();
  const auto base = single->model()->hf_tensors();
  for (int i = 0; i < 3; ++i) single->train_step(step, *CreateObjective(kind, ObjectiveOptions(kind)));
  const auto expected = single->adapter()->peft_tensors();
  const int port = FreeLoopbackPort();
  std::vector<TensorMap> adapters(2), bases(2);
  RunRanks(2, [&](int rank) {
    auto trainer = make();
    trainer->set_communicator(Communicator::Create(testing::LoopbackRank(rank, 2, port, zero)));
    for (int i = 0; i < 3; ++i) trainer->train_step(step, *CreateObjective(kind, ObjectiveOptions(kind)));
    adapters[rank] = trainer->adapter()->peft_tensors();
    bases[rank] = trainer->model()->hf_tensors();
  });
  for (const auto& [name, t] : expected) {
    EXPECT_TRUE(torch::equal(adapters[0].at(name), adapters[1].at(name))) << "ranks differ on " << name;
  }
  EXPECT_LE(CompareGradients(expected, adapters[0]).max_relative, 1e-10);
  for (int r = 0; r < 2; ++r) {
    for (const auto& [name, t] : base) EXPECT_TRUE(torch::equal(t, bases[r].at(name))) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Objectives, DataParallelLora,
                         ::testing::Values(Case{"sft", 0}, Case{"dpo", 0}, Case{"grpo", 2}),
                         [](const auto& info) { return info.param.kind + "_zero" + std::to_string(info.param.zero); });

// Overlap: the gradient buckets of each layer are launched from the engine's hook during
// the backward of the last micro-batch. Same weights as the non-overlapped path (bit for
// bit: a sum of two terms does not depend on the bucketing) and as one process.
struct OverlapCase {
  std::string kind;
  int zero;
  EngineKind engine;
};

class Overlap : public ::testing::TestWithParam<OverlapCase> {};

TEST_P(Overlap, EqualsTheNonOverlappedRunAndOneProcess) {
  RegisterBuiltinObjectives();
  const auto [kind, zero, engine] = GetParam();
  const auto config = testing::TinyConfig("qwen3");
  const auto step = Step(kind, config.vocab_size);
  constexpr int kSteps = 2;
  auto options = Options(kind);
  options.engine.kind = engine;
  options.micro_batch_tokens = 24;  // several micro-batches per rank: only the last one overlaps
  options.grad_bucket_bytes = 16 << 10;  // a layer of the tiny model is ~60 KiB in float64

  auto single = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), options);
  for (int i = 0; i < kSteps; ++i) {
    auto obj = CreateObjective(kind, ObjectiveOptions(kind));
    single->train_step(step, *obj);
  }
  const auto expected = single->model()->hf_tensors();
  int64_t gradient_bytes = 0;
  for (const auto& [name, t] : expected) gradient_bytes += t.numel() * static_cast<int64_t>(t.element_size());

  struct RankResult {
    TensorMap weights;
    std::vector<GradReduceInfo> reduces;
  };
  auto run = [&](bool overlap) {
    std::vector<RankResult> out(2);
    const int port = FreeLoopbackPort();
    RunRanks(2, [&](int rank) {
      auto o = options;
      o.overlap_grad_reduce = overlap;
      auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), o);
      trainer->set_communicator(Communicator::Create(testing::LoopbackRank(rank, 2, port, zero)));
      for (int i = 0; i < kSteps; ++i) {
        auto obj = CreateObjective(kind, ObjectiveOptions(kind));
        trainer->train_step(step, *obj);
        out[rank].reduces.push_back(trainer->last_grad_reduce());
      }
      out[rank].weights = trainer->model()->hf_tensors();
    });
    return out;
  };
  const auto overlapped = run(true);
  const auto plain = run(false);

  for (const auto& [name, t] : expected) {
    EXPECT_TRUE(torch::equal(overlapped[0].weights.at(name), overlapped[1].weights.at(name))) << "ranks differ on " << name;
    EXPECT_TRUE(torch::equal(overlapped[0].weights.at(name), plain[0].weights.at(name)))
        << "overlapped and non-overlapped runs differ on " << name;
  }
  EXPECT_LE(CompareGradients(expected, overlapped[0].weights).max_relative, 1e-10);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < kSteps; ++i) {
      const auto& o = overlapped[r].reduces[i];
      const auto& p = plain[r].reduces[i];
      EXPECT_TRUE(o.overlapped);
      EXPECT_FALSE(p.overlapped);
      // Communication started while the backward was still running, and the rest after it.
      EXPECT_GT(o.buckets_in_backward, 0) << "rank " << r << " step " << i;
      EXPECT_LT(o.buckets_in_backward, o.buckets);
      // Once per step, the whole gradient, however many micro-batches and chunks.
      EXPECT_EQ(o.bytes, gradient_bytes);
      EXPECT_EQ(p.bytes, gradient_bytes);
      EXPECT_EQ(p.buckets_in_backward, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ObjectivesStagesEngines, Overlap,
                         ::testing::Values(OverlapCase{"sft", 0, EngineKind::kStream},
                                           OverlapCase{"grpo", 1, EngineKind::kStream},
                                           OverlapCase{"dpo", 2, EngineKind::kStream},
                                           OverlapCase{"sft", 2, EngineKind::kCheckpoint},
                                           OverlapCase{"sft", 0, EngineKind::kFull}),
                         [](const auto& info) {
                           return info.param.kind + "_zero" + std::to_string(info.param.zero) + "_" +
                                  EngineName(info.param.engine);
                         });

// A rank with nothing to compute (fewer sequences than ranks) launches the same buckets
// (zeros) as the one whose backward ran, so the collectives still match.
TEST(OverlapEdge, ARankWithAnEmptyShardStillMatchesTheCollectives) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  const auto step = std::vector<Sequence>{Step("sft", config.vocab_size)[0]};
  auto options = Options("sft");
  options.grad_bucket_bytes = 16 << 10;
  auto single = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), options);
  auto obj = CreateObjective("sft", nlohmann::json::object());
  const auto single_metrics = single->train_step(step, *obj).forward.metrics;
  const auto expected = single->model()->hf_tensors();
  std::vector<TensorMap> weights(2);
  std::vector<GradReduceInfo> reduces(2);
  std::vector<std::map<std::string, double>> metrics(2);
  const int port = FreeLoopbackPort();
  RunRanks(2, [&](int rank) {
    auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), options);
    trainer->set_communicator(Communicator::Create(testing::LoopbackRank(rank, 2, port)));
    auto o = CreateObjective("sft", nlohmann::json::object());
    metrics[rank] = trainer->train_step(step, *o).forward.metrics;
    weights[rank] = trainer->model()->hf_tensors();
    reduces[rank] = trainer->last_grad_reduce();
  });
  // The empty shard's rank reports the sequence's token accuracy too.
  for (int r = 0; r < 2; ++r) testing::ExpectWholeStepMetrics(single_metrics, metrics[r], "rank " + std::to_string(r));
  EXPECT_EQ(reduces[0].buckets, reduces[1].buckets);
  EXPECT_EQ(reduces[0].bytes, reduces[1].bytes);
  // Only the rank with the sequence runs a backward to launch buckets from.
  EXPECT_EQ(std::min(reduces[0].buckets_in_backward, reduces[1].buckets_in_backward), 0);
  EXPECT_GT(std::max(reduces[0].buckets_in_backward, reduces[1].buckets_in_backward), 0);
  EXPECT_LE(CompareGradients(expected, weights[0]).max_relative, 1e-10);
  EXPECT_LE(CompareGradients(expected, weights[1]).max_relative, 1e-10);
}

TEST(DataParallelFailure, ADeadPeerFailsTheCollectiveWithinTheTimeout) {
  const int port = FreeLoopbackPort();
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  RunRanks(2, [&](int rank) {
    auto comm = Communicator::Create(testing::LoopbackRank(rank, 2, port, 0, 3));
    if (rank == 1) return;  // rank 1 "dies": it never joins the all-reduce
    try {
      comm->all_reduce_sum({torch::ones({4})});
    } catch (const Error& e) {
      error = e.what();
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("a peer died or timed out"), std::string::npos) << error;
  EXPECT_LT(seconds, 30.0);
}

// A peer that leaves between forward_backward and optim_step (a client cancelled there) fails
// the update's first collective on the other rank: the step is abandoned whole there (no
// gradient left to apply later, the weights unchanged), for every ZeRO stage.
TEST(DataParallelFailure, APeerGoneBeforeTheUpdateAbandonsTheStep) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  const auto step = Step("sft", config.vocab_size);
  for (int zero : {0, 2}) {
    const int port = FreeLoopbackPort();
    std::string error, second;
    bool no_grads = false;
    double changed = -1;
    RunRanks(2, [&](int rank) {
      auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), Options("sft"));
      trainer->set_communicator(Communicator::Create(testing::LoopbackRank(rank, 2, port, zero, 3)));
      auto obj = CreateObjective("sft", ObjectiveOptions("sft"));
      trainer->forward_backward(step, *obj);
      if (rank == 1) return;  // gone: its trainer and process group are destroyed
      const auto before = trainer->model()->hf_tensors();
      try {
        trainer->optim_step();
      } catch (const Error& e) {
        error = e.what();
      }
      no_grads = true;
      for (const auto& p : trainer->model()->parameters()) no_grads = no_grads && !p.grad().defined();
      changed = CompareGradients(before, trainer->model()->hf_tensors()).max_abs;
      try {
        trainer->optim_step();
      } catch (const Error& e) {
        second = e.what();
      }
    });
    EXPECT_NE(error.find("a peer died or timed out"), std::string::npos) << "zero " << zero << ": " << error;
    EXPECT_TRUE(no_grads) << "zero " << zero;
    EXPECT_EQ(changed, 0.0) << "zero " << zero;
    EXPECT_NE(second.find("there are no accumulated gradients"), std::string::npos) << "zero " << zero << ": " << second;
  }
}

TEST(DataParallelFailure, APeerThatNeverArrivesIsAClearError) {
  DistOptions d;
  d.rank = 0;
  d.world_size = 2;
  d.master_port = FreeLoopbackPort();
  d.timeout_seconds = 2;
  try {
    Communicator::Create(d);
    FAIL() << "rendezvous without the second rank succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rendezvous"), std::string::npos) << e.what();
  }
}

// The backend: STREAMBP_DIST_BACKEND is read and checked; NCCL in a build without it is
// a clear error at once (before the rendezvous would make the peers wait).
TEST(DataParallelBackend, ChosenFromTheEnvironmentAndRefusedWhenNotBuilt) {
  setenv("STREAMBP_DIST_BACKEND", "mpi", 1);
  try {
    DistOptions::FromEnv();
    FAIL() << "an unknown backend was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gloo | nccl"), std::string::npos) << e.what();
  }
  setenv("STREAMBP_DIST_BACKEND", "nccl", 1);
  const auto d = DistOptions::FromEnv();
  unsetenv("STREAMBP_DIST_BACKEND");
  EXPECT_EQ(d.backend, "nccl");
  // One GPU per rank: "cuda" means cuda:LOCAL_RANK in a data-parallel run.
  DistOptions ranks;
  ranks.world_size = 4;
  ranks.rank = ranks.local_rank = 3;
  EXPECT_EQ(RankDevice("cuda", ranks), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(RankDevice("cuda:1", ranks), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(RankDevice("cpu", ranks), torch::Device(torch::kCPU));
  EXPECT_EQ(RankDevice("cuda", DistOptions{}), torch::Device(torch::kCUDA));
#if !defined(STREAMBP_WITH_NCCL)
  DistOptions two = d;
  two.world_size = 2;
  two.master_port = FreeLoopbackPort();
  two.timeout_seconds = 30;
  const auto start = std::chrono::steady_clock::now();
  try {
    Communicator::Create(two);
    FAIL() << "an NCCL process group was created in a build without NCCL";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("STREAMBP_WITH_CUDA"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
#endif
}

}  // namespace
}  // namespace streambp
