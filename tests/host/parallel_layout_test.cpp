// The layout of a context-parallel server, checked at start (and with data parallel: WORLD_SIZE
// a multiple of P), and its admission: per rank, every micro-batch at least P positions long.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "admission.h"
#include "executor.h"
#include "host.h"
#include "host_fixtures.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/estimate.h"

namespace streambp::server {
namespace {

TEST(Host, ContextParallelLayoutIsCheckedAtStart) {
  auto parsed = ServerConfig::FromJson(nlohmann::json{{"parallel", {{"context_parallel", 4}}}});
  EXPECT_EQ(parsed.parallel.context_parallel, 4);
  EXPECT_EQ(ServerConfig::FromJson(parsed.ToJson()).parallel.context_parallel, 4);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message([] { ServerConfig::FromJson(nlohmann::json{{"parallel", {{"context_parallel", 0}}}}); })
                .find("parallel.context_parallel must be between 1 and 4096, got 0"),
            std::string::npos);
  EXPECT_NE(message([] { ServerConfig::FromJson(nlohmann::json{{"parallel", {{"context_paralel", 2}}}}); })
                .find("context_paralel"),
            std::string::npos);
  auto config = HostConfig();
  config.parallel.context_parallel = 2;  // one process: no WORLD_SIZE
  EXPECT_NE(message([&] { TrainingHost::Create(config); }).find("parallel.context_parallel 2 needs a multiple of 2 ranks"),
            std::string::npos);
  DistOptions three;  // data parallel x context parallel: WORLD_SIZE a multiple of P
  three.world_size = 3;
  EXPECT_NE(message([&] { CheckParallelLayout(config, three); }).find("got WORLD_SIZE=3"), std::string::npos);
  DistOptions four;
  four.world_size = 4;
  EXPECT_EQ(message([&] { CheckParallelLayout(config, four); }), "(accepted)");
  four.zero_stage = 2;  // ZeRO over the 2 data-parallel ranks
  EXPECT_EQ(message([&] { CheckParallelLayout(config, four); }), "(accepted)");
  DistOptions two;
  two.world_size = 2;
  two.zero_stage = 1;
  EXPECT_NE(message([&] { CheckParallelLayout(config, two); }).find("STREAMBP_ZERO_STAGE=0"), std::string::npos);
  two.zero_stage = 0;
  config.trainer.engine.kind = EngineKind::kCheckpoint;
  EXPECT_NE(message([&] { CheckParallelLayout(config, two); }).find("runs the stream engine only"), std::string::npos);
  config.trainer.engine.kind = EngineKind::kStream;
  EXPECT_EQ(message([&] { CheckParallelLayout(config, two); }), "(accepted)");
  config.trainer.engine.recompute_kv_per_chunk = true;
  EXPECT_NE(message([&] { CheckParallelLayout(config, two); }).find("recompute_kv_per_chunk"), std::string::npos);
  config.trainer.engine.recompute_kv_per_chunk = false;
  config.trainer.engine.keep_attention = true;  // refused at start, not by every step
  EXPECT_NE(message([&] { CheckParallelLayout(config, two); })
                .find("trainer.engine.keep_attention (--keep-attention) does not run context parallel"),
            std::string::npos);
  config.trainer.engine.keep_attention = false;

  // Admission of a context-parallel server (4 ranks): every micro-batch needs 4 positions
  // (refused before any rank starts, not partway through the step); EstimateMemory too; only
  // the stream engine.
  config.parallel.context_parallel = 4;
  config.trainer.micro_batch_tokens = 8;
  config.trainer.layout = Layout::kRightPad;
  Admission admission(config, PresetConfig("tiny"), torch::kFloat64);
  auto engine = admission.resolve_engine(EngineRequest{});
  // [10 tokens] alone, then [3, 2] together (2 rows x 3 = 6 padded tokens <= 8): 3 < 4.
  const auto short_part = SftStep({std::vector<int64_t>(10, 5), {1, 2, 3}, {4, 5}});
  EXPECT_NE(message([&] { admission.admit_step(short_part.sequences, false, &engine); })
                .find("needs every micro-batch to have at least 4 positions; sequence 1 and the others of its "
                      "micro-batch have 3 tokens at most"),
            std::string::npos);
  const auto fine = SftStep({std::vector<int64_t>(10, 5), {1, 2, 3, 4}, {4, 5}});  // [4, 2]: 4 positions
  EXPECT_EQ(message([&] { admission.admit_step(fine.sequences, false, &engine); }), "(accepted)");
  EXPECT_NE(message([&] { admission.estimate(1, 3, EngineRequest{}); }).find("shorter than the 4 ranks"),
            std::string::npos);
  EXPECT_EQ(message([&] { admission.estimate(1, 4, EngineRequest{}); }), "(accepted)");
  EngineRequest checkpoint;
  checkpoint.engine = "checkpoint";
  EXPECT_NE(message([&] { admission.resolve_engine(checkpoint); }).find("runs the stream engine only"),
            std::string::npos);

  // With a reference model its log-probs run before the step, split over the ranks as well:
  // a rank's forward over its 1024 of the 4096 positions, below one process's forward (which,
  // unsplit, would have been a rank's peak). EstimateMemory and admission count the larger
  // of the two passes, and agree.
  const int64_t T = 4096;
  auto without = config;
  without.trainer.reference.use_reference_model = false;
  const auto split = Admission(without, PresetConfig("tiny"), torch::kFloat64).estimate(1, T, EngineRequest{}).estimate;
  const auto whole = EstimateForwardMemory(PresetConfig("tiny"), torch::kFloat64, 1, T, -1).activation_bytes;
  const auto per_rank =
      EstimateForwardMemory(PresetConfig("tiny"), torch::kFloat64, 1, T, -1, c10::DeviceType::CPU, 4).activation_bytes;
  EXPECT_LT(per_rank, whole);
  EXPECT_GT(whole, split.activation_bytes);
  auto with_reference = without;
  with_reference.trainer.reference.use_reference_model = true;
  const auto counted = Admission(with_reference, PresetConfig("tiny"), torch::kFloat64).estimate(1, T, EngineRequest{});
  EXPECT_EQ(counted.estimate.activation_bytes, std::max(per_rank, split.activation_bytes));
  const auto long_step = SftStep({std::vector<int64_t>(T, 5)});
  auto refusal = [&](const ServerConfig& c) {
    Admission a(c, PresetConfig("tiny"), torch::kFloat64);
    auto e = a.resolve_engine(EngineRequest{});
    try {
      a.admit_step(long_step.sequences, false, &e);
    } catch (const ResourceExhausted& error) {
      return std::string(error.what());
    }
    return std::string("(accepted)");
  };
  with_reference.limits.memory_budget_bytes = counted.estimate.total();
  EXPECT_EQ(refusal(with_reference), "(accepted)");
  with_reference.limits.memory_budget_bytes = counted.estimate.total() - 1;
  EXPECT_NE(refusal(with_reference).find("the step (per rank, context parallel over 4) is estimated at"),
            std::string::npos)
      << refusal(with_reference);
}

// trainer.engine.keep_attention belongs to the stream engine: a request that names another
// engine runs it without (the engine would refuse the option), one that names none keeps it.
TEST(Host, KeptAttentionIsTheStreamEnginesAndOtherEnginesRunWithout) {
  auto config = HostConfig();
  config.trainer.engine.keep_attention = true;
  Admission admission(config, PresetConfig("tiny"), torch::kFloat64);
  EXPECT_TRUE(admission.resolve_engine(EngineRequest{}).keep_attention);
  for (const char* name : {"checkpoint", "full"}) {
    EngineRequest other;
    other.engine = name;
    const auto resolved = admission.resolve_engine(other);
    EXPECT_EQ(EngineName(resolved.kind), name);
    EXPECT_FALSE(resolved.keep_attention) << name;
  }
  EngineRequest stream;
  stream.engine = "stream";
  EXPECT_TRUE(admission.resolve_engine(stream).keep_attention);
}

}  // namespace
}  // namespace streambp::server
