// What an objective's chunk holds at the head. Every built-in objective takes log p(target)
// from a chunk's logits as gather - logsumexp; the order of the two decides whether the
// gather's B x c x V gradient waits beside logsumexp's backward temporaries (autograd runs the
// later node first). DPO and GRPO made them in the other order than SFT and held one logits
// chunk more at the step's peak (docs/results.md: The default chunk sizes).
#include <gtest/gtest.h>

#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "test_util/fixtures.h"
#include "test_util/objective_steps.h"

namespace streambp {
namespace {

TEST(HeadMemory, ObjectivesHoldNoMoreLogitsThanSft) {
  memory::InstallTrackingAllocator();
  RegisterBuiltinObjectives();
  const auto config = PresetConfig("tiny");
  auto model = testing::RandomModel(config, 11, torch::kFloat32);
  // Two rows of 96 tokens, the head over all 96 positions at once: its logits set the peak.
  const int64_t T = 96;
  const EngineOptions options{EngineKind::kStream, T, T, false, 16};  // a logits chunk is at most a query chunk
  const int64_t logits_bytes = 2 * T * config.vocab_size * 4;
  auto rows = [&](const std::string& objective) {
    auto seqs = testing::RandomSequences({T, T}, config.vocab_size, 4);
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].group = 0;
      if (objective == "dpo") {
        seqs[i].role = static_cast<int>(i);
        seqs[i].ref_logp = -5.0 - static_cast<double>(i);
      } else if (objective == "grpo") {
        seqs[i].reward = static_cast<double>(i);
      }
    }
    if (objective == "sft") {
      for (auto& s : seqs) s.group = -1;
    }
    return MakeBatch(seqs, Layout::kRightPad);
  };
  const int64_t sft = testing::TrackedObjectivePeak(model, rows("sft"), "sft", options);
  ASSERT_GT(sft, 3 * logits_bytes) << "the head must set the peak for this test";
  for (const char* objective : {"dpo", "grpo"}) {
    const int64_t peak = testing::TrackedObjectivePeak(model, rows(objective), objective, options);
    // Small per-row state aside (sums, weights, metrics), no logits-sized tensor more.
    EXPECT_LT(peak - sft, logits_bytes / 4) << objective << ": " << peak << " vs sft " << sft << " bytes (logits "
                                            << logits_bytes << ")";
  }
}

}  // namespace
}  // namespace streambp
