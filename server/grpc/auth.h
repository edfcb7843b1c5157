#pragma once
// Bearer-token authorization of calls (DESIGN §7 Auth): full-access and read-only tokens
// from the config, compared in constant time.
#include <string>
#include <vector>

#include <grpcpp/server_context.h>

#include "config.h"

namespace streambp::server {

enum class Access { kRead, kWrite };

class Authorizer {
 public:
  explicit Authorizer(const AuthSection& auth) : auth_(auth) {}
  bool enabled() const { return !auth_.tokens.empty() || !auth_.read_only_tokens.empty(); }
  /// Throws Unauthenticated (no or a bad token) or PermissionDenied (a read-only token on a
  /// call that changes the model). Thread-safe.
  void authorize(const grpc::CallbackServerContext& ctx, Access access) const;

 private:
  AuthSection auth_;
};

}  // namespace streambp::server
