#include "streambp/interrupt.h"

#include <utility>

namespace streambp {
namespace {

thread_local ScopedInterrupt* current = nullptr;
thread_local const std::function<void()>* current_check = nullptr;
thread_local int64_t since_check = 0;
constexpr int64_t kCheckEvery = 1 << 16;

}  // namespace

ScopedInterrupt::ScopedInterrupt(std::function<void()> check) : check_(std::move(check)), previous_(current) {
  current = this;
  current_check = &check_;
  since_check = 0;
}

ScopedInterrupt::~ScopedInterrupt() {
  current = previous_;
  current_check = previous_ != nullptr ? &previous_->check_ : nullptr;
}

void PollInterrupt(int64_t work) {
  if (current_check == nullptr) return;
  since_check += work;
  if (since_check < kCheckEvery) return;
  since_check = 0;
  (*current_check)();
}

}  // namespace streambp
