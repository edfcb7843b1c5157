#pragma once
// Threads for the read-only CPU work of requests — text turned into ids (tokenizing,
// chat rendering) and ids into text — so that it never runs on a gRPC thread: a gRPC
// thread that tokenizes 16 MiB is one that answers no Health check meanwhile. Work polls
// its caller's deadline and cancellation (streambp/interrupt.h) and stops at the next word,
// message or block of characters once either has passed.
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace streambp::server {

class CpuPool {
 public:
  struct Job {
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
    std::function<bool()> cancelled;  ///< may be empty
    /// Memory the work may hold at its peak (its estimate): a job starts only while the
    /// running jobs' estimates and its own fit in the pool's budget.
    int64_t bytes = 0;
    /// The work; whatever it throws (also Cancelled / DeadlineExceeded from the interrupt
    /// check) goes to `fail`.
    std::function<void()> run;
    /// Called instead of (or after a throwing) `run`: the error, once.
    std::function<void(std::exception_ptr)> fail;
  };

  /// `threads` workers; at most `capacity` jobs wait; the running jobs' `bytes` stay within
  /// `budget_bytes`.
  CpuPool(size_t threads, size_t capacity, int64_t budget_bytes);
  /// Stops (see stop()).
  ~CpuPool();
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  enum class Submit { kAccepted, kFull, kTooLarge, kStopped };
  /// Queues a job; nothing is called unless kAccepted (kFull: `capacity` jobs wait; kTooLarge:
  /// its bytes are over the whole budget).
  Submit submit(Job job);
  /// Fails the waiting jobs (Unavailable), lets the running ones end and joins. Idempotent.
  void stop();
  size_t capacity() const { return capacity_; }
  int64_t budget() const { return budget_; }

 private:
  void loop();

  const size_t capacity_;
  const int64_t budget_;
  int64_t in_use_ = 0;  ///< bytes of the running jobs
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

/// The interrupt check of a call: throws Cancelled once `cancelled()` is true, and
/// DeadlineExceeded once `deadline` has passed.
std::function<void()> CallInterrupt(std::chrono::system_clock::time_point deadline, std::function<bool()> cancelled);

}  // namespace streambp::server
