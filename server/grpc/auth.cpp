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

}  // namespace

void Authorizer::authorize(const grpc::CallbackServerContext& ctx, Access access) const {
  if (!enabled()) return;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    throw Unauthenticated("missing credentials: send metadata 'authorization: Bearer <token>'");
  }
  const std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  if (value.rfind(prefix, 0) != 0) throw Unauthenticated("the authorization metadata must be 'Bearer <token>'");
  const std::string token = value.substr(prefix.size());
  bool full = false, read_only = false;
  for (const auto& t : auth_.tokens) full = ConstantTimeEqual(t, token) || full;
  for (const auto& t : auth_.read_only_tokens) read_only = ConstantTimeEqual(t, token) || read_only;
  if (full) return;
  if (read_only) {
    if (access == Access::kRead) return;
    throw PermissionDenied("this token is read-only: it cannot change the model");
  }
  throw Unauthenticated("invalid token");
}

}  // namespace streambp::server
