#pragma once
// Answers of mutating requests by request id, so that a retried request returns the first
// answer and is applied once (docs/architecture.md: Errors, admission and durability). A reused id with a different request body is
// refused, never answered with the first result. Bounded by entries and by bytes: the
// oldest finished answers are forgotten first.
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace streambp::server {

class RequestCache {
 public:
  /// A finished answer: the error, or the value (type known to the caller by method).
  using Waiter = std::function<void(std::exception_ptr error, std::shared_ptr<const void> value)>;

  RequestCache(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

  /// True when `key` is new: the caller runs the request and later calls complete().
  /// Otherwise `waiter` gets the first answer, now if it is known, else when it is. Throws
  /// InvalidArgument when `key` is known with another `digest` (the same id, another body).
  bool begin(const std::string& key, const std::string& digest, Waiter waiter);
  /// Records the answer of `key` (`bytes`: its approximate size) and hands it to the
  /// waiters. When nothing was applied (`applied` false: dropped, refused) the key is
  /// forgotten so a retry may run.
  void complete(const std::string& key, std::exception_ptr error, std::shared_ptr<const void> value, size_t bytes,
                bool applied);

  size_t entries() const;
  size_t bytes() const;

 private:
  struct Entry {
    std::string digest;
    bool done = false;
    std::exception_ptr error;
    std::shared_ptr<const void> value;
    size_t bytes = 0;
    std::vector<Waiter> waiters;
  };
  void evict();  // under mutex_

  const size_t max_entries_, max_bytes_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> order_;  // finished keys, oldest first
  size_t bytes_ = 0;
};

}  // namespace streambp::server
