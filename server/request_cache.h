#pragma once
// Answers of mutating requests by request id, so that a retried request returns the first
// answer and is applied once (DESIGN §7). Bounded: the oldest answers are forgotten first.
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>

namespace streambp::server {

class RequestCache {
 public:
  using Waiter = std::function<void(const grpc::Status&, const std::string& response)>;
  explicit RequestCache(size_t capacity) : capacity_(capacity) {}

  /// True when `key` is new: the caller runs the request and later calls complete().
  /// Otherwise `waiter` gets the first answer, now if it is known, else when it is.
  bool begin(const std::string& key, Waiter waiter);
  /// Records the answer of `key` and hands it to the waiters. When nothing was applied
  /// (`applied` false: dropped, refused) the key is forgotten so a retry may run.
  void complete(const std::string& key, const grpc::Status& status, const std::string& response, bool applied);

 private:
  struct Entry {
    bool done = false;
    grpc::Status status;
    std::string response;
    std::vector<Waiter> waiters;
  };
  const size_t capacity_;
  std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> order_;
};

}  // namespace streambp::server
