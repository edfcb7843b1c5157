#pragma once
// New policy versions for WatchPolicy: a short history (a watcher that asks for versions
// since N gets the ones it missed) and the live watchers. Thread-safe.
#include <deque>
#include <exception>
#include <mutex>
#include <set>

#include "types.h"

namespace streambp::server {

/// Where a watcher's updates go (the edge's stream reactor). push() and close() are called
/// with the hub's lock held: they must only queue, never block.
class PolicySink {
 public:
  virtual ~PolicySink() = default;
  virtual void push(const PolicyUpdate& update) = 0;
  /// The stream ends: `error` null = normally (shutdown), else why.
  virtual void close(std::exception_ptr error) = 0;
};

class PolicyHub {
 public:
  void publish(const PolicyUpdate& update);
  /// Registers `sink` and hands it the updates after `since` (at least the latest one).
  /// A closed hub closes the sink at once (Unavailable).
  void subscribe(PolicySink* sink, int64_t since);
  void unsubscribe(PolicySink* sink);
  /// Ends every stream (shutdown).
  void close_all();
  size_t watchers() const;

 private:
  mutable std::mutex mutex_;
  std::deque<PolicyUpdate> history_;
  std::set<PolicySink*> sinks_;
  bool closed_ = false;
};

}  // namespace streambp::server
