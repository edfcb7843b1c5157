#pragma once
/// Allocation tracking for CPU tensors (DESIGN §9): a c10 CPU allocator that counts live
/// and peak bytes of every tensor allocation, with an optional budget past which an
/// allocation fails with c10::OutOfMemoryError, as a GPU out-of-memory would.
/// Thread-safe. Install it once, before the tensors to be measured are allocated
/// (tensors allocated earlier are simply not counted).
#include <cstdint>

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

}  // namespace streambp::memory
