#pragma once
/// SHA-256 (FIPS 180-4), so that the client verifies exported weights with no dependency
/// beyond gRPC and protobuf.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace streambp::client {

/// Incremental SHA-256: update() any number of times, then hex() or digest() once.
/// Not thread-safe (one object per stream).
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  /// Finishes the hash; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  /// digest() as 64 lowercase hex digits.
  std::string hex();

 private:
  void block(const uint8_t* p);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed so far
};

/// SHA-256 of `data` as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view data);

}  // namespace streambp::client
