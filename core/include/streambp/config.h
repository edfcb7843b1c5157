#pragma once
/// ModelConfig: the architecture of a causal LM, read from a Hugging Face `config.json`.
/// One decoder implementation covers every supported family; the families differ only in
/// the fields below, model-wide or per layer (see docs/architecture.md: Models).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace streambp {

/// RoPE frequency scaling (`rope_scaling` or `rope_parameters` in config.json).
struct RopeScaling {
  std::string type = "default";  ///< default | linear | llama3
  double factor = 1.0;           ///< linear and llama3: how much the context is stretched
  double low_freq_factor = 1.0;  ///< llama3 only
  double high_freq_factor = 4.0;  ///< llama3 only
  int64_t original_max_position_embeddings = 8192;  ///< llama3 only
};

/// The normalization a family uses: RMSNorm computed in at least float32, then
/// kScaled: cast back to the input's dtype and multiplied by w (Llama, Qwen, Mistral);
/// kOffsetOne: multiplied by (1 + w) in the compute dtype, then cast back (Gemma).
enum class NormKind { kScaled, kOffsetOne };

/// The gated MLP's activation: down(act(gate(x)) * up(x)).
enum class Activation { kSilu, kGeluTanh };

struct ModelConfig {
  std::string architecture;  ///< LlamaForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM | Qwen3MoeForCausalLM | MistralForCausalLM | Gemma3ForCausalLM
  std::string model_type;    ///< llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3_text (written back to config.json)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  ///< GQA: query heads share kv heads in groups
  int64_t head_dim = 0;             ///< explicit (Qwen3) or hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool attention_bias = false;  ///< q/k/v projections have a bias (Qwen2: always)
  bool o_proj_bias = false;     ///< o_proj has a bias (Llama's attention_bias applies to it too)
  bool mlp_bias = false;        ///< gate/up/down have a bias (Llama's mlp_bias)
  bool qk_norm = false;         ///< RMSNorm over head_dim on q and k before RoPE (Qwen3)
  bool tie_word_embeddings = false;  ///< lm_head shares the embedding matrix
  NormKind norm_kind = NormKind::kScaled;
  Activation activation = Activation::kSilu;
  /// Gemma3's four norms per layer: the attention output and the MLP output are normalized
  /// before their residual adds (post_attention_layernorm, post_feedforward_layernorm), and
  /// the MLP reads pre_feedforward_layernorm(x). Otherwise post_attention_layernorm is the
  /// MLP's input norm (Llama's naming).
  bool sandwich_norms = false;
  /// Attention scores are q·k / sqrt(query_pre_attn_scalar) (Gemma3); 0: / sqrt(head_dim).
  double query_pre_attn_scalar = 0;
  /// The token embedding is multiplied by this (Gemma: sqrt(hidden_size) as a float32
  /// number, as HF's buffer holds it, cast to the model's dtype); 1 for the others.
  double embed_scale = 1.0;
  /// logits = c * tanh(logits / c) when set (Gemma3's final_logit_softcapping).
  std::optional<double> final_logit_softcapping;
  /// The sliding layers' RoPE when it differs from the global one (Gemma3:
  /// rope_local_base_freq with no scaling); unset: every layer uses rope_theta/rope_scaling.
  std::optional<double> rope_local_base_freq;
  /// The embedding row whose lookup gradient is zero (nn.Embedding's padding_idx, which HF
  /// sets to pad_token_id): that row learns through a tied head only.
  std::optional<int64_t> pad_token_id;
  int64_t sliding_window_pattern = 0;  ///< Gemma3 (written back as read; 0: absent)
  /// The attention window W of the sliding layers: a query at i sees keys j with i - j < W.
  /// Which layers slide: `layer_types` ("sliding_attention" / "full_attention" per layer, as
  /// HF names them; empty = every layer full). Mistral: every layer when sliding_window is
  /// set; Qwen2/Qwen3: with use_sliding_window, the layers from max_window_layers on — or
  /// config.json's own layer_types.
  std::optional<int64_t> sliding_window;
  std::vector<std::string> layer_types;
  int64_t max_window_layers = 0;  ///< Qwen2/Qwen3 (written back as read)
  /// Mixture of experts (Qwen3-MoE; num_experts 0 = every layer dense). A sparse layer's MLP
  /// is a router `mlp.gate` (d -> num_experts, no bias) and num_experts gated MLPs of width
  /// moe_intermediate_size; each token goes to the num_experts_per_tok experts of highest
  /// router probability (softmax in at least float32), weighted by those probabilities,
  /// renormalised to sum 1 when norm_topk_prob. Layer l is sparse when it is not in
  /// mlp_only_layers and (l + 1) % decoder_sparse_step == 0; the others use intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  /// HF adds router_aux_loss_coef x the load-balancing loss to the loss when
  /// output_router_logits is true: so do the engines (EngineOptions::router_aux_loss_coef).
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  std::string torch_dtype = "float32";    ///< dtype recorded in the file (informational)
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  ///< the first of eos_token_ids
  /// Every end-of-sequence id config.json names (Llama 3.1 lists three); written back as a
  /// list when there is more than one.
  std::vector<int64_t> eos_token_ids;

  /// Parses a config.json object. Throws InvalidArgument naming the missing or bad field,
  /// or the unsupported architecture / activation / rope type.
  static ModelConfig FromJson(const nlohmann::json& j);
  /// Reads and parses `path` (a config.json file).
  static ModelConfig FromFile(const std::string& path);
  /// The config.json object that FromJson reads back to an equal config (HF field names).
  nlohmann::json ToJson() const;
  /// Throws InvalidArgument if sizes are inconsistent (heads not divisible, etc.).
  void Validate() const;

  int64_t num_kv_groups() const { return num_attention_heads / num_key_value_heads; }
  /// The attention window of layer `layer` (0 = global attention).
  int64_t window(int64_t layer) const {
    return sliding_window && layer < static_cast<int64_t>(layer_types.size()) &&
                   layer_types[static_cast<size_t>(layer)] == "sliding_attention"
               ? *sliding_window
               : 0;
  }
  /// Which RoPE layer `layer` uses: 0 the global one, 1 the sliding layers' own.
  int rope_kind(int64_t layer) const { return rope_local_base_freq && window(layer) > 0 ? 1 : 0; }
  /// Whether layer `layer`'s MLP is a mixture of experts (HF's Qwen3MoeDecoderLayer rule).
  bool sparse_layer(int64_t layer) const;
  /// How many layers are sparse.
  int64_t sparse_layers() const;
  double attention_scale() const;
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

/// Deterministic presets of the project's own Qwen3-architecture model.
/// tiny (tests): 2 layers, hidden 64, 4/2 heads, head_dim 16, intermediate 128, vocab 256.
/// small (benchmarks): 8 layers, hidden 512, 8/4 heads, head_dim 64, intermediate 1536, vocab 32000.
/// qwen3-8b (GPU benchmarks): Qwen3-8B's shapes (36 layers, hidden 4096, 32/8 heads, head_dim
/// 128, intermediate 12288, vocab 151936; 8.19e9 parameters) with random weights, and
/// max_position_embeddings raised to 1M so that long-sequence probes are not refused.
/// qwen3-30b-a3b (estimates and GPU benchmarks): Qwen3-30B-A3B's shapes (48 layers, hidden 2048,
/// 32/4 heads, head_dim 128, 128 experts of width 768, 8 per token, vocab 151936), qwen3_moe only.
/// `family` gives the same shapes in another family's config (llama, qwen2, qwen3, mistral
/// with a window of 4096, gemma3 with Gemma3 1B's windows, norms, GELU and tied head;
/// qwen3_moe: every layer a mixture of experts of width intermediate / 4, 8 experts with 2
/// per token for tiny and small, norm_topk_prob on).
ModelConfig PresetConfig(const std::string& name, const std::string& family = "qwen3");
/// The names PresetConfig knows, in order of size.
std::vector<std::string> PresetNames();
/// The families PresetConfig can write a preset in.
std::vector<std::string> FamilyNames();

}  // namespace streambp
