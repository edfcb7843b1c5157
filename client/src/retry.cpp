#include "streambp/client/retry.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "streambp/client/result.h"

namespace streambp::client {
namespace {

// A google.protobuf.Duration in JSON: decimal seconds with an "s" suffix (nanosecond grain).
std::string Duration(double seconds) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(9) << seconds << 's';
  return out.str();
}

}  // namespace

void ValidateRetryPolicy(const RetryPolicy& p) {
  auto bad = [](const std::string& what) { throw ClientError(grpc::StatusCode::INVALID_ARGUMENT, what); };
  if (p.max_attempts < 1 || p.max_attempts > 5) {
    bad("retry.max_attempts must be in [1, 5] (1 = no retries; gRPC allows at most 5), got " +
        std::to_string(p.max_attempts));
  }
  // gRPC rejects a service config whose backoff is 0 or below a nanosecond.
  if (!(p.initial_backoff_s >= 1e-9) || !std::isfinite(p.initial_backoff_s)) {
    bad("retry.initial_backoff_s must be a finite number of seconds > 0");
  }
  if (!(p.max_backoff_s >= p.initial_backoff_s) || !std::isfinite(p.max_backoff_s)) {
    bad("retry.max_backoff_s must be finite and >= retry.initial_backoff_s");
  }
  if (!(p.multiplier >= 1) || !std::isfinite(p.multiplier)) bad("retry.multiplier must be a finite number >= 1");
}

bool IsRetryable(grpc::StatusCode code) { return code == grpc::StatusCode::UNAVAILABLE; }

std::string ServiceConfigJson(const RetryPolicy& p) {
  ValidateRetryPolicy(p);
  if (p.max_attempts == 1) return "";
  std::ostringstream out;
  out << R"({"methodConfig":[{"name":[{"service":"streambp.v1.Trainer"}],"retryPolicy":{"maxAttempts":)"
      << p.max_attempts << R"(,"initialBackoff":")" << Duration(p.initial_backoff_s) << R"(","maxBackoff":")"
      << Duration(p.max_backoff_s) << R"(","backoffMultiplier":)" << std::setprecision(17) << p.multiplier
      << R"(,"retryableStatusCodes":["UNAVAILABLE"]}}]})";
  return out.str();
}

}  // namespace streambp::client
