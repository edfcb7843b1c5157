#pragma once
/// What the process runs on: LibTorch version, BLAS library, threads. Everything that
/// reports speed reports this too (docs/architecture.md: Build and runtime).
#include <string>

namespace streambp {

struct RuntimeInfo {
  std::string torch_version;  ///< e.g. "1.13.1"
  std::string blas;           ///< resolved path of the BLAS library loaded in this process
  int threads = 0;            ///< LibTorch intra-op threads
  bool cuda = false;          ///< built with CUDA and a device is available
  std::string describe() const;  ///< one line for logs and reports
};

RuntimeInfo GetRuntimeInfo();

/// The thread count `threads = 0` means: OMP_NUM_THREADS when it is a positive integer (as
/// PyTorch reads it), else the CPUs this process may run on: the cores, at most its affinity
/// mask's CPUs and its cgroup's CPU quota (rounded up). A container limited to 4 CPUs on a
/// 64-core node gets 4 threads, not 64 that would wait on each other at every op.
int DefaultThreads();

/// CPUs a cgroup CPU quota allows, rounded up; 0 for no quota. `quota` is cgroup v2's first
/// cpu.max field ("max" = none) or v1's cpu.cfs_quota_us ("-1" = none), `period` the
/// matching period in microseconds.
int CpuQuotaCores(const std::string& quota, const std::string& period);

/// Sets LibTorch's intra-op threads (0 = DefaultThreads()).
void ConfigureThreads(int threads);

}  // namespace streambp
