// Packed and left-padded rows through a variable-length attention kernel, one sequence at a
// time (docs/gpu.md: Attention on CUDA). The kernel (FlashAttention's varlen entry on CUDA)
// sees each row's sequences as segments laid end to end; this file plans them from the
// batch's runs (known on the host) and carries dK/dV into the stream engine's sink.
#include <algorithm>

#include <torch/torch.h>

#include "streambp/attention.h"

namespace streambp {

std::vector<AttentionSegment> CausalSegments(const AttentionPattern& pattern, int64_t row) {
  std::vector<AttentionSegment> out;
  if (!pattern.runs || pattern.mask.defined() || row < 0 || row >= static_cast<int64_t>(pattern.runs->size())) {
    return out;
  }
  const auto& starts = (*pattern.runs)[row];
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const int64_t a = starts[i], z = starts[i + 1];
    const int64_t q0 = std::max(a, pattern.q_start), q1 = std::min(z, pattern.q_end);
    if (q0 >= q1) continue;
    // The first query sees back to the run's start, or to q0 - W + 1 with a window of W.
    const int64_t k0 = pattern.window > 0 ? std::max(a, q0 - pattern.window + 1) : a;
    out.push_back({q0, q1, k0});
  }
  return out;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One row: q [C, H, hd] against k, v [Lk, KVH, hd] (the row's keys [k0, k0 + Lk)). With a
// sink, dK/dV are added into its rows [k0, k0 + Lk) of `row` and not returned.
struct VarlenFunction : public torch::autograd::Function<VarlenFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const VarlenKernel* kernel,
                               const VarlenKernel::Segments& segments, double scale, const KeysValues* sink,
                               int64_t row, int64_t k0) {
    auto result = kernel->forward(q, k, v, segments, scale);
    auto out = result[0];
    // The output through save_for_backward (held in saved_data it would hold this node: a
    // cycle); the kernel's other state beside it.
    ctx->save_for_backward({q, k, v, out});
    ctx->saved_data["state"] = std::vector<torch::Tensor>(result.begin() + 1, result.end());
    ctx->saved_data["cu_q"] = segments.cu_q;
    ctx->saved_data["cu_k"] = segments.cu_k;
    ctx->saved_data["sizes"] = std::vector<int64_t>{segments.max_q, segments.max_k, segments.window, row, k0};
    ctx->saved_data["kernel"] = reinterpret_cast<int64_t>(kernel);
    ctx->saved_data["sink"] = reinterpret_cast<int64_t>(sink);
    ctx->saved_data["scale"] = scale;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    std::vector<torch::Tensor> result{saved[3]};
    for (auto& t : ctx->saved_data["state"].toTensorVector()) result.push_back(t);
    VarlenKernel::Segments segments;
    segments.cu_q = ctx->saved_data["cu_q"].toIntVector();
    segments.cu_k = ctx->saved_data["cu_k"].toIntVector();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    segments.max_q = sizes[0];
    segments.max_k = sizes[1];
    segments.window = sizes[2];
    const int64_t row = sizes[3], k0 = sizes[4];
    const auto* kernel = reinterpret_cast<const VarlenKernel*>(ctx->saved_data["kernel"].toInt());
    const auto* sink = reinterpret_cast<const KeysValues*>(ctx->saved_data["sink"].toInt());
    auto d = kernel->backward(grad[0].contiguous(), q, k, v, result, segments, ctx->saved_data["scale"].toDouble());
    const torch::Tensor none;
    if (sink == nullptr) {
      return {d[0].to(q.scalar_type()), d[1].to(k.scalar_type()), d[2].to(v.scalar_type()), none, none, none, none,
              none, none};
    }
    torch::NoGradGuard no_grad;
    const int64_t L = k.size(0);
    // [Lk, KVH, hd] -> the sink's [KVH, Lk, hd] rows of this batch row.
    sink->k.select(0, row).slice(1, k0, k0 + L).add_(d[1].to(sink->k.scalar_type()).transpose(0, 1));
    sink->v.select(0, row).slice(1, k0, k0 + L).add_(d[2].to(sink->v.scalar_type()).transpose(0, 1));
    return {d[0].to(q.scalar_type()), none, none, none, none, none, none, none, none};
  }
};

}  // namespace

torch::Tensor VarlenAttention(const AttentionCall& call, const VarlenKernel& kernel) {
  const auto& p = call.pattern;
  if (!p.runs || p.mask.defined() || call.tiling.kept != nullptr || call.tiling.heads != nullptr) return {};
  const int64_t B = call.q.size(0), KVH = call.q.size(1), G = call.groups, hd = call.q.size(3);
  const int64_t C = call.q.size(2) / G;
  if (C == 0 || C != p.queries() || p.q_end != p.k_end || call.k.size(2) != p.k_end ||
      static_cast<int64_t>(p.runs->size()) != B) {
    return {};
  }
  // [B, KVH, C*G, hd] (row c*G + g) -> [B, C, H, hd], query head kvh*G + g as in HF.
  auto qt = call.q.reshape({B, KVH, C, G, hd}).permute({0, 2, 1, 3, 4}).reshape({B, C, KVH * G, hd});
  std::vector<torch::Tensor> outs;
  for (int64_t b = 0; b < B; ++b) {
    const auto segments = CausalSegments(p, b);
    VarlenKernel::Segments s;
    s.window = p.window;
    s.cu_q = {0};
    s.cu_k = {0};
    const int64_t k0 = segments.front().k0;
    for (const auto& seg : segments) {
      TORCH_CHECK(seg.k0 - k0 == s.cu_k.back(), "VarlenAttention: segment keys not end to end");
      s.cu_q.push_back(seg.q1 - p.q_start);
      s.cu_k.push_back(seg.q1 - k0);
      s.max_q = std::max(s.max_q, seg.q1 - seg.q0);
      s.max_k = std::max(s.max_k, seg.q1 - seg.k0);
    }
    // The row's keys [k0, q_end) as a view: [Lk, KVH, hd].
    auto keys = call.k.select(0, b).slice(1, k0, p.k_end).transpose(0, 1);
    auto values = call.v.select(0, b).slice(1, k0, p.k_end).transpose(0, 1);
    outs.push_back(VarlenFunction::apply(qt.select(0, b), keys, values, &kernel, s, call.scale,
                                         call.tiling.grad_sink, b, k0)[0]);
  }
  // [B, C, H, hd] -> [B, KVH, C*G, hd]
  return torch::stack(outs).view({B, C, KVH, G, hd}).permute({0, 2, 1, 3, 4}).reshape({B, KVH, C * G, hd});
}

}  // namespace streambp
