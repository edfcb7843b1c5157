#pragma once
/// Context parallelism (docs/architecture.md: Context parallel): the positions of every
/// sequence of a step split over the ranks of a c10d group, each rank running StreamBP on
/// its own contiguous part. Around attention the ranks exchange one of two ways:
///  - heads (Ulysses; the default where the heads split over the ranks): K/V, computed once
///    per layer by each rank for its positions, go to the ranks of their heads (all-to-all);
///    every query chunk's queries go to the ranks of their heads and the outputs come back
///    (all-to-alls inside the chunk's graph); the dK/dV of each rank's heads return to the
///    positions' ranks. A rank holds its heads' share of the whole sequence's K/V.
///  - K/V gathered: each rank receives every rank's K/V (all-gather) before its query chunks
///    attend to them, and after its backward the dK/dV its queries produced for every
///    position are summed onto the rank that owns them (reduce-scatter).
/// Everything else (norms, projections, MLP, lm_head + loss) acts on a rank's own positions
/// only, so a rank stores 1/P of the layer inputs: the term that limits StreamBP's sequence
/// length. The sum of the ranks' contributions is the single-process gradient, exactly (the
/// same arithmetic, summed in another order).
#include <cstdint>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "streambp/batch.h"
#include "streambp/dist.h"
#include "streambp/engine.h"
#include "streambp/model.h"
#include "streambp/objective.h"

namespace streambp {

/// The positions [first, second) of a batch of `seq_len` positions that rank `rank` of
/// `ranks` holds: contiguous, in rank order, sizes differing by at most one.
std::pair<int64_t, int64_t> ContextShardRange(int64_t seq_len, int rank, int ranks);

/// What a context-parallel step sent through the group: payload bytes of the collectives
/// (what one rank contributes to each, Communicator's convention) and the time this rank
/// spent in them, per kind. Per layer and step, with K/V of kv_dim values per position in
/// the model's dtype (e bytes) and their gradients in the attention's (f bytes: 4, or 8 for
/// float64): K/V gathered 2 x B x T x kv_dim x e in the forward and again in the backward,
/// dK/dV reduced 2 x B x T x kv_dim x f.
/// Heads exchanged (EngineOptions::ContextExchange::kHeads, Ulysses), per layer and step: K/V
/// sent twice (forward, backward) and dK/dV once as all-to-alls, B x T x kv_dim x R values
/// each over the group (R: the ranks sharing a kv head when there are fewer kv heads than
/// ranks), a rank sending the (P - 1) / P of its part that other ranks own (its own part is
/// counted too, as Communicator counts payloads); and every query chunk's queries and
/// attention outputs, there and back, in the forward and again (with their gradients) in
/// the backward: 6 x B x T x q_dim values of the whole sequence per layer.
struct ContextParallelStats {
  int64_t kv_bytes = 0;       ///< K/V all-gathers or all-to-alls (forward and backward)
  int64_t grad_kv_bytes = 0;  ///< dK/dV reduce-scatters or all-to-alls
  int64_t head_bytes = 0;     ///< heads exchanged: queries, outputs and their gradients
  int64_t other_bytes = 0;    ///< load-balancing statistics, the step's sums
  double seconds = 0;         ///< time in all of them
  int64_t collectives = 0;
  int64_t layers = 0;         ///< decoder layers (to report per layer)
};

/// ForwardBackward of the stream engine with the batch's positions split over the ranks of
/// `group` (ContextShardRange). Every rank of the group calls it with the same model
/// weights, batch, objective options and engine options. Each rank adds its contributions
/// to every trainable parameter's .grad: their sum over the group (SumGradients) is
/// ForwardBackward's gradient of the whole batch. The result is the whole step's on every rank: loss, target
/// and token counts, routing counts summed over the group.
/// Objectives with a sequence pass (DPO, GSPO) observe each rank's chunks and sum their
/// per-sequence quantities over the group before any gradient (Objective::sequence_pass_sums).
/// How the ranks exchange attention's inputs: options.context_exchange (ContextExchangesHeads).
/// InvalidArgument (on every rank alike, before any collective) for an engine other than
/// stream, the recompute ablation, a batch shorter than the group, or heads asked for where
/// the model's do not split over the group; (on every rank alike,
/// mid-step) for an objective whose sequence pass gives no sums or whose loss is not its
/// chunk terms' sum without a sequence pass.
StepResult ContextParallelForwardBackward(CausalLM& model, const Batch& batch, Objective& objective,
                                          const EngineOptions& options, Communicator& group,
                                          ContextParallelStats* stats = nullptr);

/// Whether `requested` runs as heads exchanged (Ulysses) for a model of `config` over
/// `ranks` ranks: kHeads and kAuto where the query heads are divisible by the ranks and the
/// kv heads divide or are divided by them (each rank then attends H / P query heads and
/// max(1, KVH / P) kv heads); kAuto falls back to K/V gathered otherwise, and kHeads is an
/// InvalidArgument naming the head counts.
bool ContextExchangesHeads(const ModelConfig& config, int ranks, EngineOptions::ContextExchange requested);

/// auto | heads | kv (EngineOptions::context_exchange); InvalidArgument otherwise.
EngineOptions::ContextExchange ParseContextExchange(const std::string& name);

/// TokenLogprobs (no gradients) of the whole batch with its positions split over the ranks of
/// `group` as in ContextParallelForwardBackward: each rank runs its positions' layers (K/V
/// gathered per layer) and head, then the ranks' columns are summed, so every rank returns
/// the [B, T] float64 CPU result of one process (heads exchanged where they split, as
/// kAuto). The reference log-probs of a
/// context-parallel step. Every rank calls it with the same batch; InvalidArgument on every
/// rank alike for a batch shorter than the group.
torch::Tensor ContextParallelTokenLogprobs(CausalLM& model, const Batch& batch, int64_t logits_chunk,
                                           double temperature, Communicator& group,
                                           ContextParallelStats* stats = nullptr);

/// Objective::finish_merged's merge over the ranks of `group` (a data- or context-parallel
/// step): every rank's metric parts added up (maxima: the largest) over the union of their
/// names, so every rank reports the whole step's metrics. Every rank of the group runs the
/// merge it returns (it runs collectives).
MetricMerge MergeMetricsOver(Communicator& group);

/// Sums the gradients of `params` (those that require grad) over the ranks of `group`, in
/// place; a parameter without a gradient on this rank takes part with zeros, and one without
/// a gradient on any rank keeps none.
void SumGradients(const std::vector<torch::Tensor>& params, Communicator& group);

}  // namespace streambp
