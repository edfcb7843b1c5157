#pragma once
// Attention over query blocks and key tiles (internal to streambp_core).
#include <vector>

#include <torch/types.h>

#include "streambp/model.h"

namespace streambp {

/// softmax(q k^T * scale, masked) v, computed block by block: query rows in blocks of
/// tiling.query_tile positions, keys in tiles of tiling.key_tile, with an online softmax
/// (running max and sum per row), so that no rows x keys score matrix exists: at most a
/// few query block x key tile blocks. Key tiles that the pattern masks for every row of a
/// block (the causal future, left of a sliding window, other documents) are skipped, and
/// tiles it allows entirely are not masked at all; a tile it masks in part over a block's
/// rows (the causal diagonal) runs in pieces of those rows, each over the keys they may see.
/// The backward recomputes each tile's
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

/// One product of a block's visit: query positions [q0, q1) (relative to the call's first)
/// against keys [k0, k1), masked or not.
struct TiledVisit {
  int64_t q0, q1, k0, k1;
  bool masked;
};

/// The products TiledAttention runs for the query block [q0, q1) with key tiles of key_tile,
/// in the order it runs them (the same plan in the forward and the backward).
std::vector<TiledVisit> TiledAttentionPlan(const AttentionPattern& pattern, int64_t q0, int64_t q1, int64_t key_tile);

/// How many threads a call with `slices` = B*KVH key/value heads on `device` splits them among:
/// on the CPU, at::get_num_threads() when the slices share evenly enough among them (outside a
/// parallel region), each thread then running its slices' tiles with one-thread products; else 1
/// (always 1 in a build without OpenMP: -DSTREAMBP_OPENMP_ATTENTION=OFF, or none found).
int64_t TiledAttentionThreads(int64_t slices, const torch::Device& device);

}  // namespace streambp
