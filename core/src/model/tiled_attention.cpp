// Tiled attention with an online softmax and a recomputing backward (the FlashAttention
// recurrences, written with LibTorch ops). Forward, per key tile j with scores S_j:
//   m' = max(m, rowmax S_j);  l = l e^(m - m') + rowsum e^(S_j - m');  acc = acc e^(m - m') + e^(S_j - m') V_j
// and out = acc / l, lse = m + log l. Backward with P_j = e^(S_j - lse) and D = rowsum(dO * out):
//   dV_j = P_j^T dO;  dS_j = P_j * (dO V_j^T - D);  dQ += dS_j K_j * scale;  dK_j = dS_j^T Q * scale.
#include "tiled_attention.h"

#include <algorithm>
#include <limits>

#include <torch/torch.h>

namespace streambp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

torch::Dtype ComputeDtypeOf(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

struct Tile {
  int64_t start, end;
  torch::Tensor allowed;  // [B, 1, 1, C, kt] bool
};

// The key tiles of [0, L) that some row may attend to (tiles masked for every row, e.g.
// left of a sliding window or padding, are skipped: they contribute nothing). Which keys
// any row allows is read back once per call (one device sync on a GPU, not one per tile).
std::vector<Tile> Tiles(const torch::Tensor& mask, int64_t tile) {
  const int64_t B = mask.size(0), C = mask.size(1), L = mask.size(2);
  const auto any_row = mask.any(1).any(0).to(torch::kCPU).contiguous();  // [L]
  const bool* key_allowed = any_row.data_ptr<bool>();
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < L; s += tile) {
    const int64_t e = std::min(L, s + tile);
    if (std::none_of(key_allowed + s, key_allowed + e, [](bool b) { return b; })) continue;
    tiles.push_back({s, e, mask.slice(2, s, e).reshape({B, 1, 1, C, e - s})});
  }
  return tiles;
}

// Scaled, masked scores of one tile in the compute dtype: [B, KVH, G*C, kt].
torch::Tensor Scores(const torch::Tensor& q, const torch::Tensor& k, const Tile& t, int64_t groups,
                     double scale, torch::Dtype cd) {
  const int64_t B = q.size(0), KVH = q.size(1), R = q.size(2), kt = t.end - t.start;
  auto s = torch::matmul(q, k.slice(2, t.start, t.end).transpose(-1, -2)).to(cd);
  s.mul_(scale);
  s.view({B, KVH, groups, R / groups, kt}).masked_fill_(t.allowed.logical_not(), kNegInf);
  return s;
}

struct TiledAttentionFunction : public torch::autograd::Function<TiledAttentionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, int64_t groups,
                               double scale, int64_t tile) {
    const auto cd = ComputeDtypeOf(q);
    const int64_t B = q.size(0), KVH = q.size(1), R = q.size(2), hd = q.size(3);
    auto opts = q.options().dtype(cd);
    auto m = torch::full({B, KVH, R, 1}, kNegInf, opts);
    auto l = torch::zeros({B, KVH, R, 1}, opts);
    auto acc = torch::zeros({B, KVH, R, hd}, opts);
    for (const auto& t : Tiles(mask, tile)) {
      auto s = Scores(q, k, t, groups, scale, cd);
      auto m_new = torch::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
      // Rows with no allowed key so far keep m = -inf; shift them by 0 so exp gives 0, not NaN.
      auto shift = torch::where(torch::isinf(m_new), torch::zeros_like(m_new), m_new);
      auto alpha = (m - shift).exp_();
      s.sub_(shift).exp_();
      l.mul_(alpha).add_(s.sum(-1, /*keepdim=*/true));
      acc.mul_(alpha).add_(torch::matmul(s.to(q.scalar_type()), v.slice(2, t.start, t.end)).to(cd));
      m = m_new;
    }
    // The backward's D = rowsum(dO * out) is subtracted from dO V^T: keep out in the
    // compute dtype for it (a bfloat16-rounded out would make that difference inexact).
    auto out_cd = acc.div_(l);
    auto lse = m + l.log();
    auto out = out_cd.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, mask, out_cd, lse});
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["tile"] = tile;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &mask = saved[3], &out = saved[4],
               &lse = saved[5];
    const int64_t groups = ctx->saved_data["groups"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t tile = ctx->saved_data["tile"].toInt();
    const auto cd = ComputeDtypeOf(q);
    const auto dtype = q.scalar_type();
    auto d_out = grad_outputs[0].to(dtype);
    auto D = (d_out.to(cd) * out).sum(-1, /*keepdim=*/true);
    auto dq = torch::zeros(q.sizes(), q.options().dtype(cd));
    auto dk = torch::zeros(k.sizes(), k.options().dtype(cd));
    auto dv = torch::zeros(v.sizes(), v.options().dtype(cd));
    for (const auto& t : Tiles(mask, tile)) {
      auto p = Scores(q, k, t, groups, scale, cd).sub_(lse).exp_();  // masked entries: 0
      auto p_low = p.to(dtype);
      dv.slice(2, t.start, t.end).add_(torch::matmul(p_low.transpose(-1, -2), d_out).to(cd));
      auto ds = torch::matmul(d_out, v.slice(2, t.start, t.end).transpose(-1, -2)).to(cd);
      ds.sub_(D).mul_(p);
      p = torch::Tensor();
      p_low = torch::Tensor();
      auto ds_low = ds.to(dtype);
      dq.add_(torch::matmul(ds_low, k.slice(2, t.start, t.end)).to(cd), scale);
      dk.slice(2, t.start, t.end).add_(torch::matmul(ds_low.transpose(-1, -2), q).to(cd), scale);
    }
    return {dq.to(dtype), dk.to(k.scalar_type()), dv.to(v.scalar_type()), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TiledAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, int64_t groups, double scale, int64_t tile) {
  TORCH_CHECK(tile > 0, "TiledAttention: tile must be positive");
  return TiledAttentionFunction::apply(q, k, v, mask, groups, scale, tile);
}

}  // namespace streambp
