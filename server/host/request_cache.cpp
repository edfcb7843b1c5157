#include "request_cache.h"

#include "streambp/error.h"

namespace streambp::server {

bool RequestCache::begin(const std::string& key, const std::string& digest, Waiter waiter) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    Entry e;
    e.digest = digest;
    e.bytes = key.size() + digest.size();
    bytes_ += e.bytes;
    entries_.emplace(key, std::move(e));
    return true;
  }
  if (it->second.digest != digest) {
    throw InvalidArgument("request_id was used before for a different request; use a new request_id for a new "
                          "request (a retry must repeat the same request)");
  }
  if (!it->second.done) {
    it->second.waiters.push_back(std::move(waiter));
    return false;
  }
  auto error = it->second.error;
  auto value = it->second.value;
  lock.unlock();
  waiter(error, value);
  return false;
}

void RequestCache::complete(const std::string& key, std::exception_ptr error, std::shared_ptr<const void> value,
                            size_t bytes, bool applied) {
  std::vector<Waiter> waiters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    waiters.swap(it->second.waiters);
    if (applied) {
      it->second.done = true;
      it->second.error = error;
      it->second.value = value;
      bytes_ += bytes;
      it->second.bytes += bytes;
      order_.push_back(key);
      evict();
    } else {
      bytes_ -= it->second.bytes;
      entries_.erase(it);
    }
  }
  for (auto& w : waiters) w(error, value);
}

void RequestCache::evict() {
  while (!order_.empty() && (order_.size() > max_entries_ || bytes_ > max_bytes_)) {
    auto it = entries_.find(order_.front());
    order_.pop_front();
    if (it == entries_.end()) continue;
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
}

size_t RequestCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

size_t RequestCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace streambp::server
