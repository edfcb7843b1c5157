#pragma once
// The one place where errors become gRPC statuses (STYLE: errors). Every non-OK status the
// server sends is made here, from a core exception.
#include <exception>
#include <string>

#include <grpcpp/support/status.h>

namespace streambp::server {

/// Error codes map one to one (invalid input -> INVALID_ARGUMENT, missing -> NOT_FOUND,
/// wrong state -> FAILED_PRECONDITION, too large / out of memory (c10 or std::bad_alloc) ->
/// RESOURCE_EXHAUSTED, cancelled, deadline, auth, unavailable), anything else -> INTERNAL.
/// Messages longer than 2000 characters are truncated. A null `error` is OK.
grpc::Status ToStatus(std::exception_ptr error);

/// Name of a status code as in the gRPC docs (OK, INVALID_ARGUMENT, ...).
std::string CodeName(grpc::StatusCode code);

}  // namespace streambp::server
