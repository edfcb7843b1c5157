#pragma once
/// SHA-256 of bytes, as lowercase hex (OpenSSL's libcrypto): checkpoint manifests, exported
/// weights, the identity of a base model.
#include <string>
#include <string_view>

namespace streambp {

std::string Sha256Hex(std::string_view bytes);

/// SHA-256 of bytes given in pieces.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view bytes);
  /// The digest of everything given, as lowercase hex (once).
  std::string hex();

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace streambp
