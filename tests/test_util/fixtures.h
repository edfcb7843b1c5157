#pragma once
// Shared test fixtures: tiny configs of every supported family, models with every
// parameter randomized (so norms and biases are exercised), batches in every layout,
// and an independent reference forward written without the decoder's code.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "streambp/batch.h"
#include "streambp/config.h"
#include "streambp/engine.h"
#include "streambp/model.h"
#include "streambp/safetensors.h"

namespace streambp::testing {

/// Puts LibTorch's intra-op thread count back as it was when this goes (the tests run one
/// thread unless told; a test that sets others restores it).
struct RestoreThreads {
  int before = at::get_num_threads();
  ~RestoreThreads() { at::set_num_threads(before); }
};

/// Tiny configs: "llama", "llama_bias" (attention + mlp bias, llama3 rope scaling),
/// "llama3_tied" (llama3 rope scaling, tied embeddings; not in TinyFamilies()),
/// "qwen2", "qwen3", "qwen3_tied", "mistral_window" (sliding window 5, linear rope),
/// "qwen2_window" (layer 1 slides), "gemma3" (tied, soft-capped, layer 0 sliding with its own
/// RoPE base, query_pre_attn_scalar != head_dim, pad_token_id 0) and "gemma3_untied" (the
/// newer config layout, no soft-cap, pad_token_id 3; not in TinyFamilies()), "qwen3_moe" (every
/// layer 6 experts, 2 per token, renormalised) and "qwen3_moe_mixed" (3 layers, layer 0 dense,
/// 3 of 5 experts, not renormalised, every layer in a window of 5).
ModelConfig TinyConfig(const std::string& family);
std::vector<std::string> TinyFamilies();

/// A model with every parameter drawn at random from `seed` (norm weights around 1,
/// biases non-zero), so that no parameter is trivially 1 or 0.
CausalLM RandomModel(const ModelConfig& config, uint64_t seed, torch::Dtype dtype);

/// Sequences of the given lengths with random tokens and a random loss mask
/// (the first two tokens of each sequence masked out).
std::vector<Sequence> RandomSequences(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed);

/// Attention inputs in the layer's layout (streambp/attention.h), float64 and requiring
/// grad: q [B, KVH, C*G, hd], k and v [B, KVH, L, hd].
struct AttentionInputs {
  torch::Tensor q, k, v;
};
AttentionInputs RandomAttentionInputs(int64_t B, int64_t KVH, int64_t G, int64_t C, int64_t L, int64_t hd,
                                      uint64_t seed);

/// Logits [n, V] (float64) of one unpadded sequence, computed by a direct, loop-based
/// implementation of the decoder from the HF formulas (per head, per position RoPE in
/// double arithmetic), reading the weights by their HF names.
torch::Tensor ReferenceLogits(const CausalLMImpl& model, const std::vector<int64_t>& tokens);
/// The same from float64 weights under their HF names (leaves that may require grad: the
/// reference's autograd then gives reference gradients) and the config.json fields.
/// Mixture-of-experts layers route token by token; `topk_gap`, when given, gets the smallest
/// margin seen between a token's k-th and (k+1)-th router probability (min with its value).
/// `routed` (Sequence::routed_experts, may be empty) replays the given experts.
/// `gate_logits`, when given, gets each sparse layer's router logits [n, E] appended.
torch::Tensor ReferenceLogits(const ModelConfig& config, const std::map<std::string, torch::Tensor>& weights,
                              const std::vector<int64_t>& tokens, double* topk_gap = nullptr,
                              const std::vector<int32_t>* routed = nullptr,
                              std::vector<torch::Tensor>* gate_logits = nullptr);

/// HF's load_balancing_loss_func (Qwen3-MoE) on the router logits of every (token, sparse
/// layer) of a batch without padding, concatenated: E * sum(tokens_per_expert [k, E] *
/// router_prob_per_expert [E]) from the softmax, its top-k and their one-hot means.
torch::Tensor ReferenceLoadBalancingLoss(const std::vector<torch::Tensor>& gate_logits, int64_t num_experts,
                                         int64_t top_k);

/// The SFT loss (mean token NLL over the trained targets of all sequences) of the reference
/// forward (each sequence's routed_experts replayed), plus `aux_coef` x the load-balancing
/// loss over all the sequences' tokens, and its gradients by the reference's own autograd,
/// under HF names. `topk_gap`: as ReferenceLogits.
std::pair<double, TensorMap> ReferenceSft(const CausalLMImpl& model, const std::vector<Sequence>& seqs,
                                          double* topk_gap = nullptr, double aux_coef = 0.0);

/// The load-balancing loss alone (ReferenceLoadBalancingLoss over all the sequences' tokens,
/// no replay) and its gradients by the reference's autograd, under HF names.
std::pair<double, TensorMap> ReferenceRouterAux(const CausalLMImpl& model, const std::vector<Sequence>& seqs);

/// Test parameters: each mixture-of-experts test family (qwen3_moe, qwen3_moe_mixed) with the
/// left-pad and packed layouts, and a test name for one ("qwen3_moe_packed").
using FamilyLayout = std::tuple<std::string, Layout>;
std::vector<FamilyLayout> MoeFamilyLayouts();
std::string FamilyLayoutName(const FamilyLayout& p);

/// The experts of `model`'s mixture-of-experts layers that no token of `batch` is routed to,
/// by module path ("model.layers.1.mlp.experts.5"): their weights get no gradient.
std::set<std::string> UnusedExperts(CausalLM& model, const Batch& batch);
/// Whether the parameter `name` (HF or PEFT name) belongs to one of `unused`.
bool InUnusedExpert(const std::set<std::string>& unused, const std::string& name);

/// The engine variants exactness tests run, by name: "stream", "checkpoint",
/// "checkpoint:tiled" (attention in query blocks of `chunk` x key tiles of `key_chunk`) and
/// "full", each with these chunk sizes where it uses them.
std::vector<std::pair<std::string, EngineOptions>> EngineVariants(int64_t chunk, int64_t logits_chunk,
                                                                  int64_t key_chunk = 0);

/// What f() throws as a streambp Error (its message), or "" when it throws nothing.
std::string ErrorOf(const std::function<void()>& f);

/// A fresh temporary folder (removed by the caller or left in the temp dir).
std::string TempDir(const std::string& name);

}  // namespace streambp::testing
