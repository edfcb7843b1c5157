#include "worker.h"

namespace streambp::server {

DeviceWorker::DeviceWorker(size_t capacity) : capacity_(capacity), thread_([this] { loop(); }) {}

DeviceWorker::~DeviceWorker() { stop(); }

bool DeviceWorker::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return true;
}

void DeviceWorker::stop() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    paused_ = false;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : dropped) {
    if (job.drop) job.drop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down; retry later"));
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

bool DeviceWorker::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [this] { return queue_.empty() && !running_; });
}

size_t DeviceWorker::depth() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

void DeviceWorker::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = true;
}

void DeviceWorker::resume() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
  }
  cv_.notify_all();
}

void DeviceWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || (!paused_ && !queue_.empty()); });
      if (stopping_ && queue_.empty()) return;
      if (paused_ && !stopping_) continue;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    if (std::chrono::system_clock::now() > job.deadline) {
      if (job.drop) {
        job.drop(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "the deadline passed while the request waited for the device; nothing was applied"));
      }
    } else if (job.cancelled && job.cancelled()) {
      if (job.drop) job.drop(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before it started; nothing applied"));
    } else {
      job.run();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace streambp::server
