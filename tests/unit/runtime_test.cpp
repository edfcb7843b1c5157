// Thread configuration: `threads = 0` follows OMP_NUM_THREADS, so a test runner or launcher
// that runs several processes on the same cores can keep them from oversubscribing.
#include <algorithm>
#include <cstdlib>
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
  {
    ScopedOmpThreads env(nullptr);
    EXPECT_EQ(DefaultThreads(), Cores());
  }
  // What is not a positive count is ignored, as if unset.
  for (const char* bad : {"", "0", "-2", "two", "4x", "99999999999999999999"}) {
    ScopedOmpThreads env(bad);
    EXPECT_EQ(DefaultThreads(), Cores()) << "OMP_NUM_THREADS='" << bad << "'";
  }
}

}  // namespace
}  // namespace streambp
