#pragma once
/// Exceptions thrown by the core. Each carries a category that the server maps to a
/// gRPC status code in one place; the message says what was wrong and, where it helps,
/// what to do. Anything else the core lets escape (c10::Error from a TORCH_CHECK) is an
/// internal error, except c10::OutOfMemoryError, which means "too large".
#include <stdexcept>
#include <string>

namespace streambp {

enum class ErrorCode {
  kInvalidArgument,     ///< the caller's input is wrong (bad token id, bad file, bad option)
  kNotFound,            ///< a named thing does not exist (file, tensor, objective)
  kFailedPrecondition,  ///< the state does not allow this now (no model, wrong step state)
  kResourceExhausted,   ///< too large for the configured limits or memory budget
  kUnavailable,         ///< a peer (another rank) is gone, or the service is shutting down
  kDeadlineExceeded,    ///< the caller's deadline passed before (or while) the work ran
  kCancelled,           ///< the caller went away; the work was abandoned and rolled back
  kUnauthenticated,     ///< no valid credentials
  kPermissionDenied,    ///< the caller may not do this (a read-only or scoped token)
  kAlreadyExists,       ///< a named thing exists already (a session name)
  kInternal,            ///< a bug or an unexpected failure
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& m) : Error(ErrorCode::kInvalidArgument, m) {}
};
class NotFound : public Error {
 public:
  explicit NotFound(const std::string& m) : Error(ErrorCode::kNotFound, m) {}
};
class FailedPrecondition : public Error {
 public:
  explicit FailedPrecondition(const std::string& m) : Error(ErrorCode::kFailedPrecondition, m) {}
};
class ResourceExhausted : public Error {
 public:
  explicit ResourceExhausted(const std::string& m) : Error(ErrorCode::kResourceExhausted, m) {}
};
class Unavailable : public Error {
 public:
  explicit Unavailable(const std::string& m) : Error(ErrorCode::kUnavailable, m) {}
};
class DeadlineExceeded : public Error {
 public:
  explicit DeadlineExceeded(const std::string& m) : Error(ErrorCode::kDeadlineExceeded, m) {}
};
class Cancelled : public Error {
 public:
  explicit Cancelled(const std::string& m) : Error(ErrorCode::kCancelled, m) {}
};
class Unauthenticated : public Error {
 public:
  explicit Unauthenticated(const std::string& m) : Error(ErrorCode::kUnauthenticated, m) {}
};
class PermissionDenied : public Error {
 public:
  explicit PermissionDenied(const std::string& m) : Error(ErrorCode::kPermissionDenied, m) {}
};
class AlreadyExists : public Error {
 public:
  explicit AlreadyExists(const std::string& m) : Error(ErrorCode::kAlreadyExists, m) {}
};

}  // namespace streambp
