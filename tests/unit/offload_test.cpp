// Layer inputs off the device (issue 17): the stream engine with offload_layer_inputs keeps
// the stored layer inputs and the final hidden states in a scratch file; gradients are
// bit-identical, the device peak is lower, and scratch-file failures are clear errors.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/gradients.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "test_util/fixtures.h"
#include "test_util/objective_steps.h"
#include "test_util/small_disk.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;

EngineOptions Offloaded(EngineOptions o, const std::string& dir) {
  o.offload_layer_inputs = true;
  o.scratch_dir = dir;
  return o;
}

// Every family and layout, float64 and float32, the three objectives (DPO and GRPO read the
// final hidden states twice: the sequence pass, then the gradient pass): the same loss and
// the same gradients bit for bit, with chunks that do not divide T and key tiles.
TEST(Offload, GradientsAreBitIdentical) {
  RegisterBuiltinObjectives();
  const auto dir = testing::TempDir("offload");
  for (const auto& family : testing::TinyFamilies()) {
    for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
      auto config = testing::TinyConfig(family);
      auto model = testing::RandomModel(config, 17, dtype);
      for (const char* objective : {"sft", "dpo", "grpo"}) {
        for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
          auto batch = MakeBatch(testing::ObjectiveSequences(objective, config.vocab_size), layout,
                                 layout == Layout::kPacked ? 24 : 0);
          const EngineOptions on_device{EngineKind::kStream, 5, 4, false, 3};
          const auto a = testing::RunObjectiveStep(model, batch, objective, on_device);
          const auto b = testing::RunObjectiveStep(model, batch, objective, Offloaded(on_device, dir));
          const std::string where = family + " " + objective + " " + LayoutName(layout) + " " + DtypeName(dtype);
          EXPECT_EQ(a.result.loss, b.result.loss) << where;
          EXPECT_EQ(a.result.offloaded_bytes, 0) << where;
          // The inputs of layers 1..L-1 (layer 0's is the embedding, looked up again) and the
          // final hidden states: L tensors [rows, T, d].
          EXPECT_EQ(b.result.offloaded_bytes, config.num_hidden_layers * batch.rows() * batch.length() *
                                                  config.hidden_size * c10::elementSize(dtype))
              << where;
          for (const auto& [name, g] : a.grads) {
            EXPECT_TRUE(torch::equal(g, b.grads.at(name))) << where << " " << name;
          }
        }
      }
    }
  }
  // The scratch file is unlinked at once: nothing is left in the folder.
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// With many layers the stored inputs dominate the stream engine's peak; offloaded, the
// device holds g, dx, K, V, dK, dV and a chunk. The estimate knows both tiers.
TEST(Offload, TrackedPeakIsLowerAndEstimated) {
  memory::InstallTrackingAllocator();
  auto config = PresetConfig("tiny");
  config.num_hidden_layers = 8;
  auto model = InitModel(config, 0, torch::kFloat32);
  const auto dir = testing::TempDir("offload-peak");
  const int64_t T = 4096;
  auto batch = MakeBatch(testing::RandomSequences({T}, config.vocab_size, 4), Layout::kRightPad);
  const EngineOptions on_device{EngineKind::kStream, 128, 128, false, 256};
  auto peak = [&](const EngineOptions& o) { return testing::TrackedSftPeak(model, batch, o); };
  const int64_t device = peak(on_device);
  const int64_t offloaded = peak(Offloaded(on_device, dir));
  const auto grads = EstimateStepMemory(config, torch::kFloat32, 1, T, on_device, "none").gradient_bytes;
  std::printf("T=%lld, 8 layers: tracked peak %.1f MiB on the device, %.1f MiB with the inputs offloaded\n",
              (long long)T, device / 1048576.0, offloaded / 1048576.0);
  EXPECT_LT(offloaded, device * 6 / 10);
  for (const auto& [o, measured] : {std::pair{on_device, device}, std::pair{Offloaded(on_device, dir), offloaded}}) {
    const auto est = EstimateStepMemory(config, torch::kFloat32, 1, T, o, "none");
    const double ratio = static_cast<double>(est.activation_bytes) / static_cast<double>(measured - grads);
    std::printf("  offload %d: estimate %.1f MiB of activations (%.2fx the measured), %.1f MiB offloaded\n",
                o.offload_layer_inputs ? 1 : 0, est.activation_bytes / 1048576.0, ratio,
                est.offloaded_bytes / 1048576.0);
    EXPECT_GE(ratio, 0.9);
    EXPECT_LE(ratio, 2.5);
    EXPECT_EQ(est.offloaded_bytes, o.offload_layer_inputs ? 8 * T * config.hidden_size * 4 : 0);  // layers 1..7, h_last
  }
  // ChooseChunks with the offloaded engine picks chunks that fit a budget the device engine
  // could not meet at any chunk size.
  const auto stream_floor = EstimateStepMemory(config, torch::kFloat32, 1, T, {EngineKind::kStream, 16, 16, false, 16});
  const auto chosen = ChooseChunks(config, torch::kFloat32, 1, T, stream_floor.total() * 3 / 4, "adamw", nullptr,
                                   Offloaded(on_device, dir));
  EXPECT_TRUE(chosen.offload_layer_inputs);
  EXPECT_LE(EstimateStepMemory(config, torch::kFloat32, 1, T, chosen).total(), stream_floor.total() * 3 / 4);
  fs::remove_all(dir);
}

// A scratch folder that does not exist, or is a file: FailedPrecondition naming it, before
// anything is computed; a full one (a small tmpfs): ResourceExhausted naming it. No crash,
// no gradient, and the next step with a good folder works.
TEST(Offload, ScratchFailuresAreClearErrors) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 5, torch::kFloat32);
  auto batch = MakeBatch(testing::RandomSequences({400, 300}, config.vocab_size, 2), Layout::kRightPad);
  const EngineOptions base{EngineKind::kStream, 16, 16, false, 16};
  auto expect_error = [&](const std::string& dir, ErrorCode code, const std::string& words) {
    auto objective = MakeSftObjective({});
    try {
      ForwardBackward(model, batch, *objective, Offloaded(base, dir));
      ADD_FAILURE() << "a step with the scratch folder " << dir << " succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << dir;
  };
  const auto tmp = testing::TempDir("offload-errors");
  expect_error(tmp + "/missing", ErrorCode::kFailedPrecondition, "No such file or directory");
  std::ofstream(tmp + "/a-file") << "x";
  expect_error(tmp + "/a-file", ErrorCode::kFailedPrecondition, "Not a directory");
  std::string why;
  auto disk = testing::SmallDisk::Create(64 << 10, &why);
  if (disk) {
    // The layers' inputs + h_last of [2, 400, d] float32: far past 64 KiB.
    expect_error(disk->path(), ErrorCode::kResourceExhausted, "No space left on device");
  }
  ZeroGradients(*model);
  auto objective = MakeSftObjective({});
  EXPECT_NO_THROW(ForwardBackward(model, batch, *objective, Offloaded(base, tmp)));
  ZeroGradients(*model);
  // Only the stream engine has layer inputs to offload.
  EXPECT_THROW(ForwardBackward(model, batch, *objective, Offloaded({EngineKind::kCheckpoint}, tmp)), InvalidArgument);
  fs::remove_all(tmp);
  if (!disk) GTEST_SKIP() << "disk-full case skipped: " << why;
}

}  // namespace
}  // namespace streambp
