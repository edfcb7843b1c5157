#pragma once
// Fused attention on CUDA (internal to streambp_core): FlashAttention through LibTorch's own
// kernels where they compute exactly what the tiled kernel would, else nothing.
#include <torch/types.h>

#include "streambp/model.h"

namespace streambp {

/// softmax(q k^T * scale, causal) v by the flash kernel of a CUDA LibTorch 2.x, for the
/// inputs TiledAttention takes (same layout, same grad_sink contract), when
///  - q is a CUDA bfloat16/float16 tensor and head_dim is a multiple of 8 up to 256,
///  - the pattern is causal over whole rows (one sequence from position 0, right padding
///    only), or (LibTorch 2.8 on, built with STREAMBP_FLASH_VARLEN) over packed or left-padded
///    rows whose runs the batch knows (the varlen entry, one call per row: VarlenAttention),
///  - with no sliding window or (LibTorch 2.8 on, built with STREAMBP_FLASH_WINDOW) with one
///    (the kernel's window_size_left, over the keys the chunk's queries see), and
///  - the queries are the last positions of the keys (a StreamBP chunk [s, e) against the
///    keys [0, e): the causal diagonal aligned bottom-right, as flash's is_causal is).
/// Returns an undefined tensor otherwise (or on a build without it, or when
/// STREAMBP_ATTENTION=tiled): the next backend (streambp/attention.h) runs. Padding query rows attend
/// to the real keys before them here (TiledAttention lets them see padding only); nothing
/// real reads those rows, so every real output and gradient is the same function.
torch::Tensor FusedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionPattern& mask, int64_t groups, double scale,
                             const AttentionTiling& tiling);

/// Whether this build has the fused kernel (a CUDA LibTorch 2.x) and it is not turned off.
bool FusedAttentionAvailable();

}  // namespace streambp
