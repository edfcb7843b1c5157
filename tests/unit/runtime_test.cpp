// Thread configuration: `threads = 0` follows OMP_NUM_THREADS, so a test runner or launcher
// that runs several processes on the same cores can keep them from oversubscribing, and
// otherwise never exceeds the CPUs the process may run on (affinity, cgroup quota).
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "streambp/runtime.h"

namespace streambp {
namespace {

// Sets OMP_NUM_THREADS for one scope and puts back what was there (and LibTorch's threads).
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(const char* value) : threads_(torch::get_num_threads()) {
    if (const char* old = std::getenv("OMP_NUM_THREADS")) old_ = old;
    if (value) {
      setenv("OMP_NUM_THREADS", value, 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
  }
  ~ScopedOmpThreads() {
    if (old_) {
      setenv("OMP_NUM_THREADS", old_->c_str(), 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
    torch::set_num_threads(threads_);
  }

 private:
  std::optional<std::string> old_;
  int threads_;
};

// What the machine has.
int Cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

TEST(Runtime, ZeroThreadsFollowsOmpNumThreadsElseTheCores) {
  {
    ScopedOmpThreads env("3");
    EXPECT_EQ(DefaultThreads(), 3);
    ConfigureThreads(0);
    EXPECT_EQ(torch::get_num_threads(), 3);
    EXPECT_EQ(GetRuntimeInfo().threads, 3);
    ConfigureThreads(1);  // an explicit count wins over the environment
    EXPECT_EQ(torch::get_num_threads(), 1);
  }
  const int usable = [] {
    ScopedOmpThreads env(nullptr);
    return DefaultThreads();
  }();
  EXPECT_GE(usable, 1);
  EXPECT_LE(usable, Cores());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_LE(usable, CPU_COUNT(&mask));  // never more threads than CPUs it may run on
  // What is not a positive count is ignored, as if unset.
  for (const char* bad : {"", "0", "-2", "two", "4x", "99999999999999999999"}) {
    ScopedOmpThreads env(bad);
    EXPECT_EQ(DefaultThreads(), usable) << "OMP_NUM_THREADS='" << bad << "'";
  }
}

// A container's CPU limit is a cgroup quota: "2.5 CPUs" is 250000 us per 100000 us.
TEST(Runtime, CpuQuotaCoresRoundUpAndNoQuotaIsZero) {
  EXPECT_EQ(CpuQuotaCores("200000", "100000"), 2);
  EXPECT_EQ(CpuQuotaCores("250000", "100000"), 3);
  EXPECT_EQ(CpuQuotaCores("50000", "100000"), 1);
  EXPECT_EQ(CpuQuotaCores("max", "100000"), 0);  // cgroup v2: no limit
  EXPECT_EQ(CpuQuotaCores("-1", "100000"), 0);   // cgroup v1: no limit
  EXPECT_EQ(CpuQuotaCores("", ""), 0);           // no cgroup files
  EXPECT_EQ(CpuQuotaCores("100000", "0"), 0);
  EXPECT_EQ(CpuQuotaCores("1x", "100000"), 0);
}

// OpenBLAS falls back to kernels without AVX2 on a CPU model newer than the library: where the
// CPU has AVX2 and FMA the process asks for "Haswell" (with AVX-512 F/CD/BW/DQ/VL "SkylakeX");
// a set that already uses AVX2 (its own choice, or an AMD one) stands.
TEST(Runtime, BetterOpenBlasCoreOnlyReplacesAFallbackTheCpuOutruns) {
  EXPECT_EQ(BetterOpenBlasCore("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", true, false), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("PRESCOTT", true, false), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("Sandybridge", true, false), "Haswell");  // AVX without AVX2
  EXPECT_EQ(BetterOpenBlasCore("Nehalem", true, true), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", false, false), "");  // the CPU has nothing better
  for (const char* own : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "Excavator", ""}) {
    EXPECT_EQ(BetterOpenBlasCore(own, true, true), "") << own;
  }
}

// The flags the kernel reports for the first CPU (/proc/cpuinfo), by name.
bool CpuHas(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

// This test process started through the tests' main (UseCpuBlasKernels): it runs the best
// kernel set its CPU has, as streambp-server and streambp-bench do.
TEST(Runtime, RunsOpenBlasKernelsForThisCpu) {
  const auto info = GetRuntimeInfo();
  if (info.blas_core.empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS: " << info.blas;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr && std::getenv("STREAMBP_OPENBLAS_FALLBACK") == nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << std::getenv("OPENBLAS_CORETYPE") << " was set before the tests ran";
  }
  const bool avx2_fma = CpuHas("avx2") && CpuHas("fma");
  const bool avx512 = CpuHas("avx512f") && CpuHas("avx512cd") && CpuHas("avx512bw") && CpuHas("avx512dq") &&
                      CpuHas("avx512vl");
  EXPECT_EQ(BetterOpenBlasCore(info.blas_core, avx2_fma, avx512), "") << info.describe();
  EXPECT_NE(info.describe().find(info.blas_core + " kernels"), std::string::npos) << info.describe();
  EXPECT_FALSE(info.softmax_rows.empty());
  EXPECT_NE(info.describe().find("softmax rows " + info.softmax_rows + ","), std::string::npos) << info.describe();
  if (!info.blas_fallback.empty()) {  // restarted: the set OpenBLAS picked by itself is said
    EXPECT_NE(info.describe().find("not its own choice " + info.blas_fallback), std::string::npos);
  }
}

}  // namespace
}  // namespace streambp
