#pragma once
// Attention over query blocks and key tiles (internal to streambp_core).
#include <torch/types.h>

#include "streambp/model.h"

namespace streambp {

/// softmax(q k^T * scale, masked) v, computed block by block: query rows in blocks of
/// tiling.query_tile positions, keys in tiles of tiling.key_tile, with an online softmax
/// (running max and sum per row), so that no rows x keys score matrix exists: at most a
/// few query block x key tile blocks. Key tiles that the pattern masks for every row of a
/// block (the causal future, left of a sliding window, other documents) are skipped, and
/// tiles it allows entirely are not masked at all. The backward recomputes each tile's
/// probabilities from the saved log-sum-exp (exact: the same quantities as the materialized
/// softmax, summed in a different order).
///   q    [B, KVH, C*G, hd]  the G query heads of one kv head folded into rows, position
///                           major (row c*G + g), so a block of positions is a row range
///   k, v [B, KVH, L, hd]    contiguous
///   mask C queries over L keys; every query row allows some key.
/// Returns [B, KVH, C*G, hd] in q's dtype. Scores, softmax and accumulation run in float32
/// (float64 for float64 inputs), as the materialized path does. tiling.grad_sink: see
/// AttentionTiling (dK, dV are then added there and not returned).
torch::Tensor TiledAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionPattern& mask, int64_t groups, double scale,
                             const AttentionTiling& tiling);

/// How many threads a call with `slices` = B*KVH key/value heads on `device` splits them among:
/// on the CPU, at::get_num_threads() when the slices share evenly enough among them (outside a
/// parallel region), each thread then running its slices' tiles with one-thread products; else 1
/// (always 1 in a build without OpenMP: -DSTREAMBP_OPENMP_ATTENTION=OFF, or none found).
int64_t TiledAttentionThreads(int64_t slices, const torch::Device& device);

}  // namespace streambp
