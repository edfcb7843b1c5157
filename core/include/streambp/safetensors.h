#pragma once
/// safetensors files: an 8-byte little-endian header length, a JSON header
/// ({name: {dtype, shape, data_offsets:[begin,end]}, "__metadata__": {str: str}}) and the
/// raw little-endian tensor bytes. Every length, offset and shape is validated against the
/// file before a byte is read; a corrupt file throws streambp::InvalidArgument naming the
/// file and the tensor, never crashes or reads past the end.
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

/// Writes a safetensors file atomically: a temporary name in the same folder, fsync, rename.
void WriteSafetensors(const std::string& path, const TensorMap& tensors,
                      const Metadata& metadata = {});

/// Loads the weights of a Hugging Face model folder: `model.safetensors`, or the shards
/// listed in `model.safetensors.index.json`. Throws NotFound when neither exists.
TensorMap LoadModelWeights(const std::string& dir);

/// Writes a file atomically: temporary name in the same folder, fsync, rename, fsync folder.
void WriteFileAtomic(const std::string& path, const std::string& bytes);

}  // namespace streambp
