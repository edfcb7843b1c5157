#include "test_util/fixtures.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "streambp/error.h"

namespace streambp::testing {

ModelConfig TinyConfig(const std::string& family) {
  nlohmann::json j{{"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                   {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 97},
                   {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"hidden_act", "silu"},
                   {"max_position_embeddings", 4096}};
  if (family == "llama") {
    j["architectures"] = {"LlamaForCausalLM"};
  } else if (family == "llama_bias") {
    j["architectures"] = {"LlamaForCausalLM"};
    j["attention_bias"] = true;
    j["mlp_bias"] = true;
    j["num_key_value_heads"] = 1;
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  } else if (family == "llama3_tied") {
    j["architectures"] = {"LlamaForCausalLM"};
    j["tie_word_embeddings"] = true;
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  } else if (family == "qwen2") {
    j["architectures"] = {"Qwen2ForCausalLM"};
  } else if (family == "qwen3") {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["head_dim"] = 16;  // q_dim 64 != hidden 32: exercises the explicit head_dim
  } else if (family == "qwen3_tied") {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["head_dim"] = 8;
    j["tie_word_embeddings"] = true;
    j["num_key_value_heads"] = 4;
  } else if (family == "qwen2_window") {
    // Layer 0 global, layer 1 sliding (use_sliding_window from max_window_layers on).
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["use_sliding_window"] = true;
    j["sliding_window"] = 5;
    j["max_window_layers"] = 1;
  } else if (family == "mistral_window") {
    j["architectures"] = {"MistralForCausalLM"};
    j["sliding_window"] = 5;
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  } else if (family == "gemma3" || family == "gemma3_untied") {
    // Layer 0 sliding (window 5, its own RoPE base), layer 1 global (linear scaling);
    // q_dim 64 != hidden 32; scores scaled by query_pre_attn_scalar 12, not head_dim 16.
    j.erase("hidden_act");
    j["architectures"] = {"Gemma3ForCausalLM"};
    j["model_type"] = "gemma3_text";
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["head_dim"] = 16;
    j["query_pre_attn_scalar"] = 12;
    j["sliding_window"] = 5;
    if (family == "gemma3") {
      // Tied (Gemma3's default), logits soft-capped at 3 (about the logits' own size), the
      // older layout: sliding_window_pattern and rope_local_base_freq; pad_token_id 0.
      j["sliding_window_pattern"] = 2;
      j["rope_local_base_freq"] = 100.0;
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
      j["final_logit_softcapping"] = 3.0;
    } else {
      // Untied, no soft-cap, the newer layout: layer_types and rope_parameters per type.
      j["tie_word_embeddings"] = false;
      j["layer_types"] = {"sliding_attention", "full_attention"};
      j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}},
                              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 50.0}}}};
      j["final_logit_softcapping"] = nullptr;
      j["pad_token_id"] = 3;
    }
  } else if (family == "qwen3_moe") {
    // Every layer sparse: 6 experts of width 24, 2 per token, renormalised.
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["head_dim"] = 16;
    j["num_experts"] = 6;
    j["num_experts_per_tok"] = 2;
    j["moe_intermediate_size"] = 24;
    j["norm_topk_prob"] = true;
  } else if (family == "qwen3_moe_mixed") {
    // Three layers, layer 0 dense (mlp_only_layers), 1 and 2 sparse with 3 of 5 experts per
    // token, not renormalised; every layer in a window of 5 (use_sliding_window).
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["num_hidden_layers"] = 3;
    j["num_experts"] = 5;
    j["num_experts_per_tok"] = 3;
    j["moe_intermediate_size"] = 20;
    j["norm_topk_prob"] = false;
    j["mlp_only_layers"] = {0};
    j["use_sliding_window"] = true;
    j["sliding_window"] = 5;
  } else {
    throw std::runtime_error("unknown test family " + family);
  }
  return ModelConfig::FromJson(j);
}

std::vector<std::string> TinyFamilies() {
  return {"llama",          "llama_bias",   "qwen2",  "qwen3",     "qwen3_tied",
          "mistral_window", "qwen2_window", "gemma3", "qwen3_moe", "qwen3_moe_mixed"};
}

std::vector<std::pair<std::string, EngineOptions>> EngineVariants(int64_t chunk, int64_t logits_chunk,
                                                                  int64_t key_chunk) {
  EngineOptions tiled{EngineKind::kCheckpoint, chunk, logits_chunk, false, key_chunk};
  tiled.tiled_attention = true;
  return {{"stream", {EngineKind::kStream, chunk, logits_chunk, false, key_chunk}},
          {"checkpoint", {EngineKind::kCheckpoint, chunk, logits_chunk, false, key_chunk}},
          {"checkpoint:tiled", tiled},
          {"full", {EngineKind::kFull}}};
}

CausalLM RandomModel(const ModelConfig& config, uint64_t seed, torch::Dtype dtype) {
  CausalLM model = InitModel(config, seed, dtype);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 7919);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : model->named_hf_parameters()) {
    auto noise = at::normal(0.0, 1.0, p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64));
    if (name.ends_with("norm.weight")) {
      // Around the identity: w near 1 for x·w, near 0 for Gemma's x·(1 + w).
      p.copy_((config.norm_kind == NormKind::kOffsetOne ? 0.0 : 1.0) + 0.2 * noise);
    } else if (name.ends_with(".bias")) {
      p.copy_(0.1 * noise);
    } else {
      p.copy_(0.15 * noise);  // larger than the 0.02 init so attention is far from uniform
    }
  }
  return model;
}

AttentionInputs RandomAttentionInputs(int64_t B, int64_t KVH, int64_t G, int64_t C, int64_t L, int64_t hd,
                                      uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  return {at::randn({B, KVH, C * G, hd}, gen, opts).requires_grad_(true),
          at::randn({B, KVH, L, hd}, gen, opts).requires_grad_(true),
          at::randn({B, KVH, L, hd}, gen, opts).requires_grad_(true)};
}

std::vector<Sequence> RandomSequences(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<Sequence> out;
  for (int64_t n : lengths) {
    auto ids = at::randint(0, vocab, {n}, gen, torch::kInt64);
    auto mask = at::randint(0, 4, {n}, gen, torch::kInt64);
    Sequence s;
    for (int64_t i = 0; i < n; ++i) {
      s.tokens.push_back(ids[i].item<int64_t>());
      s.loss_mask.push_back(i < 2 ? 0 : (mask[i].item<int64_t>() != 0));
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

using torch::Tensor;

// RMSNorm: Llama's x̂·w, or Gemma's x̂·(1 + w).
Tensor Rms(const Tensor& x, const Tensor& w, double eps, bool gemma) {
  return x / torch::sqrt(x.pow(2).mean(-1, true) + eps) * (gemma ? 1.0 + w : w);
}

// gelu with the tanh approximation (gelu_pytorch_tanh), written out.
Tensor GeluTanh(const Tensor& x) {
  return 0.5 * x * (1.0 + torch::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}

// inv_freq[i] for a base and a scaling rule, from the HF formulas, in plain double arithmetic.
std::vector<double> InvFreq(int64_t head_dim, double theta, const RopeScaling& s) {
  std::vector<double> out;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f = 1.0 / std::pow(theta, (2.0 * i) / head_dim);
    if (s.type == "linear") {
      f /= s.factor;
    } else if (s.type == "llama3") {
      const double wavelen = 2 * M_PI / f;
      const double low = s.original_max_position_embeddings / s.low_freq_factor;
      const double high = s.original_max_position_embeddings / s.high_freq_factor;
      if (wavelen > low) {
        f = f / s.factor;
      } else if (wavelen >= high) {
        const double smooth =
            (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
            (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    out.push_back(f);
  }
  return out;
}

// x: [n, head_dim] for positions 0..n-1. The angles in plain double arithmetic; the rotation
// in tensor ops, so that autograd differentiates through it.
Tensor RopeRows(const Tensor& x, const std::vector<double>& inv_freq) {
  const int64_t n = x.size(0), half = x.size(1) / 2;
  auto cos = torch::empty({n, half}, torch::kFloat64), sin = torch::empty({n, half}, torch::kFloat64);
  auto ca = cos.accessor<double, 2>();
  auto sa = sin.accessor<double, 2>();
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      ca[p][i] = std::cos(p * inv_freq[i]);
      sa[p][i] = std::sin(p * inv_freq[i]);
    }
  }
  auto x1 = x.narrow(1, 0, half), x2 = x.narrow(1, half, half);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 1);
}

// The window of a layer as HF's configuration classes define it, from the config.json fields
// (0 = global). Mistral: sliding_window on every layer. Qwen2/Qwen3: sliding_window only
// with use_sliding_window, on the layers i >= max_window_layers (default 28). An explicit
// layer_types list decides which layers slide.
int64_t HfLayerWindow(const nlohmann::json& j, int64_t layer) {
  const std::string type = j.at("model_type");
  auto number = [&](const char* key, int64_t fallback) {
    return j.contains(key) && !j[key].is_null() ? j[key].get<int64_t>() : fallback;
  };
  int64_t window = number("sliding_window", 0);
  if ((type == "qwen2" || type == "qwen3" || type == "qwen3_moe") &&
      !(j.contains("use_sliding_window") && j["use_sliding_window"] == true)) {
    window = 0;
  }
  if (type == "llama") window = 0;
  if (window == 0) return 0;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    return j["layer_types"][static_cast<size_t>(layer)] == "sliding_attention" ? window : 0;
  }
  // Qwen3MoeConfig keeps sliding_window when use_sliding_window and has no max_window_layers.
  if (type == "mistral" || type == "qwen3_moe") return window;
  if (type == "gemma3_text") return (layer + 1) % number("sliding_window_pattern", 6) != 0 ? window : 0;
  return layer >= number("max_window_layers", 28) ? window : 0;
}

// Whether layer `layer` is a Qwen3MoeSparseMoeBlock, from the config.json fields
// (Qwen3MoeDecoderLayer: not in mlp_only_layers, experts configured, (l + 1) % step == 0).
bool HfSparseLayer(const nlohmann::json& j, int64_t layer) {
  if (j.at("model_type") != "qwen3_moe" || j.value("num_experts", 0) <= 0) return false;
  for (const auto& l : j.value("mlp_only_layers", nlohmann::json::array())) {
    if (l.get<int64_t>() == layer) return false;
  }
  return (layer + 1) % j.value("decoder_sparse_step", 1) == 0;
}

// Qwen3MoeSparseMoeBlock token by token: the router's softmax, the k experts of highest
// probability (a sort in plain double arithmetic), their probabilities (renormalised when
// norm_topk_prob), and the weighted sum of those experts' SwiGLU outputs. `gap` gets the
// smallest difference between the k-th and (k+1)-th probability seen (a tie would make the
// choice ill-defined).
// With `routed` (Sequence::routed_experts' layout; this is sparse layer `sparse` of `layers`),
// a token whose entries are given goes to those experts instead, weighted by the router's
// probabilities of them.
Tensor ReferenceMoe(const nlohmann::json& hf, const std::map<std::string, Tensor>& w, const std::string& prefix,
                    const Tensor& h, double* gap, const std::vector<int32_t>* routed, int64_t sparse, int64_t layers,
                    std::vector<Tensor>* gate_logits) {
  const int64_t experts = hf.at("num_experts"), k = hf.at("num_experts_per_tok");
  const bool renormalise = hf.value("norm_topk_prob", false);
  auto expert = [&](int64_t e, const Tensor& x) {
    const std::string p = prefix + ".experts." + std::to_string(e);
    auto gate = torch::matmul(x, w.at(p + ".gate_proj.weight").t());
    auto up = torch::matmul(x, w.at(p + ".up_proj.weight").t());
    return torch::matmul(gate * torch::sigmoid(gate) * up, w.at(p + ".down_proj.weight").t());
  };
  std::vector<Tensor> rows, router;
  for (int64_t t = 0; t < h.size(0); ++t) {
    auto logits = torch::matmul(w.at(prefix + ".gate.weight"), h[t]);  // [E]
    router.push_back(logits);
    auto probs = torch::exp(logits - logits.max());
    probs = probs / probs.sum();
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t e = 0; e < experts; ++e) ranked.emplace_back(probs[e].item<double>(), e);
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (gap != nullptr && k < experts) *gap = std::min(*gap, ranked[k - 1].first - ranked[k].first);
    const size_t at = static_cast<size_t>((t * layers + sparse) * k);
    if (routed != nullptr && !routed->empty() && (*routed)[at] >= 0) {
      for (int64_t j = 0; j < k; ++j) ranked[j].second = (*routed)[at + j];
    }
    Tensor chosen_sum = torch::zeros({}, torch::kFloat64);
    for (int64_t j = 0; j < k; ++j) chosen_sum = chosen_sum + probs[ranked[j].second];
    Tensor out = torch::zeros({h.size(1)}, torch::kFloat64);
    for (int64_t j = 0; j < k; ++j) {
      auto weight = renormalise ? probs[ranked[j].second] / chosen_sum : probs[ranked[j].second];
      out = out + weight * expert(ranked[j].second, h[t]);
    }
    rows.push_back(out);
  }
  if (gate_logits != nullptr) gate_logits->push_back(torch::stack(router));
  return torch::stack(rows);
}

}  // namespace

Tensor ReferenceLogits(const CausalLMImpl& model, const std::vector<int64_t>& tokens) {
  std::map<std::string, Tensor> w;
  for (const auto& [name, p] : model.named_hf_parameters()) w[name] = p.detach().to(torch::kFloat64);
  return ReferenceLogits(model.config(), w, tokens);
}

Tensor ReferenceLogits(const ModelConfig& c, const std::map<std::string, Tensor>& w,
                       const std::vector<int64_t>& tokens, double* topk_gap, const std::vector<int32_t>* routed,
                       std::vector<Tensor>* gate_logits) {
  auto get = [&](const std::string& n) { return w.at(n); };
  auto linear = [&](const Tensor& x, const std::string& prefix) {
    auto y = torch::matmul(x, get(prefix + ".weight").t());
    if (w.count(prefix + ".bias")) y = y + get(prefix + ".bias");
    return y;
  };
  // Gemma3's definitions read from config.json's own fields, not from the decoder's.
  const nlohmann::json hf = c.ToJson();
  const bool gemma = hf.at("model_type") == "gemma3_text";
  auto number = [&](const char* key, double fallback) {
    return hf.contains(key) && !hf[key].is_null() ? hf[key].get<double>() : fallback;
  };
  auto rms = [&](const Tensor& x, const std::string& name) { return Rms(x, get(name), c.rms_norm_eps, gemma); };
  const int64_t n = tokens.size(), hd = c.head_dim;
  const auto global_freq = InvFreq(hd, c.rope_theta, c.rope_scaling);
  const auto local_freq = gemma ? InvFreq(hd, number("rope_local_base_freq", 10000.0), RopeScaling{}) : global_freq;
  const double scale = 1.0 / std::sqrt(gemma ? number("query_pre_attn_scalar", 256.0) : static_cast<double>(hd));
  auto ids = torch::tensor(tokens, torch::kInt64);
  // nn.Embedding(padding_idx=pad_token_id), as HF builds it: that row's lookup has no gradient.
  Tensor x;  // [n, d]
  if (hf.contains("pad_token_id") && !hf["pad_token_id"].is_null()) {
    const int64_t pad = hf["pad_token_id"].get<int64_t>();
    x = torch::nn::functional::embedding(ids, get("model.embed_tokens.weight"),
                                         torch::nn::functional::EmbeddingFuncOptions().padding_idx(pad));
  } else {
    x = get("model.embed_tokens.weight").index_select(0, ids);
  }
  // Gemma: times sqrt(hidden_size) held as a float32 number.
  if (gemma) x = x * static_cast<double>(std::sqrt(static_cast<float>(hf.at("hidden_size").get<int64_t>())));
  int64_t sparse_layers = 0, sparse = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) sparse_layers += HfSparseLayer(hf, l) ? 1 : 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const int64_t window = HfLayerWindow(hf, l);
    const auto& inv_freq = window > 0 ? local_freq : global_freq;
    auto h = rms(x, p + ".input_layernorm.weight");
    auto q = linear(h, p + ".self_attn.q_proj");
    auto k = linear(h, p + ".self_attn.k_proj");
    auto v = linear(h, p + ".self_attn.v_proj");
    std::vector<Tensor> heads;
    for (int64_t a = 0; a < c.num_attention_heads; ++a) {
      const int64_t b = a / (c.num_attention_heads / c.num_key_value_heads);
      auto qa = q.narrow(1, a * hd, hd);
      auto kb = k.narrow(1, b * hd, hd);
      auto vb = v.narrow(1, b * hd, hd);
      if (c.qk_norm) {
        qa = rms(qa, p + ".self_attn.q_norm.weight");
        kb = rms(kb, p + ".self_attn.k_norm.weight");
      }
      qa = RopeRows(qa.contiguous(), inv_freq);
      kb = RopeRows(kb.contiguous(), inv_freq);
      auto out = torch::zeros({n, hd}, torch::kFloat64);
      for (int64_t i = 0; i < n; ++i) {
        int64_t first = 0;
        if (window > 0) first = std::max<int64_t>(0, i - window + 1);
        auto keys = kb.slice(0, first, i + 1);
        auto scores = torch::matmul(keys, qa[i]) * scale;
        auto probs = torch::exp(scores - scores.max());
        probs = probs / probs.sum();
        out[i] = torch::matmul(probs, vb.slice(0, first, i + 1));
      }
      heads.push_back(out);
    }
    auto attn = linear(torch::cat(heads, 1), p + ".self_attn.o_proj");
    if (gemma) {  // Gemma3DecoderLayer: norms around both blocks
      x = x + rms(attn, p + ".post_attention_layernorm.weight");
      auto h2 = rms(x, p + ".pre_feedforward_layernorm.weight");
      auto mlp = linear(GeluTanh(linear(h2, p + ".mlp.gate_proj")) * linear(h2, p + ".mlp.up_proj"), p + ".mlp.down_proj");
      x = x + rms(mlp, p + ".post_feedforward_layernorm.weight");
    } else {
      x = x + attn;
      auto h2 = rms(x, p + ".post_attention_layernorm.weight");
      if (HfSparseLayer(hf, l)) {
        x = x + ReferenceMoe(hf, w, p + ".mlp", h2, topk_gap, routed, sparse++, sparse_layers, gate_logits);
      } else {
        auto gate = linear(h2, p + ".mlp.gate_proj");
        x = x + linear(gate * torch::sigmoid(gate) * linear(h2, p + ".mlp.up_proj"), p + ".mlp.down_proj");
      }
    }
  }
  auto h = rms(x, "model.norm.weight");
  auto head = c.tie_word_embeddings ? get("model.embed_tokens.weight") : get("lm_head.weight");
  auto logits = torch::matmul(h, head.t());
  if (gemma && hf.contains("final_logit_softcapping") && !hf["final_logit_softcapping"].is_null()) {
    const double cap = hf["final_logit_softcapping"].get<double>();
    logits = torch::tanh(logits / cap) * cap;
  }
  return logits;
}

Tensor ReferenceLoadBalancingLoss(const std::vector<Tensor>& gate_logits, int64_t num_experts, int64_t top_k) {
  const auto logits = torch::cat(gate_logits, 0);  // [layers x tokens, E]
  const auto routing_weights = torch::softmax(logits, -1);
  const auto selected = std::get<1>(torch::topk(routing_weights, top_k, -1));
  const auto expert_mask = torch::one_hot(selected, num_experts).to(torch::kFloat64);  // [M, k, E]
  const auto tokens_per_expert = expert_mask.mean(0);                              // [k, E]
  const auto router_prob_per_expert = routing_weights.mean(0);                     // [E]
  return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(num_experts);
}

std::pair<double, TensorMap> ReferenceSft(const CausalLMImpl& model, const std::vector<Sequence>& seqs,
                                          double* topk_gap, double aux_coef) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [name, p] : model.named_hf_parameters()) {
    weights[name] = p.detach().to(torch::kFloat64).clone().requires_grad_(true);
  }
  torch::Tensor nll = torch::zeros({}, torch::kFloat64);
  int64_t count = 0;
  std::vector<Tensor> gate_logits;
  for (const auto& s : seqs) {
    auto logp = torch::log_softmax(
        ReferenceLogits(model.config(), weights, s.tokens, topk_gap, &s.routed_experts, &gate_logits), -1);
    for (size_t t = 1; t < s.tokens.size(); ++t) {
      if (!s.loss_mask[t]) continue;
      nll = nll - logp[t - 1][s.tokens[t]];
      ++count;
    }
  }
  auto loss = count > 0 ? nll / static_cast<double>(count) : nll;
  if (aux_coef > 0) {
    const auto& c = model.config();
    loss = loss + aux_coef * ReferenceLoadBalancingLoss(gate_logits, c.num_experts, c.num_experts_per_tok);
  }
  loss.backward();
  TensorMap grads;
  for (const auto& [name, w] : weights) grads[name] = w.grad();
  return {loss.item<double>(), grads};
}

std::pair<double, TensorMap> ReferenceRouterAux(const CausalLMImpl& model, const std::vector<Sequence>& seqs) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [name, p] : model.named_hf_parameters()) {
    weights[name] = p.detach().to(torch::kFloat64).clone().requires_grad_(true);
  }
  std::vector<Tensor> gate_logits;
  for (const auto& s : seqs) ReferenceLogits(model.config(), weights, s.tokens, nullptr, nullptr, &gate_logits);
  const auto& c = model.config();
  auto aux = ReferenceLoadBalancingLoss(gate_logits, c.num_experts, c.num_experts_per_tok);
  aux.backward();
  TensorMap grads;
  for (const auto& [name, w] : weights) {
    grads[name] = w.grad().defined() ? w.grad() : torch::zeros_like(w);
  }
  return {aux.item<double>(), grads};
}

std::vector<FamilyLayout> MoeFamilyLayouts() {
  std::vector<FamilyLayout> out;
  for (const char* family : {"qwen3_moe", "qwen3_moe_mixed"}) {
    for (auto layout : {Layout::kLeftPad, Layout::kPacked}) out.emplace_back(family, layout);
  }
  return out;
}

std::string FamilyLayoutName(const FamilyLayout& p) { return std::get<0>(p) + "_" + LayoutName(std::get<1>(p)); }

std::set<std::string> UnusedExperts(CausalLM& model, const Batch& batch) {
  const auto& c = model->config();
  std::set<std::string> out;
  const auto routing = RecordRouting(model, batch);
  const int64_t k = c.num_experts_per_tok, width = c.sparse_layers() * k;
  int64_t sparse = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.sparse_layer(l)) continue;
    std::set<int64_t> used;
    for (const auto& r : routing) {
      for (size_t t = 0; t * width < r.size(); ++t) {
        for (int64_t i = 0; i < k; ++i) used.insert(r[t * width + sparse * k + i]);
      }
    }
    for (int64_t e = 0; e < c.num_experts; ++e) {
      if (!used.count(e)) out.insert("model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e));
    }
    ++sparse;
  }
  return out;
}

bool InUnusedExpert(const std::set<std::string>& unused, const std::string& name) {
  return std::any_of(unused.begin(), unused.end(), [&](const std::string& u) { return name.rfind(u + ".", 0) == 0; });
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("streambp-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace streambp::testing
