// The client's retry policy: the service config it becomes, what is retried, request ids.
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/client/client.h"
#include "streambp/client/retry.h"

namespace streambp::client {
namespace {

// The policy becomes the channel's service config, which gRPC itself parses (a channel
// made with a bad one would fail every call): a real parser checks the JSON here.
TEST(ClientRetry, ServiceConfigCarriesThePolicy) {
  const auto config = nlohmann::json::parse(ServiceConfigJson({}));
  ASSERT_EQ(config["methodConfig"].size(), 1u);
  const auto& method = config["methodConfig"][0];
  EXPECT_EQ(method["name"], nlohmann::json::parse(R"([{"service": "streambp.v1.Trainer"}])"));
  const auto& retry = method["retryPolicy"];
  EXPECT_EQ(retry["maxAttempts"], 5);
  EXPECT_EQ(retry["initialBackoff"], "0.200000000s");
  EXPECT_EQ(retry["maxBackoff"], "5.000000000s");
  EXPECT_EQ(retry["backoffMultiplier"].get<double>(), 2.0);
  EXPECT_EQ(retry["retryableStatusCodes"], nlohmann::json::parse(R"(["UNAVAILABLE"])"));

  const auto custom = nlohmann::json::parse(
      ServiceConfigJson({.max_attempts = 3, .initial_backoff_s = 0.001, .max_backoff_s = 0.25, .multiplier = 1.5}));
  const auto& r = custom["methodConfig"][0]["retryPolicy"];
  EXPECT_EQ(r["maxAttempts"], 3);
  EXPECT_EQ(r["initialBackoff"], "0.001000000s");
  EXPECT_EQ(r["maxBackoff"], "0.250000000s");
  EXPECT_EQ(r["backoffMultiplier"].get<double>(), 1.5);

  EXPECT_EQ(ServiceConfigJson({.max_attempts = 1}), "");  // no retries: no policy
  EXPECT_THROW(ServiceConfigJson({.max_attempts = 9}), ClientError);
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
  EXPECT_EQ(error_of({.max_attempts = 0}),
            "retry.max_attempts must be in [1, 5] (1 = no retries; gRPC allows at most 5), got 0");
  EXPECT_EQ(error_of({.max_attempts = 6}),
            "retry.max_attempts must be in [1, 5] (1 = no retries; gRPC allows at most 5), got 6");
  EXPECT_EQ(error_of({.max_attempts = 1}), "");
  EXPECT_EQ(error_of({.initial_backoff_s = 0}), "retry.initial_backoff_s must be a finite number of seconds > 0");
  EXPECT_EQ(error_of({.initial_backoff_s = -1}), "retry.initial_backoff_s must be a finite number of seconds > 0");
  EXPECT_EQ(error_of({.initial_backoff_s = 1, .max_backoff_s = 0.5}),
            "retry.max_backoff_s must be finite and >= retry.initial_backoff_s");
  EXPECT_EQ(error_of({.multiplier = 0.5}), "retry.multiplier must be a finite number >= 1");
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
  Result<int> bad(grpc::Status(grpc::StatusCode::ABORTED, "stop"));
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), grpc::StatusCode::ABORTED);
  EXPECT_THROW(bad.value(), ClientError);
  Result<int> good(7);
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(good.value(), 7);
}

}  // namespace
}  // namespace streambp::client
