// The tracking allocator counts tensor bytes and enforces a budget like a GPU OOM.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "streambp/engine.h"
#include "streambp/gradients.h"
#include "streambp/memory.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

class TrackingAllocator : public ::testing::Test {
 protected:
  void SetUp() override { memory::InstallTrackingAllocator(); }
};

TEST_F(TrackingAllocator, CountsLiveAndPeakBytes) {
  ASSERT_TRUE(memory::TrackingInstalled());
  const int64_t base = memory::LiveBytes();
  memory::ResetPeak();
  {
    auto a = torch::empty({1024, 1024}, torch::kFloat32);  // 4 MiB
    EXPECT_GE(memory::LiveBytes() - base, 4 * 1024 * 1024);
    {
      auto b = torch::empty({512, 1024}, torch::kFloat64);  // 4 MiB more
      EXPECT_GE(memory::LiveBytes() - base, 8 * 1024 * 1024);
    }
    EXPECT_LT(memory::LiveBytes() - base, 8 * 1024 * 1024);
  }
  EXPECT_EQ(memory::LiveBytes(), base);
  EXPECT_GE(memory::PeakBytes() - base, 8 * 1024 * 1024);
  memory::ResetPeak();
  EXPECT_EQ(memory::PeakBytes(), memory::LiveBytes());
}

TEST_F(TrackingAllocator, BudgetFailsLikeAnOutOfMemoryAndRecovers) {
  const int64_t base = memory::LiveBytes();
  {
    memory::ScopedBudget budget(base + 2 * 1024 * 1024);
    auto small = torch::empty({1024}, torch::kFloat32);
    try {
      auto big = torch::empty({1024, 1024}, torch::kFloat32);
      FAIL() << "expected an out-of-memory error";
    } catch (const c10::OutOfMemoryError& e) {
      EXPECT_NE(std::string(e.what()).find("memory budget exceeded"), std::string::npos);
    }
    EXPECT_LT(memory::LiveBytes() - base, 1024 * 1024);  // the failed allocation is not counted
  }
  EXPECT_EQ(memory::Budget(), 0);
  auto big = torch::empty({1024, 1024}, torch::kFloat32);  // fine again without the budget
  EXPECT_EQ(big.numel(), 1024 * 1024);
}

TEST_F(TrackingAllocator, StepUnderTooSmallBudgetThrowsAndModelIsUnchanged) {
  auto model = InitModel(PresetConfig("tiny"), 0, torch::kFloat32);
  auto before = model->hf_tensors();
  auto batch = MakeBatch(testing::RandomSequences({512}, 256, 1), Layout::kRightPad);
  auto objective = MakeSftObjective({});
  {
    memory::ScopedBudget budget(memory::LiveBytes() + 1024 * 1024);
    EXPECT_THROW(ForwardBackward(model, batch, *objective, {EngineKind::kFull}), c10::OutOfMemoryError);
  }
  ZeroGradients(*model);
  for (const auto& [name, t] : model->hf_tensors()) EXPECT_TRUE(torch::equal(t, before.at(name))) << name;
  // The same step fits without the budget.
  EXPECT_NO_THROW(ForwardBackward(model, batch, *objective, {EngineKind::kStream}));
  ZeroGradients(*model);
}

}  // namespace
}  // namespace streambp
