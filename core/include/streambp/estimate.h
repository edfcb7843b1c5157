#pragma once
/// Predicted peak memory of a training step (docs/architecture.md: Engines, API semantics), from the model's shape, the
/// sequence length and the engine's chunk sizes. The server uses it to refuse, before
/// starting, a step that cannot fit its memory budget, and to pick chunk sizes; the
/// benchmark prints it next to the measured peak.
#include <cstdint>
#include <string>

#include <torch/types.h>

#include "streambp/config.h"
#include "streambp/engine.h"
#include "streambp/lora.h"

namespace streambp {

struct MemoryEstimate {
  int64_t weights_bytes = 0;     ///< the model's parameters
  int64_t gradient_bytes = 0;    ///< one gradient per parameter
  int64_t optimizer_bytes = 0;   ///< optimizer state (AdamW: two moments)
  int64_t activation_bytes = 0;  ///< device peak beyond the three above during forward + backward
  /// Held in the second tier (offload_layer_inputs: host memory or the scratch file), not on
  /// the device and not in total().
  int64_t offloaded_bytes = 0;
  int64_t chunk = 0;             ///< the chunk sizes the estimate assumed
  int64_t logits_chunk = 0;
  int64_t key_chunk = 0;
  /// The sum, saturating at int64's maximum (sizes never wrap around).
  int64_t total() const;
};

/// Bytes of the feed-forward's graph per row (one position of one sequence), the largest of
/// the model's layers: a dense MLP's five F-wide tensors, or a mixture of experts' router
/// (logits, probabilities, their gradient, at f bytes), the rows gathered per expert and
/// their weighted outputs (k per token, d wide: input, output, weighted, reordered) and five
/// k x moe_intermediate tensors. `e`: bytes per element of the weights' dtype; `f`: of the
/// softmax precision.
double FeedForwardBytesPerRow(const ModelConfig& config, double e, double f);

/// Parameters of all the feed-forward modules: the dense layers' MLPs, and each sparse
/// layer's router and experts — all of them, or (`active`) the k a token goes through.
double FeedForwardParameters(const ModelConfig& config, bool active);

/// `rows` x `seq_len` positions; `optimizer` is "adamw", "sgd" (momentum buffer) or "none".
/// With `lora`, the base is frozen: weights are the base (at `dtype`) plus the adapter (at
/// float32, float64 for a float64 base), and gradients and optimizer state are the
/// adapter's only.
/// `context_parallel` P > 1: one rank's peak when the positions are split over P ranks
/// (streambp/context_parallel.h; the stream engine): the stored layer inputs, the head and
/// the chunks shrink to the rank's T/P positions; the whole sequence's K/V and their
/// gradients (4 x T x kv_dim) are the rank's kv heads' share where the ranks exchange heads
/// (engine.context_exchange, ContextExchangesHeads), else all of them; the batch's tensors
/// stay whole-sequence.
MemoryEstimate EstimateStepMemory(const ModelConfig& config, torch::Dtype dtype, int64_t rows,
                                  int64_t seq_len, const EngineOptions& engine,
                                  const std::string& optimizer = "adamw", const LoraConfig* lora = nullptr,
                                  int64_t context_parallel = 1);

/// Peak of a no-grad forward with log-probs (ComputeLogprobs: TokenLogprobs over `rows` x
/// `seq_len`): weights and activations only (no gradient or optimizer state is touched).
/// `context_parallel` P > 1: one rank's peak in ContextParallelTokenLogprobs (its T/P
/// positions' activations beside the whole sequence's K/V of one layer, or of its kv heads
/// where the heads split over the ranks).
MemoryEstimate EstimateForwardMemory(const ModelConfig& config, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                                     int64_t logits_chunk = 0, c10::DeviceType device = c10::DeviceType::CPU,
                                     int64_t context_parallel = 1);

/// Peak of Sample: `prompts` prompts left-padded to `longest_prompt`, `n` completions each,
/// up to `max_tokens` new tokens (the prefill, the K/V cache of every row, the logits).
MemoryEstimate EstimateSampleMemory(const ModelConfig& config, torch::Dtype dtype, int64_t prompts,
                                    int64_t longest_prompt, int64_t n, int64_t max_tokens);

/// The chunk sizes whose estimate fits `budget_bytes`: DefaultChunks' for this length, halved
/// together (each at least 16) until the estimate fits; the smallest when none does. With
/// `like.keep_attention`, sizes that fit with it; where none do, it is dropped (false in the
/// result) and the sizes are chosen without it.
/// `like`: the engine whose chunks are chosen (its kind and other options are kept; its
/// chunk sizes are replaced): the stream engine by default, or checkpoint with tiled
/// attention (chunk = its attention's query block).
/// `context_parallel`: the chunks of one rank's T/P positions, against its per-rank estimate.
EngineOptions ChooseChunks(const ModelConfig& config, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                           int64_t budget_bytes, const std::string& optimizer = "adamw",
                           const LoraConfig* lora = nullptr, const EngineOptions& like = EngineOptions{},
                           int64_t context_parallel = 1);

}  // namespace streambp
