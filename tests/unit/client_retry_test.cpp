// The client's retry policy: the backoff schedule, what is retried, request ids.
#include <set>

#include <gtest/gtest.h>

#include "streambp/client/client.h"
#include "streambp/client/retry.h"

namespace streambp::client {
namespace {

TEST(ClientRetry, ExponentialScheduleCappedAtMax) {
  const RetryPolicy p;  // 0.2 s, x2, max 5 s, jitter 0.2
  const double expected[] = {0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0};
  for (int k = 1; k <= 7; ++k) EXPECT_NEAR(BackoffSeconds(p, k, 0.5), expected[k - 1], 1e-12) << "retry " << k;
  EXPECT_NEAR(BackoffSeconds(p, 100000, 0.5), 5.0, 1e-12);  // no overflow for huge retry counts
}

TEST(ClientRetry, JitterStaysWithinBounds) {
  const RetryPolicy p;
  for (int k = 1; k <= 8; ++k) {
    const double base = BackoffSeconds(p, k, 0.5);
    EXPECT_NEAR(BackoffSeconds(p, k, 0.0), 0.8 * base, 1e-12);
    EXPECT_NEAR(BackoffSeconds(p, k, 1.0), 1.2 * base, 1e-12);
    for (double u = 0; u < 1; u += 0.01) {
      const double d = BackoffSeconds(p, k, u);
      EXPECT_GE(d, 0.8 * base - 1e-12);
      EXPECT_LE(d, 1.2 * base + 1e-12);
    }
  }
  RetryPolicy none = p;
  none.jitter = 0;
  EXPECT_DOUBLE_EQ(BackoffSeconds(none, 3, 0.9), 0.8);
}

TEST(ClientRetry, OnlyUnavailableIsRetried) {
  EXPECT_TRUE(IsRetryable(grpc::StatusCode::UNAVAILABLE));
  for (auto code : {grpc::StatusCode::OK, grpc::StatusCode::CANCELLED, grpc::StatusCode::UNKNOWN,
                    grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::DEADLINE_EXCEEDED,
                    grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::FAILED_PRECONDITION,
                    grpc::StatusCode::ABORTED, grpc::StatusCode::INTERNAL, grpc::StatusCode::UNAUTHENTICATED}) {
    EXPECT_FALSE(IsRetryable(code)) << StatusCodeName(code);
  }
}

TEST(ClientRetry, PolicyValidation) {
  auto error_of = [](RetryPolicy p) -> std::string {
    try {
      ValidateRetryPolicy(p);
    } catch (const ClientError& e) {
      EXPECT_EQ(e.code(), grpc::StatusCode::INVALID_ARGUMENT);
      return e.message();
    }
    return "";
  };
  EXPECT_EQ(error_of({}), "");
  EXPECT_EQ(error_of({.max_attempts = 0}), "retry.max_attempts must be >= 1, got 0");
  EXPECT_EQ(error_of({.initial_backoff_s = -1}), "retry.initial_backoff_s must be a finite number >= 0");
  EXPECT_EQ(error_of({.initial_backoff_s = 1, .max_backoff_s = 0.5}),
            "retry.max_backoff_s must be finite and >= retry.initial_backoff_s");
  EXPECT_EQ(error_of({.multiplier = 0.5}), "retry.multiplier must be a finite number >= 1");
  EXPECT_EQ(error_of({.jitter = 2}), "retry.jitter must be in [0, 1]");
}

TEST(ClientRetry, RequestIdsAre128BitHexAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const auto id = NewRequestId();
    ASSERT_EQ(id.size(), 32u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(ClientRetry, StatusCodeNamesAndErrors) {
  EXPECT_STREQ(StatusCodeName(grpc::StatusCode::INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(StatusCodeName(grpc::StatusCode::UNAVAILABLE), "UNAVAILABLE");
  const ClientError e(grpc::StatusCode::NOT_FOUND, "no checkpoint 'x'");
  EXPECT_STREQ(e.what(), "NOT_FOUND: no checkpoint 'x'");
  EXPECT_EQ(e.message(), "no checkpoint 'x'");
  Result<int> bad(grpc::Status(grpc::StatusCode::ABORTED, "stop"), 2);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.attempts(), 2);
  EXPECT_THROW(bad.value(), ClientError);
  Result<int> good(7);
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(good.value(), 7);
}

}  // namespace
}  // namespace streambp::client
