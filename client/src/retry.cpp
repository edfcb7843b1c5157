#include "streambp/client/retry.h"

#include <algorithm>
#include <cmath>

#include "streambp/client/result.h"

namespace streambp::client {

void ValidateRetryPolicy(const RetryPolicy& p) {
  auto bad = [](const std::string& what) { throw ClientError(grpc::StatusCode::INVALID_ARGUMENT, what); };
  if (p.max_attempts < 1) bad("retry.max_attempts must be >= 1, got " + std::to_string(p.max_attempts));
  if (!(p.initial_backoff_s >= 0) || !std::isfinite(p.initial_backoff_s)) {
    bad("retry.initial_backoff_s must be a finite number >= 0");
  }
  if (!(p.max_backoff_s >= p.initial_backoff_s) || !std::isfinite(p.max_backoff_s)) {
    bad("retry.max_backoff_s must be finite and >= retry.initial_backoff_s");
  }
  if (!(p.multiplier >= 1) || !std::isfinite(p.multiplier)) bad("retry.multiplier must be a finite number >= 1");
  if (!(p.jitter >= 0 && p.jitter <= 1)) bad("retry.jitter must be in [0, 1]");
}

bool IsRetryable(grpc::StatusCode code) { return code == grpc::StatusCode::UNAVAILABLE; }

double BackoffSeconds(const RetryPolicy& p, int retry, double u) {
  // min(initial * multiplier^(retry-1), max), computed without overflowing for large retries.
  double base = p.initial_backoff_s;
  for (int k = 1; k < retry && base < p.max_backoff_s; ++k) base *= p.multiplier;
  base = std::min(base, p.max_backoff_s);
  u = std::clamp(u, 0.0, 1.0);
  return std::max(0.0, base * (1.0 + p.jitter * (2.0 * u - 1.0)));
}

}  // namespace streambp::client
