#pragma once
// Helpers of the distributed tests: ranks as threads of this process, each with its own
// process group on loopback.
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "streambp/dist.h"

namespace streambp::testing {

/// Rank `rank` of `world_size` on 127.0.0.1:`port`.
inline DistOptions LoopbackRank(int rank, int world_size, int port, int zero_stage = 0, double timeout_seconds = 60) {
  DistOptions d;
  d.rank = rank;
  d.world_size = world_size;
  d.master_port = port;
  d.zero_stage = zero_stage;
  d.timeout_seconds = timeout_seconds;
  return d;
}

/// Runs f(rank) on `n` threads; rethrows the first failure.
inline void RunRanks(int n, const std::function<void(int)>& f) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

/// A split step's objective metrics (`got`, one rank's) equal one process's (`single`,
/// not empty) to `tol` relative: the same names (but `ignore_prefix`, the split's own) and
/// values.
inline void ExpectWholeStepMetrics(const std::map<std::string, double>& single, const std::map<std::string, double>& got,
                                   const std::string& where, const std::string& ignore_prefix = "context_parallel_",
                                   double tol = 1e-10) {
  EXPECT_FALSE(single.empty()) << where;
  // DPO's accuracy counts the pairs whose margin is > 0. While the policy is the reference
  // (the first step) every margin is 0 up to rounding, and which side of 0 a margin falls on
  // depends on the order of the sums (ranks, chunks, the CPU's kernels): not compared then.
  const auto margins = single.find("rewards/margins");
  const bool zero_margins = margins != single.end() && std::abs(margins->second) <= 1e-12;
  for (const auto& [name, v] : single) {
    if (zero_margins && name == "rewards/accuracies") continue;
    const auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << where << ": no metric " << name;
      continue;
    }
    EXPECT_NEAR(it->second, v, tol * std::max(1.0, std::abs(v))) << where << ": metric " << name;
  }
  for (const auto& [name, v] : got) {
    if (name.rfind(ignore_prefix, 0) != 0) {
      EXPECT_EQ(single.count(name), 1u) << where << ": extra metric " << name;
    }
  }
}

}  // namespace streambp::testing
