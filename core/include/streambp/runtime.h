#pragma once
/// What the process runs on: LibTorch version, BLAS library, threads. Everything that
/// reports speed reports this too (docs/architecture.md: Build and runtime).
#include <string>

namespace streambp {

struct RuntimeInfo {
  std::string torch_version;  ///< e.g. "1.13.1"
  std::string blas;           ///< resolved path of the BLAS library loaded in this process
  std::string blas_core;      ///< OpenBLAS's kernel set ("SkylakeX", "Haswell", ...); "" for another BLAS
  std::string blas_fallback;  ///< the kernels OpenBLAS picked by itself where UseCpuBlasKernels replaced them
  std::string softmax_rows;   ///< the version of attention's fused softmax passes: avx512f | avx2+fma | baseline
  int threads = 0;            ///< LibTorch intra-op threads
  bool cuda = false;          ///< built with CUDA and a device is available
  std::string describe() const;  ///< one line for logs and reports
  std::string blas_kernels() const;  ///< `blas`, with the kernel set where it is OpenBLAS
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

/// OpenBLAS (built for many CPUs) chooses its kernels from the CPU's model number when it
/// loads; on a model newer than the library it falls back to kernels without AVX2 (0.3.21,
/// Debian 12's, runs "Prescott" SSE3 kernels on Emerald Rapids Xeons: a 2048^3 float32 product
/// at 50 GFLOP/s on two cores where its AVX-512 kernels reach 200). The kernels to ask for
/// instead, from what OpenBLAS chose and what the CPU runs: "SkylakeX" with AVX-512
/// (F, CD, BW, DQ, VL), else "Haswell" with AVX2 and FMA; "" where OpenBLAS's choice stands
/// (it already uses AVX2, or the CPU has nothing better).
std::string BetterOpenBlasCore(const std::string& chosen, bool avx2_fma, bool avx512);

/// The kernel set of the OpenBLAS this process runs ("" for another BLAS).
std::string OpenBlasCore();

/// First thing in main(): where OpenBLAS fell back to slower kernels than this CPU runs and
/// OPENBLAS_CORETYPE is unset, sets OPENBLAS_CORETYPE to BetterOpenBlasCore's choice and
/// re-executes the program with the same arguments (the PID stays; OpenBLAS reads the
/// variable only when it loads). Returns everywhere else. Any OPENBLAS_CORETYPE the user sets
/// is kept as it is (docs/operations.md: Metrics, logs, health, "OpenBLAS's kernels for the CPU").
void UseCpuBlasKernels(char** argv);

}  // namespace streambp
