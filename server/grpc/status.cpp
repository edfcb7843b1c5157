#include "status.h"

#include <c10/util/Exception.h>

#include "streambp/error.h"

namespace streambp::server {
namespace {

constexpr size_t kMaxMessage = 2000;

grpc::Status Make(grpc::StatusCode code, std::string message) {
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage) + "... (truncated)";
  return grpc::Status(code, message);
}

}  // namespace

grpc::Status ToStatus(std::exception_ptr error) {
  if (!error) return grpc::Status::OK;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    switch (e.code()) {
      case ErrorCode::kInvalidArgument: return Make(grpc::StatusCode::INVALID_ARGUMENT, e.what());
      case ErrorCode::kNotFound: return Make(grpc::StatusCode::NOT_FOUND, e.what());
      case ErrorCode::kFailedPrecondition: return Make(grpc::StatusCode::FAILED_PRECONDITION, e.what());
      case ErrorCode::kResourceExhausted: return Make(grpc::StatusCode::RESOURCE_EXHAUSTED, e.what());
      case ErrorCode::kUnavailable: return Make(grpc::StatusCode::UNAVAILABLE, e.what());
      case ErrorCode::kDeadlineExceeded: return Make(grpc::StatusCode::DEADLINE_EXCEEDED, e.what());
      case ErrorCode::kCancelled: return Make(grpc::StatusCode::CANCELLED, e.what());
      case ErrorCode::kUnauthenticated: return Make(grpc::StatusCode::UNAUTHENTICATED, e.what());
      case ErrorCode::kPermissionDenied: return Make(grpc::StatusCode::PERMISSION_DENIED, e.what());
      case ErrorCode::kAlreadyExists: return Make(grpc::StatusCode::ALREADY_EXISTS, e.what());
      case ErrorCode::kInternal: return Make(grpc::StatusCode::INTERNAL, e.what());
    }
    return Make(grpc::StatusCode::INTERNAL, e.what());
  } catch (const c10::OutOfMemoryError& e) {
    return Make(grpc::StatusCode::RESOURCE_EXHAUSTED,
                std::string("out of memory during the step; it was rolled back (no gradients kept): ") +
                    e.what_without_backtrace() +
                    ". Use smaller micro-batches (trainer.micro_batch_tokens), shorter sequences or smaller chunks.");
  } catch (const c10::Error& e) {
    return Make(grpc::StatusCode::INTERNAL, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return Make(grpc::StatusCode::RESOURCE_EXHAUSTED, "out of host memory during the request");
  } catch (const std::exception& e) {
    return Make(grpc::StatusCode::INTERNAL, e.what());
  } catch (...) {
    return Make(grpc::StatusCode::INTERNAL, "unknown error");
  }
}

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "CODE_" + std::to_string(static_cast<int>(code));
  }
}

}  // namespace streambp::server
