#pragma once
/// The retry policy of the client: gRPC's own retries (the channel's service-config
/// retryPolicy), for UNAVAILABLE only.
#include <string>

#include <grpcpp/support/status.h>

namespace streambp::client {

/// Retries of one call, done by the gRPC channel: the same request bytes are sent again, so
/// a retried step keeps its request_id and the server applies it once. Attempt k + 1 starts
/// after a random wait in [0, min(initial_backoff_s * multiplier^(k-1), max_backoff_s)]
/// (gRPC's schedule). All attempts share the call's deadline. gRPC retries a call only
/// until the server's first response message: a stream that breaks later (ExportWeights,
/// TrainStepWithProgress) returns UNAVAILABLE, and calling again is safe.
struct RetryPolicy {
  int max_attempts = 5;            ///< attempts in all, in [1, 5] (gRPC's cap); 1 = no retries
  double initial_backoff_s = 0.2;  ///< cap of the first wait, > 0
  double max_backoff_s = 5.0;      ///< cap of every wait, >= initial_backoff_s
  double multiplier = 2.0;         ///< growth of the cap per retry, >= 1
};

/// Throws ClientError(INVALID_ARGUMENT) naming the bad field ("retry.max_attempts ...").
void ValidateRetryPolicy(const RetryPolicy& policy);

/// Whether a call that failed with `code` is retried. Only UNAVAILABLE: the request did not
/// reach the server or the connection broke. Mutating calls are safe to repeat because
/// they carry one request_id for all attempts; every other code is final.
bool IsRetryable(grpc::StatusCode code);

/// The channel's service config (JSON): `policy` as the retryPolicy of every method of
/// streambp.v1.Trainer, retrying the codes IsRetryable accepts. "" when max_attempts is 1.
std::string ServiceConfigJson(const RetryPolicy& policy);

}  // namespace streambp::client
