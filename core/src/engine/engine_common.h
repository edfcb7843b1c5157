#pragma once
// Pieces shared by the three engines (internal to streambp_core).
#include <vector>

#include <torch/torch.h>

#include "layer_store.h"
#include "streambp/engine.h"

namespace streambp::engine {

/// Throws InvalidArgument when the batch does not fit the model (shapes, token ids).
void ValidateBatch(const CausalLMImpl& model, const Batch& batch);
/// Batch::routed_experts against the model: the entries per token, expert ids in range,
/// given or -1 for all k of a (token, layer), no expert twice. InvalidArgument naming the field.
void ValidateRouting(const ModelConfig& config, const Batch& batch);

LogitsChunk MakeChunk(const Batch& batch, torch::Tensor logits, int64_t s, int64_t e);

/// The lm_head + loss part over final hidden states `h_last` [B, T, d] (no graph) in
/// chunks of `chunk` positions: the objective's sequence pass (if it wants one), then for
/// each chunk logits -> loss term -> backward. Returns the summed loss and dL/dh_last
/// (undefined when `want_grad` is false: loss only). With want_grad, dL/dh_last is written
/// into h_last's storage chunk by chunk (h_last is used up).
struct HeadResult {
  double loss = 0.0;
  torch::Tensor grad_h;
};
using Progress = std::function<void(const EngineProgress&)>;

/// Context parallel (docs/architecture.md: Context parallel): this rank's positions [begin,
/// end) of every row of the batch, and the exchanges with the other ranks of the group.
/// Every rank holds the whole Batch (token ids and side inputs are small), so positions,
/// targets, masks and the objective's step-wide normalizers stay in the batch's coordinates;
/// activations (layer inputs, hidden states, their gradients) exist for [begin, end) only.
struct SequenceShard {
  int64_t begin = 0, end = 0;
  /// Whole-sequence K/V [B, KVH, T, hd] from this rank's rows [B, KVH, end - begin, hd]:
  /// every rank's rows, in position order.
  std::function<KeysValues(const KeysValues& local)> gather_kv;
  /// dK/dV over the whole sequence [B, KVH, T, hd] (this rank's queries' part) summed over
  /// the ranks; returns this rank's rows.
  std::function<KeysValues(const KeysValues& whole)> reduce_grad_kv;
  /// Sums tensors over the ranks, in place (a mixture of experts' load-balancing statistics).
  std::function<void(const std::vector<torch::Tensor>&)> all_reduce;
  /// The most positions any rank of the group holds: every rank resolves its chunk sizes
  /// from it, so chunk c covers the same rows [c x chunk, ...) of every rank's part.
  int64_t longest = 0;
  /// Set when the ranks exchange heads (Ulysses) instead of gathering K/V: gather_kv then
  /// returns this rank's heads of the whole sequence's K/V, reduce_grad_kv takes their
  /// gradients and returns all heads of this rank's rows, and query chunk c attends through
  /// exchange(c, chunk, batch, kv, sink, window, key_chunk), a collective: every rank runs
  /// the same chunks(chunk) query chunks per layer, in order (a rank whose part is shorter
  /// runs empty ones). `batch` is the step's on the model's device.
  std::function<std::unique_ptr<HeadExchange>(int64_t c, int64_t chunk, const Batch& batch, const KeysValues& kv,
                                               const KeysValues* sink, int64_t window, int64_t key_chunk)>
      exchange;
  int64_t length() const { return end - begin; }
  /// Query chunks per layer: this rank's own without an exchange, the longest rank's with one.
  int64_t chunks(int64_t chunk) const { return ((exchange ? longest : length()) + chunk - 1) / chunk; }
};

HeadResult HeadForwardBackward(CausalLMImpl& model, const torch::Tensor& h_last, const Batch& batch,
                               Objective& objective, int64_t chunk, bool want_grad,
                               const Progress& progress = nullptr);
/// The same with h_last in slot `slot` of `store`, read chunk by chunk; `then` is
/// prefetched after the last read. With a `shard`, the store holds the positions [begin,
/// end) of the batch (row t of the store is position begin + t).
HeadResult HeadForwardBackward(CausalLMImpl& model, LayerStore& store, int64_t slot, const Batch& batch,
                               Objective& objective, int64_t chunk, bool want_grad, const Progress& progress,
                               ChunkReader::Next then, const SequenceShard* shard = nullptr);

/// The lm_head + loss of one chunk of final hidden states at a time, in any order of chunks
/// (HeadForwardBackward's chunks; the stream engine's top layer, docs/architecture.md:
/// Engines). step(rows, s, e): rows [B, e - s, d] (no graph) at the batch's positions
/// [s, e); adds the chunk's loss term and, with want_grad, lm_head's weight gradient in
/// place, and returns dL/drows (undefined without want_grad). The objective's sequence
/// pass, if any, is over. loss(): the terms' sum, read once.
class HeadSteps {
 public:
  HeadSteps(CausalLMImpl& model, const Batch& batch, Objective& objective, bool want_grad);
  torch::Tensor step(const torch::Tensor& rows, int64_t s, int64_t e);
  double loss() const;

 private:
  void add_loss(const torch::Tensor& loss);
  CausalLMImpl& model_;
  const Batch& batch_;
  Objective& objective_;
  bool want_grad_, head_trains_ = false;
  torch::Tensor head_grad_, loss_sum_;
};

/// Tells `progress` (if any) where the step is.
inline void Report(const Progress& progress, EngineProgress::Phase phase, int64_t layer, int64_t layers,
                   int64_t chunk = 0, int64_t chunks = 1) {
  if (progress) progress(EngineProgress{phase, layer, layers, chunk, chunks});
}

/// The step result of a micro-batch: the loss (the objective's batch_loss() when it has
/// one, else the sum of the chunk terms) and token counts.
StepResult MakeResult(const Objective& objective, const Batch& batch, double chunk_loss_sum);

using GradsReady = std::function<void(int64_t layer)>;
StepResult FullForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                               const GradsReady& ready, const Progress& progress);
StepResult CheckpointForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                                     const ResolvedChunks& chunks, bool tiled_attention,
                                     const GradsReady& ready, const Progress& progress);
/// With a `shard`: this rank's part of a context-parallel step (its positions' loss terms
/// and its contributions to every gradient; see SequenceShard).
StepResult StreamForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                                 const ResolvedChunks& chunks, const EngineOptions& options,
                                 const GradsReady& ready, const Progress& progress,
                                 const SequenceShard* shard = nullptr);

/// ForwardBackward with `shard` handed to the stream engine (null: the whole batch): the
/// validation, routing replay and load-balancing loss around RunEngine.
StepResult ForwardBackwardShard(CausalLM& model, const Batch& batch, Objective& objective,
                                const EngineOptions& options, const SequenceShard* shard);

/// One layer's attention output and log-sum-exp over all T positions (EngineOptions::
/// keep_attention): out [B * kv_heads, T * groups, head_dim], lse [B * kv_heads, T * groups, 1]
/// in the attention's compute dtype, written by the forward and replayed by the backward.
struct KeptAttention {
  torch::Tensor out, lse;
  int64_t groups = 1;
  static KeptAttention Make(const ModelConfig& config, int64_t rows, int64_t T, const torch::Tensor& like);
  /// The views of query positions [s, e) for one attention call.
  AttentionKept positions(int64_t s, int64_t e, bool replay) const;
};

/// StreamBP's no-graph forward of one layer: K/V once, then queries chunk by chunk (keys
/// tile by tile), so no more than one chunk x key_chunk block of scores exists at a time.
/// With a `shard`, x and rope hold its positions only and K/V come from every rank. With
/// `kept`, every chunk's attention output and log-sum-exp are written there.
torch::Tensor StreamLayerForward(DecoderLayerImpl& layer, const torch::Tensor& x, const Rope& rope,
                                 const Batch& batch, int64_t chunk, int64_t key_chunk,
                                 int64_t sliding_window, const SequenceShard* shard = nullptr,
                                 const KeptAttention* kept = nullptr);

/// TokenLogprobs of a shard's positions [begin, end) only (its layers' K/V gathered from every
/// rank): [B, T] float64 CPU with this rank's columns filled and every other column 0, so the
/// ranks' results summed are TokenLogprobs of the whole batch. Every rank of the shard's
/// group calls it with the same batch.
torch::Tensor ShardTokenLogprobs(CausalLM& model, const Batch& batch, int64_t logits_chunk, double temperature,
                                 const SequenceShard& shard);

}  // namespace streambp::engine
