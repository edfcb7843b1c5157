// The tracking allocator counts tensor bytes and enforces a budget like a GPU OOM.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>
#include <string>

#include "streambp/engine.h"
#include "streambp/estimate.h"
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

// A scope may bound what it keeps: bounded scopes add their bounds up (under the limit), an
// unbounded one leaves the limit in force, and closing a scope takes its bound away.
TEST_F(TrackingAllocator, ScopedCacheBoundsAddUpUnderTheLimit) {
  const int64_t block = 1024 * 1024 * 4, limit = memory::CacheLimit();
  memory::SetCacheLimit(3 * block);
  auto free_blocks = [](int n) {
    std::vector<torch::Tensor> t;
    for (int i = 0; i < n; ++i) t.push_back(torch::empty({1024, 1024 + i}, torch::kFloat32));  // distinct sizes
  };
  {
    memory::ScopedCache one(block + block / 2);
    free_blocks(4);
    EXPECT_EQ(memory::CachedBytes() / 1024, block / 1024);  // one block, not a second
    {
      memory::ScopedCache two(block + block / 2);  // 3 blocks' worth in all, within the limit
      free_blocks(4);
      EXPECT_GE(memory::CachedBytes(), 2 * block);
      EXPECT_LE(memory::CachedBytes(), 3 * block);
    }
    {
      memory::ScopedCache unbounded;
      free_blocks(4);
      EXPECT_GT(memory::CachedBytes(), 2 * block);  // the limit, not the bounds
      EXPECT_LE(memory::CachedBytes(), 3 * block);
    }
  }
  EXPECT_EQ(memory::CachedBytes(), 0);
  {
    memory::ScopedCache none(0);  // a zero bound keeps nothing
    free_blocks(2);
    EXPECT_EQ(memory::CachedBytes(), 0);
  }
  memory::SetCacheLimit(limit);
}

// A step bounds its cache by its estimated activation: with the limit far above it, the bytes
// kept during a stream step never pass the estimate. Key tiles of 100 over chunks of 48 give
// a last tile of a new width at almost every chunk, blocks that do not come back: unbounded,
// the cache held 11.6 MiB here against a 9.1 MiB estimate.
TEST_F(TrackingAllocator, StepCachesNoMoreThanItsEstimatedActivation) {
  auto model = InitModel(PresetConfig("tiny"), 3, torch::kFloat32);
  auto batch = MakeBatch(testing::RandomSequences({1500, 1400, 1300, 1200}, 256, 4), Layout::kRightPad);
  auto objective = MakeSftObjective({});
  const int64_t limit = memory::CacheLimit();
  memory::SetCacheLimit(int64_t{1} << 30);
  EngineOptions options{EngineKind::kStream};
  options.chunk = 48;
  options.key_chunk = 100;
  const int64_t bound =
      EstimateStepMemory(model->config(), torch::kFloat32, batch.rows(), batch.length(), options, "none").activation_bytes;
  int64_t most = 0;
  options.on_progress = [&](const EngineProgress&) { most = std::max(most, memory::CachedBytes()); };
  const int64_t reuses = memory::CacheReuses();
  ForwardBackward(model, batch, *objective, options);
  memory::SetCacheLimit(limit);
  ZeroGradients(*model);
  EXPECT_GT(memory::CacheReuses(), reuses);
  EXPECT_GT(most, 0);
  EXPECT_LE(most, bound);
  EXPECT_EQ(memory::CachedBytes(), 0);
  std::printf("cached at most %.2f MiB of a %.2f MiB estimated activation\n", most / 1048576.0, bound / 1048576.0);
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

// The offload tier's pinned buffers on a GPU go through HostBufferCache (cudaHostAlloc there);
// its rules are the same with any allocator, counted here with malloc.
namespace host_buffers {
int allocated = 0, released = 0;
bool fail = false;
void* Allocate(int64_t bytes) {
  if (fail) return nullptr;
  ++allocated;
  return std::malloc(static_cast<size_t>(bytes));
}
void Release(void* p) {
  ++released;
  std::free(p);
}
}  // namespace host_buffers

TEST(HostBufferCache, AStepOfTheSameLengthReusesTheLastStepsBuffers) {
  using namespace host_buffers;
  allocated = released = 0;
  fail = false;
  {
    streambp::memory::HostBufferCache cache(Allocate, Release);
    // The first step: nothing kept, three buffers allocated, given back at its end.
    EXPECT_EQ(cache.Prepare(1000), 0);
    std::vector<void*> step;
    for (int i = 0; i < 3; ++i) step.push_back(cache.Take(1000));
    EXPECT_EQ(allocated, 3);
    for (void* p : step) cache.Give(p, 1000);
    EXPECT_EQ(cache.kept_bytes(), 3000);
    EXPECT_EQ(released, 0);
    // The next step of the same length: all three reused, none allocated; a fourth is new.
    EXPECT_EQ(cache.Prepare(1000), 3000);
    std::vector<void*> again;
    for (int i = 0; i < 4; ++i) again.push_back(cache.Take(1000));
    EXPECT_EQ(allocated, 4);
    EXPECT_EQ(cache.allocations(), 4);
    for (void* p : step) EXPECT_NE(std::find(again.begin(), again.end(), p), again.end());
    EXPECT_EQ(cache.kept_bytes(), 0);
    for (void* p : again) cache.Give(p, 1000);
    // A step of another length gets the host's memory back before it looks at it.
    EXPECT_EQ(cache.Prepare(2000), 0);
    EXPECT_EQ(released, 4);
    EXPECT_EQ(cache.kept_bytes(), 0);
    void* big = cache.Take(2000);
    EXPECT_EQ(allocated, 5);
    cache.Give(big, 2000);
    // A failed allocation is reported (the step refuses with the numbers) and changes nothing.
    fail = true;
    EXPECT_EQ(cache.Take(3000), nullptr);
    EXPECT_EQ(cache.kept_bytes(), 2000);
    EXPECT_EQ(cache.allocations(), 5);
    fail = false;
    // Giving back buffers of another size frees the kept ones first: one size at a time.
    void* other = cache.Take(500);
    cache.Give(other, 500);
    EXPECT_EQ(released, 5);
    EXPECT_EQ(cache.kept_bytes(), 500);
  }
  EXPECT_EQ(released, 6);  // what it kept is released with it
  EXPECT_EQ(allocated, released);
}

TEST(HostBufferCache, KeepFalseReleasesEveryBufferWithItsStep) {
  using namespace host_buffers;
  allocated = released = 0;
  fail = false;
  streambp::memory::HostBufferCache cache(Allocate, Release, /*keep=*/false);
  void* p = cache.Take(1000);
  cache.Give(p, 1000);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(cache.kept_bytes(), 0);
  EXPECT_EQ(cache.Prepare(1000), 0);
  cache.Give(nullptr, 1000);  // a slot never pinned
  EXPECT_EQ(released, 1);
}
