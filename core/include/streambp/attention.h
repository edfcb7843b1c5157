#pragma once
// The attention seam (docs/architecture.md: Attention backends): what computes
// softmax(q k^T * scale, pattern) v for one layer call. The layer hands every call to
// Attend(), which runs the first backend that computes exactly that call: a fused kernel
// where the device and the pattern allow one, the tiled online softmax where the caller
// tiles (key tiles, query blocks, a dK/dV sink), and the materialized softmax (the
// reference, PyTorch eager's way) otherwise. A new kernel is one more backend.
#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "streambp/model.h"

namespace streambp {

/// One attention call of a layer, in the layout the layer keeps:
///   q    [B, KVH, C*G, hd]  the G query heads of one kv head folded into rows, position
///                           major (row c*G + g: query head kvh*G + g, as in HF)
///   k, v [B, KVH, L, hd]    the keys [0, L) of the pattern (a prefix view for a stream chunk)
/// `pattern` says which of the L keys each of the C query positions may see (causal
/// offset, documents, window); `tiling` how the caller wants it visited and, with a
/// grad_sink, where dK/dV go instead of autograd.
struct AttentionCall {
  const torch::Tensor& q;
  const torch::Tensor& k;
  const torch::Tensor& v;
  const AttentionPattern& pattern;
  int64_t groups;
  double scale;
  const AttentionTiling& tiling;

  /// Whether the caller asked for tiles: keys past key_tile, queries past query_tile, or a
  /// grad sink (which only tiled visiting fills).
  bool tiled() const;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const char* name() const = 0;
  /// The output [B, KVH, C*G, hd] in q's dtype, differentiable as the call needs; an
  /// undefined tensor when this backend does not compute exactly this call.
  virtual torch::Tensor attend(const AttentionCall& call) const = 0;
};

/// The backends in the order Attend tries them: "fused" (LibTorch's flash kernel: CUDA builds
/// against LibTorch 2.x, bfloat16/float16, whole rows, no window, tiled calls; off with
/// STREAMBP_ATTENTION=tiled), "tiled" (tiled calls), "materialized" (untiled calls).
const std::vector<const AttentionBackend*>& AttentionBackends();

struct AttentionResult {
  torch::Tensor out;
  const char* backend = "";  ///< the name of the backend that computed it
};

/// Runs the first backend that takes the call. Every call is taken by one: tiled calls by
/// "tiled" at the latest, the others by "materialized".
AttentionResult Attend(const AttentionCall& call);

}  // namespace streambp
