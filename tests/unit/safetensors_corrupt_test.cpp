// Corrupt safetensors files: every way a header or its offsets can be wrong is refused with an
// InvalidArgument naming the file and the problem, and random corruption never crashes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <string>

#include "streambp/error.h"
#include "streambp/safetensors.h"
#include "unit/safetensors_util.h"

namespace streambp {
namespace {

using namespace safetensors_test;  // NOLINT: the shared helpers

// ---------------------------------------------------------------------------------------
// Corrupt files

std::string valid_file() {
  return SerializeSafetensors(
      {{"a", torch::arange(4, torch::kFloat32)}, {"b", torch::arange(3, torch::kInt64)}}, {{"format", "pt"}});
}

TEST(SafetensorsCorrupt, TruncatedFile) {
  const std::string file = valid_file();
  const std::uint64_t n = header_length(file);
  ASSERT_EQ(file.size(), 8 + n + 16 + 24);
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
    EXPECT_THROW(ParseSafetensors(file.substr(0, cut), kWhat), InvalidArgument) << cut;
    expect_invalid(file.substr(0, cut), {"shorter than the 8-byte header length"});
  }
  for (std::size_t cut : {std::size_t{8}, std::size_t{9}, std::size_t{8 + n / 2}, std::size_t{8 + n - 1}}) {
    EXPECT_THROW(ParseSafetensors(file.substr(0, cut), kWhat), InvalidArgument) << cut;
    expect_invalid(file.substr(0, cut), {"past the end of the file"});
  }
  // Within the data: the last tensor ("b", after "a" in name order) no longer fits.
  for (std::size_t cut : {std::size_t{8 + n + 16 + 1}, file.size() - 1}) {
    EXPECT_THROW(ParseSafetensors(file.substr(0, cut), kWhat), InvalidArgument) << cut;
    expect_invalid(file.substr(0, cut), {"tensor 'b'", "past the data buffer"});
  }
  expect_invalid(file.substr(0, 8 + n), {"past the data buffer"});
  expect_invalid(file.substr(0, 8 + n + 3), {"tensor 'a'", "past the data buffer"});
}

TEST(SafetensorsCorrupt, HeaderLengthPastEndOfFile) {
  const std::string file = valid_file();
  std::string bad = le_u64(file.size() - 7) + file.substr(8);
  expect_invalid(bad, {"header length", "past the end of the file"});
  bad = le_u64(std::numeric_limits<std::uint64_t>::max()) + file.substr(8);
  expect_invalid(bad, {"18446744073709551615", "past the end of the file"});
  bad = le_u64(std::numeric_limits<std::uint64_t>::max() - 6) + file.substr(8);
  expect_invalid(bad, {"past the end of the file"});
  expect_invalid(le_u64(std::uint64_t{1} << 63), {"past the end of the file"});
}

TEST(SafetensorsCorrupt, HeaderLengthAboveLimit) {
  const std::uint64_t n = 100'000'001;
  std::string file = le_u64(n);
  file += "{}";
  file.append(n - 2, ' ');
  expect_invalid(file, {"exceeds the limit"});
}

TEST(SafetensorsCorrupt, OverlappingOffsets) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  expect_invalid(make_file(header, std::string(24, '\0')), {"tensor 'b'", "overlap", "'a'"});
  // The same range twice.
  const std::string same = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  expect_invalid(make_file(same, std::string(16, '\0')), {"overlap"});
  // An empty tensor inside another one's range.
  const std::string inside = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  expect_invalid(make_file(inside, std::string(16, '\0')), {"tensor 'e'", "overlap"});
}

TEST(SafetensorsCorrupt, OutOfRangeOffsets) {
  expect_invalid(make_file(one_tensor_header("w", "F32", "[4]", "[0,16]"), std::string(8, '\0')),
                 {"tensor 'w'", "past the data buffer of 8 bytes"});
  expect_invalid(make_file(one_tensor_header("w", "F32", "[1]",
                                             "[18446744073709551611,"
                                             "18446744073709551615]"),
                           std::string(8, '\0')),
                 {"tensor 'w'", "past the data buffer"});
}

TEST(SafetensorsCorrupt, HoleInBuffer) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[16,24]}})";
  expect_invalid(make_file(header, std::string(24, '\0')), {"tensor 'b'", "hole", "[8, 16)"});
  // A hole at the start, and bytes after the last tensor.
  expect_invalid(make_file(one_tensor_header("w", "U8", "[4]", "[4,8]"), std::string(8, '\0')),
                 {"tensor 'w'", "hole"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[4]", "[0,4]"), std::string(8, '\0')),
                 {"[4, 8)", "belong to no tensor"});
  expect_invalid(make_file("{}", "x"), {"belong to no tensor"});
}

TEST(SafetensorsCorrupt, BadJson) {
  expect_invalid(make_file(""), {"not valid JSON"});
  expect_invalid(make_file("{\"a\":"), {"not valid JSON"});
  expect_invalid(make_file("{not json}"), {"not valid JSON"});
  expect_invalid(make_file("{} trailing"), {"not valid JSON"});
  expect_invalid(make_file("{\"\xff\":1}"), {"not valid JSON"});  // not UTF-8
  expect_invalid(make_file(std::string("{}\0", 3)), {"not valid JSON", "NUL"});
  expect_invalid(make_file(std::string("{}\0{\"a\":", 8)), {"not valid JSON", "NUL"});
  // A huge unterminated string: the message stays short.
  try {
    ParseSafetensors(make_file("{\"" + std::string(100000, 'a')), kWhat);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_LT(std::string(e.what()).size(), 1000u);
  }
}

TEST(SafetensorsCorrupt, HeaderNotAnObject) {
  expect_invalid(make_file("[1,2]"), {"not a JSON object"});
  expect_invalid(make_file("\"str\""), {"not a JSON object"});
  expect_invalid(make_file("42"), {"not a JSON object"});
  expect_invalid(make_file("null"), {"not a JSON object"});
}

TEST(SafetensorsCorrupt, EntryNotAnObjectOrIllTyped) {
  expect_invalid(make_file(R"({"w":5})"), {"tensor 'w'", "not a JSON object"});
  expect_invalid(make_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})"),
                 {"tensor 'w'", "missing \"dtype\""});
  expect_invalid(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"),
                 {"tensor 'w'", "missing \"shape\""});
  expect_invalid(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"),
                 {"tensor 'w'", "missing \"data_offsets\""});
  expect_invalid(make_file(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                 {"tensor 'w'", "\"dtype\" is not a string"});
  expect_invalid(make_file(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", "abcd"),
                 {"tensor 'w'", "\"shape\" is not an array"});
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  expect_invalid(make_file(one_tensor_header("layer.w", "F8_E4M3", "[4]", "[0,4]"), "abcd"),
                 {"tensor 'layer.w'", "dtype 'F8_E4M3'"});
  expect_invalid(make_file(one_tensor_header("w", "f32", "[1]", "[0,4]"), "abcd"), {"tensor 'w'", "'f32'"});
}

TEST(SafetensorsCorrupt, ShapeSizeMismatch) {
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  const std::string file =
      make_file(one_tensor_header(name, "F32", "[5,6]", "[0,100]"), std::string(100, '\0'));
  try {
    ParseSafetensors(file, kWhat);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight': data_offsets "
                 "[0, 100] hold 100 bytes but dtype F32 and shape [5, 6] need 120");
  }
  // Too many bytes, and a scalar that claims no bytes.
  expect_invalid(make_file(one_tensor_header("w", "I16", "[2]", "[0,8]"), std::string(8, '\0')),
                 {"tensor 'w'", "hold 8 bytes", "need 4"});
  expect_invalid(make_file(one_tensor_header("w", "F64", "[]", "[0,0]")), {"tensor 'w'", "need 8"});
  // numel fits in int64 but numel * element size does not fit in 64 bits.
  expect_invalid(
      make_file(one_tensor_header("w", "F64", "[2305843009213693952]", "[0,8]"), std::string(8, '\0')),
      {"tensor 'w'", "more than 2^64"});
}

TEST(SafetensorsCorrupt, BadShapeEntries) {
  expect_invalid(make_file(one_tensor_header("w", "U8", "[-1,2]", "[0,0]")),
                 {"tensor 'w'", "-1", "not a non-negative integer"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[2.5]", "[0,0]")),
                 {"tensor 'w'", "not a non-negative integer"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[\"2\"]", "[0,2]"), "ab"),
                 {"tensor 'w'", "not a non-negative integer"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[[2]]", "[0,2]"), "ab"),
                 {"tensor 'w'", "not a non-negative integer"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[18446744073709551616]", "[0,0]")),
                 {"tensor 'w'", "not a non-negative integer"});
  // Element counts that overflow, also with a zero dimension in front.
  expect_invalid(make_file(one_tensor_header("w", "U8", "[4294967296,4294967296]", "[0,0]")),
                 {"tensor 'w'", "too many elements"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[0,4294967296,4294967296]", "[0,0]")),
                 {"tensor 'w'", "too many elements"});
  expect_invalid(make_file(one_tensor_header("w", "U8", "[9223372036854775808]", "[0,0]")),
                 {"tensor 'w'", "too many elements"});
  // A shape nested far deeper than any stack: rejected without recursion.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_invalid(make_file(one_tensor_header("w", "U8", "[" + deep + "]", "[0,0]")),
                 {"tensor 'w'", "not a non-negative integer"});
}

TEST(SafetensorsCorrupt, BadDataOffsets) {
  expect_invalid(make_file(one_tensor_header("w", "U8", "[4]", "[8,4]"), std::string(8, '\0')),
                 {"tensor 'w'", "begin after end"});
  for (const char* offsets : {"[0]", "[0,4,8]", "[-1,3]", "[\"0\",4]", "[0,4.5]", "4", "{}", "null", "[]"}) {
    expect_invalid(make_file(one_tensor_header("w", "U8", "[4]", offsets), "abcd"),
                   {"tensor 'w'", "not two non-negative integers"});
  }
}

TEST(SafetensorsCorrupt, BadMetadata) {
  expect_invalid(make_file(R"({"__metadata__":{"format":"pt","step":1}})"),
                 {"__metadata__", "'step'", "not a string"});
  expect_invalid(make_file(R"({"__metadata__":{"k":null}})"), {"'k'", "not a string"});
  expect_invalid(make_file(R"({"__metadata__":["pt"]})"), {"__metadata__", "not a JSON object"});
  // null metadata is accepted, as by the reference implementation.
  EXPECT_TRUE(ParseSafetensors(make_file(R"({"__metadata__":null})"), kWhat).metadata.empty());
}

TEST(SafetensorsCorrupt, BoolBytesOtherThanZeroOrOne) {
  expect_invalid(make_file(one_tensor_header("mask", "BOOL", "[3]", "[0,3]"), std::string("\x01\x00\x02", 3)),
                 {"tensor 'mask'", "not 0 or 1"});
  const auto ok = ParseSafetensors(
      make_file(one_tensor_header("mask", "BOOL", "[3]", "[0,3]"), std::string("\x01\x00\x01", 3)), kWhat);
  EXPECT_TRUE(torch::equal(ok.tensors.at("mask"), torch::tensor({true, false, true})));
}

TEST(SafetensorsCorrupt, LongNamesAreCutInMessages) {
  const std::string name(100000, 'n');
  try {
    ParseSafetensors(make_file(one_tensor_header(name, "XX", "[1]", "[0,1]"), "a"), kWhat);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_LT(std::string(e.what()).size(), 1000u);
    EXPECT_NE(std::string(e.what()).find("100000 bytes"), std::string::npos);
  }
}

TEST(SafetensorsCorrupt, RandomCorruptionNeverCrashes) {
  const std::string valid = SerializeSafetensors({{"a", torch::arange(6, torch::kFloat32).reshape({2, 3})},
                                                  {"b", torch::ones({2, 2}, torch::kBFloat16)},
                                                  {"c", torch::tensor({true, false, true})},
                                                  {"d", torch::empty({0}, torch::kInt64)},
                                                  {"e", torch::tensor(7, torch::kInt16).reshape({})}},
                                                 {{"format", "pt"}});
  const std::size_t header_end = 8 + header_length(valid);
  std::mt19937_64 rng(20240601);
  int accepted = 0;
  int rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = valid;
    switch (iter % 4) {
      case 0:    // flip a few random bytes anywhere
      case 1: {  // ... or within the header, where they matter most
        const std::size_t limit = iter % 4 == 0 ? bytes.size() : header_end;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) {
          bytes[rng() % limit] ^= static_cast<char>(1 + rng() % 255);
        }
        break;
      }
      case 2:  // truncate
        bytes.resize(rng() % bytes.size());
        break;
      case 3: {  // a random header length, or a random byte appended
        if (rng() % 2) {
          std::uint64_t n = rng();
          if (rng() % 2) n %= bytes.size() + 16;
          bytes.replace(0, 8, le_u64(n));
        } else {
          bytes.push_back(static_cast<char>(rng() % 256));
        }
        break;
      }
    }
    try {
      const auto contents = ParseSafetensors(bytes, kWhat);
      for (const auto& [name, t] : contents.tensors) {
        // Touch every element so that a bad tensor would show up under the sanitizers.
        if (t.numel() > 0) (void)t.to(torch::kFloat64).sum().item<double>();
      }
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << ": unexpected exception " << e.what();
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace streambp
