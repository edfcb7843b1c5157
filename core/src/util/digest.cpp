#include "streambp/digest.h"

#include <openssl/evp.h>

#include "streambp/error.h"

namespace streambp {

namespace {

std::string Hex(const unsigned char* digest, unsigned int length) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "SHA-256 failed (OpenSSL)");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(std::string_view bytes) {
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size()) != 1) {
    throw Error(ErrorCode::kInternal, "SHA-256 failed (OpenSSL)");
  }
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &length) != 1) {
    throw Error(ErrorCode::kInternal, "SHA-256 failed (OpenSSL)");
  }
  return Hex(digest, length);
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "SHA-256 failed (OpenSSL)");
  }
  return Hex(digest, length);
}

}  // namespace streambp
