#pragma once
// The elementwise work of tiled attention's softmax, one pass per score tile (internal to
// streambp_core). On the CPU each row of a tile is read and written once, while it is in
// the first-level cache, with a vectorized exp for float32 (docs/architecture.md: Attention
// backends); elsewhere (a GPU) the same formulas run as LibTorch ops.
#include <string>
#include <vector>

#include <torch/types.h>

namespace streambp {

/// The online softmax's step over one key tile. s [n, R, K] holds the tile's scores (rows
/// contiguous; -inf where masked); m, l [n, R, 1] the rows' running max and sum, acc
/// [n, R, hd] their running output (views of a block's, any strides but the last). Per row:
///   m' = max(m, rowmax s);  s = e^(s - m');  l = l e^(m - m') + rowsum s;  acc *= e^(m - m');  m = m'
/// where a row with no key seen yet (m' = -inf) is shifted by 0, so that its s becomes 0, not
/// NaN. With first, the tile is the rows' first: m and l are written (m = rowmax s,
/// l = rowsum e^(s - m)) and acc is not used.
void OnlineSoftmaxStep(const torch::Tensor& s, const torch::Tensor& m, const torch::Tensor& l,
                       const torch::Tensor& acc, bool first);

/// The backward's step over one key tile: s [n, R, K] (scores, -inf where masked) becomes
/// P = e^(s - lse) and dp [n, R, K] (dO V^T) becomes dS = P * (dp - D), for the rows'
/// log-sum-exp lse and D = rowsum(dO * out), both [n, R, 1].
void SoftmaxGradStep(const torch::Tensor& s, const torch::Tensor& dp, const torch::Tensor& lse,
                     const torch::Tensor& D);

/// log p(target) = logits[target] - logsumexp(logits) over the last dimension: logits [..., V],
/// targets [...] (int64, in [0, V)) give [...] in the logits' dtype, differentiable in the
/// logits (d logits = g (onehot(target) - softmax(logits))). On the CPU in float32/float64 one
/// autograd node whose forward reads each row twice and whose backward writes the gradient in
/// one pass, with no temporaries of the logits' size; elsewhere the same as LibTorch ops.
/// `target_is_top` (when given) receives bool [...]: whether each target is its row's argmax, as
/// LibTorch's argmax picks it (the first NaN, else the first largest logit); on the fused path
/// from the forward's own read of the row, with no pass of argmax's.
torch::Tensor TargetLogprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                             torch::Tensor* target_is_top = nullptr);

/// The entropy -sum p log p of softmax(logits) over the last dimension, [...] in the logits'
/// dtype, without gradient. On the CPU in float32/float64 one read of each row after its max
/// (no temporaries of the logits' size; a -inf logit adds 0); elsewhere LibTorch ops.
torch::Tensor RowEntropy(const torch::Tensor& logits);

/// e^x of a contiguous float32 CPU tensor, elementwise, as the fused CPU passes compute it:
/// within 2 units in the last place of the exact value from -87.33 to 88 (0 below, +inf
/// above, NaN for NaN). For the tests.
torch::Tensor SoftmaxExp(const torch::Tensor& x);

/// The versions of the float32 passes this CPU runs, best first (of "avx512f", "avx2+fma",
/// "baseline"): chosen from its features, the first is the default.
std::vector<std::string> SoftmaxRowIsas();

/// The version the float32 passes use now.
std::string SoftmaxRowIsa();

/// Makes the passes use the version `name` (one of SoftmaxRowIsas(), else
/// std::invalid_argument): for tests that run each one. Process-wide; returns the previous.
std::string SetSoftmaxRowIsa(const std::string& name);

/// Whether OnlineSoftmaxStep, SoftmaxGradStep, TargetLogprobs and RowEntropy run their fused
/// CPU passes where they can (the default), or LibTorch ops everywhere, as on a GPU: for tests that compare the two.
/// Process-wide; returns the previous setting.
bool SetFusedSoftmaxRows(bool on);

}  // namespace streambp
