// Host buffers of one size kept from one step to the next (streambp/memory.h).
#include <utility>

#include "streambp/memory.h"

namespace streambp::memory {

HostBufferCache::HostBufferCache(Allocate allocate, Release release, bool keep)
    : allocate_(allocate), release_(release), keep_(keep) {}

HostBufferCache::~HostBufferCache() { Clear(); }

void HostBufferCache::ReleaseKeptLocked() {
  for (void* p : kept_) release_(p);
  kept_.clear();
}

int64_t HostBufferCache::Prepare(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (size_ != bytes) ReleaseKeptLocked();
  return static_cast<int64_t>(kept_.size()) * size_;
}

void* HostBufferCache::Take(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (size_ == bytes && !kept_.empty()) {
      void* p = kept_.back();
      kept_.pop_back();
      return p;
    }
  }
  void* p = allocate_(bytes);
  if (p != nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++allocations_;
  }
  return p;
}

void HostBufferCache::Give(void* buffer, int64_t bytes) {
  if (buffer == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!keep_) {
    release_(buffer);
    return;
  }
  if (size_ != bytes) {
    ReleaseKeptLocked();
    size_ = bytes;
  }
  kept_.push_back(buffer);
}

void HostBufferCache::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ReleaseKeptLocked();
}

int64_t HostBufferCache::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(kept_.size()) * size_;
}

int64_t HostBufferCache::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

}  // namespace streambp::memory
