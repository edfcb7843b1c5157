#pragma once
/// LoRA adapters (docs/architecture.md: Models Adapters), as PEFT defines them: an adapted linear layer
/// computes y = W x (+ b) + s · B (A x) with A: [r, in], B: [out, r] and s = alpha / r
/// (alpha / sqrt(r) with rsLoRA). The base weights W stay frozen; only A and B train.
///
/// PEFT's modules_to_save is supported for the mixture-of-experts router ("gate"): each sparse
/// layer's mlp.gate weight gets a trainable full copy in the adapter, used instead of the
/// base's while the adapter is attached (the router stays frozen unless asked).
///
/// An adapter is a set of tensors attached to a model with CausalLMImpl::set_adapter(); the
/// decoder adds its terms in every projection it targets, so every engine (full,
/// checkpoint, StreamBP with K/V once, chunked queries and MLP, key tiles, the chunked head)
/// carries them and computes exact adapter gradients. Several adapters can share one base
/// model (one is attached at a time).
///
/// Files follow PEFT exactly (adapter_config.json + adapter_model.safetensors, tensor
/// names "base_model.model.<HF module>.lora_A.weight"), so PEFT, vLLM and SGLang load them.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/types.h>

#include "streambp/config.h"
#include "streambp/safetensors.h"

namespace streambp {

class CausalLMImpl;

/// The module names an adapter may target (PEFT's target_modules), in the decoder's order;
/// which of them a model has, and where, is ProjectionSites() (streambp/model.h).
const std::vector<std::string>& LoraModuleNames();

/// The largest |alpha / r| (|alpha / sqrt(r)| with rsLoRA) an adapter may have.
constexpr double kMaxLoraScale = 65536.0;

struct LoraConfig {
  int64_t r = 8;          ///< rank
  double alpha = 16.0;    ///< lora_alpha
  /// Module names: any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj lm_head
  /// ("all-linear" in a PEFT file means the seven projections).
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  /// PEFT's modules_to_save: modules trained as full copies. Only "gate" (every sparse layer's
  /// mixture-of-experts router); empty = the router is frozen.
  std::vector<std::string> modules_to_save;
  bool use_rslora = false;    ///< s = alpha / sqrt(r) instead of alpha / r
  double dropout = 0.0;       ///< lora_dropout: must be 0 (dropout is not implemented; refused)
  uint64_t seed = 0;          ///< initialization of A
  std::string base_model_name_or_path;  ///< written to adapter_config.json

  double scale() const;
  /// InvalidArgument naming the field (r < 1, alpha not finite or its scale over kMaxLoraScale,
  /// dropout != 0, unknown or
  /// repeated module, lm_head on a model with tied embeddings, a modules_to_save entry other
  /// than "gate", "gate" on a model without mixture-of-experts layers).
  void Validate(const ModelConfig* model = nullptr) const;
  /// adapter_config.json as PEFT writes it / reads it. Refuses what is not plain LoRA with a
  /// clear error naming the field: peft_type other than LORA, use_dora, bias != "none",
  /// rank_pattern / alpha_pattern, layers_to_transform, modules_to_save other than ["gate"],
  /// fan_in_fan_out, a regex target_modules.
  static LoraConfig FromPeftJson(const nlohmann::json& j);
  nlohmann::json ToPeftJson() const;
  /// Our own JSON (checkpoints, server config): {"r", "alpha", "target_modules",
  /// "modules_to_save", "use_rslora", "seed"}.
  static LoraConfig FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

/// Parameters of an adapter of `config` on `model` (A and B of every target, and the full
/// copies of modules_to_save).
int64_t LoraParameterCount(const ModelConfig& model, const LoraConfig& config);

/// The module paths `config`'s modules_to_save copies on `model`, in the model's order
/// ("model.layers.1.mlp.gate", ...), with their weights' shapes [out, in].
std::vector<std::pair<std::string, std::vector<int64_t>>> SavedModules(const ModelConfig& model,
                                                                       const LoraConfig& config);

/// A and B of one adapted projection, or the full copy of a module to save.
struct LoraWeights {
  torch::Tensor a;  ///< [r, in]
  torch::Tensor b;  ///< [out, r]
  /// modules_to_save: the trainable copy used instead of the base weight [out, in] (a and b
  /// undefined).
  torch::Tensor weight;
};

/// The adapter of one model: LoraWeights per targeted projection of every layer (and the
/// lm_head when targeted), and per module to save. Not thread-safe; the Trainer that owns it uses it.
class LoraAdapter {
 public:
  /// PEFT's default initialization, deterministic from config.seed: A Kaiming-uniform
  /// (a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B zero. `dtype`: the adapter's (float32 for
  /// a bfloat16 base; float64 for a float64 one). The copies of modules_to_save start as
  /// `base`'s weights; without `base` they must be loaded (load_peft_tensors) before the
  /// adapter is attached.
  static std::shared_ptr<LoraAdapter> Create(const ModelConfig& model, const LoraConfig& config, torch::Dtype dtype,
                                             const torch::Device& device = torch::kCPU,
                                             const CausalLMImpl* base = nullptr);
  /// A PEFT adapter folder for `model`: validates the config and every tensor name and
  /// shape (a module the model lacks, a rank that does not match the tensors, a missing
  /// tensor: InvalidArgument naming it).
  static std::shared_ptr<LoraAdapter> Load(const std::string& dir, const ModelConfig& model, torch::Dtype dtype,
                                           const torch::Device& device = torch::kCPU);
  /// Writes adapter_config.json and adapter_model.safetensors into `dir`.
  void save(const std::string& dir) const;

  const LoraConfig& config() const { return config_; }
  double scale() const { return scale_; }
  torch::Dtype dtype() const { return dtype_; }
  /// The weights of the projection at HF module path `path` ("model.layers.3.self_attn.q_proj",
  /// "lm_head", "model.layers.1.mlp.gate"), or null when the adapter does not hold it.
  const LoraWeights* find(const std::string& path) const;

  /// The trainable tensors (the adapter's own, updated in place) under names that follow
  /// the model's: "model.layers.0.self_attn.q_proj.lora_A.weight", "lm_head.lora_B.weight",
  /// and a module to save's own: "model.layers.1.mlp.gate.weight".
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  /// Detached copies under PEFT's names ("base_model.model." + the name above; a module to
  /// save's as PEFT writes it, with ".modules_to_save.default" left out).
  TensorMap peft_tensors() const;
  /// Copies PEFT-named tensors in (any floating dtype): every tensor must be present with
  /// the right shape, and no other; InvalidArgument naming it otherwise, nothing changed.
  void load_peft_tensors(const TensorMap& tensors);
  int64_t num_parameters() const;
  /// InvalidArgument unless the adapter was made for a model of `model`'s shape and its
  /// modules_to_save copies hold values (from the base or loaded).
  void check_fits(const ModelConfig& model) const;

  /// PEFT's name of one of our names.
  static std::string PeftName(const std::string& name) { return "base_model.model." + name; }

 private:
  LoraAdapter() = default;
  LoraConfig config_;
  double scale_ = 1.0;
  torch::Dtype dtype_ = torch::kFloat32;
  // Per targeted projection, in the model's order (ProjectionSites), then per module to save,
  // and by path.
  std::vector<std::pair<std::string, std::unique_ptr<LoraWeights>>> weights_;
  std::map<std::string, const LoraWeights*> by_path_;
  ModelConfig model_;
  bool saved_set_ = true;  // the modules_to_save copies hold values
};

}  // namespace streambp
