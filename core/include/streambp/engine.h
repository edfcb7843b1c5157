#pragma once
/// Backward engines: the same loss and gradients, different memory and time (docs/architecture.md: Engines).
///  - full:       plain autograd through the whole model and the whole logits.
///  - checkpoint: forward without a graph keeping each layer's input; backward recomputes
///                one layer at a time. Logits materialized (logits_chunk = 0) or chunked;
///                attention materialized (T x T scores) or tiled (tiled_attention).
///  - stream:     StreamBP: K/V once per layer, queries and the MLP chunk by chunk along
///                the sequence, lm_head + loss chunk by chunk.
#include <cstdint>
#include <functional>
#include <string>

#include "streambp/batch.h"
#include "streambp/model.h"
#include "streambp/objective.h"

namespace streambp {

enum class EngineKind { kFull, kCheckpoint, kStream };
EngineKind ParseEngine(const std::string& name);  ///< full | checkpoint | stream
std::string EngineName(EngineKind kind);

/// Where a step is: what EngineOptions::on_progress is told at each boundary.
struct EngineProgress {
  enum class Phase { kForward, kHead, kBackward };
  Phase phase = Phase::kForward;
  int64_t layer = 0;   ///< decoder layer (forward, backward), from 0
  int64_t layers = 0;  ///< decoder layers of the model
  int64_t chunk = 0;   ///< chunk of the layer (stream backward) or of the head, from 0
  int64_t chunks = 1;  ///< chunks of that layer or of the head
};
const char* PhaseName(EngineProgress::Phase phase);  ///< forward | head | backward

struct EngineOptions {
  EngineKind kind = EngineKind::kStream;
  int64_t chunk = 0;         ///< stream: query positions per layer chunk (0 = DefaultChunks)
  int64_t logits_chunk = -1;  ///< positions per logits chunk; 0 = all at once; -1 = default
                              ///< (stream, tiled checkpoint: DefaultChunks; checkpoint: 0)
  /// When true, K/V are recomputed over the whole prefix for every chunk (the reference
  /// implementation's way) instead of once per layer. For the ablation in streambp-bench.
  bool recompute_kv_per_chunk = false;
  /// stream: keys per attention tile inside a query chunk (0 = DefaultChunks). A chunk
  /// attending to more keys than this runs tile by tile with an online softmax, so its
  /// scores are chunk x key_chunk instead of chunk x T. full never tiles, checkpoint only
  /// with tiled_attention (the plain baselines as PyTorch eager computes them: T x T scores).
  int64_t key_chunk = 0;
  /// Called on the calling thread as soon as parameter gradients are complete for this
  /// micro-batch, in this order: -2 for the final norm and an untied lm_head (after the
  /// chunked head's backward), i for each decoder layer in decreasing order, -1 for the
  /// rest (the embedding, with a tied lm_head). Data-parallel training starts their sum
  /// over the ranks here, overlapping it with the backward of earlier layers.
  std::function<void(int64_t layer)> on_grads_ready;
  /// Called on the calling thread at every boundary: each layer of the forward, each chunk
  /// of the lm_head + loss, each layer (stream: each query chunk) of the backward. For
  /// progress reports, and for abandoning a step whose caller has gone: it may throw, and
  /// the step then fails as any failed step does (the Trainer clears the gradients).
  std::function<void(const EngineProgress&)> on_progress;
  /// checkpoint: attention over query blocks of `chunk` positions and key tiles of
  /// `key_chunk` (0 = DefaultChunks) with an online softmax and a
  /// recomputing backward, as stream's: no T x T scores or mask, only a block x tile at a
  /// time. The memory-efficient attention FlashAttention provides on GPUs, i.e. gradient
  /// checkpointing as users of torch.utils.checkpoint + FlashAttention run it. With a
  /// logits chunk this is `checkpoint:tiled`, the strongest baseline. Other engines ignore it.
  bool tiled_attention = false;
  /// stream: keep the stored layer inputs and the final hidden states in a second tier
  /// instead of device memory: on a GPU (CUDA builds) pinned host memory with copies on a
  /// side stream; on the CPU a scratch file in `scratch_dir`, written by a background
  /// thread while the next layer computes and read back chunk by chunk, the next chunk
  /// prefetched while the current one is in use. The device then holds g, dL/dx, K, V and
  /// their gradients of one layer (bytes x T x (2d + 4 d_kv)) plus a chunk's working set,
  /// instead of also L x T x d of inputs. Gradients are bit-identical with and without.
  /// Other engines refuse it (InvalidArgument).
  bool offload_layer_inputs = false;
  /// Folder of the CPU scratch file (created, unlinked at once and its space reserved
  /// before the forward; empty = $TMPDIR or /tmp). A folder that cannot hold the file is a
  /// FailedPrecondition, a full one ResourceExhausted, naming the folder.
  std::string scratch_dir;
  /// Where the step runs: ForwardBackward takes it from the model; the memory estimate,
  /// admission and GetInfo from the caller (the server: its device). On CUDA, DefaultChunks
  /// allows query chunks up to kDefaultCudaChunk: every chunk costs the host the same kernel
  /// launches whatever its size, so short chunks leave a GPU waiting on the CPU.
  c10::DeviceType device = c10::DeviceType::CPU;
  /// Mixture of experts: the coefficient of the router's load-balancing loss added to the
  /// loss (HF's load_balancing_loss_func over the sparse layers, padding masked; see
  /// RouterAuxLoss): -1 = the model's (config.json's router_aux_loss_coef when its
  /// output_router_logits is true, else none), 0 = none. Dense models have none.
  double router_aux_loss_coef = -1;
  /// Non-padding tokens of the whole step when the batch is one part of it (micro-batches,
  /// data-parallel ranks): each part adds its aux loss weighted by its share. 0 = the batch's.
  int64_t aux_loss_step_tokens = 0;
  /// Context parallel (ContextParallelForwardBackward): how the ranks exchange attention's
  /// inputs (docs/architecture.md: Context parallel). kHeads: Ulysses, each rank attends a
  /// share of the heads over the whole sequence (K/V and their gradients per rank divided
  /// by the ranks); needs the query heads divisible by the ranks and the kv heads dividing or
  /// divided by them. kKeysValues: every rank gathers the whole sequence's K/V of all heads.
  /// kAuto: heads where the shapes allow, else keys and values.
  enum class ContextExchange { kAuto, kHeads, kKeysValues };
  ContextExchange context_exchange = ContextExchange::kAuto;
  /// stream: selective recompute. The forward keeps every layer's attention output and
  /// log-sum-exp (B x T x (q_dim + heads) floats per layer, float64 for float64 models) until
  /// that layer's backward, which then runs the attention's backward from them instead of its
  /// forward again: two of the attention's seven GEMMs per key tile in the backward pass,
  /// for L x that much more activation (docs/architecture.md: Engines). Gradients are the
  /// same. Refused (InvalidArgument) by the other engines, with offload_layer_inputs, the
  /// prefix-recompute ablation and context parallel.
  bool keep_attention = false;
};

/// The load-balancing coefficient `options` give for `config`: 0 when there is no such loss.
/// InvalidArgument for a coefficient that is neither -1 nor a finite number >= 0.
double RouterAuxCoefficient(const EngineOptions& options, const ModelConfig& config);
/// The largest sizes DefaultChunks picks (and the smallest it goes down to, sequence allowing).
constexpr int64_t kDefaultChunk = 512;
constexpr int64_t kDefaultCudaChunk = 4096;  ///< the largest query chunk on a CUDA device
constexpr int64_t kDefaultLogitsChunk = 1024;
constexpr int64_t kDefaultKeyChunk = 1024;
/// The longest default key tile on the CPU: a tile of scores for a 512-position chunk then stays
/// within a core's second-level cache while its softmax pass and products run (docs/results.md).
constexpr int64_t kDefaultCpuKeyChunk = 256;
constexpr int64_t kMinDefaultChunk = 64;
constexpr int64_t kMinDefaultLogitsChunk = 32;

/// The chunk sizes an engine will actually use for a sequence of length T.
struct ResolvedChunks {
  int64_t chunk;         ///< query positions per layer chunk (stream) or attention query
                         ///< block (checkpoint with tiled attention); T otherwise
  int64_t logits_chunk;  ///< positions per logits chunk (T when materialized)
  int64_t key_chunk;     ///< keys per attention tile (T: scores against all keys at once)
};

/// The sizes used where a request, the config and the flags leave them unset, from the model's
/// shapes and the sequence (docs/architecture.md: Chunk sizes). What a step of T positions
/// must hold anyway is the layer inputs StreamBP stores plus one layer's K/V and their
/// gradients, S = T (L d + 4 d_kv) bytes per row; a query chunk's working set (its graph with a
/// key tile of twice its size) and a logits chunk's (logits, log-softmax and their gradients:
/// 4 x chunk x V floats) are each kept within S / 4, as large as that allows (powers of two,
/// kMinDefault* .. kDefault*, at most T), so the step's peak stays near S without the many
/// small GEMMs of tiny chunks (on CUDA up to kDefaultCudaChunk query positions). The same rule
/// serves the engines, TokenLogprobs, the memory estimate, ChooseChunks, the server, the tools
/// and the bench.
ResolvedChunks DefaultChunks(const ModelConfig& config, torch::Dtype dtype, int64_t seq_len,
                             c10::DeviceType device = c10::DeviceType::CPU);

/// `options`' sizes with the unset ones from DefaultChunks for `options.device` (or T where
/// the engine does not chunk).
ResolvedChunks ResolveChunks(const EngineOptions& options, int64_t seq_len, const ModelConfig& config,
                             torch::Dtype dtype);

struct StepResult {
  double loss = 0.0;        ///< sum of the objective's chunk terms
  int64_t targets = 0;      ///< selected target tokens in the batch
  int64_t tokens = 0;       ///< non-padding tokens in the batch
  int64_t offloaded_bytes = 0;  ///< bytes kept in the second tier (offload_layer_inputs), else 0
  /// Routing replay (Batch::routed_experts): replayed (token, sparse layer, slot) decisions
  /// the layers saw, and how many named an expert outside the router's own top-k (every
  /// pass over the batch counts, so their ratio is the share of differing decisions).
  int64_t routing_decisions = 0;
  int64_t routing_mismatches = 0;
  /// The load-balancing loss (HF's aux_loss, before the coefficient; weighted by the batch's
  /// share of the step's tokens), when the step has one: `loss` includes coef x this.
  double router_aux_loss = 0.0;
  Metrics metrics;          ///< the objective's metrics (filled by callers: finish() or finish_merged())
};

/// Runs forward and backward of `batch` under `objective` and accumulates gradients into
/// the model's parameters (.grad, added to what is there). The model is not changed.
/// The objective sees begin() ... batch_loss(); the caller calls objective.finish().
/// If it throws after the backward started (out of memory), gradients may be partially
/// accumulated: the caller clears them (the Trainer does).
/// Throws InvalidArgument for a batch that does not fit the model (token ids, lengths).
StepResult ForwardBackward(CausalLM& model, const Batch& batch, Objective& objective,
                           const EngineOptions& options);

/// Loss only, no gradients, computed chunk by chunk.
StepResult ForwardOnly(CausalLM& model, const Batch& batch, Objective& objective, int64_t logits_chunk = 0);

/// The experts the routers pick for every token of `batch` (a no-grad StreamBP forward), per
/// input sequence in Sequence::routed_experts' layout: what a sampler records so that training
/// can replay it. Empty vectors for a model without mixture-of-experts layers.
std::vector<std::vector<int32_t>> RecordRouting(CausalLM& model, const Batch& batch);

/// Per-token log-probabilities without gradients: [B, T] float64 CPU, where entry (r, t)
/// is log p(token t+1 | tokens <= t) of the sequence at (r, t), with logits divided by
/// `temperature`, and 0 where position t has no next token of its own sequence (the last
/// token of a sequence, padding). Computed chunk by chunk: no T x T scores, no T x V logits
/// (logits_chunk <= 0: DefaultChunks').
torch::Tensor TokenLogprobs(CausalLM& model, const Batch& batch, int64_t logits_chunk = 0,
                            double temperature = 1.0);

}  // namespace streambp
