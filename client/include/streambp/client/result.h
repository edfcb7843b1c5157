#pragma once
/// The error model of the client library.
///
/// RPCs return `Result<T>`: either the response or the final grpc::Status of the call
/// (after retries). Nothing is thrown for a failed RPC; check ok() first. value() on a
/// failed result throws ClientError, so code that prefers exceptions can write
/// `client->GetInfo().value()`.
///
/// Everything that is not an RPC (bad ClientOptions, unreadable or malformed data files,
/// bad objective options) throws ClientError with a status code: INVALID_ARGUMENT for bad
/// input, NOT_FOUND for a missing file, DATA_LOSS for a corrupt weights stream.
#include <stdexcept>
#include <string>
#include <utility>

#include <grpcpp/support/status.h>

namespace streambp::client {

/// "INVALID_ARGUMENT", "UNAVAILABLE", ... (the canonical gRPC code names).
const char* StatusCodeName(grpc::StatusCode code);

/// An error with a gRPC status code; what() is "<CODE>: <message>".
class ClientError : public std::runtime_error {
 public:
  ClientError(grpc::StatusCode code, const std::string& message);
  explicit ClientError(const grpc::Status& status) : ClientError(status.error_code(), status.error_message()) {}

  grpc::StatusCode code() const { return code_; }
  /// The message without the code prefix.
  const std::string& message() const { return message_; }
  grpc::Status status() const { return grpc::Status(code_, message_); }

 private:
  grpc::StatusCode code_;
  std::string message_;
};

/// The outcome of one call: the response, or the final status (after the channel's retries).
template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}
  Result(grpc::Status status) : status_(std::move(status)) {}

  bool ok() const { return status_.ok(); }
  const grpc::Status& status() const { return status_; }
  grpc::StatusCode code() const { return status_.error_code(); }

  /// The response; throws ClientError(status()) when !ok().
  const T& value() const& {
    check();
    return value_;
  }
  T& value() & {
    check();
    return value_;
  }
  T&& value() && {
    check();
    return std::move(value_);
  }
  const T* operator->() const {
    check();
    return &value_;
  }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!status_.ok()) throw ClientError(status_);
  }

  T value_{};
  grpc::Status status_;  // OK by default
};

}  // namespace streambp::client
