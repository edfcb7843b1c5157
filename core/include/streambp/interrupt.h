#pragma once
/// Cooperative interruption of long CPU work on one thread (tokenizing a large text,
/// rendering a long conversation): the caller installs a check for a scope, and the work
/// polls it at its natural boundaries (words, messages, blocks of characters). A check stops
/// the work by throwing (Cancelled, DeadlineExceeded); the work leaves no shared state
/// half-changed when it does. Without a check installed, polling costs a thread-local read.
#include <cstdint>
#include <functional>

namespace streambp {

/// Installs `check` on this thread for its lifetime (nested scopes: the innermost is used;
/// the outer one comes back when it ends).
class ScopedInterrupt {
 public:
  explicit ScopedInterrupt(std::function<void()> check);
  ~ScopedInterrupt();
  ScopedInterrupt(const ScopedInterrupt&) = delete;
  ScopedInterrupt& operator=(const ScopedInterrupt&) = delete;

 private:
  std::function<void()> check_;
  ScopedInterrupt* previous_;
};

/// Called by long work at its boundaries, with the amount of work done since the last call
/// (bytes, words): the installed check runs about every 64 Ki units. May throw what it throws.
void PollInterrupt(int64_t work = 1);

}  // namespace streambp
