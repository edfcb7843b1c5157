// CUDA builds only: the caching allocator's device statistics and memory fraction for
// streambp-bench (bench/device_memory.cpp). Kept apart: these headers exist only in a CUDA
// LibTorch, and their namespaces moved between versions.
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/version.h>

namespace streambp::bench {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

auto Allocated(int device) {
  const auto stats = cca::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[0];  // StatType::AGGREGATE
}

}  // namespace

int64_t CudaAllocatedBytes(int device) { return Allocated(device).current; }
int64_t CudaPeakAllocatedBytes(int device) { return Allocated(device).peak; }
void CudaResetPeak(int device) { cca::resetPeakStats(static_cast<c10::DeviceIndex>(device)); }
int64_t CudaTotalBytes(int device) {
  return static_cast<int64_t>(at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device))->totalGlobalMem);
}
void CudaSetMemoryFraction(double fraction, int device) {
  cca::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
}
void CudaReleaseCache() { cca::emptyCache(); }

std::string CudaDescribe(int device) {
  const auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  return std::string(p->name) + " (sm_" + std::to_string(p->major) + std::to_string(p->minor) + ", " +
         std::to_string(p->multiProcessorCount) + " SMs, " + std::to_string(p->totalGlobalMem >> 20) +
         " MiB), CUDA runtime " + version(runtime) + ", driver API " + version(driver);
}

}  // namespace streambp::bench
