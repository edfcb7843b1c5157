#pragma once
// Helpers of the safetensors tests (safetensors_test.cpp, safetensors_corrupt_test.cpp): files
// written byte by byte, independent of the library's writer.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "streambp/error.h"
#include "streambp/safetensors.h"

namespace streambp::safetensors_test {

inline constexpr const char* kWhat = "model.safetensors";

/// The 8-byte little-endian length, built byte by byte (independent of the host order).
inline std::string le_u64(std::uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

/// A file from a header written by hand and raw data bytes; no padding added.
inline std::string make_file(const std::string& header, const std::string& data = "") {
  return le_u64(header.size()) + header + data;
}

inline std::string bytes_of(std::initializer_list<unsigned char> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

/// Parses `bytes` and expects InvalidArgument whose message holds every one of `parts`.
inline void expect_invalid(const std::string& bytes, std::initializer_list<std::string> parts) {
  try {
    ParseSafetensors(bytes, kWhat);
    ADD_FAILURE() << "expected InvalidArgument, parse succeeded";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(kWhat), std::string::npos) << message;
    for (const auto& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message \"" << message << "\" lacks \"" << part << "\"";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument, got: " << e.what();
  }
}

/// A header with one F32 tensor of `shape` at `offsets`, written by hand.
inline std::string one_tensor_header(const std::string& name, const std::string& dtype, const std::string& shape,
                              const std::string& offsets) {
  return "{\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}}";
}

inline std::uint64_t header_length(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

}  // namespace streambp::safetensors_test
