#pragma once
// Helpers of the distributed tests: ranks as threads of this process, each with its own
// process group on loopback.
#include <exception>
#include <functional>
#include <thread>
#include <vector>

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

}  // namespace streambp::testing
