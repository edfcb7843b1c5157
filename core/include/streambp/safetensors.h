#pragma once
/// safetensors files: an 8-byte little-endian header length, a JSON header
/// ({name: {dtype, shape, data_offsets:[begin,end]}, "__metadata__": {str: str}}) and the
/// raw little-endian tensor bytes. Every length, offset and shape is validated against the
/// file before a byte is read; a corrupt file throws streambp::InvalidArgument naming the
/// file and the tensor, never crashes or reads past the end.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

namespace streambp {

using TensorMap = std::map<std::string, torch::Tensor>;
using Metadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  TensorMap tensors;  ///< CPU tensors in the dtype stored in the file
  Metadata metadata;  ///< the optional "__metadata__" entry
};

/// Reads a whole safetensors file. Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
SafetensorsContents ReadSafetensors(const std::string& path);

/// Parses safetensors bytes held in memory (`what` names the source in error messages).
SafetensorsContents ParseSafetensors(const std::string& bytes, const std::string& what);

/// Serializes tensors (any device; written from CPU copies) to safetensors bytes.
std::string SerializeSafetensors(const TensorMap& tensors, const Metadata& metadata = {});

/// What an atomic write put on disk: its size and, when asked for, its SHA-256 (hex).
struct WrittenFile {
  std::uint64_t size = 0;
  std::string sha256;
};

/// Receives a file's bytes piece by piece.
using ByteSink = std::function<void(const char* data, std::size_t size)>;

/// Writes a safetensors file atomically: a temporary name in the same folder, fsync, rename.
/// Streamed: the header, then one tensor at a time (copied to the CPU only when it is on a
/// device or not contiguous), so no copy of the file exists in memory.
WrittenFile WriteSafetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {},
                             bool sha256 = false);

/// Loads the weights of a Hugging Face model folder: `model.safetensors`, or the shards
/// listed in `model.safetensors.index.json`. Throws NotFound when neither exists.
TensorMap LoadModelWeights(const std::string& dir);

/// Writes a file atomically: temporary name in the same folder, fsync, rename, fsync folder.
/// A full disk is ResourceExhausted; on any failure the temporary file is removed and the
/// target is untouched.
WrittenFile WriteFileAtomic(const std::string& path, const std::string& bytes, bool sha256 = false);
/// The same, from pieces: `produce` writes the file's bytes through the sink it is given (an
/// exception it throws fails the write the same way).
WrittenFile WriteFileAtomic(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                            bool sha256 = false);

}  // namespace streambp
