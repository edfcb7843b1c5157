#pragma once
/// SHA-256 of bytes, as lowercase hex (OpenSSL's libcrypto): checkpoint manifests, exported
/// weights, the identity of a base model.
#include <string>
#include <string_view>

namespace streambp {

std::string Sha256Hex(std::string_view bytes);

}  // namespace streambp
