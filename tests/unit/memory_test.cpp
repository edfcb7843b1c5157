// The tracking allocator counts tensor bytes and enforces a budget like a GPU OOM.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <map>
#include <string>

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


// Inside a ScopedCache a freed block is handed to the next allocation of its size (the same
// address, no fresh pages); the cached bytes are not live, the limit holds, and closing the
// scope frees them. Outside a scope nothing is kept.
TEST_F(TrackingAllocator, ScopedCacheReusesBlocksBySizeAndFreesThemOnClose) {
  const int64_t base = memory::LiveBytes();
  ASSERT_EQ(memory::CachedBytes(), 0);
  const int64_t block = 1024 * 1024 * 4;  // a 1M-float tensor
  { auto a = torch::empty({1024, 1024}, torch::kFloat32); }
  EXPECT_EQ(memory::CachedBytes(), 0);  // no scope: freed at once
  const int64_t limit = memory::CacheLimit();
  memory::SetCacheLimit(3 * block / 2);
  {
    memory::ScopedCache cache;
    void* kept = nullptr;
    {
      auto a = torch::empty({1024, 1024}, torch::kFloat32);
      auto b = torch::empty({1024, 1024}, torch::kFloat32);
      kept = b.data_ptr();  // b is destroyed first (reverse order) and kept; a would pass the limit
    }
    EXPECT_EQ(memory::CachedBytes(), block);
    EXPECT_EQ(memory::LiveBytes(), base);
    memory::ResetPeak();
    {
      auto small = torch::empty({1000}, torch::kFloat32);       // under 64 KiB: never cached
      auto other = torch::empty({512, 1024}, torch::kFloat32);  // another size: a fresh block
      EXPECT_EQ(memory::CachedBytes(), block);
      auto again = torch::ones({1024, 1024}, torch::kFloat32);  // the cached block, reused
      EXPECT_EQ(again.data_ptr(), kept);
      EXPECT_EQ(memory::CachedBytes(), 0);
      EXPECT_EQ(memory::LiveBytes() - base, block + block / 2 + 4000);
      EXPECT_EQ(memory::PeakBytes() - base, block + block / 2 + 4000);
      EXPECT_EQ(again.sum().item<double>(), 1024.0 * 1024.0);
    }
    { memory::ScopedCache nested; }  // nested scopes: only the outermost one frees
    EXPECT_GT(memory::CachedBytes(), 0);
  }
  EXPECT_EQ(memory::CachedBytes(), 0);
  EXPECT_EQ(memory::LiveBytes(), base);
  memory::SetCacheLimit(0);  // off: nothing kept even inside a scope
  {
    memory::ScopedCache cache;
    { auto a = torch::empty({1024, 1024}, torch::kFloat32); }
    EXPECT_EQ(memory::CachedBytes(), 0);
  }
  memory::SetCacheLimit(limit);
}

// A step opens the cache for itself: afterwards nothing is cached and every tensor of the
// step is freed, and the gradients equal those of a step with the cache off.
TEST_F(TrackingAllocator, StepLeavesNothingCachedAndCacheChangesNoBits) {
  auto model = InitModel(PresetConfig("tiny"), 3, torch::kFloat32);
  auto batch = MakeBatch(testing::RandomSequences({300, 200}, 256, 2), Layout::kRightPad);
  auto objective = MakeSftObjective({});
  const int64_t limit = memory::CacheLimit();
  auto grads_with = [&](int64_t cache_limit) {
    memory::SetCacheLimit(cache_limit);
    ZeroGradients(*model);
    EngineOptions options{EngineKind::kStream};
    options.chunk = 64;
    options.key_chunk = 64;
    const int64_t reuses = memory::CacheReuses();
    auto result = ForwardBackward(model, batch, *objective, options);
    EXPECT_EQ(memory::CachedBytes(), 0);
    if (cache_limit > 0) {
      EXPECT_GT(memory::CacheReuses(), reuses);  // chunk after chunk, the same shapes
    } else {
      EXPECT_EQ(memory::CacheReuses(), reuses);
    }
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().clone();
    return std::make_pair(result.loss, grads);
  };
  const auto [loss_on, on] = grads_with(int64_t{64} << 20);
  const auto [loss_off, off] = grads_with(0);
  memory::SetCacheLimit(limit);
  ZeroGradients(*model);
  EXPECT_EQ(loss_on, loss_off);
  ASSERT_EQ(on.size(), off.size());
  for (const auto& [name, g] : on) EXPECT_TRUE(torch::equal(g, off.at(name))) << name;
}

}  // namespace
}  // namespace streambp
