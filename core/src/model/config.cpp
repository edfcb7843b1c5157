#include "streambp/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "streambp/error.h"

namespace streambp {
namespace {

using nlohmann::json;

struct Family {
  const char* architecture;
  const char* model_type;
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"Qwen3MoeForCausalLM", "qwen3_moe"},
    {"MistralForCausalLM", "mistral"},
    {"Gemma3ForCausalLM", "gemma3_text"},
};

int64_t RequiredInt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    throw InvalidArgument(std::string("config.json: missing required field '") + key + "'");
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    throw InvalidArgument(std::string("config.json: field '") + key +
                          "' must be a positive integer, got " + it->dump());
  }
  return it->get<int64_t>();
}

int64_t OptionalInt(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    throw InvalidArgument(std::string("config.json: field '") + key +
                          "' must be an integer, got " + it->dump());
  }
  return it->get<int64_t>();
}

double OptionalNumber(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    throw InvalidArgument(std::string("config.json: field '") + key +
                          "' must be a number, got " + it->dump());
  }
  return it->get<double>();
}

bool OptionalBool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    throw InvalidArgument(std::string("config.json: field '") + key +
                          "' must be true or false, got " + it->dump());
  }
  return it->get<bool>();
}

std::optional<int64_t> OptionalTokenId(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_array()) {  // some configs list several eos ids; keep the first
    if (it->empty() || !(*it)[0].is_number_integer()) return std::nullopt;
    return (*it)[0].get<int64_t>();
  }
  if (!it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

// One RoPE description: an object with "rope_type" (or "type"), the type's parameters and
// perhaps its own "rope_theta". `field` names it in errors.
void ParseRopeObject(const json& rope, const std::string& field, RopeScaling& s, double& theta) {
  if (!rope.is_object()) throw InvalidArgument("config.json: field '" + field + "' must be an object");
  if (rope.contains("rope_theta")) theta = OptionalNumber(rope, "rope_theta", theta);
  std::string type = "default";
  if (auto t = rope.find("rope_type"); t != rope.end() && t->is_string()) {
    type = t->get<std::string>();
  } else if (auto t2 = rope.find("type"); t2 != rope.end() && t2->is_string()) {
    type = t2->get<std::string>();
  }
  s = RopeScaling{};
  s.type = type;
  if (type == "default") return;
  if (type == "linear") {
    s.factor = OptionalNumber(rope, "factor", 0.0);
    if (!(s.factor > 0)) throw InvalidArgument("config.json: " + field + ".factor must be > 0 for linear");
    return;
  }
  if (type == "llama3") {
    s.factor = OptionalNumber(rope, "factor", 0.0);
    s.low_freq_factor = OptionalNumber(rope, "low_freq_factor", 1.0);
    s.high_freq_factor = OptionalNumber(rope, "high_freq_factor", 4.0);
    s.original_max_position_embeddings = OptionalInt(rope, "original_max_position_embeddings", 8192);
    if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position_embeddings <= 0) {
      throw InvalidArgument("config.json: " + field +
                            " for llama3 needs factor > 0, high_freq_factor > low_freq_factor "
                            "and original_max_position_embeddings > 0");
    }
    return;
  }
  throw InvalidArgument("config.json: " + field + " type '" + type +
                        "' is not supported (supported: default, linear, llama3)");
}

// rope_scaling (older layout) or rope_parameters (newer layout, which may also carry
// rope_theta). Gemma3's newer layout has one object per layer type ("full_attention",
// "sliding_attention"); its older one names the sliding layers' base rope_local_base_freq.
void ParseRope(const json& j, ModelConfig& c) {
  const bool gemma = c.model_type == "gemma3_text";
  c.rope_theta = OptionalNumber(j, "rope_theta", gemma ? 1000000.0 : 10000.0);
  if (gemma) c.rope_local_base_freq = OptionalNumber(j, "rope_local_base_freq", 10000.0);
  const json* rope = nullptr;
  std::string field = "rope_scaling";
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    rope = &*it;
    field = "rope_parameters";
  } else if (auto it2 = j.find("rope_scaling"); it2 != j.end() && !it2->is_null()) {
    rope = &*it2;
  }
  if (rope == nullptr) return;
  if (gemma && rope->is_object() && (rope->contains("full_attention") || rope->contains("sliding_attention"))) {
    for (const auto& [type, value] : rope->items()) {
      if (type != "full_attention" && type != "sliding_attention") {
        throw InvalidArgument("config.json: " + field + " has an entry for layer type '" + type +
                              "' (known: full_attention, sliding_attention)");
      }
    }
    if (auto full = rope->find("full_attention"); full != rope->end() && !full->is_null()) {
      ParseRopeObject(*full, field + ".full_attention", c.rope_scaling, c.rope_theta);
    }
    if (auto local = rope->find("sliding_attention"); local != rope->end() && !local->is_null()) {
      RopeScaling s;
      ParseRopeObject(*local, field + ".sliding_attention", s, *c.rope_local_base_freq);
      if (s.type != "default") {
        throw InvalidArgument("config.json: " + field + ".sliding_attention rope_type '" + s.type +
                              "' is not supported for Gemma3's sliding layers (only default)");
      }
    }
    return;
  }
  ParseRopeObject(*rope, field, c.rope_scaling, c.rope_theta);
}

// Sliding windows as HF's configs define them. Mistral: sliding_window (null = none) on every
// layer. Qwen2/Qwen3: only with use_sliding_window, on the layers i >= max_window_layers
// (default 28); Qwen3-MoE: with use_sliding_window, on every layer. Any: an explicit
// layer_types list decides which layers slide.
void ParseWindows(const json& j, ModelConfig& c) {
  std::optional<int64_t> window;
  const bool gemma = c.model_type == "gemma3_text";
  if (gemma) {
    // Gemma3: sliding_window (4096 when absent) on the layers layer_types names, or on every
    // layer but each sliding_window_pattern-th (default 6) when it does not.
    const int64_t w = OptionalInt(j, "sliding_window", 4096);
    if (w <= 0) throw InvalidArgument("config.json: sliding_window must be > 0, got " + std::to_string(w));
    window = w;
    c.sliding_window_pattern = OptionalInt(j, "sliding_window_pattern", 0);
    if (c.sliding_window_pattern < 0) throw InvalidArgument("config.json: sliding_window_pattern must be > 0");
  } else if (c.model_type == "mistral" || ((c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen3_moe") &&
                                           OptionalBool(j, "use_sliding_window", false))) {
    const int64_t w = OptionalInt(j, "sliding_window", 0);
    if (w < 0) throw InvalidArgument("config.json: sliding_window must be > 0, got " + std::to_string(w));
    if (w == 0 && c.model_type != "mistral") {
      throw InvalidArgument("config.json: use_sliding_window is true but sliding_window is not set (> 0)");
    }
    if (w > 0) window = w;
  }
  c.max_window_layers = OptionalInt(j, "max_window_layers", 28);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_hidden_layers) {
      throw InvalidArgument("config.json: layer_types must list one type per layer (" +
                            std::to_string(c.num_hidden_layers) + "), got " + it->dump().substr(0, 200));
    }
    for (const auto& t : *it) {
      if (!t.is_string() || (t != "full_attention" && t != "sliding_attention")) {
        throw InvalidArgument("config.json: layer_types entry " + t.dump() +
                              " is not supported (full_attention or sliding_attention)");
      }
      c.layer_types.push_back(t.get<std::string>());
    }
  } else if (window) {
    const int64_t pattern = c.sliding_window_pattern > 0 ? c.sliding_window_pattern : 6;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      // Qwen3-MoE's configuration has no max_window_layers: with use_sliding_window, every layer.
      const bool slides = gemma ? (i + 1) % pattern != 0
                                : c.model_type == "mistral" || c.model_type == "qwen3_moe" || i >= c.max_window_layers;
      c.layer_types.push_back(slides ? "sliding_attention" : "full_attention");
    }
  }
  if (window && std::find(c.layer_types.begin(), c.layer_types.end(), "sliding_attention") != c.layer_types.end()) {
    c.sliding_window = window;
  } else {
    c.layer_types.clear();  // no layer slides: every layer global
  }
}

// Gemma3's model-wide fields (docs/architecture.md: Models). attn_logit_softcapping is read
// and not applied: HF's Gemma3 attention does not pass it on (Gemma2's did).
void ParseGemma3(const json& j, ModelConfig& c) {
  if (OptionalBool(j, "use_bidirectional_attention", false)) {
    throw InvalidArgument(
        "config.json: use_bidirectional_attention is true (an embedding model): a causal LM cannot train it");
  }
  c.attention_bias = OptionalBool(j, "attention_bias", false);
  c.o_proj_bias = c.attention_bias;
  c.qk_norm = true;
  c.norm_kind = NormKind::kOffsetOne;
  c.sandwich_norms = true;
  c.query_pre_attn_scalar = OptionalNumber(j, "query_pre_attn_scalar", 256.0);
  if (!(c.query_pre_attn_scalar > 0)) throw InvalidArgument("config.json: query_pre_attn_scalar must be > 0");
  // HF keeps sqrt(hidden_size) in a float32 buffer: that rounding is part of the model.
  c.embed_scale = static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))));
  if (auto cap = j.find("final_logit_softcapping"); cap != j.end() && !cap->is_null()) {
    const double v = OptionalNumber(j, "final_logit_softcapping", 0.0);
    if (!(v > 0)) throw InvalidArgument("config.json: final_logit_softcapping must be > 0 or null");
    c.final_logit_softcapping = v;
  }
  (void)OptionalNumber(j, "attn_logit_softcapping", 0.0);  // type-checked only (see above)
}

// Qwen3-MoE's expert fields, with Qwen3MoeConfig's defaults (docs/architecture.md: Models).
void ParseMoe(const json& j, ModelConfig& c) {
  c.num_experts = OptionalInt(j, "num_experts", 128);
  c.num_experts_per_tok = OptionalInt(j, "num_experts_per_tok", 8);
  c.moe_intermediate_size = OptionalInt(j, "moe_intermediate_size", 768);
  c.decoder_sparse_step = OptionalInt(j, "decoder_sparse_step", 1);
  c.norm_topk_prob = OptionalBool(j, "norm_topk_prob", false);
  c.router_aux_loss_coef = OptionalNumber(j, "router_aux_loss_coef", 0.001);
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) throw InvalidArgument("config.json: mlp_only_layers must be a list of layer indices, got " + it->dump());
    for (const auto& l : *it) {
      if (!l.is_number_integer()) throw InvalidArgument("config.json: mlp_only_layers entry " + l.dump() + " is not a layer index");
      c.mlp_only_layers.push_back(l.get<int64_t>());
    }
  }
  c.output_router_logits = OptionalBool(j, "output_router_logits", false);
}

}  // namespace

ModelConfig ModelConfig::FromJson(const json& j) {
  if (!j.is_object()) throw InvalidArgument("config.json: the top level must be a JSON object");
  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
    throw InvalidArgument("config.json: missing field 'architectures' (a list naming the model class)");
  }
  c.architecture = (*arch)[0].get<std::string>();
  for (const Family& f : kFamilies) {
    if (c.architecture == f.architecture) c.model_type = f.model_type;
  }
  if (c.model_type.empty()) {
    std::string known;
    for (const Family& f : kFamilies) known += std::string(known.empty() ? "" : ", ") + f.architecture;
    throw InvalidArgument("config.json: architecture '" + c.architecture +
                          "' is not supported (supported: " + known + ")");
  }
  const bool gemma = c.model_type == "gemma3_text";
  if (gemma) {
    // HF's Gemma3 reads hidden_activation (not hidden_act).
    const auto act = j.contains("hidden_activation") && !j["hidden_activation"].is_null() ? j["hidden_activation"]
                                                                                            : json("gelu_pytorch_tanh");
    if (!act.is_string() || (act != "gelu_pytorch_tanh" && act != "gelu_tanh")) {
      throw InvalidArgument("config.json: hidden_activation " + act.dump() +
                            " is not supported for Gemma3 (gelu_pytorch_tanh)");
    }
    c.activation = Activation::kGeluTanh;
  } else if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      throw InvalidArgument("config.json: hidden_act " + act->dump() + " is not supported (only silu)");
    }
  }
  c.vocab_size = RequiredInt(j, "vocab_size");
  c.hidden_size = RequiredInt(j, "hidden_size");
  c.intermediate_size = RequiredInt(j, "intermediate_size");
  c.num_hidden_layers = RequiredInt(j, "num_hidden_layers");
  c.num_attention_heads = RequiredInt(j, "num_attention_heads");
  c.num_key_value_heads = OptionalInt(j, "num_key_value_heads", c.num_attention_heads);
  c.head_dim = OptionalInt(j, "head_dim", 0);
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = OptionalInt(j, "max_position_embeddings", gemma ? 131072 : 32768);
  c.rms_norm_eps = OptionalNumber(j, "rms_norm_eps", 1e-6);
  ParseRope(j, c);
  c.tie_word_embeddings = OptionalBool(j, "tie_word_embeddings", gemma);
  if (c.model_type == "qwen2") {
    c.attention_bias = true;
  } else if (c.model_type == "llama") {
    c.attention_bias = OptionalBool(j, "attention_bias", false);
    c.o_proj_bias = c.attention_bias;
    c.mlp_bias = OptionalBool(j, "mlp_bias", false);
  } else if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    c.attention_bias = OptionalBool(j, "attention_bias", false);
    c.o_proj_bias = c.attention_bias;
    c.qk_norm = true;
    if (c.model_type == "qwen3_moe") ParseMoe(j, c);
  } else if (gemma) {
    ParseGemma3(j, c);
  }
  ParseWindows(j, c);
  if (auto d = j.find("torch_dtype"); d != j.end() && d->is_string()) c.torch_dtype = d->get<std::string>();
  c.bos_token_id = OptionalTokenId(j, "bos_token_id");
  if (auto pad = j.find("pad_token_id"); pad != j.end() && !pad->is_null()) {
    if (!pad->is_number_integer() || pad->get<int64_t>() < 0) {
      throw InvalidArgument("config.json: field 'pad_token_id' must be a token id, got " + pad->dump());
    }
    c.pad_token_id = pad->get<int64_t>();
  } else if (gemma && !j.contains("pad_token_id")) {
    c.pad_token_id = 0;  // Gemma3TextConfig's default
  }
  c.eos_token_id = OptionalTokenId(j, "eos_token_id");
  if (auto e = j.find("eos_token_id"); e != j.end() && e->is_array()) {
    for (const auto& id : *e) {
      if (id.is_number_integer()) c.eos_token_ids.push_back(id.get<int64_t>());
    }
  } else if (c.eos_token_id) {
    c.eos_token_ids = {*c.eos_token_id};
  }
  c.Validate();
  return c;
}

ModelConfig ModelConfig::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw NotFound("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw InvalidArgument(path + ": not valid JSON: " + e.what());
  }
  try {
    return FromJson(j);
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    const std::string prefix = "config.json: ";
    if (m.starts_with(prefix)) m = m.substr(prefix.size());
    throw InvalidArgument(path + ": " + m);
  }
}

void ModelConfig::Validate() const {
  auto fail = [](const std::string& m) { throw InvalidArgument("config.json: " + m); };
  if (num_key_value_heads <= 0 || num_attention_heads % num_key_value_heads != 0) {
    fail("num_attention_heads (" + std::to_string(num_attention_heads) +
         ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  }
  if (head_dim <= 0 || head_dim % 2 != 0) {
    fail("head_dim must be a positive even number, got " + std::to_string(head_dim));
  }
  if (!(rms_norm_eps > 0)) fail("rms_norm_eps must be > 0");
  if (!(rope_theta > 0)) fail("rope_theta must be > 0");
  if (!layer_types.empty() && static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
    fail("layer_types lists " + std::to_string(layer_types.size()) + " layers, the model has " +
         std::to_string(num_hidden_layers));
  }
  if (sliding_window && *sliding_window <= 0) fail("sliding_window must be > 0");
  if (rope_local_base_freq && !(*rope_local_base_freq > 0)) fail("rope_local_base_freq must be > 0");
  if (final_logit_softcapping && !(*final_logit_softcapping > 0)) fail("final_logit_softcapping must be > 0");
  if (query_pre_attn_scalar < 0) fail("query_pre_attn_scalar must be > 0");
  if (!(embed_scale > 0)) fail("the embedding scale must be > 0");
  if (num_experts < 0) fail("num_experts must be >= 0, got " + std::to_string(num_experts));
  if (num_experts > 0) {
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts) {
      fail("num_experts_per_tok must be between 1 and num_experts (" + std::to_string(num_experts) + "), got " +
           std::to_string(num_experts_per_tok));
    }
    if (moe_intermediate_size <= 0) fail("moe_intermediate_size must be > 0, got " + std::to_string(moe_intermediate_size));
    if (decoder_sparse_step < 1) fail("decoder_sparse_step must be >= 1, got " + std::to_string(decoder_sparse_step));
    if (!(std::isfinite(router_aux_loss_coef) && router_aux_loss_coef >= 0)) {
      fail("router_aux_loss_coef must be a finite number >= 0, got " + std::to_string(router_aux_loss_coef));
    }
  }
  for (const int64_t l : mlp_only_layers) {
    if (l < 0 || l >= num_hidden_layers) {
      fail("mlp_only_layers names layer " + std::to_string(l) + "; the model has layers 0.." +
           std::to_string(num_hidden_layers - 1));
    }
  }
  if (pad_token_id && *pad_token_id >= vocab_size) {
    fail("pad_token_id " + std::to_string(*pad_token_id) + " is outside the vocabulary (" +
         std::to_string(vocab_size) + " tokens)");
  }
}

bool ModelConfig::sparse_layer(int64_t layer) const {
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

int64_t ModelConfig::sparse_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += sparse_layer(l) ? 1 : 0;
  return n;
}

double ModelConfig::attention_scale() const {
  return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim));
}

json ModelConfig::ToJson() const {
  json j;
  j["architectures"] = json::array({architecture});
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling.type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    json r{{"rope_type", rope_scaling.type}, {"factor", rope_scaling.factor}};
    if (rope_scaling.type == "llama3") {
      r["low_freq_factor"] = rope_scaling.low_freq_factor;
      r["high_freq_factor"] = rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  const bool gemma = model_type == "gemma3_text";
  if (gemma) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["attention_bias"] = attention_bias;
    j["query_pre_attn_scalar"] = query_pre_attn_scalar;
    j["final_logit_softcapping"] = final_logit_softcapping ? json(*final_logit_softcapping) : json(nullptr);
    j["attn_logit_softcapping"] = nullptr;
    j["rope_local_base_freq"] = rope_local_base_freq.value_or(10000.0);
    // Every layer global: layer_types says so (the pattern rule would make some slide).
    j["sliding_window"] = sliding_window.value_or(4096);
    j["layer_types"] = layer_types.empty() ? json(std::vector<std::string>(num_hidden_layers, "full_attention"))
                                           : json(layer_types);
    if (sliding_window_pattern > 0) j["sliding_window_pattern"] = sliding_window_pattern;
  } else {
    j["hidden_act"] = "silu";
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (pad_token_id) {
    j["pad_token_id"] = *pad_token_id;
  } else if (gemma) {
    j["pad_token_id"] = nullptr;  // absent would read back as Gemma3's default, 0
  }
  const bool qwen3 = model_type == "qwen3" || model_type == "qwen3_moe";
  if (model_type == "llama" || qwen3) j["attention_bias"] = attention_bias;
  if (model_type == "llama") j["mlp_bias"] = mlp_bias;
  if (model_type == "qwen2" || qwen3) {
    j["use_sliding_window"] = sliding_window.has_value();
    j["max_window_layers"] = max_window_layers;
  }
  if (model_type == "qwen3_moe") {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["norm_topk_prob"] = norm_topk_prob;
    j["mlp_only_layers"] = mlp_only_layers;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = output_router_logits;
  }
  if (model_type == "qwen2" || qwen3 || model_type == "mistral") {
    j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
    if (sliding_window) j["layer_types"] = layer_types;
  }
  j["torch_dtype"] = torch_dtype;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() > 1) {
    j["eos_token_id"] = eos_token_ids;
  } else if (eos_token_id) {
    j["eos_token_id"] = *eos_token_id;
  }
  return j;
}

ModelConfig PresetConfig(const std::string& name, const std::string& family) {
  json j{{"architectures", {"Qwen3ForCausalLM"}},
         {"model_type", "qwen3"},
         {"hidden_act", "silu"},
         {"rms_norm_eps", 1e-6},
         {"rope_theta", 1000000.0},
         {"tie_word_embeddings", false},
         {"max_position_embeddings", 262144},
         {"bos_token_id", 1},
         {"eos_token_id", 2}};
  if (name == "tiny") {
    j.update({{"num_hidden_layers", 2}, {"hidden_size", 64}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 128},
              {"vocab_size", 256}});
  } else if (name == "small") {
    j.update({{"num_hidden_layers", 8}, {"hidden_size", 512}, {"num_attention_heads", 8},
              {"num_key_value_heads", 4}, {"head_dim", 64}, {"intermediate_size", 1536},
              {"vocab_size", 32000}});
  } else if (name == "qwen3-8b") {
    j.update({{"num_hidden_layers", 36}, {"hidden_size", 4096}, {"num_attention_heads", 32},
              {"num_key_value_heads", 8}, {"head_dim", 128}, {"intermediate_size", 12288},
              {"vocab_size", 151936}, {"max_position_embeddings", 1 << 20}, {"bos_token_id", 151643},
              {"eos_token_id", 151645}});
  } else if (name == "qwen3-30b-a3b") {
    if (family != "qwen3" && family != "qwen3_moe") {
      throw InvalidArgument("model preset qwen3-30b-a3b is a qwen3_moe model (no --family " + family + ")");
    }
    j.update({{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"num_hidden_layers", 48},
              {"hidden_size", 2048}, {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128},
              {"intermediate_size", 6144}, {"moe_intermediate_size", 768}, {"num_experts", 128},
              {"num_experts_per_tok", 8}, {"norm_topk_prob", true}, {"vocab_size", 151936},
              {"max_position_embeddings", 1 << 20}, {"bos_token_id", 151643}, {"eos_token_id", 151645}});
    return ModelConfig::FromJson(j);
  } else {
    throw InvalidArgument("unknown model preset '" + name + "' (known: tiny, small, qwen3-8b, qwen3-30b-a3b)");
  }
  // Another family: the same shapes in that family's config.json, with its usual settings.
  if (family == "llama") {
    j.update({{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}});
  } else if (family == "qwen2") {
    j.update({{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}});
  } else if (family == "mistral") {
    j.update({{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"}, {"sliding_window", 4096}});
  } else if (family == "gemma3") {
    // Gemma3 1B's settings: windows of 512 on five layers of six, tied, no soft-cap.
    j.erase("hidden_act");
    j.update({{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"},
              {"hidden_activation", "gelu_pytorch_tanh"}, {"query_pre_attn_scalar", j["head_dim"]},
              {"sliding_window", 512}, {"sliding_window_pattern", 6}, {"rope_local_base_freq", 10000.0},
              {"tie_word_embeddings", true}, {"final_logit_softcapping", nullptr}, {"pad_token_id", 0},
              {"bos_token_id", 2}, {"eos_token_id", 1}});
  } else if (family == "qwen3_moe") {
    j.update({{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"num_experts", 8},
              {"num_experts_per_tok", 2}, {"moe_intermediate_size", j["intermediate_size"].get<int64_t>() / 4},
              {"norm_topk_prob", true}});
  } else if (family != "qwen3") {
    std::string known;
    for (const auto& f : FamilyNames()) known += (known.empty() ? "" : ", ") + f;
    throw InvalidArgument("unknown model family '" + family + "' (known: " + known + ")");
  }
  return ModelConfig::FromJson(j);
}

std::vector<std::string> PresetNames() { return {"tiny", "small", "qwen3-8b", "qwen3-30b-a3b"}; }

std::vector<std::string> FamilyNames() { return {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "gemma3"}; }

}  // namespace streambp
