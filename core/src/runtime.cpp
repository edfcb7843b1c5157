#include "streambp/runtime.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <torch/torch.h>
#include <torch/version.h>

namespace streambp {

std::string RuntimeInfo::describe() const {
  return "LibTorch " + torch_version + ", BLAS " + blas + ", " + std::to_string(threads) +
         " thread(s)" + (cuda ? ", CUDA" : ", CPU");
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
  return info;
}

void ConfigureThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(threads);
}

}  // namespace streambp
