#include "auth.h"

#include "streambp/error.h"

namespace streambp::server {
namespace {

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool Matches(const std::vector<std::string>& patterns, const std::string& name) {
  if (name.empty()) return false;  // the default session is the server's own
  for (const auto& p : patterns) {
    if (!p.empty() && p.back() == '*' ? name.rfind(p.substr(0, p.size() - 1), 0) == 0 : name == p) return true;
  }
  return false;
}

}  // namespace

void Caller::require(const std::string& session, Access access) const {
  switch (kind_) {
    case Kind::kAdmin:
      return;
    case Kind::kReadOnly:
      if (access == Access::kRead) return;
      throw PermissionDenied("this token is read-only: it cannot change the model");
    case Kind::kScoped:
      // "" names no session on a server with sessions (scoped tokens need them): the
      // server-wide reads answer, everything else is refused by the host.
      if (session.empty()) return;
      if (!Matches(scope_->sessions, session)) throw NotFound("no session named '" + session + "'");
      if (access == Access::kWrite && scope_->access != "write") {
        throw PermissionDenied("this token may only read session '" + session + "'");
      }
      return;
  }
}

void Caller::require_create(const std::string& session) const {
  if (kind_ == Kind::kAdmin) return;
  if (kind_ == Kind::kScoped && scope_->create && scope_->access == "write" && Matches(scope_->sessions, session)) {
    return;
  }
  throw PermissionDenied("this token may not create a session named '" + session + "'");
}

bool Caller::sees(const std::string& session) const {
  return kind_ != Kind::kScoped || Matches(scope_->sessions, session);
}

Caller Authorizer::authorize(const grpc::CallbackServerContext& ctx, Access access) const {
  if (!enabled()) return Caller::Admin();
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return authorize(nullptr, access);
  const std::string value(it->second.data(), it->second.size());
  return authorize(&value, access);
}

Caller Authorizer::authorize(const std::string* authorization, Access access) const {
  if (!enabled()) return Caller::Admin();
  if (authorization == nullptr) {
    throw Unauthenticated("missing credentials: send metadata 'authorization: Bearer <token>'");
  }
  const std::string& value = *authorization;
  const std::string prefix = "Bearer ";
  if (value.rfind(prefix, 0) != 0) throw Unauthenticated("the authorization metadata must be 'Bearer <token>'");
  const std::string token = value.substr(prefix.size());
  bool full = false, read_only = false;
  const ScopedToken* scoped = nullptr;
  for (const auto& t : auth_.tokens) full = ConstantTimeEqual(t, token) || full;
  for (const auto& t : auth_.read_only_tokens) read_only = ConstantTimeEqual(t, token) || read_only;
  for (const auto& t : auth_.scoped_tokens) {
    if (ConstantTimeEqual(t.token, token)) scoped = &t;
  }
  if (full) return Caller::Admin();
  if (scoped) return Caller::Scoped(scoped);
  if (read_only) {
    if (access == Access::kRead) return Caller::ReadOnly();
    throw PermissionDenied("this token is read-only: it cannot change the model");
  }
  throw Unauthenticated("invalid token");
}

}  // namespace streambp::server
