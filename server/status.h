#pragma once
// The one place where exceptions from the core become gRPC statuses (STYLE: errors).
#include <exception>
#include <string>

#include <grpcpp/support/status.h>

namespace streambp::server {

/// invalid input -> INVALID_ARGUMENT, missing -> NOT_FOUND, wrong state ->
/// FAILED_PRECONDITION, too large / out of memory -> RESOURCE_EXHAUSTED, anything else ->
/// INTERNAL. Messages longer than 2000 characters are truncated.
grpc::Status ToStatus(std::exception_ptr error);

/// Name of a status code as in the gRPC docs (OK, INVALID_ARGUMENT, ...).
std::string CodeName(grpc::StatusCode code);

}  // namespace streambp::server
