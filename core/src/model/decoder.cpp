// The decoder layers and the causal LM (docs/architecture.md: Models): one implementation, switched by config.
#include <cmath>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "streambp/attention.h"
#include "streambp/error.h"
#include "streambp/lora.h"
#include "streambp/model.h"

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

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, NormKind kind) : eps_(eps), kind_(kind) {
  // 1 for x·w, 0 for x·(1 + w): the identity either way, as HF initializes them.
  weight = register_parameter("weight", kind == NormKind::kOffsetOne ? torch::zeros({dim}) : torch::ones({dim}));
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
  if (kind_ == NormKind::kOffsetOne) return (h * (1.0 + weight.to(h.scalar_type()))).to(in_dtype);
  return weight * h.to(in_dtype);
}

RotaryEmbedding::RotaryEmbedding(int64_t dim, double theta, const RopeScaling& s) {
  auto exponents = torch::arange(0, dim, 2, torch::kFloat64) / static_cast<double>(dim);
  inv_freq_ = 1.0 / torch::pow(theta, exponents);
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

RopeTable RotaryEmbedding::tables(const torch::Tensor& position_ids, const torch::Tensor& like) const {
  const auto cd = ComputeDtype(like.scalar_type());
  auto inv = inv_freq_.to(like.device(), cd);
  auto freqs = position_ids.to(cd).unsqueeze(-1) * inv;  // [B, T, hd/2]
  auto emb = torch::cat({freqs, freqs}, -1);
  return RopeTable{emb.cos().to(like.scalar_type()), emb.sin().to(like.scalar_type())};
}

Rope Rope::slice(int64_t s, int64_t e) const {
  Rope out;
  for (const auto& t : kinds) out.kinds.push_back(RopeTable{t.cos.slice(1, s, e), t.sin.slice(1, s, e)});
  return out;
}

torch::Tensor RotaryEmbedding::apply(const torch::Tensor& x, const RopeTable& rope) {
  RECORD_USER_SCOPE("streambp::rope");
  auto cos = rope.cos.unsqueeze(2);
  auto sin = rope.sin.unsqueeze(2);
  return x * cos + RotateHalf(x) * sin;
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t index)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scale_(c.attention_scale()),
      rope_kind_(c.rope_kind(index)),
      activation_(c.activation) {
  q_proj = register_module("q_proj", MakeLinear(c.hidden_size, c.q_dim(), c.attention_bias));
  k_proj = register_module("k_proj", MakeLinear(c.hidden_size, c.kv_dim(), c.attention_bias));
  v_proj = register_module("v_proj", MakeLinear(c.hidden_size, c.kv_dim(), c.attention_bias));
  o_proj = register_module("o_proj", MakeLinear(c.q_dim(), c.hidden_size, c.o_proj_bias));
  gate_proj = register_module("gate_proj", MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", MakeLinear(c.intermediate_size, c.hidden_size, c.mlp_bias));
  auto norm = [&](const char* name, int64_t dim) {
    return register_module(name, RMSNorm(dim, c.rms_norm_eps, c.norm_kind));
  };
  input_layernorm = norm("input_layernorm", c.hidden_size);
  post_attention_layernorm = norm("post_attention_layernorm", c.hidden_size);
  if (c.sandwich_norms) {
    pre_feedforward_layernorm = norm("pre_feedforward_layernorm", c.hidden_size);
    post_feedforward_layernorm = norm("post_feedforward_layernorm", c.hidden_size);
  }
  if (c.qk_norm) {
    q_norm = norm("q_norm", c.head_dim);
    k_norm = norm("k_norm", c.head_dim);
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
  k = RotaryEmbedding::apply(k, rope.kinds.at(rope_kind_));
  auto v = project(2, v_proj, h).view({B, T, kv_heads_, head_dim_});
  // [B, KVH, T, hd] contiguous: a tile of keys is then a plain view for the attention GEMMs.
  RECORD_USER_SCOPE("streambp::layout");
  return KeysValues{k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()};
}

torch::Tensor DecoderLayerImpl::forward_queries(const torch::Tensor& x_q, const Rope& rope_q,
                                                const KeysValues& kv, const AttentionPattern& mask,
                                                const AttentionTiling& tiling) {
  const int64_t B = x_q.size(0), C = x_q.size(1);
  const int64_t groups = heads_ / kv_heads_;
  auto h = input_layernorm(x_q);
  auto q = project(0, q_proj, h).view({B, C, heads_, head_dim_});
  if (q_norm) q = q_norm(q);
  q = RotaryEmbedding::apply(q, rope_q.kinds.at(rope_kind_));  // [B, C, H, hd]
  // The rows of one kv head: position major with its G query heads adjacent (row c*G + g),
  // so one batched matmul per kv head serves the whole group without copying K or V, and
  // a block of positions is a range of rows.
  torch::Tensor qg;
  {
    RECORD_USER_SCOPE("streambp::layout");
    qg = q.view({B, C, kv_heads_, groups, head_dim_}).permute({0, 2, 1, 3, 4}).reshape(
        {B, kv_heads_, C * groups, head_dim_});
  }
  // [B, KVH, C*G, hd] from the first backend that computes this call exactly
  // (docs/architecture.md: Attention backends).
  auto attn = Attend(AttentionCall{qg, kv.k, kv.v, mask, groups, scale_, tiling}).out;
  {
    RECORD_USER_SCOPE("streambp::layout");
    attn = attn.view({B, kv_heads_, C, groups, head_dim_}).permute({0, 2, 1, 3, 4}).reshape({B, C, heads_ * head_dim_});
  }
  auto attn_out = project(3, o_proj, attn);
  // Llama: x + attn, then the MLP reads post_attention_layernorm. Gemma3 (sandwich): the
  // attention and MLP outputs are normalized before their residual adds.
  auto x1 = x_q + (pre_feedforward_layernorm ? post_attention_layernorm(attn_out) : attn_out);
  auto h2 = pre_feedforward_layernorm ? pre_feedforward_layernorm(x1) : post_attention_layernorm(x1);
  RECORD_USER_SCOPE("streambp::mlp");
  auto gate = project(4, gate_proj, h2);
  gate = activation_ == Activation::kGeluTanh ? F::gelu(gate, F::GELUFuncOptions().approximate("tanh")) : F::silu(gate);
  auto mlp = project(6, down_proj, gate * project(5, up_proj, h2));
  return x1 + (post_feedforward_layernorm ? post_feedforward_layernorm(mlp) : mlp);
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const Rope& rope, const AttentionPattern& mask,
                                        const AttentionTiling& tiling) {
  return forward_queries(x, rope, keys_values(x, rope), mask, tiling);
}

CausalLMImpl::CausalLMImpl(const ModelConfig& config) : config_(config) {
  config_.Validate();
  rotary_.emplace_back(config.head_dim, config.rope_theta, config.rope_scaling);
  // Gemma3's local RoPE, only when some layer is local (rope_kind 1): an all-global model
  // would otherwise build a table per step that no layer reads.
  bool any_local = false;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) any_local = any_local || config.rope_kind(i) == 1;
  if (any_local) rotary_.emplace_back(config.head_dim, *config.rope_local_base_freq, RopeScaling{});
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    DecoderLayer layer(config, i);
    layers->push_back(layer);
    layer_list.push_back(layer);
  }
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_kind));
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", MakeLinear(config.hidden_size, config.vocab_size, false));
  }
}

Rope CausalLMImpl::rope_tables(const torch::Tensor& position_ids, const torch::Tensor& like) const {
  Rope out;
  for (const auto& r : rotary_) out.kinds.push_back(r.tables(position_ids, like));
  return out;
}

torch::Tensor CausalLMImpl::embed(const torch::Tensor& input_ids) {
  auto x = config_.pad_token_id ? F::embedding(input_ids, embed_tokens->weight,
                                               F::EmbeddingFuncOptions().padding_idx(*config_.pad_token_id))
                                : embed_tokens(input_ids);
  // Gemma: HF multiplies by the scale cast to the weights' dtype.
  if (config_.embed_scale != 1.0) x = x * torch::scalar_tensor(config_.embed_scale, x.options());
  return x;
}

void CausalLMImpl::embed_backward(const torch::Tensor& input_ids, const torch::Tensor& grad) {
  auto& weight = embed_tokens->weight;
  if (!weight.requires_grad()) return;  // a frozen base (adapter training)
  RECORD_USER_SCOPE("streambp::embedding");
  // The rows of dL/dx added into the embedding's gradient in place, where autograd's embedding
  // backward would first build a dense [V, d] gradient of its own.
  torch::NoGradGuard no_grad;
  const int64_t d = grad.size(-1);
  auto ids = input_ids.reshape({-1});
  auto rows = grad.reshape({-1, d}).to(weight.scalar_type());
  if (config_.embed_scale != 1.0) rows = rows * torch::scalar_tensor(config_.embed_scale, rows.options());
  if (config_.pad_token_id) rows = rows.masked_fill(ids.eq(*config_.pad_token_id).unsqueeze(1), 0);
  if (!weight.grad().defined()) weight.mutable_grad() = torch::zeros_like(weight);
  weight.mutable_grad().index_add_(0, ids, rows);
}

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
  out = out.to(ComputeDtype(out.scalar_type()));
  if (config_.final_logit_softcapping) {  // Gemma3: c·tanh(logits / c)
    const double c = *config_.final_logit_softcapping;
    out = torch::tanh(out / c) * c;
  }
  return out;
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
