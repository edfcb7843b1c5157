#pragma once
// Attention over many keys, tile by tile (internal to streambp_core).
#include <torch/types.h>

namespace streambp {

/// softmax(q k^T * scale, masked) v, computed over key tiles of `tile` positions with an
/// online softmax (running max and sum per row), so that no rows x keys score matrix exists:
/// at most a few rows x tile blocks. The backward recomputes each tile's probabilities from
/// the saved log-sum-exp (exact: the same quantities as the materialized softmax, summed
/// in a different order).
///   q    [B, KVH, G*C, hd]  query heads of one kv head folded into rows (g major, c minor)
///   k, v [B, KVH, L, hd]
///   mask [B, C, L] bool, true where attention is allowed; every row allows some key.
/// Returns [B, KVH, G*C, hd] in q's dtype. Scores, softmax and accumulation run in float32
/// (float64 for float64 inputs), as the materialized path does.
torch::Tensor TiledAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, int64_t groups, double scale, int64_t tile);

}  // namespace streambp
