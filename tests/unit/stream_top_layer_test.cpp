// The stream engine's top layer with the head inside its backward (docs/architecture.md:
// Engines): where the objective has no sequence pass, the forward stops below the top layer,
// and the top layer's chunks run the attention half without a graph, the feed-forward half
// and the head in blocks of logits-chunk rows, then the attention half again from its kept
// output. The gradients stay exact, and the top layer's forward runs once.
#include <gtest/gtest.h>

#include <set>

#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/gradients.h"
#include "streambp/objective.h"
#include "test_util/fixtures.h"
#include "test_util/objective_steps.h"

namespace streambp {
namespace {

// Query chunks of 7 with logits chunks of 3: every chunk's feed-forward and head run in
// blocks of 3, 3 and 1 rows (the last chunk of a 13-token row in 3 and 3), key tiles of 4.
EngineOptions Blocks() {
  EngineOptions o{EngineKind::kStream, 7, 3, false, 4};
  return o;
}

// float64: every family, the objectives that take the top-layer path (sft, grpo) and one that
// does not (dpo: its sequence pass needs the top layer's output first), on the device and
// offloaded (dL/dx in a buffer of its own instead of the top layer's stored input), against
// the full engine.
TEST(StreamTopLayer, HeadInsideTheTopLayerMatchesFullInFloat64) {
  RegisterBuiltinObjectives();
  for (const auto& family : testing::TinyFamilies()) {
    const auto config = testing::TinyConfig(family);
    auto model = testing::RandomModel(config, 5, torch::kFloat64);
    for (const char* objective : {"sft", "grpo", "dpo"}) {
      const auto batch = MakeBatch(testing::ObjectiveSequences(objective, config.vocab_size), Layout::kRightPad);
      const auto full = testing::RunObjectiveStep(model, batch, objective, {EngineKind::kFull});
      for (bool offload : {false, true}) {
        auto options = Blocks();
        options.offload_layer_inputs = offload;
        const auto stream = testing::RunObjectiveStep(model, batch, objective, options);
        const auto diff = CompareGradients(full.grads, stream.grads);
        EXPECT_LE(diff.max_relative, 1e-10) << family << " " << objective << (offload ? " offloaded " : " ")
                                            << diff.worst;
        EXPECT_NEAR(stream.result.loss, full.result.loss, 1e-12 * std::abs(full.result.loss)) << family << " "
                                                                                               << objective;
      }
    }
  }
}

// What the step reports says which path ran: with the head inside the top layer no layer
// runs forward past L - 2 and no head phase is reported; DPO's step runs every layer forward
// and then the head.
TEST(StreamTopLayer, TheTopLayersForwardRunsOnce) {
  RegisterBuiltinObjectives();
  const auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 6, torch::kFloat32);
  const int64_t L = config.num_hidden_layers;
  for (const char* objective : {"sft", "grpo", "dpo"}) {
    const auto batch = MakeBatch(testing::ObjectiveSequences(objective, config.vocab_size), Layout::kRightPad);
    std::set<int64_t> forward, backward;
    bool head = false;
    auto options = Blocks();
    options.on_progress = [&](const EngineProgress& p) {
      if (p.phase == EngineProgress::Phase::kForward) forward.insert(p.layer);
      if (p.phase == EngineProgress::Phase::kBackward) backward.insert(p.layer);
      if (p.phase == EngineProgress::Phase::kHead) head = true;
    };
    testing::RunObjectiveStep(model, batch, objective, options);
    const bool inside = std::string(objective) != "dpo";
    EXPECT_EQ(static_cast<int64_t>(forward.size()), inside ? L - 1 : L) << objective;
    EXPECT_EQ(forward.count(L - 1), inside ? 0u : 1u) << objective;
    EXPECT_EQ(static_cast<int64_t>(backward.size()), L) << objective;
    EXPECT_EQ(head, !inside) << objective;
  }
}

// The stream engine's logits chunk is at most its query chunk (the top layer runs the head on
// a chunk's rows), on every path, so that its memory estimate does not depend on the
// objective; checkpoint:tiled keeps the logits chunk it is given.
TEST(StreamTopLayer, LogitsChunkIsAtMostTheQueryChunk) {
  const auto config = testing::TinyConfig("qwen3");
  EXPECT_EQ(ResolveChunks({EngineKind::kStream, 64, 512}, 1000, config, torch::kFloat32).logits_chunk, 64);
  EXPECT_EQ(ResolveChunks({EngineKind::kStream, 64, 0}, 1000, config, torch::kFloat32).logits_chunk, 64);
  EXPECT_EQ(ResolveChunks({EngineKind::kStream, 64, 16}, 1000, config, torch::kFloat32).logits_chunk, 16);
  EngineOptions tiled{EngineKind::kCheckpoint, 64, 512};
  tiled.tiled_attention = true;
  EXPECT_EQ(ResolveChunks(tiled, 1000, config, torch::kFloat32).logits_chunk, 512);
}

}  // namespace
}  // namespace streambp
