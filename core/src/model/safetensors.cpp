#include "streambp/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "streambp/digest.h"
#include "streambp/error.h"

namespace streambp {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied byte for byte");

using Json = nlohmann::json;

/// The reference implementation's limit; a larger header is refused before it is parsed.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
/// Length of the little-endian u64 that opens every file.
constexpr std::size_t kLengthPrefixBytes = 8;
/// Names longer than this are cut in error messages (the header is untrusted input).
constexpr std::size_t kMaxNameInMessage = 200;

constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

struct DtypeInfo {
  const char* name;
  torch::ScalarType type;
  std::uint64_t element_size;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", torch::kFloat64, 8},   {"F32", torch::kFloat32, 4}, {"F16", torch::kFloat16, 2},
    {"BF16", torch::kBFloat16, 2}, {"I64", torch::kInt64, 8},   {"I32", torch::kInt32, 4},
    {"I16", torch::kInt16, 2},     {"I8", torch::kInt8, 1},     {"U8", torch::kUInt8, 1},
    {"BOOL", torch::kBool, 1},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* find_dtype(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

/// A name from an untrusted header, quoted and cut to a readable length.
std::string quote_name(std::string_view name) {
  if (name.size() <= kMaxNameInMessage) return "'" + std::string(name) + "'";
  return "'" + std::string(name.substr(0, kMaxNameInMessage)) + "...' (" + std::to_string(name.size()) +
         " bytes)";
}

/// Text from untrusted input (a JSON parser's message may quote a whole token), cut short.
std::string truncated(std::string text) {
  constexpr std::size_t kMax = 500;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

/// A short description of an untrusted JSON value: scalars are shown, containers only
/// named (dumping them would recurse as deep as an adversary nests them).
std::string describe(const Json& value) {
  if (value.is_structured()) return std::string("a JSON ") + value.type_name();
  return truncated(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::string format_shape(const std::vector<std::uint64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

[[noreturn]] void fail(const std::string& what, const std::string& detail) {
  throw InvalidArgument(what + ": " + detail);
}

[[noreturn]] void fail_tensor(const std::string& what, std::string_view name, const std::string& detail) {
  throw InvalidArgument(what + ": tensor " + quote_name(name) + ": " + detail);
}

/// A non-negative JSON integer, or nothing (negative, fractional, too large, not a number).
std::optional<std::uint64_t> as_non_negative(const Json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer()) {  // nlohmann parses "-0" as a signed integer
    const auto v = value.get<std::int64_t>();
    if (v >= 0) return static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

/// One entry of the header, validated on its own (not yet against the other entries).
struct Entry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

Entry parse_entry(const std::string& what, const std::string& name, const Json& value,
                  std::uint64_t buffer_size) {
  Entry e;
  e.name = name;
  if (!value.is_object()) fail_tensor(what, name, "entry is not a JSON object");

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) fail_tensor(what, name, "missing \"dtype\"");
  if (!dtype_it->is_string()) fail_tensor(what, name, "\"dtype\" is not a string");
  const auto& dtype_name = dtype_it->get_ref<const std::string&>();
  e.dtype = find_dtype(dtype_name);
  if (e.dtype == nullptr) {
    fail_tensor(what, name,
                "unknown or unsupported dtype " + quote_name(dtype_name) +
                    " (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  }

  const auto shape_it = value.find("shape");
  if (shape_it == value.end()) fail_tensor(what, name, "missing \"shape\"");
  if (!shape_it->is_array()) fail_tensor(what, name, "\"shape\" is not an array");
  // Every dimension and the product of all of them (zeros counted as one, so that the
  // strides of an empty tensor fit too) must fit in int64_t, LibTorch's size type.
  constexpr auto kMaxSize = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t numel = 1;
  std::uint64_t span = 1;
  for (const auto& dim : *shape_it) {
    const auto d = as_non_negative(dim);
    if (!d) {
      fail_tensor(what, name, "\"shape\" entry " + describe(dim) + " is not a non-negative integer");
    }
    if (*d > kMaxSize || __builtin_mul_overflow(span, std::max<std::uint64_t>(*d, 1), &span) ||
        span > kMaxSize) {
      fail_tensor(what, name, "shape has too many elements");
    }
    numel *= *d;  // cannot overflow: numel <= span
    e.shape.push_back(*d);
  }

  const auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end()) fail_tensor(what, name, "missing \"data_offsets\"");
  const Json& offsets = *offsets_it;
  std::optional<std::uint64_t> begin;
  std::optional<std::uint64_t> end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = as_non_negative(offsets[0]);
    end = as_non_negative(offsets[1]);
  }
  if (!begin || !end) {
    fail_tensor(what, name, "\"data_offsets\" " + describe(offsets) + " is not two non-negative integers");
  }
  e.begin = *begin;
  e.end = *end;
  const std::string offsets_text =
      "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) fail_tensor(what, name, offsets_text + " begin after end");
  if (e.end > buffer_size) {
    fail_tensor(what, name,
                offsets_text + " end past the data buffer of " + std::to_string(buffer_size) + " bytes");
  }
  std::uint64_t needed = 0;
  const bool too_large = __builtin_mul_overflow(numel, e.dtype->element_size, &needed);
  if (too_large || needed != e.end - e.begin) {
    fail_tensor(what, name,
                offsets_text + " hold " + std::to_string(e.end - e.begin) + " bytes but dtype " +
                    e.dtype->name + " and shape " + format_shape(e.shape) + " need " +
                    (too_large ? std::string("more than 2^64") : std::to_string(needed)));
  }
  return e;
}

Metadata parse_metadata(const std::string& what, const Json& value) {
  Metadata metadata;
  if (value.is_null()) return metadata;  // the reference implementation accepts null
  if (!value.is_object()) fail(what, "\"__metadata__\" is not a JSON object");
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      fail(what, "\"__metadata__\" value for key " + quote_name(key) + " is not a string");
    }
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

/// Checks that the ranges tile [0, buffer_size) exactly: no overlap, no hole, no tail.
/// Same rule as the reference implementation: sorted by offsets, each begins where the
/// previous one ended (an empty tensor included).
void check_layout(const std::string& what, std::vector<const Entry*> entries, std::uint64_t buffer_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  std::uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : entries) {
    const std::string offsets_text =
        "data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) + "]";
    if (e->begin < cursor) {
      fail_tensor(what, e->name,
                  offsets_text + " overlap tensor " + quote_name(previous->name) + " which ends at " +
                      std::to_string(cursor));
    }
    if (e->begin > cursor) {
      fail_tensor(what, e->name,
                  offsets_text + " leave a hole: bytes [" + std::to_string(cursor) + ", " +
                      std::to_string(e->begin) + ") of the data buffer belong to no tensor");
    }
    cursor = e->end;
    previous = e;
  }
  if (cursor != buffer_size) {
    fail(what, "bytes [" + std::to_string(cursor) + ", " + std::to_string(buffer_size) +
                   ") at the end of the data buffer belong to no tensor");
  }
}

std::string errno_text(int err) { return std::strerror(err); }

/// Reads a whole file. NotFound when it cannot be opened; InvalidArgument when it is not a
/// regular file; Error(kInternal) on a read failure.
std::string read_file(const std::string& path) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw NotFound("cannot open " + path + ": " + errno_text(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw Error(ErrorCode::kInternal, "cannot stat " + path + ": " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) throw InvalidArgument(path + ": not a regular file");

  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    constexpr std::size_t kChunk = std::size_t{1} << 30;
    const ssize_t n = ::read(fd, bytes.data() + done, std::min(kChunk, bytes.size() - done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kInternal, "cannot read " + path + ": " + errno_text(errno));
    }
    if (n == 0) {
      throw Error(ErrorCode::kInternal, path + ": file shrank while being read");
    }
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

SafetensorsContents ParseSafetensors(const std::string& bytes, const std::string& what) {
  if (bytes.size() < kLengthPrefixBytes) {
    fail(what, "file is " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  }
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), sizeof header_size);
  const std::uint64_t after_prefix = bytes.size() - kLengthPrefixBytes;
  if (header_size > after_prefix) {
    fail(what, "header length " + std::to_string(header_size) + " is past the end of the file (" +
                   std::to_string(after_prefix) + " bytes follow the length)");
  }
  if (header_size > kMaxHeaderBytes) {
    fail(what, "header length " + std::to_string(header_size) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  const char* header_begin = bytes.data() + kLengthPrefixBytes;
  const char* header_end = header_begin + header_size;
  const std::uint64_t buffer_size = after_prefix - header_size;

  // Valid JSON text holds no NUL byte, but nlohmann's parser stops at one and would ignore
  // whatever follows it.
  if (std::memchr(header_begin, '\0', header_size) != nullptr) {
    fail(what, "header is not valid JSON: it contains a NUL byte");
  }
  Json header;
  try {
    header = Json::parse(header_begin, header_end);
  } catch (const Json::exception& e) {
    fail(what, "header is not valid JSON: " + truncated(e.what()));
  }
  if (!header.is_object()) fail(what, "header is not a JSON object");

  SafetensorsContents contents;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      contents.metadata = parse_metadata(what, value);
    } else {
      entries.push_back(parse_entry(what, key, value, buffer_size));
    }
  }
  std::vector<const Entry*> layout;
  layout.reserve(entries.size());
  for (const auto& e : entries) layout.push_back(&e);
  check_layout(what, std::move(layout), buffer_size);

  const char* buffer = header_end;
  for (const auto& e : entries) {
    const std::uint64_t nbytes = e.end - e.begin;
    const char* src = buffer + e.begin;
    if (e.dtype->type == torch::kBool) {
      // Any byte but 0 or 1 is not a valid bool; copying it into a tensor would be UB later.
      const auto* bad = std::find_if(src, src + nbytes, [](char c) { return c != 0 && c != 1; });
      if (bad != src + nbytes) {
        fail_tensor(what, e.name,
                    "BOOL byte at offset " + std::to_string(e.begin + (bad - src)) + " is " +
                        std::to_string(static_cast<unsigned char>(*bad)) + ", not 0 or 1");
      }
    }
    std::vector<std::int64_t> sizes(e.shape.begin(), e.shape.end());
    torch::Tensor t = torch::empty(sizes, torch::TensorOptions().dtype(e.dtype->type));
    if (nbytes > 0) std::memcpy(t.data_ptr(), src, nbytes);
    contents.tensors.emplace(e.name, std::move(t));
  }
  return contents;
}

SafetensorsContents ReadSafetensors(const std::string& path) {
  return ParseSafetensors(read_file(path), path);
}

namespace {

// The header of a safetensors file for `tensors` (validated, padded so the data starts
// 8-byte aligned) and the data's size; no tensor is copied.
std::pair<std::string, std::uint64_t> PlanSafetensors(const TensorMap& tensors, const Metadata& metadata) {
  Json header = Json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) {
      throw InvalidArgument("cannot serialize a tensor named \"__metadata__\" (reserved)");
    }
    if (!tensor.defined()) {
      throw InvalidArgument("cannot serialize tensor " + quote_name(name) + ": undefined tensor");
    }
    const DtypeInfo* dtype = find_dtype(tensor.scalar_type());
    if (dtype == nullptr) {
      throw InvalidArgument("cannot serialize tensor " + quote_name(name) + ": dtype " +
                            std::string(c10::toString(tensor.scalar_type())) +
                            " has no safetensors equivalent here");
    }
    Json shape = Json::array();
    for (const auto d : tensor.sizes()) shape.push_back(d);
    const auto nbytes = static_cast<std::uint64_t>(tensor.numel()) * dtype->element_size;
    header[name] = {
        {"dtype", dtype->name}, {"shape", std::move(shape)}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const Json::exception& e) {
    throw InvalidArgument(std::string("cannot serialize safetensors header: ") + e.what());
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  return {std::move(header_text), offset};
}

// The file's pieces in order: length prefix, header, then each tensor's bytes from a CPU,
// contiguous view (a copy only where the tensor is elsewhere or strided), one at a time.
void EmitSafetensors(const TensorMap& tensors, const std::string& header_text, const ByteSink& write) {
  const std::uint64_t header_size = header_text.size();
  write(reinterpret_cast<const char*>(&header_size), sizeof header_size);
  write(header_text.data(), header_text.size());
  for (const auto& [name, tensor] : tensors) {
    const torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const auto nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    if (nbytes > 0) write(static_cast<const char*>(t.data_ptr()), nbytes);
  }
}

}  // namespace

std::string SerializeSafetensors(const TensorMap& tensors, const Metadata& metadata) {
  const auto [header_text, data_bytes] = PlanSafetensors(tensors, metadata);
  std::string out;
  out.reserve(kLengthPrefixBytes + header_text.size() + data_bytes);
  EmitSafetensors(tensors, header_text, [&](const char* data, std::size_t size) { out.append(data, size); });
  return out;
}

WrittenFile WriteSafetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata,
                             bool sha256) {
  const auto plan = PlanSafetensors(tensors, metadata);  // invalid input fails before any file exists
  return WriteFileAtomic(
      path, [&](const ByteSink& write) { EmitSafetensors(tensors, plan.first, write); }, sha256);
}

WrittenFile WriteFileAtomic(const std::string& path, const std::string& bytes, bool sha256) {
  return WriteFileAtomic(
      path, [&](const ByteSink& write) { write(bytes.data(), bytes.size()); }, sha256);
}

WrittenFile WriteFileAtomic(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                            bool sha256) {
  // pid plus a per-process counter: unique across processes and across threads of one.
  static std::atomic<std::uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const auto fail_io = [&](const std::string& step, int err, bool remove_tmp) {
    if (remove_tmp) ::unlink(tmp.c_str());
    if (err == ENOSPC || err == EDQUOT) {
      throw ResourceExhausted("writing " + std::filesystem::path(path).filename().string() +
                              ": no space left on the device (" + errno_text(err) + ")");
    }
    throw Error(ErrorCode::kInternal, "writing " + path + ": " + step + " " + tmp + ": " + errno_text(err));
  };

  int fd = -1;
  do {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail_io("cannot create", errno, false);

  WrittenFile written;
  std::optional<Sha256> digest;
  if (sha256) digest.emplace();
  const ByteSink sink = [&](const char* data, std::size_t size) {
    if (digest) digest->update(std::string_view(data, size));
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        fd = -1;
        fail_io("cannot write", err, true);
      }
      done += static_cast<std::size_t>(n);
    }
    written.size += size;
  };
  try {
    produce(sink);
  } catch (...) {
    if (fd >= 0) {  // the producer failed (not the write, which closed and removed already)
      ::close(fd);
      ::unlink(tmp.c_str());
    }
    throw;
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail_io("cannot fsync", err, true);
  }
  if (::close(fd) != 0) fail_io("cannot close", errno, true);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("cannot rename", errno, true);

  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    throw Error(ErrorCode::kInternal,
                "writing " + path + ": cannot open folder " + dir + ": " + errno_text(errno));
  }
  const int sync_rc = ::fsync(dir_fd);
  const int sync_err = errno;
  ::close(dir_fd);
  if (sync_rc != 0) {
    throw Error(ErrorCode::kInternal,
                "writing " + path + ": cannot fsync folder " + dir + ": " + errno_text(sync_err));
  }
  if (digest) written.sha256 = digest->hex();
  return written;
}

TensorMap LoadModelWeights(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path folder(dir);
  const fs::path index_path = folder / kIndexFile;
  const fs::path single_path = folder / kSingleFile;
  std::error_code ec;

  if (fs::exists(index_path, ec)) {
    const std::string what = index_path.string();
    Json index;
    try {
      index = Json::parse(read_file(what));
    } catch (const Json::exception& e) {
      fail(what, "not valid JSON: " + truncated(e.what()));
    }
    if (!index.is_object()) fail(what, "not a JSON object");
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      fail(what, "\"weight_map\" is missing or not a JSON object");
    }
    // shard file name -> tensor names the index places in it
    std::map<std::string, std::vector<std::string>> shards;
    for (const auto& [name, file] : map_it->items()) {
      if (!file.is_string()) fail_tensor(what, name, "shard name is not a string");
      const auto& shard = file.get_ref<const std::string&>();
      if (!is_plain_file_name(shard)) {
        fail_tensor(what, name, "shard " + quote_name(shard) + " is not a plain file name inside the folder");
      }
      shards[shard].push_back(name);
    }

    TensorMap tensors;
    std::map<std::string, std::string> shard_of;  // tensor name -> shard it came from
    for (const auto& [shard, names] : shards) {
      SafetensorsContents contents = ReadSafetensors((folder / shard).string());
      for (const auto& name : names) {
        if (contents.tensors.find(name) == contents.tensors.end()) {
          fail_tensor(what, name, "listed in shard " + quote_name(shard) + " but not found there");
        }
      }
      for (auto& [name, tensor] : contents.tensors) {
        const auto [it, inserted] = shard_of.emplace(name, shard);
        if (!inserted) {
          fail_tensor(what, name,
                      "found in both shard " + quote_name(it->second) + " and shard " + quote_name(shard));
        }
        tensors.emplace(name, std::move(tensor));
      }
    }
    return tensors;
  }
  if (fs::exists(single_path, ec)) return ReadSafetensors(single_path.string()).tensors;
  throw NotFound("no model.safetensors or model.safetensors.index.json in " + dir);
}

}  // namespace streambp
