#include "test_util/varlen_reference.h"

#include <limits>

#include <torch/torch.h>

namespace streambp::testing {
namespace {

torch::Tensor SegmentsSoftmax(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const VarlenKernel::Segments& s, double scale) {
  const int64_t H = q.size(1), G = H / k.size(1);
  std::vector<torch::Tensor> outs;
  for (size_t i = 0; i + 1 < s.cu_q.size(); ++i) {
    auto qs = q.slice(0, s.cu_q[i], s.cu_q[i + 1]);
    auto ks = k.slice(0, s.cu_k[i], s.cu_k[i + 1]).repeat_interleave(G, 1);  // query head h: kv head h / G
    auto vs = v.slice(0, s.cu_k[i], s.cu_k[i + 1]).repeat_interleave(G, 1);
    const int64_t nq = qs.size(0), nk = ks.size(0);
    TORCH_CHECK(0 < nq && nq <= nk && nq <= s.max_q && nk <= s.max_k, "segment ", i, ": ", nq, " queries, ", nk,
                " keys (max ", s.max_q, ", ", s.max_k, ")");
    auto scores = torch::einsum("qhd,khd->hqk", {qs, ks}) * scale;
    auto qi = torch::arange(nk - nq, nk, torch::kInt64).view({-1, 1});
    auto kj = torch::arange(0, nk, torch::kInt64).view({1, -1});
    auto allowed = kj <= qi;
    if (s.window > 0) allowed = allowed & (qi - kj < s.window);
    scores = scores.masked_fill(allowed.logical_not().unsqueeze(0), -std::numeric_limits<double>::infinity());
    outs.push_back(torch::einsum("hqk,khd->qhd", {torch::softmax(scores, -1), vs}));
  }
  return torch::cat(outs);
}

}  // namespace

std::vector<torch::Tensor> ReferenceVarlenKernel::forward(const torch::Tensor& q, const torch::Tensor& k,
                                                          const torch::Tensor& v, const Segments& s,
                                                          double scale) const {
  return {SegmentsSoftmax(q, k, v, s, scale)};
}

std::vector<torch::Tensor> ReferenceVarlenKernel::backward(const torch::Tensor& g, const torch::Tensor& q,
                                                           const torch::Tensor& k, const torch::Tensor& v,
                                                           const std::vector<torch::Tensor>&, const Segments& s,
                                                           double scale) const {
  torch::AutoGradMode on(true);
  auto q1 = q.detach().requires_grad_(true), k1 = k.detach().requires_grad_(true);
  auto v1 = v.detach().requires_grad_(true);
  return torch::autograd::grad({SegmentsSoftmax(q1, k1, v1, s, scale)}, {q1, k1, v1}, {g});
}

torch::Tensor ReferenceVarlenBackend::attend(const AttentionCall& c) const {
  if (!c.tiled() || c.tiling.kept != nullptr || c.pattern.whole_rows) return {};
  auto out = VarlenAttention(c, kernel_);
  if (out.defined()) ++taken;
  return out;
}

}  // namespace streambp::testing
