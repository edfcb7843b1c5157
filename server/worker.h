#pragma once
// The device owner: one thread runs jobs in the order they were accepted. Handlers
// validate, submit and return; nothing on a gRPC thread waits for training.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/support/status.h>

namespace streambp::server {

class DeviceWorker {
 public:
  struct Job {
    std::string method;
    /// A job whose deadline has passed when its turn comes is dropped (DEADLINE_EXCEEDED).
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
    /// A job whose call was cancelled before its turn is dropped (CANCELLED).
    std::function<bool()> cancelled;
    /// Runs on the device thread. Must not throw (it reports its own errors).
    std::function<void()> run;
    /// Called instead of run when the job is dropped (deadline, cancellation, shutdown).
    std::function<void(const grpc::Status&)> drop;
  };

  /// `capacity`: jobs that may wait (the running one not counted).
  explicit DeviceWorker(size_t capacity);
  /// Stops (see stop()).
  ~DeviceWorker();
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  /// Accepts a job, or returns false when the queue is full or the worker is stopping.
  bool submit(Job job);
  /// Stops accepting, lets the running job finish, drops the waiting ones with UNAVAILABLE
  /// and joins the thread. Idempotent.
  void stop();
  /// Waits until the queue is empty and no job runs, up to `timeout`. True when idle.
  bool wait_idle(std::chrono::milliseconds timeout);

  size_t depth() const;
  size_t capacity() const { return capacity_; }
  /// For tests: hold jobs in the queue until resume().
  void pause();
  void resume();

 private:
  void loop();

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  bool paused_ = false;
  bool running_ = false;
  std::thread thread_;
};

}  // namespace streambp::server
