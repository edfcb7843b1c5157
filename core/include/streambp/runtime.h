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
/// PyTorch reads it), else the number of cores.
int DefaultThreads();

/// Sets LibTorch's intra-op threads (0 = DefaultThreads()).
void ConfigureThreads(int threads);

}  // namespace streambp
