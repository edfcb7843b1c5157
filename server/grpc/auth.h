#pragma once
// Bearer-token authorization of calls (docs/architecture.md: Errors, admission and durability Auth): full-access (admin) tokens,
// read-only tokens, and tokens scoped to some sessions (tenants), compared in constant time.
#include <string>
#include <vector>

#include <grpcpp/server_context.h>

#include "config.h"

namespace streambp::server {

enum class Access { kRead, kWrite };

/// Who a call comes from, once authenticated: what it may do to which session.
class Caller {
 public:
  /// Everything (no auth configured, or an admin token).
  static Caller Admin() { return Caller(Kind::kAdmin, nullptr); }
  static Caller ReadOnly() { return Caller(Kind::kReadOnly, nullptr); }
  static Caller Scoped(const ScopedToken* scope) { return Caller(Kind::kScoped, scope); }

  /// Throws NotFound for a session this caller may not see (names do not leak), and
  /// PermissionDenied for a change it may not make.
  void require(const std::string& session, Access access) const;
  /// Throws PermissionDenied unless the caller may create a session of this name.
  void require_create(const std::string& session) const;
  /// Whether ListSessions shows it this session.
  bool sees(const std::string& session) const;
  bool admin() const { return kind_ == Kind::kAdmin; }

 private:
  enum class Kind { kAdmin, kReadOnly, kScoped };
  Caller(Kind kind, const ScopedToken* scope) : kind_(kind), scope_(scope) {}
  Kind kind_;
  const ScopedToken* scope_;
};

class Authorizer {
 public:
  explicit Authorizer(const AuthSection& auth) : auth_(auth) {}
  bool enabled() const {
    return !auth_.tokens.empty() || !auth_.read_only_tokens.empty() || !auth_.scoped_tokens.empty();
  }
  /// Throws Unauthenticated (no or a bad token) or PermissionDenied (a read-only token on a
  /// call that changes the model). Thread-safe. The Caller lives as long as this Authorizer.
  Caller authorize(const grpc::CallbackServerContext& ctx, Access access) const;
  /// The same from an `authorization` value ("Bearer <token>"; null: none was sent).
  Caller authorize(const std::string* authorization, Access access) const;

 private:
  AuthSection auth_;
};

}  // namespace streambp::server
