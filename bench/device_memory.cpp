// The measuring device's memory: the CPU's tracking allocator, or (CUDA builds) the CUDA
// caching allocator's device statistics (bench/cuda_memory.cpp).
#include <torch/torch.h>

#include "bench.h"
#include "streambp/error.h"
#include "streambp/memory.h"

namespace streambp::bench {

#if defined(STREAMBP_WITH_CUDA)
// bench/cuda_memory.cpp
int64_t CudaAllocatedBytes(int device);
int64_t CudaPeakAllocatedBytes(int device);
void CudaResetPeak(int device);
int64_t CudaTotalBytes(int device);
void CudaSetMemoryFraction(double fraction, int device);
void CudaReleaseCache();
std::string CudaDescribe(int device);
#endif

namespace {

[[maybe_unused]] int Index(const torch::Device& d) { return d.has_index() ? d.index() : 0; }

[[noreturn]] void NoCuda() {
  throw InvalidArgument("streambp-bench: --device cuda needs a CUDA build (cmake -DSTREAMBP_WITH_CUDA=ON, "
                        "docs/development.md)");
}

}  // namespace

int64_t DeviceMemory::live() const {
  if (device.is_cpu()) return memory::LiveBytes();
#if defined(STREAMBP_WITH_CUDA)
  return CudaAllocatedBytes(Index(device));
#else
  NoCuda();
#endif
}

int64_t DeviceMemory::peak() const {
  if (device.is_cpu()) return memory::PeakBytes();
#if defined(STREAMBP_WITH_CUDA)
  return CudaPeakAllocatedBytes(Index(device));
#else
  NoCuda();
#endif
}

void DeviceMemory::reset_peak() const {
  if (device.is_cpu()) return memory::ResetPeak();
#if defined(STREAMBP_WITH_CUDA)
  CudaResetPeak(Index(device));
#else
  NoCuda();
#endif
}

int64_t DeviceMemory::total() const {
  if (device.is_cpu()) return 0;
#if defined(STREAMBP_WITH_CUDA)
  return CudaTotalBytes(Index(device));
#else
  NoCuda();
#endif
}

std::string DeviceMemory::describe() const {
  if (device.is_cpu()) return "cpu";
#if defined(STREAMBP_WITH_CUDA)
  return CudaDescribe(Index(device));
#else
  NoCuda();
#endif
}

void DeviceMemory::synchronize() const {
#if defined(STREAMBP_WITH_CUDA)
  if (device.is_cuda()) torch::cuda::synchronize(Index(device));
#endif
}

void DeviceMemory::release_cached() const {
#if defined(STREAMBP_WITH_CUDA)
  if (device.is_cuda()) {
    synchronize();
    CudaReleaseCache();
  }
#endif
}

DeviceMemory::Budget::Budget(const DeviceMemory& memory, int64_t bytes) : memory_(memory) {
  if (memory_.device.is_cpu()) {
    previous_ = memory::Budget();
    memory::SetBudget(bytes);
    return;
  }
#if defined(STREAMBP_WITH_CUDA)
  // The caching allocator refuses to reserve more than a fraction of the device: the budget.
  // Cached blocks count against it, so they are given back first.
  memory_.release_cached();
  const double total = static_cast<double>(memory_.total());
  CudaSetMemoryFraction(bytes > 0 ? std::min(1.0, static_cast<double>(bytes) / total) : 1.0, Index(memory_.device));
#else
  NoCuda();
#endif
}

DeviceMemory::Budget::~Budget() {
  if (memory_.device.is_cpu()) {
    memory::SetBudget(previous_);
    return;
  }
#if defined(STREAMBP_WITH_CUDA)
  try {
    memory_.release_cached();
    CudaSetMemoryFraction(1.0, Index(memory_.device));
  } catch (...) {
  }
#endif
}

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  // cuBLAS and cuDNN report a failed workspace allocation as their own status, not as the
  // caching allocator's OutOfMemoryError.
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("ALLOC_FAILED") != std::string::npos;
}

}  // namespace streambp::bench
