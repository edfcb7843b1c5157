// The decoder layers and the causal LM (docs/architecture.md: Models): one implementation, switched by config.
#include <cmath>
#include <limits>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/lora.h"
#include "streambp/model.h"
#include "fused_attention.h"
#include "tiled_attention.h"

namespace streambp {
namespace F = torch::nn::functional;

namespace {

// float64 models compute everything in float64; lower precisions compute norms, RoPE
// tables, softmax and logits in float32 (as HF does).
torch::Dtype ComputeDtype(torch::Dtype dtype) {
  return dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

// RECORD_USER_SCOPE("streambp::...") marks what a piece of the layer computes (norm, rope,
// projection, attention, mlp, layout): streambp-bench's time breakdown attributes the ops
// inside, and their backward, to it. Free when nothing observes RecordFunction.

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  RECORD_USER_SCOPE("streambp::norm");
  const auto in_dtype = x.scalar_type();
  auto h = x.to(ComputeDtype(in_dtype));
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight * h.to(in_dtype);
}

RotaryEmbedding::RotaryEmbedding(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  auto exponents = torch::arange(0, dim, 2, torch::kFloat64) / static_cast<double>(dim);
  inv_freq_ = 1.0 / torch::pow(config.rope_theta, exponents);
  const RopeScaling& s = config.rope_scaling;
  if (s.type == "linear") {
    inv_freq_ = inv_freq_ / s.factor;
  } else if (s.type == "llama3") {
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_ctx / s.low_freq_factor;
    const double high_freq_wavelen = old_ctx / s.high_freq_factor;
    auto wavelen = 2.0 * M_PI / inv_freq_;
    auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq_ / s.factor, inv_freq_);
    auto smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
    auto is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
    inv_freq_ = torch::where(is_medium, smoothed, scaled);
  }
}

Rope RotaryEmbedding::tables(const torch::Tensor& position_ids, const torch::Tensor& like) const {
  const auto cd = ComputeDtype(like.scalar_type());
  auto inv = inv_freq_.to(like.device(), cd);
  auto freqs = position_ids.to(cd).unsqueeze(-1) * inv;  // [B, T, hd/2]
  auto emb = torch::cat({freqs, freqs}, -1);
  return Rope{emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

torch::Tensor RotaryEmbedding::apply(const torch::Tensor& x, const Rope& rope) {
  RECORD_USER_SCOPE("streambp::rope");
  auto cos = rope.cos.unsqueeze(2);
  auto sin = rope.sin.unsqueeze(2);
  return x * cos + RotateHalf(x) * sin;
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t index)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {
  (void)index;
  q_proj = register_module("q_proj", MakeLinear(c.hidden_size, c.q_dim(), c.attention_bias));
  k_proj = register_module("k_proj", MakeLinear(c.hidden_size, c.kv_dim(), c.attention_bias));
  v_proj = register_module("v_proj", MakeLinear(c.hidden_size, c.kv_dim(), c.attention_bias));
  o_proj = register_module("o_proj", MakeLinear(c.q_dim(), c.hidden_size, c.o_proj_bias));
  gate_proj = register_module("gate_proj", MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", MakeLinear(c.intermediate_size, c.hidden_size, c.mlp_bias));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(c.head_dim, c.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(c.head_dim, c.rms_norm_eps));
  }
}

void DecoderLayerImpl::set_lora(const std::array<const LoraWeights*, 7>& weights, double scale) {
  lora_ = weights;
  lora_scale_ = scale;
}

torch::Tensor DecoderLayerImpl::project(int target, torch::nn::Linear& base, const torch::Tensor& x) {
  RECORD_USER_SCOPE("streambp::projection");
  auto y = base(x);
  const LoraWeights* w = lora_[target];
  if (w == nullptr) return y;
  // PEFT: the input in the adapter's dtype, the term scaled and added in the output's.
  auto term = F::linear(F::linear(x.to(w->a.scalar_type()), w->a), w->b) * lora_scale_;
  return y + term.to(y.scalar_type());
}

KeysValues DecoderLayerImpl::keys_values(const torch::Tensor& x, const Rope& rope) {
  const int64_t B = x.size(0), T = x.size(1);
  auto h = input_layernorm(x);
  auto k = project(1, k_proj, h).view({B, T, kv_heads_, head_dim_});
  if (k_norm) k = k_norm(k);
  k = RotaryEmbedding::apply(k, rope);
  auto v = project(2, v_proj, h).view({B, T, kv_heads_, head_dim_});
  // [B, KVH, T, hd] contiguous: a tile of keys is then a plain view for the attention GEMMs.
  RECORD_USER_SCOPE("streambp::layout");
  return KeysValues{k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()};
}

torch::Tensor DecoderLayerImpl::forward_queries(const torch::Tensor& x_q, const Rope& rope_q,
                                                const KeysValues& kv, const AttentionPattern& mask,
                                                const AttentionTiling& tiling) {
  const int64_t B = x_q.size(0), C = x_q.size(1), L = kv.k.size(2);
  const int64_t groups = heads_ / kv_heads_;
  auto h = input_layernorm(x_q);
  auto q = project(0, q_proj, h).view({B, C, heads_, head_dim_});
  if (q_norm) q = q_norm(q);
  q = RotaryEmbedding::apply(q, rope_q);  // [B, C, H, hd]
  // The rows of one kv head: position major with its G query heads adjacent (row c*G + g),
  // so one batched matmul per kv head serves the whole group without copying K or V, and
  // a block of positions is a range of rows.
  torch::Tensor qg;
  {
    RECORD_USER_SCOPE("streambp::layout");
    qg = q.view({B, C, kv_heads_, groups, head_dim_}).permute({0, 2, 1, 3, 4}).reshape(
        {B, kv_heads_, C * groups, head_dim_});
  }
  const bool tiled = (tiling.key_tile > 0 && L > tiling.key_tile) ||
                     (tiling.query_tile > 0 && C > tiling.query_tile) || tiling.grad_sink != nullptr;
  torch::Tensor attn;  // [B, KVH, C*G, hd]
  if (tiled) {
    RECORD_USER_SCOPE("streambp::attention");
    attn = FusedAttention(qg, kv.k, kv.v, mask, groups, scale_, tiling);  // CUDA only, where exact
    if (!attn.defined()) attn = TiledAttention(qg, kv.k, kv.v, mask, groups, scale_, tiling);
  } else {
    RECORD_USER_SCOPE("streambp::attention");
    auto scores = torch::matmul(qg, kv.k.transpose(-1, -2));  // [B, KVH, C*G, L]
    scores.mul_(scale_);
    scores = scores.view({B, kv_heads_, C, groups, L});
    scores.masked_fill_(mask.dense().logical_not().reshape({B, 1, C, 1, L}), -std::numeric_limits<double>::infinity());
    const auto dtype = q.scalar_type();
    auto probs = torch::softmax(scores, -1, ComputeDtype(dtype)).to(dtype);
    attn = torch::matmul(probs.view({B, kv_heads_, C * groups, L}), kv.v);
  }
  {
    RECORD_USER_SCOPE("streambp::layout");
    attn = attn.view({B, kv_heads_, C, groups, head_dim_}).permute({0, 2, 1, 3, 4}).reshape({B, C, heads_ * head_dim_});
  }
  auto x1 = x_q + project(3, o_proj, attn);
  auto h2 = post_attention_layernorm(x1);
  RECORD_USER_SCOPE("streambp::mlp");
  return x1 + project(6, down_proj, F::silu(project(4, gate_proj, h2)) * project(5, up_proj, h2));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const Rope& rope, const AttentionPattern& mask,
                                        const AttentionTiling& tiling) {
  return forward_queries(x, rope, keys_values(x, rope), mask, tiling);
}

CausalLMImpl::CausalLMImpl(const ModelConfig& config) : config_(config), rotary_(config) {
  config_.Validate();
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    DecoderLayer layer(config, i);
    layers->push_back(layer);
    layer_list.push_back(layer);
  }
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", MakeLinear(config.hidden_size, config.vocab_size, false));
  }
}

torch::Tensor CausalLMImpl::embed(const torch::Tensor& input_ids) { return embed_tokens(input_ids); }

torch::Tensor CausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : embed_tokens->weight;
}

torch::Tensor CausalLMImpl::logits(const torch::Tensor& h_last) { return logits_outside_head(h_last, nullptr, nullptr); }

torch::Tensor CausalLMImpl::logits_outside_head(const torch::Tensor& h_last, torch::Tensor* normed,
                                                torch::Tensor* projected) {
  auto h = norm(h_last);
  auto out = F::linear(h, projected != nullptr ? lm_head_weight().detach() : lm_head_weight());
  if (normed != nullptr) *normed = h;
  if (projected != nullptr) *projected = out;
  if (adapter_) {
    if (const LoraWeights* w = adapter_->find(-1, LoraTarget::kLmHead)) {
      auto term = F::linear(F::linear(h.to(w->a.scalar_type()), w->a), w->b) * adapter_->scale();
      out = out + term.to(out.scalar_type());
    }
  }
  return out.to(ComputeDtype(out.scalar_type()));
}

void CausalLMImpl::set_adapter(std::shared_ptr<const LoraAdapter> adapter) {
  if (adapter) adapter->check_fits(config_);
  for (int64_t i = 0; i < static_cast<int64_t>(layer_list.size()); ++i) {
    std::array<const LoraWeights*, 7> w{};
    if (adapter) {
      for (int t = 0; t < kLoraLayerTargets; ++t) w[t] = adapter->find(i, static_cast<LoraTarget>(t));
    }
    layer_list[i]->set_lora(w, adapter ? adapter->scale() : 0.0);
  }
  adapter_ = std::move(adapter);
}

ScopedAdapter::ScopedAdapter(CausalLMImpl& model, std::shared_ptr<const LoraAdapter> adapter)
    : model_(model), previous_(model.adapter()) {
  model_.set_adapter(std::move(adapter));
}

ScopedAdapter::~ScopedAdapter() { model_.set_adapter(previous_); }

}  // namespace streambp
