#include "streambp/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "streambp/digest.h"
#include "streambp/error.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWhat = "model.safetensors";

/// The 8-byte little-endian length, built byte by byte (independent of the host order).
std::string le_u64(std::uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

/// A file from a header written by hand and raw data bytes; no padding added.
std::string make_file(const std::string& header, const std::string& data = "") {
  return le_u64(header.size()) + header + data;
}

std::string bytes_of(std::initializer_list<unsigned char> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

/// Parses `bytes` and expects InvalidArgument whose message holds every one of `parts`.
void expect_invalid(const std::string& bytes, std::initializer_list<std::string> parts) {
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
std::string one_tensor_header(const std::string& name, const std::string& dtype, const std::string& shape,
                              const std::string& offsets) {
  return "{\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}}";
}

/// A unique folder under the system temporary folder, removed with its contents.
class SafetensorsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("streambp_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  /// Names of the files left in the folder.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

/// One tensor of every supported dtype, a 0-dim scalar, an empty and a 3-D tensor.
TensorMap sample_tensors() {
  torch::manual_seed(1234);
  TensorMap t;
  t["f64"] = torch::randn({3, 5}, torch::kFloat64);
  t["f32"] = torch::randn({4, 7}, torch::kFloat32);
  t["f16"] = torch::randn({6}, torch::kFloat16);
  t["bf16"] = torch::randn({2, 9}, torch::kBFloat16);
  t["i64"] = torch::randint(-(std::int64_t{1} << 40), std::int64_t{1} << 40, {5}, torch::kInt64);
  t["i32"] = torch::randint(-2000000000, 2000000000, {3, 3}, torch::kInt32);
  t["i16"] = torch::randint(-32768, 32767, {11}, torch::kInt16);
  t["i8"] = torch::randint(-128, 127, {13}, torch::kInt8);
  t["u8"] = torch::randint(0, 255, {2, 2, 2}, torch::kUInt8);
  t["bool"] = torch::randint(0, 2, {10}).to(torch::kBool);
  t["scalar"] = torch::tensor(3.25, torch::kFloat32).reshape({});
  t["empty"] = torch::empty({0, 3}, torch::kFloat16);
  t["cube"] = torch::randn({2, 3, 4}, torch::kFloat32);
  t["model.layers.0.self_attn.q_proj.weight"] = torch::randn({8, 8}, torch::kBFloat16);
  return t;
}

void expect_same(const TensorMap& expected, const TensorMap& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, want] : expected) {
    const auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << name;
    const auto& got = it->second;
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(got.device().is_cpu()) << name;
    EXPECT_TRUE(got.is_contiguous()) << name;
    EXPECT_TRUE(torch::equal(got, want.cpu())) << name;
  }
}

std::uint64_t header_length(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

// ---------------------------------------------------------------------------------------
// Round trips and layout

TEST(Safetensors, RoundTripEveryDtypeInMemory) {
  const TensorMap tensors = sample_tensors();
  const auto contents = ParseSafetensors(SerializeSafetensors(tensors), kWhat);
  expect_same(tensors, contents.tensors);
  EXPECT_TRUE(contents.metadata.empty());
  EXPECT_EQ(contents.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(contents.tensors.at("empty").numel(), 0);
}

TEST_F(SafetensorsFiles, RoundTripEveryDtypeAndMetadataThroughFile) {
  const TensorMap tensors = sample_tensors();
  const Metadata metadata = {{"format", "pt"}, {"step", "17"}, {"note", "ünïcödé"}};
  WriteSafetensors(path("model.safetensors"), tensors, metadata);
  const auto contents = ReadSafetensors(path("model.safetensors"));
  expect_same(tensors, contents.tensors);
  EXPECT_EQ(contents.metadata, metadata);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST(Safetensors, ReturnedTensorsOwnTheirMemory) {
  const TensorMap tensors = {{"w", torch::arange(6, torch::kFloat32)}};
  TensorMap got;
  {
    std::string bytes = SerializeSafetensors(tensors);
    got = ParseSafetensors(bytes, kWhat).tensors;
    std::fill(bytes.begin(), bytes.end(), '\xff');
  }
  EXPECT_TRUE(torch::equal(got.at("w"), tensors.at("w")));
}

TEST(Safetensors, NonContiguousInputIsWrittenInLogicalOrder) {
  const auto base = torch::arange(12, torch::kInt32).reshape({3, 4});
  const TensorMap tensors = {{"t", base.t()}, {"s", base.index({torch::indexing::Slice(), 1})}};
  const auto got = ParseSafetensors(SerializeSafetensors(tensors), kWhat).tensors;
  EXPECT_TRUE(torch::equal(got.at("t"), base.t().contiguous()));
  EXPECT_TRUE(torch::equal(got.at("s"), torch::tensor({1, 5, 9}, torch::kInt32)));
}

TEST(Safetensors, HeaderIsPaddedSoDataStartsAligned) {
  for (int len = 1; len <= 17; ++len) {
    const TensorMap tensors = {{std::string(len, 'x'), torch::ones({3}, torch::kInt8)}};
    const Metadata metadata = len % 2 ? Metadata{{"k", std::string(len, 'v')}} : Metadata{};
    const std::string file = SerializeSafetensors(tensors, metadata);
    const std::uint64_t n = header_length(file);
    EXPECT_EQ((8 + n) % 8, 0u) << len;
    EXPECT_EQ(file.size(), 8 + n + 3) << len;
    // The padding is trailing spaces; the header is still one JSON object.
    EXPECT_EQ(file[8], '{');
    expect_same(tensors, ParseSafetensors(file, kWhat).tensors);
  }
}

TEST(Safetensors, WriterProducesTheExactBytesOfTheFormat) {
  const TensorMap tensors = {
      {"w", torch::tensor({1.0f, -2.5f, 0.5f, 3.0f}, torch::kFloat32).reshape({2, 2})}};
  const std::string header = R"({"w":{"data_offsets":[0,16],"dtype":"F32","shape":[2,2]}})";
  ASSERT_EQ(header.size(), 57u);
  const std::string expected = le_u64(64) + header + std::string(7, ' ') +
                               bytes_of({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0, 0x00, 0x00, 0x00,
                                         0x3f, 0x00, 0x00, 0x40, 0x40});
  EXPECT_EQ(SerializeSafetensors(tensors), expected);

  const std::string with_metadata =
      R"({"__metadata__":{"format":"pt"},"w":{"data_offsets":[0,16],"dtype":"F32","shape":[2,2]}})";
  ASSERT_EQ(with_metadata.size() % 8, 0u);
  EXPECT_EQ(SerializeSafetensors(tensors, {{"format", "pt"}}),
            le_u64(with_metadata.size()) + with_metadata + expected.substr(8 + 64));
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  // Unpadded header, keys in a different order than the writer uses, and a metadata entry.
  const std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},)"
                             R"("__metadata__":{"format":"pt"},)"
                             R"("a":{"shape":[2,2],"dtype":"F32","data_offsets":[0,16]},)"
                             R"("e":{"dtype":"I64","shape":[0],"data_offsets":[20,20]},)"
                             R"("s":{"dtype":"I16","shape":[],"data_offsets":[20,22]}})";
  const std::string data = bytes_of({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0,  // 1, -2.5
                                     0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x40, 0x40,  // .5, 3
                                     0x80, 0x3f, 0xc0, 0xbf,                          // 1, -1.5
                                     0xfe, 0xff});                                    // -2
  const auto contents = ParseSafetensors(make_file(header, data), kWhat);
  ASSERT_EQ(contents.tensors.size(), 4u);
  EXPECT_EQ(contents.metadata, (Metadata{{"format", "pt"}}));
  const auto& a = contents.tensors.at("a");
  EXPECT_EQ(a.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(a, torch::tensor({1.0f, -2.5f, 0.5f, 3.0f}).reshape({2, 2})));
  const auto& b = contents.tensors.at("b");
  EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(b.to(torch::kFloat32), torch::tensor({1.0f, -1.5f})));
  EXPECT_EQ(contents.tensors.at("e").sizes(), (std::vector<std::int64_t>{0}));
  const auto& s = contents.tensors.at("s");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<std::int16_t>(), -2);
}

TEST(Safetensors, EmptyHeaderAndEmptyTensorsAreValid) {
  EXPECT_TRUE(ParseSafetensors(make_file("{}"), kWhat).tensors.empty());
  EXPECT_TRUE(ParseSafetensors(make_file("{}        "), kWhat).tensors.empty());
  // Several empty tensors at the same offset, before and after a non-empty one.
  const std::string header = R"({"x":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                             R"("y":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                             R"("z":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("w":{"dtype":"BOOL","shape":[3,0],"data_offsets":[2,2]}})";
  const auto contents = ParseSafetensors(make_file(header, "\x07\x08"), kWhat);
  EXPECT_EQ(contents.tensors.size(), 4u);
  EXPECT_EQ(contents.tensors.at("x").sizes(), (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(contents.tensors.at("w").sizes(), (std::vector<std::int64_t>{3, 0}));
}

TEST(Safetensors, SerializeRejectsUnsupportedInput) {
  try {
    SerializeSafetensors({{"c", torch::zeros({2}, torch::kComplexFloat)}});
    ADD_FAILURE() << "complex dtype accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'c'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SerializeSafetensors({{"u", torch::Tensor()}}), InvalidArgument);
  EXPECT_THROW(SerializeSafetensors({{"__metadata__", torch::zeros({1})}}), InvalidArgument);
}

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
  std::string file = le_u64(n) + "{}" + std::string(n - 2, ' ');
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

// ---------------------------------------------------------------------------------------
// Files and model folders

TEST_F(SafetensorsFiles, MissingFileIsNotFound) {
  EXPECT_THROW(ReadSafetensors(path("absent.safetensors")), NotFound);
  try {
    ReadSafetensors(path("absent.safetensors"));
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos);
  }
  EXPECT_THROW(ReadSafetensors(dir_.string()), InvalidArgument);  // a folder
}

TEST_F(SafetensorsFiles, CorruptFileNamesThePath) {
  write_text("bad.safetensors", "short");
  try {
    ReadSafetensors(path("bad.safetensors"));
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(path("bad.safetensors")), std::string::npos);
  }
}

TEST_F(SafetensorsFiles, WriteFileAtomicReplacesAndLeavesNoTemporary) {
  WriteFileAtomic(path("f.bin"), "first");
  WriteFileAtomic(path("f.bin"), std::string("second\0x", 8));
  std::ifstream in(path("f.bin"), std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, std::string("second\0x", 8));
  EXPECT_EQ(listing(), std::vector<std::string>{"f.bin"});
  WriteFileAtomic(path("empty.bin"), "");
  EXPECT_EQ(fs::file_size(path("empty.bin")), 0u);
}

TEST_F(SafetensorsFiles, WriteFileAtomicFailureIsInternalAndCleansUp) {
  try {
    WriteFileAtomic(path("no_such_folder/f.bin"), "x");
    ADD_FAILURE() << "wrote into a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("f.bin"), std::string::npos);
  }
  // Renaming over a non-empty folder fails after the temporary was written.
  fs::create_directories(dir_ / "occupied" / "inside");
  EXPECT_THROW(WriteFileAtomic(path("occupied"), "x"), Error);
  EXPECT_EQ(listing(), std::vector<std::string>{"occupied"});
}

// The streamed writer puts on disk exactly the bytes SerializeSafetensors makes (strided
// views and tensors of every dtype included), reports their size and SHA-256, and a producer
// that fails leaves nothing behind and the target as it was.
TEST_F(SafetensorsFiles, StreamedWriteEqualsTheSerializedBytes) {
  TensorMap tensors = sample_tensors();
  const auto base = torch::arange(24, torch::kFloat64).reshape({4, 6});
  tensors["strided"] = base.t().slice(0, 1, 5);  // a non-contiguous view into `base`
  const auto written = WriteSafetensors(path("m.safetensors"), tensors, {{"format", "pt"}}, /*sha256=*/true);
  std::ifstream in(path("m.safetensors"), std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, SerializeSafetensors(tensors, {{"format", "pt"}}));
  EXPECT_EQ(written.size, got.size());
  EXPECT_EQ(written.sha256, Sha256Hex(got));
  EXPECT_TRUE(WriteSafetensors(path("n.safetensors"), tensors).sha256.empty());  // only when asked
  EXPECT_EQ(WriteFileAtomic(path("t.txt"), "abc", true).sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // FIPS 180-2's "abc"

  // Invalid input fails before any file exists; a producer that throws halfway removes its
  // temporary file and leaves the old file.
  EXPECT_THROW(WriteSafetensors(path("m.safetensors"), {{"__metadata__", torch::zeros({1})}}), InvalidArgument);
  EXPECT_THROW(WriteFileAtomic(path("m.safetensors"),
                               [](const ByteSink& write) {
                                 write("partial", 7);
                                 throw InvalidArgument("the producer failed");
                               }),
               InvalidArgument);
  std::ifstream again(path("m.safetensors"), std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>()), got);
  EXPECT_EQ(listing(), (std::vector<std::string>{"m.safetensors", "n.safetensors", "t.txt"}));
}

TEST_F(SafetensorsFiles, LoadsSingleFileModel) {
  const TensorMap tensors = sample_tensors();
  WriteSafetensors(path("model.safetensors"), tensors);
  expect_same(tensors, LoadModelWeights(dir_.string()));
}

TEST_F(SafetensorsFiles, LoadsShardedModel) {
  const TensorMap tensors = sample_tensors();
  TensorMap first, second;
  std::string weight_map;
  int i = 0;
  for (const auto& [name, t] : tensors) {
    const bool in_first = i++ % 2 == 0;
    (in_first ? first : second)[name] = t;
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + name + "\":\"" +
                  (in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
  }
  WriteSafetensors(path("model-00001-of-00002.safetensors"), first);
  WriteSafetensors(path("model-00002-of-00002.safetensors"), second);
  write_text("model.safetensors.index.json",
             R"({"metadata":{"total_size":1234},"weight_map":{)" + weight_map + "}}");
  // The index wins over a stray single file.
  WriteSafetensors(path("model.safetensors"), {{"stray", torch::zeros({1})}});
  expect_same(tensors, LoadModelWeights(dir_.string()));
}

class ShardedIndex : public SafetensorsFiles {
 protected:
  void SetUp() override {
    SafetensorsFiles::SetUp();
    WriteSafetensors(path("s1.safetensors"), {{"a", torch::ones({2})}, {"b", torch::ones({3})}});
    WriteSafetensors(path("s2.safetensors"), {{"c", torch::ones({4})}});
  }
  /// Expects LoadModelWeights to throw InvalidArgument whose message holds every part.
  void expect_load_invalid(const std::string& index, std::initializer_list<std::string> parts) {
    write_text("model.safetensors.index.json", index);
    try {
      LoadModelWeights(dir_.string());
      ADD_FAILURE() << "loaded: " << index;
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("model.safetensors.index.json"), std::string::npos) << message;
      for (const auto& part : parts) {
        EXPECT_NE(message.find(part), std::string::npos)
            << "message \"" << message << "\" lacks \"" << part << "\"";
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected InvalidArgument, got: " << e.what();
    }
  }
};

TEST_F(ShardedIndex, ValidIndexLoads) {
  write_text("model.safetensors.index.json",
             R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})");
  const TensorMap got = LoadModelWeights(dir_.string());
  EXPECT_EQ(got.size(), 3u);
  EXPECT_TRUE(torch::equal(got.at("c"), torch::ones({4})));
}

TEST_F(ShardedIndex, MissingTensorIsNamed) {
  expect_load_invalid(R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors",)"
                      R"("d":"s2.safetensors"}})",
                      {"tensor 'd'", "'s2.safetensors'", "not found"});
  // Listed in the wrong shard.
  expect_load_invalid(R"({"weight_map":{"a":"s2.safetensors","c":"s2.safetensors"}})",
                      {"tensor 'a'", "'s2.safetensors'"});
}

TEST_F(ShardedIndex, PathsMustStayInsideTheFolder) {
  expect_load_invalid(R"({"weight_map":{"a":"../x.safetensors"}})",
                      {"tensor 'a'", "'../x.safetensors'", "plain file name"});
  expect_load_invalid(R"({"weight_map":{"a":"sub/s1.safetensors"}})", {"plain file name"});
  expect_load_invalid(R"({"weight_map":{"a":"/etc/passwd"}})", {"plain file name"});
  expect_load_invalid(R"({"weight_map":{"a":".."}})", {"plain file name"});
  expect_load_invalid(R"({"weight_map":{"a":""}})", {"plain file name"});
}

TEST_F(ShardedIndex, MalformedIndex) {
  expect_load_invalid("{not json", {"not valid JSON"});
  expect_load_invalid("[]", {"not a JSON object"});
  expect_load_invalid(R"({"metadata":{}})", {"weight_map"});
  expect_load_invalid(R"({"weight_map":[]})", {"weight_map"});
  expect_load_invalid(R"({"weight_map":{"a":1}})", {"tensor 'a'", "not a string"});
}

TEST_F(ShardedIndex, SameTensorInTwoShards) {
  WriteSafetensors(path("s2.safetensors"), {{"c", torch::ones({4})}, {"a", torch::ones({2})}});
  expect_load_invalid(R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})",
                      {"tensor 'a'", "'s1.safetensors'", "'s2.safetensors'"});
}

TEST_F(ShardedIndex, MissingShardIsNotFound) {
  write_text("model.safetensors.index.json", R"({"weight_map":{"a":"s9.safetensors"}})");
  EXPECT_THROW(LoadModelWeights(dir_.string()), NotFound);
}

TEST_F(SafetensorsFiles, FolderWithNeitherFileIsNotFound) {
  try {
    LoadModelWeights(dir_.string());
    ADD_FAILURE() << "loaded an empty folder";
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find(dir_.string()), std::string::npos);
  }
  EXPECT_THROW(LoadModelWeights(path("no_such_folder")), NotFound);
}

}  // namespace
}  // namespace streambp
