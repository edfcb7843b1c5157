#include "policy_hub.h"

#include "streambp/error.h"

namespace streambp::server {

constexpr size_t kHistory = 256;

void PolicyHub::publish(const PolicyUpdate& update) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_.push_back(update);
  while (history_.size() > kHistory) history_.pop_front();
  for (auto* s : sinks_) s->push(update);
}

void PolicyHub::subscribe(PolicySink* sink, int64_t since) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) {
    sink->close(std::make_exception_ptr(Unavailable("the server is shutting down")));
    return;
  }
  sinks_.insert(sink);
  bool sent = false;
  for (const auto& u : history_) {
    if (u.policy_version > since) {
      sink->push(u);
      sent = true;
    }
  }
  if (!sent && !history_.empty() && history_.back().policy_version >= since) sink->push(history_.back());
}

void PolicyHub::unsubscribe(PolicySink* sink) {
  std::lock_guard<std::mutex> lock(mutex_);
  sinks_.erase(sink);
}

void PolicyHub::close_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  for (auto* s : sinks_) s->close(nullptr);
}

size_t PolicyHub::watchers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sinks_.size();
}

}  // namespace streambp::server
