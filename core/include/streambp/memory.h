#pragma once
/// Allocation tracking for CPU tensors (docs/architecture.md: Measuring): a c10 CPU allocator that counts live
/// and peak bytes of every tensor allocation, with an optional budget past which an
/// allocation fails with c10::OutOfMemoryError, as a GPU out-of-memory would.
/// Thread-safe. Install it once, before the tensors to be measured are allocated
/// (tensors allocated earlier are simply not counted).
#include <cstdint>
#include <mutex>
#include <vector>

namespace streambp::memory {

/// Installs the tracking allocator as LibTorch's CPU allocator. Idempotent.
void InstallTrackingAllocator();
bool TrackingInstalled();

int64_t LiveBytes();  ///< bytes of tracked allocations alive now
int64_t PeakBytes();  ///< highest LiveBytes() since the last ResetPeak()
void ResetPeak();     ///< peak := live

/// Allocations that would take LiveBytes() past `bytes` fail (0 = no budget).
void SetBudget(int64_t bytes);
int64_t Budget();

/// Block cache. While a ScopedCache is open (the engines open one per step), freed blocks
/// of 64 KiB or more are kept by size, up to CacheLimit() bytes, and reused by the next
/// allocation of the same size instead of fresh pages from the OS; when the last scope
/// closes they are freed. Cached blocks hold no tensor: LiveBytes, PeakBytes and budgets
/// do not count them (the process's RSS does, by at most the limit).
/// The default limit is kDefaultCacheBytes; the environment variable
/// STREAMBP_CPU_CACHE_BYTES sets another (0 turns the cache off). A scope may bound what it
/// keeps (a step: its estimated activation, which is all it can reuse); open scopes' bounds
/// add up, and an unbounded open scope leaves the limit alone.
inline constexpr int64_t kDefaultCacheBytes = int64_t{256} << 20;
int64_t CachedBytes();  ///< bytes of freed blocks kept now
int64_t CacheReuses();  ///< allocations served from the cache since the start
int64_t CacheLimit();
void SetCacheLimit(int64_t bytes);

class ScopedCache {
 public:
  /// bound < 0: no bound of its own (CacheLimit() holds).
  explicit ScopedCache(int64_t bound = -1);
  ~ScopedCache();
  ScopedCache(const ScopedCache&) = delete;
  ScopedCache& operator=(const ScopedCache&) = delete;

 private:
  int64_t bound_;
};

/// Sets a budget for a scope and restores the previous one on exit.
class ScopedBudget {
 public:
  explicit ScopedBudget(int64_t bytes) : previous_(Budget()) { SetBudget(bytes); }
  ~ScopedBudget() { SetBudget(previous_); }
  ScopedBudget(const ScopedBudget&) = delete;
  ScopedBudget& operator=(const ScopedBudget&) = delete;

 private:
  int64_t previous_;
};

/// Host buffers of one size kept from one step to the next: the offload tier's pinned buffers
/// on a GPU, whose page-locking costs the kernel about a second per GiB (130 s for the 104 GiB
/// of a 376832-token Qwen3-8B step on the H200: docs/gpu.md), so that a run of steps of one
/// length pins them once. A step takes what it needs and gives it back when it ends. Buffers
/// of another size are freed first (Prepare, Give): a step of another length gets the host's
/// memory back before it checks how much there is. Thread-safe.
class HostBufferCache {
 public:
  using Allocate = void* (*)(int64_t bytes);  ///< nullptr when it fails
  using Release = void (*)(void* buffer);
  /// keep = false: Give releases at once (nothing is kept between steps).
  HostBufferCache(Allocate allocate, Release release, bool keep = true);
  ~HostBufferCache();  ///< releases what it keeps
  HostBufferCache(const HostBufferCache&) = delete;
  HostBufferCache& operator=(const HostBufferCache&) = delete;

  /// Releases the kept buffers unless they are `bytes` each; returns the bytes kept after.
  int64_t Prepare(int64_t bytes);
  /// A kept buffer of `bytes` if there is one, else a new one (nullptr when that fails).
  void* Take(int64_t bytes);
  /// Keeps `buffer` (of `bytes`) for a later Take.
  void Give(void* buffer, int64_t bytes);
  /// Releases every kept buffer.
  void Clear();
  int64_t kept_bytes() const;
  int64_t allocations() const;  ///< buffers allocated (not reused) since construction

 private:
  void ReleaseKeptLocked();
  Allocate allocate_;
  Release release_;
  bool keep_;
  mutable std::mutex mutex_;
  std::vector<void*> kept_;
  int64_t size_ = 0;
  int64_t allocations_ = 0;
};

}  // namespace streambp::memory
