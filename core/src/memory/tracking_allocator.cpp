// A CPU allocator that counts live and peak bytes of every tensor allocation and can
// enforce a budget (docs/architecture.md: Measuring). Inside a step (ScopedCache) freed blocks are kept by size
// and handed to the next allocation of the same size: the engines allocate the same shapes
// chunk after chunk and layer after layer, and a fresh block from the OS costs a page fault
// per 4 KiB on its first touch (about a million per step at T=4096 on the small preset).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include "streambp/memory.h"

namespace streambp::memory {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_budget{0};
std::atomic<bool> g_installed{false};
std::atomic<int64_t> g_cached{0};
std::atomic<int64_t> g_reuses{0};

// Each block carries its size in a header just before the data, so that the DataPtr's
// context is the data pointer itself: LibTorch's raw_allocate()/raw_deleter() path (used
// by some kernels, e.g. bfloat16 GEMM) requires context == data.
constexpr size_t kHeader = 64;  // keeps the data at alloc_cpu's 64-byte alignment

// Blocks smaller than this come from malloc's heap, which reuses them without new faults.
constexpr int64_t kCacheMinBytes = 64 * 1024;

// The freed blocks kept while a ScopedCache is open, by requested size. Not counted in
// LiveBytes (they hold no tensor), so budgets and peaks are unchanged.
struct Cache {
  std::mutex mu;
  int scopes = 0;
  int unbounded = 0;     // open scopes without a bound of their own
  int64_t bounds = 0;    // the sum of the open scopes' bounds
  int64_t limit = 0;
  std::unordered_map<int64_t, std::vector<char*>> free;
  int64_t keep_at_most() const { return unbounded > 0 ? limit : std::min(limit, bounds); }
};

Cache& TheCache() {
  static Cache* cache = [] {
    auto* c = new Cache();  // never destroyed: tensors may be freed during static destruction
    const char* env = std::getenv("STREAMBP_CPU_CACHE_BYTES");
    c->limit = env != nullptr && *env != '\0' ? std::max<int64_t>(0, std::atoll(env)) : kDefaultCacheBytes;
    return c;
  }();
  return *cache;
}

char* TakeCached(int64_t bytes) {
  if (bytes < kCacheMinBytes || g_cached.load(std::memory_order_relaxed) == 0) return nullptr;
  auto& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.free.find(bytes);
  if (it == c.free.end() || it->second.empty()) return nullptr;
  char* base = it->second.back();
  it->second.pop_back();
  g_cached.fetch_sub(bytes, std::memory_order_relaxed);
  g_reuses.fetch_add(1, std::memory_order_relaxed);
  return base;
}

bool KeepCached(char* base, int64_t bytes) {
  if (bytes < kCacheMinBytes) return false;
  auto& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.scopes == 0 || g_cached.load(std::memory_order_relaxed) + bytes > c.keep_at_most()) return false;
  c.free[bytes].push_back(base);
  g_cached.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void Release(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  g_live.fetch_sub(bytes, std::memory_order_relaxed);
  if (!KeepCached(base, bytes)) c10::free_cpu(base);
}

void RaisePeak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

std::string Mib(int64_t bytes) {
  return std::to_string(bytes / (1024 * 1024)) + " MiB";
}

class TrackingAllocator final : public c10::Allocator {
 public:
  // LibTorch 2.x: allocate() is no longer const, and copy_data() is pure virtual.
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    const auto bytes = static_cast<int64_t>(n);
    const int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const int64_t budget = g_budget.load(std::memory_order_relaxed);
    if (budget > 0 && live > budget) {
      g_live.fetch_sub(bytes, std::memory_order_relaxed);
      C10_THROW_ERROR(OutOfMemoryError,
                      "memory budget exceeded: allocating " + std::to_string(bytes) + " bytes with " +
                          std::to_string(live - bytes) + " bytes live would pass the budget of " +
                          std::to_string(budget) + " bytes (" + Mib(budget) + ")");
    }
    char* base = TakeCached(bytes);
    if (base == nullptr) {
      try {
        base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
      } catch (...) {
        g_live.fetch_sub(bytes, std::memory_order_relaxed);
        throw;
      }
      std::memcpy(base, &bytes, sizeof bytes);
    }
    RaisePeak(live);
    void* data = base + kHeader;
    return {data, data, &Release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif
};

TrackingAllocator& Instance() {
  static TrackingAllocator allocator;
  return allocator;
}

}  // namespace

void InstallTrackingAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Priority above the default registration so that no later default replaces it.
    c10::SetCPUAllocator(&Instance(), /*priority=*/100);
    g_installed = true;
  });
}

bool TrackingInstalled() { return g_installed.load(); }
int64_t LiveBytes() { return g_live.load(std::memory_order_relaxed); }
int64_t PeakBytes() { return g_peak.load(std::memory_order_relaxed); }
void ResetPeak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
void SetBudget(int64_t bytes) { g_budget.store(bytes < 0 ? 0 : bytes, std::memory_order_relaxed); }
int64_t Budget() { return g_budget.load(std::memory_order_relaxed); }
int64_t CachedBytes() { return g_cached.load(std::memory_order_relaxed); }
int64_t CacheReuses() { return g_reuses.load(std::memory_order_relaxed); }

int64_t CacheLimit() {
  auto& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.limit;
}

void SetCacheLimit(int64_t bytes) {
  auto& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.limit = std::max<int64_t>(0, bytes);
}

ScopedCache::ScopedCache(int64_t bound) : bound_(bound) {
  auto& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.scopes;
  if (bound_ < 0) {
    ++c.unbounded;
  } else {
    c.bounds += bound_;
  }
}

ScopedCache::~ScopedCache() {
  std::vector<char*> blocks;
  {
    auto& c = TheCache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (bound_ < 0) {
      --c.unbounded;
    } else {
      c.bounds -= bound_;
    }
    if (--c.scopes > 0) return;
    for (auto& [bytes, list] : c.free) {
      blocks.insert(blocks.end(), list.begin(), list.end());
      g_cached.fetch_sub(bytes * static_cast<int64_t>(list.size()), std::memory_order_relaxed);
    }
    c.free.clear();
  }
  for (char* base : blocks) c10::free_cpu(base);
}

}  // namespace streambp::memory
