#pragma once
/// The retry policy of the client: exponential backoff with jitter, for UNAVAILABLE only.
#include <string>

#include <grpcpp/support/status.h>

namespace streambp::client {

/// Retries of one logical call. The wait before retry k (k = 1 after the first attempt) is
///   min(initial_backoff_s * multiplier^(k-1), max_backoff_s) * (1 + jitter * (2u - 1))
/// with u uniform in [0, 1): within ±jitter of the exponential schedule.
/// All attempts of a call share the call's deadline: no retry starts after it.
struct RetryPolicy {
  int max_attempts = 5;            ///< attempts in all, >= 1 (1 = no retries)
  double initial_backoff_s = 0.2;  ///< wait before the first retry
  double max_backoff_s = 5.0;      ///< cap of the exponential schedule
  double multiplier = 2.0;         ///< growth of the wait per retry, >= 1
  double jitter = 0.2;             ///< relative spread of each wait, in [0, 1]
};

/// Throws ClientError(INVALID_ARGUMENT) naming the bad field ("retry.max_attempts ...").
void ValidateRetryPolicy(const RetryPolicy& policy);

/// Whether a failed attempt with `code` is retried. Only UNAVAILABLE: the request did not
/// reach the server or the connection broke. Mutating calls are safe to repeat because
/// they carry one request_id for all attempts; every other code is final.
bool IsRetryable(grpc::StatusCode code);

/// Seconds to wait before retry `retry` (1-based), for a uniform sample `u` in [0, 1).
/// Pure, so the schedule can be tested: u = 0.5 gives the schedule without jitter.
double BackoffSeconds(const RetryPolicy& policy, int retry, double u);

}  // namespace streambp::client
