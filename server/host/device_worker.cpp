#include "device_worker.h"

#include <algorithm>

#include "streambp/error.h"

namespace streambp::server {

DeviceWorker::DeviceWorker(size_t capacity, size_t lane_capacity)
    : capacity_(capacity), lane_capacity_(lane_capacity), thread_([this] { loop(); }) {}

DeviceWorker::~DeviceWorker() { stop(); }

DeviceWorker::Submit DeviceWorker::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return Submit::kStopped;
    if (waiting_ >= capacity_) return Submit::kFull;
    auto& lane = lanes_[job.lane];
    if (lane.size() >= lane_capacity_) return Submit::kLaneFull;
    lane.push_back(std::move(job));
    ++waiting_;
    if (lane.back().on_position) lane.back().on_position(ahead_of(lane.back().lane, lane.size() - 1));
  }
  cv_.notify_all();
  return Submit::kAccepted;
}

size_t DeviceWorker::ahead_of(const std::string& lane, size_t index) const {
  // Round-robin: each other lane runs at most index + 1 of its jobs before this one; the
  // running job goes first.
  size_t ahead = index + (running_ ? 1 : 0);
  for (const auto& [name, jobs] : lanes_) {
    if (name != lane) ahead += std::min(jobs.size(), index + 1);
  }
  return ahead;
}

void DeviceWorker::tell_positions() {
  for (const auto& [name, jobs] : lanes_) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].on_position) jobs[i].on_position(ahead_of(name, i));
    }
  }
}

void DeviceWorker::stop() {
  std::map<std::string, std::deque<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    paused_ = false;
    dropped.swap(lanes_);
    waiting_ = 0;
  }
  cv_.notify_all();
  for (auto& [lane, jobs] : dropped) {
    for (auto& job : jobs) {
      if (job.drop) job.drop(std::make_exception_ptr(Unavailable("the server is shutting down; retry later")));
    }
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

bool DeviceWorker::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [this] { return waiting_ == 0 && !running_; });
}

size_t DeviceWorker::depth() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

size_t DeviceWorker::depth(const std::string& lane) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lanes_.find(lane);
  return it == lanes_.end() ? 0 : it->second.size();
}

size_t DeviceWorker::position(const std::string& lane) const {
  // Round-robin: each other lane runs at most as many jobs as this lane has waiting + 1
  // before the new job's turn.
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lanes_.find(lane);
  const size_t mine = it == lanes_.end() ? 0 : it->second.size();
  size_t ahead = mine;
  for (const auto& [name, jobs] : lanes_) {
    if (name != lane) ahead += std::min(jobs.size(), mine + 1);
  }
  return ahead;
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

bool DeviceWorker::take(Job* job) {
  if (waiting_ == 0) return false;
  // The first non-empty lane after the last one served, wrapping around.
  auto it = lanes_.upper_bound(last_lane_);
  for (size_t i = 0; i <= lanes_.size(); ++i, ++it) {
    if (it == lanes_.end()) it = lanes_.begin();
    if (!it->second.empty()) break;
  }
  last_lane_ = it->first;
  *job = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) lanes_.erase(it);
  --waiting_;
  return true;
}

void DeviceWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || (!paused_ && waiting_ > 0); });
      if (stopping_ && waiting_ == 0) return;
      if (paused_ && !stopping_) continue;
      take(&job);
      running_ = true;
      tell_positions();
    }
    bool done = true;
    if (std::chrono::system_clock::now() > job.deadline) {
      if (job.drop) {
        job.drop(std::make_exception_ptr(
            DeadlineExceeded("the deadline passed while the request waited for the device; nothing was applied")));
      }
    } else if (job.cancelled && job.cancelled()) {
      if (job.drop) job.drop(std::make_exception_ptr(Cancelled("cancelled before it started; nothing was applied")));
    } else {
      done = job.run();
    }
    bool abandon = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
      if (!done) {
        if (stopping_) {
          abandon = true;
        } else {
          lanes_[job.lane].push_back(std::move(job));  // a yielded job goes round again
          ++waiting_;
        }
      }
    }
    if (abandon && job.drop) job.drop(std::make_exception_ptr(Unavailable("the server is shutting down; retry later")));
    cv_.notify_all();
  }
}

}  // namespace streambp::server
