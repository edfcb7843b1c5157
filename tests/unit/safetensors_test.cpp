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
#include "unit/safetensors_util.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;
using namespace safetensors_test;  // NOLINT: the shared helpers


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
