// FlashAttention for the stream engine's query chunks and checkpoint:tiled's blocks on CUDA
// (docs/gpu.md: Attention on CUDA). LibTorch's private flash ops change between versions,
// so they are called here only, behind the version guard; everything else uses TiledAttention.
#include "fused_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <torch/torch.h>
#include <torch/version.h>

#include "streambp/attention.h"

#if defined(STREAMBP_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define STREAMBP_FLASH 1
#endif
// Sliding windows through _flash_attention_forward/_backward's window_size_left (LibTorch
// 2.8 on, builds configured with -DSTREAMBP_FLASH_WINDOW=ON; else windowed layers run the
// tiled kernel).
#if defined(STREAMBP_FLASH) && !defined(STREAMBP_NO_FLASH_WINDOW) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8))
#define STREAMBP_FLASH_WINDOW 1
#endif
// Packed and left-padded rows through _flash_attention_forward/_backward's varlen entry
// (cum_seq_q/k), one sequence at a time (builds configured with -DSTREAMBP_FLASH_VARLEN=ON;
// else those rows run the tiled kernel).
#if defined(STREAMBP_FLASH) && !defined(STREAMBP_NO_FLASH_VARLEN) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8))
#define STREAMBP_FLASH_VARLEN 1
#endif

namespace streambp {

#if defined(STREAMBP_FLASH)
namespace {

bool TurnedOn() {
  static const bool on = [] {
    const char* v = std::getenv("STREAMBP_ATTENTION");
    return v == nullptr || std::string(v) != "tiled";
  }();
  return on;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
int64_t AsInt(const T& v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return v.expect_int();
  }
}

// K/V with fewer heads than the queries: the flash kernel's own grouped-query support (each
// kv head serves `groups` consecutive query heads, as in HF; dK/dV come back summed over
// them), or, where a version's kernel refuses it, K/V repeated per query head.
// STREAMBP_FLASH_GQA=expand chooses the latter.
enum class Gqa { kUnknown, kNative, kExpand };
std::atomic<Gqa>& GqaMode() {
  static std::atomic<Gqa> mode{[] {
    const char* v = std::getenv("STREAMBP_FLASH_GQA");
    return v != nullptr && std::string(v) == "expand" ? Gqa::kExpand : Gqa::kUnknown;
  }()};
  return mode;
}

// dK and dV of keys [k0, k0 + L) ([B, heads, L, hd]) added into the sink (per kv head: summed
// over its query heads where the kernel did not sum them, in the sink's precision).
void AddIntoSink(const KeysValues& sink, const torch::Tensor& dk, const torch::Tensor& dv, int64_t k0) {
  const int64_t B = dk.size(0), KVH = sink.k.size(1), L = dk.size(2), hd = dk.size(3);
  auto fold = [&](const torch::Tensor& d) {
    auto t = d.to(sink.k.scalar_type());
    const int64_t heads = d.size(1);
    return heads == KVH ? t : t.reshape({B, KVH, heads / KVH, L, hd}).sum(2);
  };
  torch::NoGradGuard no_grad;
  sink.k.slice(2, k0, k0 + L).add_(fold(dk));
  sink.v.slice(2, k0, k0 + L).add_(fold(dv));
}

// One causal flash call on [B, H, C, hd] queries against [B, KVH, L, hd] keys and values
// (L >= C, bottom-right aligned; KVH divides H). With a sink, dK and dV (per kv head: summed
// over its query heads, in the sink's precision where the kernel did not sum them) are added
// into sink->k / sink->v[:, :, :L] and not returned.
struct FlashFunction : public torch::autograd::Function<FlashFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double scale, int64_t sink) {
    auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, /*is_causal=*/true, /*return_debug_mask=*/false,
                                                     scale);
    auto out = std::get<0>(r);
    // The output through save_for_backward, which knows it is this node's output: held in
    // saved_data it would hold its own grad_fn, a cycle that never frees the chunk.
    ctx->save_for_backward({q, k, v, out});
    ctx->saved_data["lse"] = std::get<1>(r);
    ctx->saved_data["max_q"] = AsInt(std::get<4>(r));
    ctx->saved_data["max_k"] = AsInt(std::get<5>(r));
    ctx->saved_data["seed"] = std::get<6>(r);
    ctx->saved_data["offset"] = std::get<7>(r);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["sink"] = sink;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    auto g = grad[0].contiguous();
    auto r = at::_scaled_dot_product_flash_attention_backward(
        g, q, k, v, out, ctx->saved_data["lse"].toTensor(), torch::Tensor(),
        torch::Tensor(), ctx->saved_data["max_q"].toInt(), ctx->saved_data["max_k"].toInt(), 0.0,
        /*is_causal=*/true, ctx->saved_data["seed"].toTensor(), ctx->saved_data["offset"].toTensor(),
        ctx->saved_data["scale"].toDouble());
    auto dq = std::get<0>(r), dk = std::get<1>(r), dv = std::get<2>(r);
    const auto* sink = reinterpret_cast<const KeysValues*>(ctx->saved_data["sink"].toInt());
    if (sink == nullptr) return {dq, dk, dv, torch::Tensor(), torch::Tensor()};
    AddIntoSink(*sink, dk, dv, 0);
    return {dq, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

#if defined(STREAMBP_FLASH_WINDOW)
// One causal flash call with a sliding window of W: [B, H, C, hd] queries against the last
// keys of [B, KVH, L, hd] (bottom-right aligned, L >= C), the query at key position i seeing
// the keys j with i - j < W (HF's rule; the kernel's window_size_left is W - 1). The caller
// passes only the keys some query sees, [k0, e): the sink's dK/dV rows are k0 on. The kernel
// takes [B, T, heads, hd].
struct FlashWindowFunction : public torch::autograd::Function<FlashWindowFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double scale, int64_t window, int64_t sink, int64_t k0) {
    auto qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);
    auto r = at::_flash_attention_forward(qt, kt, vt, std::nullopt, std::nullopt, qt.size(1), kt.size(1), 0.0,
                                          /*is_causal=*/true, /*return_debug_mask=*/false, scale,
                                          /*window_size_left=*/window - 1, /*window_size_right=*/0);
    auto out = std::get<0>(r);  // [B, C, H, hd]
    ctx->save_for_backward({qt, kt, vt, out});
    ctx->saved_data["lse"] = std::get<1>(r);
    ctx->saved_data["seed"] = std::get<2>(r);
    ctx->saved_data["offset"] = std::get<3>(r);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["k0"] = k0;
    return {out.transpose(1, 2)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto &qt = saved[0], &kt = saved[1], &vt = saved[2], &out = saved[3];
    auto g = grad[0].transpose(1, 2).contiguous();
    auto r = at::_flash_attention_backward(g, qt, kt, vt, out, ctx->saved_data["lse"].toTensor(), torch::Tensor(),
                                           torch::Tensor(), qt.size(1), kt.size(1), 0.0, /*is_causal=*/true,
                                           ctx->saved_data["seed"].toTensor(), ctx->saved_data["offset"].toTensor(),
                                           ctx->saved_data["scale"].toDouble(),
                                           /*window_size_left=*/ctx->saved_data["window"].toInt() - 1,
                                           /*window_size_right=*/0);
    auto dq = std::get<0>(r).transpose(1, 2), dk = std::get<1>(r).transpose(1, 2), dv = std::get<2>(r).transpose(1, 2);
    const auto* sink = reinterpret_cast<const KeysValues*>(ctx->saved_data["sink"].toInt());
    if (sink == nullptr) return {dq, dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    AddIntoSink(*sink, dk, dv, ctx->saved_data["k0"].toInt());
    return {dq, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

#if defined(STREAMBP_FLASH_VARLEN)
// FlashAttention's varlen entry as the VarlenKernel (streambp/attention.h): q [Nq, H, hd],
// k, v [Nk, KVH, hd] with any row and head strides (the kernel reads the last dim contiguous
// only, so a row's K/V go in as views), the offsets int32 on the device. K/V heads as
// FlashFunction does: native grouped-query, or repeated per query head (then dK/dV come back
// per query head and are summed per kv head here).
class FlashVarlenKernel final : public VarlenKernel {
 public:
  std::vector<torch::Tensor> forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const Segments& s, double scale) const override {
    auto cu_q = Offsets(s.cu_q, q.device()), cu_k = Offsets(s.cu_k, q.device());
    const int64_t H = q.size(1), KVH = k.size(1);
    auto& gqa = GqaMode();
    // The result: output, log-sum-exp, the kernel's two RNG tensors, the offsets, and (on the
    // host) whether K/V went in repeated per query head, for the backward to do the same.
    auto call = [&](const torch::Tensor& keys, const torch::Tensor& values) {
      auto r = at::_flash_attention_forward(q, keys, values, cu_q, cu_k, s.max_q, s.max_k, 0.0, /*is_causal=*/true,
                                            /*return_debug_mask=*/false, scale, Left(s), Right(s));
      return std::vector<torch::Tensor>{std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), cu_q, cu_k,
                                        torch::scalar_tensor(keys.size(1) != KVH ? 1 : 0, torch::kInt64)};
    };
    if (H == KVH || gqa.load() != Gqa::kExpand) {
      try {
        auto r = call(k, v);
        if (H != KVH) gqa.store(Gqa::kNative);
        return r;
      } catch (const c10::Error& e) {
        if (H == KVH || gqa.load() == Gqa::kNative) throw;
        gqa.store(Gqa::kExpand);
        std::fprintf(stderr, "fused attention (varlen): the flash kernel refused %lld kv heads for %lld query heads "
                     "(%s); K/V are repeated per query head from now on\n",
                     static_cast<long long>(KVH), static_cast<long long>(H), e.what_without_backtrace());
      }
    }
    return call(Expand(k, H), Expand(v, H));
  }

  std::vector<torch::Tensor> backward(const torch::Tensor& g, const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const std::vector<torch::Tensor>& f, const Segments& s,
                                      double scale) const override {
    const int64_t H = q.size(1), KVH = k.size(1);
    const bool expanded = f[6].item<int64_t>() != 0;  // a host tensor: no device read
    auto keys = expanded ? Expand(k, H) : k, values = expanded ? Expand(v, H) : v;
    auto r = at::_flash_attention_backward(g, q, keys, values, f[0], f[1], f[4], f[5], s.max_q, s.max_k, 0.0,
                                           /*is_causal=*/true, f[2], f[3], scale, Left(s), Right(s));
    auto dk = std::get<1>(r), dv = std::get<2>(r);
    if (expanded) {
      auto fold = [&](const torch::Tensor& d) {
        return d.to(torch::kFloat32).view({d.size(0), KVH, H / KVH, d.size(2)}).sum(2);
      };
      dk = fold(dk);
      dv = fold(dv);
    }
    return {std::get<0>(r), dk, dv};
  }

 private:
  // Offsets to the device without waiting for it: from pinned memory, asynchronously (the
  // caching host allocator keeps the buffer until the copy has run).
  static torch::Tensor Offsets(const std::vector<int64_t>& cu, const torch::Device& device) {
    auto host = torch::empty({static_cast<int64_t>(cu.size())}, torch::dtype(torch::kInt32).pinned_memory(true));
    auto* p = host.data_ptr<int32_t>();
    for (size_t i = 0; i < cu.size(); ++i) p[i] = static_cast<int32_t>(cu[i]);
    return host.to(device, /*non_blocking=*/true);
  }
  static torch::Tensor Expand(const torch::Tensor& t, int64_t H) {
    const int64_t N = t.size(0), KVH = t.size(1), hd = t.size(2);
    return t.unsqueeze(2).expand({N, KVH, H / KVH, hd}).reshape({N, H, hd});
  }
  // HF's window W: query i sees keys j with i - j < W, the kernel's window_size_left W - 1.
  static std::optional<int64_t> Left(const Segments& s) {
    return s.window > 0 ? std::optional<int64_t>(s.window - 1) : std::nullopt;
  }
  static std::optional<int64_t> Right(const Segments& s) {
    return s.window > 0 ? std::optional<int64_t>(0) : std::nullopt;
  }
};
#endif

}  // namespace

bool FusedAttentionAvailable() { return TurnedOn(); }

torch::Tensor FusedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionPattern& mask, int64_t groups, double scale,
                             const AttentionTiling& tiling) {
  const auto dtype = q.scalar_type();
  const int64_t hd = q.size(-1);
#if defined(STREAMBP_FLASH_WINDOW)
  const bool window_ok = true;
#else
  const bool window_ok = mask.window == 0;
#endif
  if (!TurnedOn() || !q.is_cuda() || (dtype != torch::kBFloat16 && dtype != torch::kFloat16) || hd % 8 != 0 ||
      hd > 256 || mask.mask.defined() || !window_ok || k.size(2) != mask.k_end || mask.q_end != mask.k_end) {
    return {};
  }
  // Whole rows are known from the batch's layout, and so are the runs of packed or
  // left-padded ones: no device read per chunk.
  if (!mask.whole_rows) {
#if defined(STREAMBP_FLASH_VARLEN)
    static const FlashVarlenKernel varlen;
    return VarlenAttention(AttentionCall{q, k, v, mask, groups, scale, tiling}, varlen);
#else
    return {};
#endif
  }
  const int64_t B = q.size(0), KVH = q.size(1), C = q.size(2) / groups, L = k.size(2);
  // [B, KVH, C*G, hd] (row c*G + g) -> [B, H, C, hd], query head h = kv head * G + g as in HF.
  auto qh = q.reshape({B, KVH, C, groups, hd}).permute({0, 1, 3, 2, 4}).reshape({B, KVH * groups, C, hd});
  const auto sink = reinterpret_cast<int64_t>(tiling.grad_sink);
  torch::Tensor out;
  auto& gqa = GqaMode();
  // A window narrower than the keys: only [k0, L) are seen by some query of the chunk.
  [[maybe_unused]] const int64_t w = mask.window > 0 && mask.window < L ? mask.window : 0;
  [[maybe_unused]] const int64_t k0 = w > 0 ? std::max<int64_t>(0, L - C - w + 1) : 0;
  auto call = [&](const torch::Tensor& keys, const torch::Tensor& values) {
#if defined(STREAMBP_FLASH_WINDOW)
    if (w > 0) return FlashWindowFunction::apply(qh, keys.slice(2, k0, L), values.slice(2, k0, L), scale, w, sink, k0)[0];
#endif
    return FlashFunction::apply(qh, keys, values, scale, sink)[0];
  };
  if (groups == 1 || gqa.load() != Gqa::kExpand) {
    try {
      out = call(k, v);
      if (groups > 1) gqa.store(Gqa::kNative);
    } catch (const c10::Error& e) {
      if (groups == 1 || gqa.load() == Gqa::kNative) throw;
      gqa.store(Gqa::kExpand);  // this version's kernel wants a kv head per query head
      std::fprintf(stderr, "fused attention: the flash kernel refused %lld kv heads for %lld query heads (%s); "
                   "K/V are repeated per query head from now on\n",
                   static_cast<long long>(KVH), static_cast<long long>(KVH * groups), e.what_without_backtrace());
    }
  }
  if (!out.defined()) {
    auto expand = [&](const torch::Tensor& t) {
      return t.unsqueeze(2).expand({B, KVH, groups, L, hd}).reshape({B, KVH * groups, L, hd});
    };
    out = call(expand(k), expand(v));
  }
  // back to [B, KVH, C*G, hd]
  return out.reshape({B, KVH, groups, C, hd}).permute({0, 1, 3, 2, 4}).reshape({B, KVH, C * groups, hd});
}

#else

bool FusedAttentionAvailable() { return false; }

torch::Tensor FusedAttention(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                             const AttentionPattern&, int64_t, double, const AttentionTiling&) {
  return {};
}

#endif

}  // namespace streambp
