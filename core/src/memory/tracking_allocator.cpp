// A CPU allocator that counts live and peak bytes of every tensor allocation and can
// enforce a budget (DESIGN §9).
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include "streambp/memory.h"

namespace streambp::memory {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_budget{0};
std::atomic<bool> g_installed{false};

// Each block carries its size in a header just before the data, so that the DataPtr's
// context is the data pointer itself: LibTorch's raw_allocate()/raw_deleter() path (used
// by some kernels, e.g. bfloat16 GEMM) requires context == data.
constexpr size_t kHeader = 64;  // keeps the data at alloc_cpu's 64-byte alignment

void Release(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  c10::free_cpu(base);
  g_live.fetch_sub(bytes, std::memory_order_relaxed);
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
  c10::DataPtr allocate(size_t n) const override {
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
    char* base = nullptr;
    try {
      base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    } catch (...) {
      g_live.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
    std::memcpy(base, &bytes, sizeof bytes);
    RaisePeak(live);
    void* data = base + kHeader;
    return {data, data, &Release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
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

}  // namespace streambp::memory
