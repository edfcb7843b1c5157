#include "cpu_threads.h"

#include <algorithm>

namespace streambp {

int64_t CpuSplitThreads(const torch::Device& device) {
#ifndef _OPENMP
  (void)device;
  return 1;
#else
  if (!device.is_cpu() || at::in_parallel_region()) return 1;
  return std::max<int64_t>(1, at::get_num_threads());
#endif
}

}  // namespace streambp
