#pragma once
// Helpers of the distributed tests: ranks as threads of this process, each with its own
// process group on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "streambp/dist.h"

namespace streambp::testing {

/// A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT).
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

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
