#pragma once
// The device owner: one thread runs the jobs that touch the model. Jobs wait in lanes (one
// per session); the worker takes them round-robin across lanes, so a session that floods
// its lane cannot starve another, and in order within a lane. Callers submit and return;
// nothing waits for the device on a caller's thread.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace streambp::server {

class DeviceWorker {
 public:
  struct Job {
    std::string lane;    ///< the session it belongs to ("" = the default)
    std::string method;  ///< for logs
    /// A job whose deadline has passed when its turn comes is dropped (DeadlineExceeded).
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
    /// A job whose caller has gone before its turn is dropped (Cancelled).
    std::function<bool()> cancelled;
    /// Runs on the device thread; must not throw (it reports its own errors). Returns true
    /// when the job is done, false to yield: it goes to the back of its lane and runs again
    /// on its next turn (a long generation gives other sessions the device in between).
    std::function<bool()> run;
    /// Called instead of run when the job is dropped (deadline, cancellation, shutdown).
    std::function<void(std::exception_ptr)> drop;
    /// Told the number of jobs that will run before this one: when it is queued and again
    /// whenever a job ahead of it starts. Called under the worker's lock: must not block or
    /// call the worker.
    std::function<void(size_t)> on_position;
  };

  /// `capacity`: jobs that may wait in all lanes together; `lane_capacity`: in one lane.
  DeviceWorker(size_t capacity, size_t lane_capacity);
  /// Stops (see stop()).
  ~DeviceWorker();
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  enum class Submit { kAccepted, kFull, kLaneFull, kStopped };
  /// Queues a job, or says why not (nothing is called then).
  Submit submit(Job job);
  /// Stops accepting, lets the running job finish, drops the waiting ones (Unavailable)
  /// and joins the thread. Idempotent.
  void stop();
  /// Waits until no job waits or runs, up to `timeout`. True when idle.
  bool wait_idle(std::chrono::milliseconds timeout);

  size_t depth() const;                         ///< jobs waiting (the running one not counted)
  size_t depth(const std::string& lane) const;  ///< jobs waiting in one lane
  /// Jobs of other lanes the worker takes before a job submitted to `lane` now would run.
  size_t position(const std::string& lane) const;
  size_t capacity() const { return capacity_; }
  size_t lane_capacity() const { return lane_capacity_; }
  /// For tests: hold jobs in the queue until resume().
  void pause();
  void resume();

 private:
  void loop();
  bool take(Job* job);  // under mutex_: the next job round-robin; false when none
  void tell_positions();  // under mutex_: on_position of every waiting job that has one
  size_t ahead_of(const std::string& lane, size_t index) const;  // under mutex_

  const size_t capacity_, lane_capacity_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<Job>> lanes_;
  std::string last_lane_;  // the lane the last job came from
  size_t waiting_ = 0;
  bool stopping_ = false;
  bool paused_ = false;
  bool running_ = false;
  std::thread thread_;
};

}  // namespace streambp::server
