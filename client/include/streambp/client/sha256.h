#pragma once
/// SHA-256 for verifying exported weights: OpenSSL's (libcrypto, which gRPC links already).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace streambp::client {

/// Incremental SHA-256: update() any number of times, then hex() or digest() once.
/// Not thread-safe (one object per stream).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  /// Finishes the hash; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  /// digest() as 64 lowercase hex digits.
  std::string hex();

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
};

/// SHA-256 of `data` as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view data);

}  // namespace streambp::client
