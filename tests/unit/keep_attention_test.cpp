// Selective recompute (EngineOptions::keep_attention, issue 31): the stream engine keeps each
// layer's attention output and log-sum-exp from its forward, and the layer's backward runs
// the attention's backward from them instead of its forward again. The output is the one the
// backward would have recomputed, bit for bit, so the gradients are the stream engine's
// (which the float64 references check); the memory it costs is measured and estimated; where
// it does not run it is refused before anything changes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/gradients.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "streambp/trainer_options.h"
#include "test_util/fixtures.h"
#include "test_util/objective_steps.h"

namespace streambp {
namespace {

EngineOptions Kept(EngineOptions o) {
  o.keep_attention = true;
  return o;
}

// Every family (GQA, sliding windows, Gemma3's query scaling and norms, experts) and layout,
// float64, float32 and bfloat16, the three objectives, with chunks that do not divide T, key
// tiles shorter than a chunk's keys and longer than the sequence: the same loss and the same
// gradients bit for bit.
TEST(KeepAttention, GradientsAreBitIdentical) {
  RegisterBuiltinObjectives();
  int compared = 0;
  for (const auto& family : testing::TinyFamilies()) {
    for (auto dtype : {torch::kFloat64, torch::kFloat32, torch::kBFloat16}) {
      auto config = testing::TinyConfig(family);
      auto model = testing::RandomModel(config, 17, dtype);
      for (const char* objective : {"sft", "dpo", "grpo"}) {
        for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
          auto batch = MakeBatch(testing::ObjectiveSequences(objective, config.vocab_size), layout,
                                 layout == Layout::kPacked ? 24 : 0);
          // Key tiles shorter than a chunk's keys, and key tiles longer than the sequence
          // (every chunk's keys in one tile, which a forward not tiled like the backward
          // computed another way).
          for (const EngineOptions& recomputed :
               {EngineOptions{EngineKind::kStream, 5, 4, false, 3}, EngineOptions{EngineKind::kStream, 3, 4, false, 64}}) {
            const auto a = testing::RunObjectiveStep(model, batch, objective, recomputed);
            const auto b = testing::RunObjectiveStep(model, batch, objective, Kept(recomputed));
            const std::string where = family + " " + objective + " " + LayoutName(layout) + " " + DtypeName(dtype) +
                                      " key tile " + std::to_string(recomputed.key_chunk);
            EXPECT_EQ(a.result.loss, b.result.loss) << where;
            for (const auto& [name, g] : a.grads) {
              EXPECT_TRUE(torch::equal(g, b.grads.at(name))) << where << " " << name;
              ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 2000);
}

// The float64 gradient of a longer sequence (many chunks and tiles, a sliding window) against
// the whole-graph engine, which autograd differentiates directly.
TEST(KeepAttention, MatchesTheFullGraphInFloat64) {
  RegisterBuiltinObjectives();
  for (const char* family : {"qwen3", "mistral_window", "gemma3"}) {
    auto config = testing::TinyConfig(family);
    auto model = testing::RandomModel(config, 23, torch::kFloat64);
    auto batch = MakeBatch(testing::RandomSequences({70, 41}, config.vocab_size, 9), Layout::kRightPad);
    const auto full = testing::RunObjectiveStep(model, batch, "sft", EngineOptions{EngineKind::kFull});
    const auto kept =
        testing::RunObjectiveStep(model, batch, "sft", Kept(EngineOptions{EngineKind::kStream, 16, 8, false, 8}));
    EXPECT_NEAR(kept.result.loss, full.result.loss, 1e-12 * std::abs(full.result.loss)) << family;
    EXPECT_LE(CompareGradients(full.grads, kept.grads).max_relative, 1e-10) << family;
  }
}

// What it costs: every layer's output and log-sum-exp, L x T x (q_dim + heads) floats, alive
// from the forward until the layer's backward. Measured by the tracking allocator, and the
// estimate counts exactly that much more.
TEST(KeepAttention, CostsItsOutputsInMeasuredAndEstimatedMemory) {
  memory::InstallTrackingAllocator();
  auto config = PresetConfig("tiny");
  config.num_hidden_layers = 8;
  auto model = InitModel(config, 0, torch::kFloat32);
  const int64_t T = 2048;
  auto batch = MakeBatch(testing::RandomSequences({T}, config.vocab_size, 4), Layout::kRightPad);
  const EngineOptions recomputed{EngineKind::kStream, 128, 128, false, 256};
  auto peak = [&](const EngineOptions& o) { return testing::TrackedSftPeak(model, batch, o); };
  const int64_t without = peak(recomputed), with = peak(Kept(recomputed));
  const double kept_bytes = 8.0 * T * (config.q_dim() + config.num_attention_heads) * 4;
  const double measured = static_cast<double>(with - without);
  EXPECT_GE(measured, 0.85 * kept_bytes) << with << " vs " << without;
  EXPECT_LE(measured, 1.15 * kept_bytes) << with << " vs " << without;
  const auto est_without = EstimateStepMemory(config, torch::kFloat32, 1, T, recomputed, "none");
  const auto est_with = EstimateStepMemory(config, torch::kFloat32, 1, T, Kept(recomputed), "none");
  EXPECT_EQ(static_cast<double>(est_with.activation_bytes - est_without.activation_bytes),
            static_cast<double>(static_cast<int64_t>(kept_bytes)));
  const auto grads = est_with.gradient_bytes;
  const double ratio = static_cast<double>(est_with.activation_bytes) / static_cast<double>(with - grads);
  EXPECT_GE(ratio, 0.9);
  EXPECT_LE(ratio, 2.5);
}

// Other engines, offloaded layer inputs and the prefix-recompute ablation refuse it with a
// clear error before anything is computed: no gradient, the weights unchanged. So does a
// trainer configuration that asks for it with another engine.
TEST(KeepAttention, RefusedWhereItDoesNotRun) {
  RegisterBuiltinObjectives();
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 5, torch::kFloat32);
  const auto weights = model->hf_tensors();
  auto batch = MakeBatch(testing::RandomSequences({20, 12}, config.vocab_size, 2), Layout::kRightPad);
  EngineOptions checkpoint = Kept(EngineOptions{EngineKind::kCheckpoint});
  EngineOptions offloaded = Kept(EngineOptions{EngineKind::kStream, 8, 8, false, 8});
  offloaded.offload_layer_inputs = true;
  EngineOptions ablation = Kept(EngineOptions{EngineKind::kStream, 8, 8, true, 8});
  for (const auto& [options, words] : {std::pair{checkpoint, "keep_attention needs the stream engine (engine checkpoint)"},
                                       std::pair{offloaded, "keep_attention does not run with offload_layer_inputs"},
                                       std::pair{ablation, "keep_attention does not run with recompute_kv_per_chunk"}}) {
    auto objective = MakeSftObjective({});
    try {
      ForwardBackward(model, batch, *objective, options);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << words;
    EXPECT_EQ(CompareGradients(weights, model->hf_tensors()).max_abs, 0.0) << words;
  }
  // The trainer's configuration: read, written back, and checked against the engine.
  const auto stream = TrainerOptions::FromJson({{"engine", {{"kind", "stream"}, {"keep_attention", true}}}});
  EXPECT_TRUE(stream.engine.keep_attention);
  EXPECT_EQ(EngineOptionsToJson(stream.engine).at("keep_attention"), true);
  for (const auto& [json, words] :
       {std::pair{nlohmann::json{{"engine", {{"kind", "checkpoint"}, {"keep_attention", true}}}},
                  "engine.keep_attention needs engine.kind stream"},
        std::pair{nlohmann::json{{"engine", {{"kind", "stream"}, {"keep_attention", true}, {"offload_layer_inputs", true}}}},
                  "engine.keep_attention and engine.offload_layer_inputs do not run together"}}) {
    try {
      TrainerOptions::FromJson(json).Validate();
      ADD_FAILURE() << "accepted: " << json.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace streambp
