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
/// against LibTorch 2.x, bfloat16/float16, whole rows (packed ones and windows in builds with
/// STREAMBP_FLASH_VARLEN / STREAMBP_FLASH_WINDOW), tiled calls; off with
/// STREAMBP_ATTENTION=tiled), "tiled" (tiled calls), "materialized" (untiled calls).
const std::vector<const AttentionBackend*>& AttentionBackends();

struct AttentionResult {
  torch::Tensor out;
  const char* backend = "";  ///< the name of the backend that computed it
};

/// Runs the first backend that takes the call. Every call is taken by one: tiled calls by
/// "tiled" at the latest, the others by "materialized".
AttentionResult Attend(const AttentionCall& call);

/// While it lives, `backend` is tried before the others (a kernel under test, or one a
/// deployment brings); one at a time.
class ScopedAttentionBackend {
 public:
  explicit ScopedAttentionBackend(const AttentionBackend* backend);
  ~ScopedAttentionBackend();
  ScopedAttentionBackend(const ScopedAttentionBackend&) = delete;
  ScopedAttentionBackend& operator=(const ScopedAttentionBackend&) = delete;
};

/// Rows that hold several sequences (packed) or padding before their sequence, attended one
/// sequence at a time by a variable-length kernel (docs/gpu.md: Attention on CUDA).
///
/// One run of a row (a sequence, or padding) met by a call's queries: the queries [q0, q1)
/// see the keys [k0, q1) (causal within the run, and a sliding window moves k0). Positions
/// are the row's.
struct AttentionSegment {
  int64_t q0 = 0, q1 = 0, k0 = 0;
};

/// The segments of `row` for a Causal pattern over known runs (Batch::runs), in order. Their
/// queries tile [q_start, q_end) and their keys [front().k0, q_end), each segment's keys
/// ending where the next one's begin. Empty where the runs are unknown.
std::vector<AttentionSegment> CausalSegments(const AttentionPattern& pattern, int64_t row);

/// A kernel that attends variable-length segments laid end to end: for each i, the queries
/// [cu_q[i], cu_q[i+1]) of q against the keys [cu_k[i], cu_k[i+1]) of k, causal with the
/// diagonal at the bottom right (the last query sees the last key), and with a sliding
/// window W (0: none) query i - j < W. q is [Nq, H, hd]; k, v are [Nk, KVH, hd] (KVH divides
/// H; query head h reads kv head h / (H / KVH)). FlashAttention's varlen entry on CUDA.
class VarlenKernel {
 public:
  struct Segments {
    std::vector<int64_t> cu_q, cu_k;  ///< n + 1 offsets each, 0 first
    int64_t max_q = 0, max_k = 0;     ///< the longest segment's queries, keys
    int64_t window = 0;
  };
  virtual ~VarlenKernel() = default;
  /// The output [Nq, H, hd] (q's dtype), and what the backward needs besides q, k, v and it.
  virtual std::vector<torch::Tensor> forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             const Segments& segments, double scale) const = 0;
  /// dq [Nq, H, hd], dk and dv [Nk, KVH, hd] (any floating dtype), given forward()'s result.
  virtual std::vector<torch::Tensor> backward(const torch::Tensor& grad_out, const torch::Tensor& q,
                                              const torch::Tensor& k, const torch::Tensor& v,
                                              const std::vector<torch::Tensor>& forward_result,
                                              const Segments& segments, double scale) const = 0;
};

/// The call through `kernel`, one kernel call per row over its CausalSegments (the row's K/V
/// as views of [k0, q_end), no copy); dK/dV go into tiling.grad_sink when it is set, else
/// back through autograd. Every query row, padding too, gets what the tiled kernel gives it.
/// Undefined (not taken) unless the pattern is Causal with known runs, its keys are the
/// call's [0, q_end) and it has no kept attention.
torch::Tensor VarlenAttention(const AttentionCall& call, const VarlenKernel& kernel);

}  // namespace streambp
