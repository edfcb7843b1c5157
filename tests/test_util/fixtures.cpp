#include "test_util/fixtures.h"

#include <cmath>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <unistd.h>

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
  } else {
    throw std::runtime_error("unknown test family " + family);
  }
  return ModelConfig::FromJson(j);
}

std::vector<std::string> TinyFamilies() {
  return {"llama", "llama_bias", "qwen2", "qwen3", "qwen3_tied", "mistral_window", "qwen2_window"};
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
      p.copy_(1.0 + 0.2 * noise);
    } else if (name.ends_with(".bias")) {
      p.copy_(0.1 * noise);
    } else {
      p.copy_(0.15 * noise);  // larger than the 0.02 init so attention is far from uniform
    }
  }
  return model;
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

Tensor Rms(const Tensor& x, const Tensor& w, double eps) {
  return x / torch::sqrt(x.pow(2).mean(-1, true) + eps) * w;
}

// inv_freq[i] for the config, from the HF formulas, in plain double arithmetic.
std::vector<double> InvFreq(const ModelConfig& c) {
  std::vector<double> out;
  const auto& s = c.rope_scaling;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, (2.0 * i) / c.head_dim);
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

// x: [n, head_dim] for positions 0..n-1.
Tensor RopeRows(const Tensor& x, const std::vector<double>& inv_freq) {
  const int64_t n = x.size(0), half = x.size(1) / 2;
  auto out = torch::empty_like(x);
  auto xa = x.accessor<double, 2>();
  auto oa = out.accessor<double, 2>();
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * inv_freq[i], c = std::cos(a), s = std::sin(a);
      oa[p][i] = xa[p][i] * c - xa[p][i + half] * s;
      oa[p][i + half] = xa[p][i + half] * c + xa[p][i] * s;
    }
  }
  return out;
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
  if ((type == "qwen2" || type == "qwen3") && !(j.contains("use_sliding_window") && j["use_sliding_window"] == true)) {
    window = 0;
  }
  if (type == "llama") window = 0;
  if (window == 0) return 0;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    return j["layer_types"][static_cast<size_t>(layer)] == "sliding_attention" ? window : 0;
  }
  if (type == "mistral") return window;
  return layer >= number("max_window_layers", 28) ? window : 0;
}

}  // namespace

Tensor ReferenceLogits(const CausalLMImpl& model, const std::vector<int64_t>& tokens) {
  const auto& c = model.config();
  std::map<std::string, Tensor> w;
  for (const auto& [name, p] : model.named_hf_parameters()) w[name] = p.detach().to(torch::kFloat64);
  auto get = [&](const std::string& n) { return w.at(n); };
  auto linear = [&](const Tensor& x, const std::string& prefix) {
    auto y = torch::matmul(x, get(prefix + ".weight").t());
    if (w.count(prefix + ".bias")) y = y + get(prefix + ".bias");
    return y;
  };
  const int64_t n = tokens.size(), hd = c.head_dim;
  const auto inv_freq = InvFreq(c);
  auto ids = torch::tensor(tokens, torch::kInt64);
  Tensor x = get("model.embed_tokens.weight").index_select(0, ids);  // [n, d]
  const nlohmann::json hf = c.ToJson();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const int64_t window = HfLayerWindow(hf, l);
    auto h = Rms(x, get(p + ".input_layernorm.weight"), c.rms_norm_eps);
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
        qa = Rms(qa, get(p + ".self_attn.q_norm.weight"), c.rms_norm_eps);
        kb = Rms(kb, get(p + ".self_attn.k_norm.weight"), c.rms_norm_eps);
      }
      qa = RopeRows(qa.contiguous(), inv_freq);
      kb = RopeRows(kb.contiguous(), inv_freq);
      auto out = torch::zeros({n, hd}, torch::kFloat64);
      for (int64_t i = 0; i < n; ++i) {
        int64_t first = 0;
        if (window > 0) first = std::max<int64_t>(0, i - window + 1);
        auto keys = kb.slice(0, first, i + 1);
        auto scores = torch::matmul(keys, qa[i]) / std::sqrt(static_cast<double>(hd));
        auto probs = torch::exp(scores - scores.max());
        probs = probs / probs.sum();
        out[i] = torch::matmul(probs, vb.slice(0, first, i + 1));
      }
      heads.push_back(out);
    }
    x = x + linear(torch::cat(heads, 1), p + ".self_attn.o_proj");
    auto h2 = Rms(x, get(p + ".post_attention_layernorm.weight"), c.rms_norm_eps);
    auto gate = linear(h2, p + ".mlp.gate_proj");
    x = x + linear(gate * torch::sigmoid(gate) * linear(h2, p + ".mlp.up_proj"), p + ".mlp.down_proj");
  }
  auto h = Rms(x, get("model.norm.weight"), c.rms_norm_eps);
  auto head = c.tie_word_embeddings ? get("model.embed_tokens.weight") : get("lm_head.weight");
  return torch::matmul(h, head.t());
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("streambp-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace streambp::testing
