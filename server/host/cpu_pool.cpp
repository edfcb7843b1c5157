#include "cpu_pool.h"

#include <algorithm>

#include "streambp/error.h"
#include "streambp/interrupt.h"

namespace streambp::server {

std::function<void()> CallInterrupt(std::chrono::system_clock::time_point deadline, std::function<bool()> cancelled) {
  return [deadline, cancelled = std::move(cancelled)] {
    if (cancelled && cancelled()) throw Cancelled("the client went away; the work was stopped");
    if (std::chrono::system_clock::now() > deadline) {
      throw DeadlineExceeded("the deadline passed while the request's text was processed; nothing was applied");
    }
  };
}

CpuPool::CpuPool(size_t threads, size_t capacity, int64_t budget_bytes) : capacity_(capacity), budget_(budget_bytes) {
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i) threads_.emplace_back([this] { loop(); });
}

CpuPool::~CpuPool() { stop(); }

CpuPool::Submit CpuPool::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return Submit::kStopped;
    if (job.bytes > budget_) return Submit::kTooLarge;
    if (jobs_.size() >= capacity_) return Submit::kFull;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Submit::kAccepted;
}

void CpuPool::stop() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    dropped.swap(jobs_);
  }
  cv_.notify_all();
  for (auto& job : dropped) {
    if (job.fail) job.fail(std::make_exception_ptr(Unavailable("the server is shutting down; retry later")));
  }
  for (auto& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
  threads_.clear();
}

void CpuPool::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // First come, first served: the front job waits until its bytes fit beside the running ones.
      cv_.wait(lock, [this] { return stopping_ || (!jobs_.empty() && in_use_ + jobs_.front().bytes <= budget_); });
      if (jobs_.empty()) return;  // stopping
      job = std::move(jobs_.front());
      jobs_.pop_front();
      in_use_ += job.bytes;
    }
    const int64_t bytes = job.bytes;
    try {
      auto check = CallInterrupt(job.deadline, job.cancelled);
      check();  // gone or late before it starts: not started
      ScopedInterrupt interrupt(std::move(check));
      job.run();
    } catch (...) {
      if (job.fail) job.fail(std::current_exception());
    }
    job = Job{};  // what the work captured goes before its bytes are given back
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_ -= bytes;
    }
    cv_.notify_all();
  }
}

}  // namespace streambp::server
