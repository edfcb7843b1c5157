#include "streambp/runtime.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <torch/torch.h>
#include <torch/version.h>

#include "model/softmax_rows.h"

namespace streambp {

std::string RuntimeInfo::blas_kernels() const {
  if (blas_core.empty()) return blas;
  return blas + " (" + blas_core + " kernels" + (blas_fallback.empty() ? "" : ", not its own choice " + blas_fallback) + ")";
}

std::string RuntimeInfo::describe() const {
  return "LibTorch " + torch_version + ", BLAS " + blas_kernels() + ", softmax rows " + softmax_rows + ", " +
         std::to_string(threads) + " thread(s)" + (cuda ? ", CUDA" : ", CPU");
}

RuntimeInfo GetRuntimeInfo() {
  RuntimeInfo info;
  info.torch_version = TORCH_VERSION;
  info.threads = torch::get_num_threads();
  info.cuda = torch::cuda::is_available();
  // The BLAS LibTorch calls is whatever libblas.so.3 the loader resolved (Debian's
  // alternatives system): read it from this process's mappings.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  info.blas = "unknown";
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    auto name = std::filesystem::path(path).filename().string();
    if (name.find("blas") != std::string::npos || name.find("mkl_core") != std::string::npos) {
      std::error_code ec;
      auto real = std::filesystem::canonical(path, ec);
      info.blas = ec ? path : real.string();
      if (info.blas.find("openblas") != std::string::npos || info.blas.find("mkl") != std::string::npos) break;
    }
  }
  info.blas_core = OpenBlasCore();
  info.softmax_rows = SoftmaxRowIsa();
  if (const char* fallback = std::getenv("STREAMBP_OPENBLAS_FALLBACK"); fallback && !info.blas_core.empty()) {
    info.blas_fallback = fallback;
  }
  return info;
}

int DefaultThreads() {
  // OMP_NUM_THREADS is how a launcher (or a test runner running several processes on the
  // same cores) asks for fewer threads: LibTorch's threads wait for each other at every op,
  // so processes that oversubscribe the cores slow down far beyond their share.
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(env, &end, 10);
    if (errno == 0 && *end == '\0' && n > 0 && n <= 4096) return static_cast<int>(n);
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) > 0) cores = std::min(cores, CPU_COUNT(&mask));
  // The cgroup's quota: v2's cpu.max ("<quota> <period>"), else v1's two files.
  std::string quota, period;
  std::ifstream v2("/sys/fs/cgroup/cpu.max");
  if (!(v2 >> quota >> period)) {
    std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!(q >> quota && p >> period)) quota.clear();
  }
  if (const int limit = CpuQuotaCores(quota, period); limit > 0) cores = std::min(cores, limit);
  return cores;
}

int CpuQuotaCores(const std::string& quota, const std::string& period) {
  auto number = [](const std::string& text) -> long long {
    if (text.empty()) return -1;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    return errno == 0 && *end == '\0' ? v : -1;
  };
  const long long q = number(quota), p = number(period);
  if (q <= 0 || p <= 0) return 0;
  return static_cast<int>(std::min<long long>((q + p - 1) / p, 1 << 20));
}

void ConfigureThreads(int threads) {
  if (threads <= 0) threads = DefaultThreads();
  torch::set_num_threads(threads);
}

std::string BetterOpenBlasCore(const std::string& chosen, bool avx2_fma, bool avx512) {
  // OpenBLAS's kernel sets (openblas_get_corename's names) that stop short of AVX2.
  static const char* const kBeforeAvx2[] = {
      "katmai", "coppermine", "northwood", "prescott", "banias", "core2", "penryn", "dunnington",
      "nehalem", "atom", "sandybridge", "athlon", "opteron", "opteron_sse3", "barcelona", "bobcat",
      "bulldozer", "piledriver", "steamroller", "nano"};
  std::string name;
  for (char c : chosen) name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  bool before_avx2 = false;
  for (const char* core : kBeforeAvx2) before_avx2 = before_avx2 || name == core;
  if (!before_avx2 || !avx2_fma) return "";
  return avx512 ? "SkylakeX" : "Haswell";
}

std::string OpenBlasCore() {
  // OpenBLAS came in as LibTorch's libblas.so.3, so its symbols are in the global scope.
  using CoreName = char* (*)();
  auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = corename ? corename() : nullptr;
  return name ? std::string(name) : std::string();
}

void UseCpuBlasKernels(char** argv) {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr) return;  // the user's, or ours after exec
  const std::string chosen = OpenBlasCore();
  if (chosen.empty()) return;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
#else
  const bool avx2_fma = false, avx512 = false;
#endif
  const std::string better = BetterOpenBlasCore(chosen, avx2_fma, avx512);
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv("STREAMBP_OPENBLAS_FALLBACK", chosen.c_str(), 1);
  execv("/proc/self/exe", argv);
  // No exec (no /proc): run on as loaded; the same results, only slower products.
  std::fprintf(stderr, "streambp: could not restart with OPENBLAS_CORETYPE=%s (%s); running on OpenBLAS's %s kernels\n",
               better.c_str(), std::strerror(errno), chosen.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("STREAMBP_OPENBLAS_FALLBACK");
}

}  // namespace streambp
