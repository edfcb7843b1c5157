// The decoder layers and the causal LM (docs/architecture.md: Models): one implementation, switched by config.
#include <cmath>
#include <map>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "streambp/attention.h"
#include "streambp/error.h"
#include "streambp/lora.h"
#include "streambp/model.h"
#include "weight_gradients.h"

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

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, bool bias) {
  // Values come from InitModel or a checkpoint; nn.Linear's own initialization would only
  // draw from the global generator here.
  weight = register_parameter("weight", torch::empty({out, in}));
  if (bias) this->bias = register_parameter("bias", torch::zeros({out}));
}

void ProjectionImpl::set_lora(const LoraWeights* weights, double scale) {
  lora_ = weights;
  lora_scale_ = scale;
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) { return apply(x, /*product=*/true); }

torch::Tensor ProjectionImpl::backward_only(const torch::Tensor& x) { return apply(x, /*product=*/false); }

torch::Tensor ProjectionImpl::apply(const torch::Tensor& x, bool product) {
  RECORD_USER_SCOPE("streambp::projection");
  if (lora_ != nullptr && lora_->weight.defined()) {
    // A module to save (PEFT's modules_to_save): the adapter's trainable copy replaces the
    // weight; the input in its dtype, the output in the input's.
    const auto& w = lora_->weight;
    return F::linear(x.to(w.scalar_type()), w, bias.defined() ? bias.to(w.scalar_type()) : bias).to(x.scalar_type());
  }
  const bool graph = torch::GradMode::is_enabled() && (weight.requires_grad() || x.requires_grad());
  // A frozen weight's projection goes through the same function too (its backward computes dX
  // alone): with and without the product, the same dX by construction, whatever the BLAS's
  // kernels do with linear's layouts (on OpenBLAS's AVX-512 kernels F::linear's autograd dX
  // differed from this function's in the last bit).
  const bool in_place = InPlaceWeightGradients::active() && graph;
  auto y = in_place ? LinearAddingWeightGradients(x, weight, bias, product)
           : graph  ? F::linear(x, weight, bias)
                    : LinearRows(x, weight, bias);
  if (lora_ == nullptr) return y;
  // PEFT: the input in the adapter's dtype, the term scaled and added in the output's.
  auto term = F::linear(F::linear(x.to(lora_->a.scalar_type()), lora_->a), lora_->b) * lora_scale_;
  return y + term.to(y.scalar_type());
}

namespace {

// Registers the projections of `specs` on `module` in order and returns them by name.
std::map<std::string, Projection> RegisterProjections(torch::nn::Module& module, const std::vector<ProjectionSpec>& specs) {
  std::map<std::string, Projection> out;
  for (const auto& p : specs) out.emplace(p.name, module.register_module(p.name, Projection(p.in, p.out, p.bias)));
  return out;
}

void AppendProjection(std::vector<std::pair<std::string, torch::Tensor>>& out, const std::string& path,
                      const Projection& p) {
  out.emplace_back(path + ".weight", p->weight);
  if (p->bias.defined()) out.emplace_back(path + ".bias", p->bias);
}

}  // namespace

std::vector<ProjectionSpec> AttentionImpl::Projections(const ModelConfig& c) {
  return {{"q_proj", c.hidden_size, c.q_dim(), c.attention_bias},
          {"k_proj", c.hidden_size, c.kv_dim(), c.attention_bias},
          {"v_proj", c.hidden_size, c.kv_dim(), c.attention_bias},
          {"o_proj", c.q_dim(), c.hidden_size, c.o_proj_bias}};
}

AttentionImpl::AttentionImpl(const ModelConfig& c, int64_t layer)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scale_(c.attention_scale()),
      rope_kind_(c.rope_kind(layer)) {
  auto p = RegisterProjections(*this, Projections(c));
  q_proj = p.at("q_proj");
  k_proj = p.at("k_proj");
  v_proj = p.at("v_proj");
  o_proj = p.at("o_proj");
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(c.head_dim, c.rms_norm_eps, c.norm_kind));
    k_norm = register_module("k_norm", RMSNorm(c.head_dim, c.rms_norm_eps, c.norm_kind));
  }
}

KeysValues AttentionImpl::keys_values(const torch::Tensor& h, const Rope& rope, bool read) {
  const int64_t B = h.size(0), T = h.size(1);
  // Unread, only the k-norm's backward reads a value (its input); RoPE's reads only its tables.
  auto k = (read || k_norm ? k_proj(h) : k_proj->backward_only(h)).view({B, T, kv_heads_, head_dim_});
  if (k_norm) k = k_norm(k);
  k = RotaryEmbedding::apply(k, rope.kinds.at(rope_kind_));
  auto v = (read ? v_proj(h) : v_proj->backward_only(h)).view({B, T, kv_heads_, head_dim_});
  // [B, KVH, T, hd] contiguous: a tile of keys is then a plain view for the attention GEMMs.
  RECORD_USER_SCOPE("streambp::layout");
  return KeysValues{k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()};
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& h_q, const Rope& rope_q, const KeysValues& kv,
                                     const AttentionPattern& pattern, const AttentionTiling& tiling) {
  const int64_t B = h_q.size(0), C = h_q.size(1);
  const int64_t groups = heads_ / kv_heads_;
  auto q = q_proj(h_q).view({B, C, heads_, head_dim_});
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
  // (docs/architecture.md: Attention backends). Context parallel over heads: the exchange's.
  auto attn = tiling.heads ? tiling.heads->attend(qg, groups, scale_)
                           : Attend(AttentionCall{qg, kv.k, kv.v, pattern, groups, scale_, tiling}).out;
  {
    RECORD_USER_SCOPE("streambp::layout");
    attn = attn.view({B, kv_heads_, C, groups, head_dim_}).permute({0, 2, 1, 3, 4}).reshape({B, C, heads_ * head_dim_});
  }
  return o_proj(attn);
}

void AttentionImpl::append_hf_parameters(const std::string& prefix,
                                         std::vector<std::pair<std::string, torch::Tensor>>& out) const {
  for (const auto& [name, p] : projections()) AppendProjection(out, prefix + "." + name, p);
  if (q_norm) {
    out.emplace_back(prefix + ".q_norm.weight", q_norm->weight);
    out.emplace_back(prefix + ".k_norm.weight", k_norm->weight);
  }
}

std::vector<std::pair<std::string, Projection>> AttentionImpl::projections() const {
  return {{"q_proj", q_proj}, {"k_proj", k_proj}, {"v_proj", v_proj}, {"o_proj", o_proj}};
}

std::vector<ProjectionSpec> GatedMlpImpl::Projections(const ModelConfig& c, int64_t width) {
  const int64_t f = width > 0 ? width : c.intermediate_size;
  return {{"gate_proj", c.hidden_size, f, c.mlp_bias},
          {"up_proj", c.hidden_size, f, c.mlp_bias},
          {"down_proj", f, c.hidden_size, c.mlp_bias}};
}

GatedMlpImpl::GatedMlpImpl(const ModelConfig& c, int64_t width) : activation_(c.activation) {
  auto p = RegisterProjections(*this, Projections(c, width));
  gate_proj = p.at("gate_proj");
  up_proj = p.at("up_proj");
  down_proj = p.at("down_proj");
}

namespace {

// act(gate_proj(h)) * up_proj(h): what the down projection reads.
torch::Tensor GatedHidden(ProjectionImpl& gate_proj, ProjectionImpl& up_proj, Activation activation,
                          const torch::Tensor& h) {
  auto gate = gate_proj.forward(h);
  gate = activation == Activation::kGeluTanh ? F::gelu(gate, F::GELUFuncOptions().approximate("tanh")) : F::silu(gate);
  return gate * up_proj.forward(h);
}

}  // namespace

torch::Tensor GatedMlpImpl::forward(const torch::Tensor& h, int64_t /*q_start*/) {
  RECORD_USER_SCOPE("streambp::mlp");
  return down_proj(GatedHidden(*gate_proj, *up_proj, activation_, h));
}

torch::Tensor GatedMlpImpl::backward_only(const torch::Tensor& h, int64_t /*q_start*/) {
  RECORD_USER_SCOPE("streambp::mlp");
  return down_proj->backward_only(GatedHidden(*gate_proj, *up_proj, activation_, h));
}

void GatedMlpImpl::append_hf_parameters(const std::string& prefix,
                                        std::vector<std::pair<std::string, torch::Tensor>>& out) const {
  for (const auto& [name, p] : projections()) AppendProjection(out, prefix + "." + name, p);
}

std::vector<std::pair<std::string, Projection>> GatedMlpImpl::projections() const {
  return {{"gate_proj", gate_proj}, {"up_proj", up_proj}, {"down_proj", down_proj}};
}

std::shared_ptr<FeedForwardImpl> MakeFeedForward(const ModelConfig& config, int64_t layer) {
  if (config.sparse_layer(layer)) return std::make_shared<SparseMoeImpl>(config);
  return std::make_shared<GatedMlpImpl>(config);
}

std::vector<ProjectionSpec> FeedForwardProjections(const ModelConfig& config, int64_t layer) {
  return config.sparse_layer(layer) ? SparseMoeImpl::Projections(config) : GatedMlpImpl::Projections(config);
}

std::vector<ProjectionSite> ProjectionSites(const ModelConfig& c) {
  std::vector<ProjectionSite> out;
  // PEFT matches target_modules against a module path's last part ("experts.3.gate_proj" is
  // a gate_proj).
  auto last = [](const std::string& name) { return name.substr(name.rfind('.') + 1); };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    for (const auto& p : AttentionImpl::Projections(c)) out.push_back({layer + ".self_attn." + p.name, p.name, p.in, p.out});
    for (const auto& p : FeedForwardProjections(c, i)) out.push_back({layer + ".mlp." + p.name, last(p.name), p.in, p.out});
  }
  if (!c.tie_word_embeddings) out.push_back({"lm_head", "lm_head", c.hidden_size, c.vocab_size});
  return out;
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t index) {
  auto norm = [&](const char* name) { return register_module(name, RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_kind)); };
  input_layernorm = norm("input_layernorm");
  self_attn = register_module("self_attn", Attention(c, index));
  post_attention_layernorm = norm("post_attention_layernorm");
  if (c.sandwich_norms) pre_feedforward_layernorm = norm("pre_feedforward_layernorm");
  mlp = register_module("mlp", MakeFeedForward(c, index));
  if (c.sandwich_norms) post_feedforward_layernorm = norm("post_feedforward_layernorm");
}

KeysValues DecoderLayerImpl::keys_values(const torch::Tensor& x, const Rope& rope, bool read) {
  return self_attn->keys_values(input_layernorm(x), rope, read);
}

KeysValues DecoderLayerImpl::keys_values_normed(const torch::Tensor& h, const Rope& rope, bool read) {
  return self_attn->keys_values(h, rope, read);
}

torch::Tensor DecoderLayerImpl::forward_queries(const torch::Tensor& x_q, const Rope& rope_q,
                                                const KeysValues& kv, const AttentionPattern& mask,
                                                const AttentionTiling& tiling) {
  return forward_queries_normed(x_q, input_layernorm(x_q), rope_q, kv, mask, tiling);
}

torch::Tensor DecoderLayerImpl::forward_queries_normed(const torch::Tensor& x_q, const torch::Tensor& h_q,
                                                       const Rope& rope_q, const KeysValues& kv,
                                                       const AttentionPattern& mask, const AttentionTiling& tiling) {
  return queries_output(x_q, h_q, rope_q, kv, mask, tiling, /*read=*/true);
}

torch::Tensor DecoderLayerImpl::queries_output(const torch::Tensor& x_q, const torch::Tensor& h_q, const Rope& rope_q,
                                               const KeysValues& kv, const AttentionPattern& mask,
                                               const AttentionTiling& tiling, bool read) {
  return feedforward_residual(attention_residual(x_q, h_q, rope_q, kv, mask, tiling), mask.q_start, read);
}

torch::Tensor DecoderLayerImpl::attention_residual(const torch::Tensor& x_q, const torch::Tensor& h_q,
                                                   const Rope& rope_q, const KeysValues& kv,
                                                   const AttentionPattern& mask, const AttentionTiling& tiling) {
  auto attn_out = self_attn->forward(h_q, rope_q, kv, mask, tiling);
  // Llama: x + attn, then the MLP reads post_attention_layernorm. Gemma3 (sandwich): the
  // attention and MLP outputs are normalized before their residual adds.
  return x_q + (pre_feedforward_layernorm ? post_attention_layernorm(attn_out) : attn_out);
}

torch::Tensor DecoderLayerImpl::feedforward_residual(const torch::Tensor& x1, int64_t q_start, bool read) {
  auto h2 = pre_feedforward_layernorm ? pre_feedforward_layernorm(x1) : post_attention_layernorm(x1);
  // Unread, the MLP's output only passes its gradient on, unless a norm reads its value.
  if (!read && !post_feedforward_layernorm) return x1 + mlp->backward_only(h2, q_start);
  auto ff = mlp->forward(h2, q_start);
  return x1 + (post_feedforward_layernorm ? post_feedforward_layernorm(ff) : ff);
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const Rope& rope, const AttentionPattern& mask,
                                        const AttentionTiling& tiling) {
  auto h = input_layernorm(x);  // once for both halves
  return forward_queries_normed(x, h, rope, keys_values_normed(h, rope), mask, tiling);
}

void DecoderLayerImpl::backward_queries_normed(const torch::Tensor& x_q, const torch::Tensor& h_q, const Rope& rope_q,
                                               const KeysValues& kv, const AttentionPattern& mask,
                                               const AttentionTiling& tiling, const torch::Tensor& grad_y) {
  torch::AutoGradMode grad_mode(true);
  auto y = queries_output(x_q, h_q, rope_q, kv, mask, tiling, /*read=*/false);
  torch::autograd::backward({y}, {grad_y});
}

void DecoderLayerImpl::backward_queries(const torch::Tensor& x_q, const Rope& rope_q, const KeysValues& kv,
                                        const AttentionPattern& mask, const AttentionTiling& tiling,
                                        const torch::Tensor& grad_y) {
  torch::AutoGradMode grad_mode(true);
  backward_queries_normed(x_q, input_layernorm(x_q), rope_q, kv, mask, tiling, grad_y);
}

void DecoderLayerImpl::backward(const torch::Tensor& x, const Rope& rope, const AttentionPattern& mask,
                                const AttentionTiling& tiling, const torch::Tensor& grad_y) {
  torch::AutoGradMode grad_mode(true);
  auto h = input_layernorm(x);
  backward_queries_normed(x, h, rope, keys_values_normed(h, rope), mask, tiling, grad_y);
}

void DecoderLayerImpl::append_hf_parameters(const std::string& p,
                                            std::vector<std::pair<std::string, torch::Tensor>>& out) const {
  self_attn->append_hf_parameters(p + ".self_attn", out);
  mlp->append_hf_parameters(p + ".mlp", out);
  out.emplace_back(p + ".input_layernorm.weight", input_layernorm->weight);
  out.emplace_back(p + ".post_attention_layernorm.weight", post_attention_layernorm->weight);
  if (pre_feedforward_layernorm) {
    out.emplace_back(p + ".pre_feedforward_layernorm.weight", pre_feedforward_layernorm->weight);
    out.emplace_back(p + ".post_feedforward_layernorm.weight", post_feedforward_layernorm->weight);
  }
}

std::vector<std::pair<std::string, Projection>> DecoderLayerImpl::projections() const {
  std::vector<std::pair<std::string, Projection>> out;
  for (auto& [name, p] : self_attn->projections()) out.emplace_back("self_attn." + name, p);
  for (auto& [name, p] : mlp->projections()) out.emplace_back("mlp." + name, p);
  return out;
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
    if (const LoraWeights* w = adapter_->find("lm_head")) {
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
  // Every projection by its module path: the adapter's weights for it, or none.
  for (int64_t i = 0; i < static_cast<int64_t>(layer_list.size()); ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    for (auto& [name, p] : layer_list[i]->projections()) {
      p->set_lora(adapter ? adapter->find(layer + name) : nullptr, adapter ? adapter->scale() : 0.0);
    }
    // The router, when the adapter trains a copy of it (modules_to_save).
    if (auto* moe = dynamic_cast<SparseMoeImpl*>(layer_list[i]->mlp.get())) {
      moe->gate->set_lora(adapter ? adapter->find(layer + "mlp.gate") : nullptr, 1.0);
    }
  }
  adapter_ = std::move(adapter);
}

void CausalLMImpl::set_routing(RoutingReplay* replay, RouterAuxLoss* aux) {
  replay_ = replay;
  aux_ = aux;
  int64_t sparse = 0;
  for (auto& layer : layer_list) {
    if (auto* moe = dynamic_cast<SparseMoeImpl*>(layer->mlp.get())) moe->set_routing(replay, aux, sparse++);
  }
}

ScopedRoutingReplay::ScopedRoutingReplay(CausalLMImpl& model, RoutingReplay* replay, RouterAuxLoss* aux)
    : model_(model), previous_replay_(model.routing_replay()), previous_aux_(model.router_aux_loss()) {
  model_.set_routing(replay != nullptr && replay->experts.defined() ? replay : nullptr, aux);
}

ScopedRoutingReplay::~ScopedRoutingReplay() { model_.set_routing(previous_replay_, previous_aux_); }

ScopedAdapter::ScopedAdapter(CausalLMImpl& model, std::shared_ptr<const LoraAdapter> adapter)
    : model_(model), previous_(model.adapter()) {
  model_.set_adapter(std::move(adapter));
}

ScopedAdapter::~ScopedAdapter() { model_.set_adapter(previous_); }

}  // namespace streambp
