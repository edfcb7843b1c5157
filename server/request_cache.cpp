#include "request_cache.h"

namespace streambp::server {

bool RequestCache::begin(const std::string& key, Waiter waiter) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    entries_.emplace(key, Entry{});
    order_.push_back(key);
    while (order_.size() > capacity_) {
      auto old = entries_.find(order_.front());
      if (old != entries_.end() && old->second.done) entries_.erase(old);
      order_.pop_front();
    }
    return true;
  }
  if (!it->second.done) {
    it->second.waiters.push_back(std::move(waiter));
    return false;
  }
  const grpc::Status status = it->second.status;
  const std::string response = it->second.response;
  lock.unlock();
  waiter(status, response);
  return false;
}

void RequestCache::complete(const std::string& key, const grpc::Status& status, const std::string& response,
                            bool applied) {
  std::vector<Waiter> waiters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    waiters.swap(it->second.waiters);
    if (applied) {
      it->second.done = true;
      it->second.status = status;
      it->second.response = response;
    } else {
      entries_.erase(it);
    }
  }
  for (auto& w : waiters) w(status, response);
}

}  // namespace streambp::server
