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
HeadResult HeadForwardBackward(CausalLMImpl& model, const torch::Tensor& h_last, const Batch& batch,
                               Objective& objective, int64_t chunk, bool want_grad,
                               const Progress& progress = nullptr);
/// The same with h_last in slot `slot` of `store`, read chunk by chunk; `then` is
/// prefetched after the last read.
HeadResult HeadForwardBackward(CausalLMImpl& model, LayerStore& store, int64_t slot, const Batch& batch,
                               Objective& objective, int64_t chunk, bool want_grad, const Progress& progress,
                               ChunkReader::Next then);

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
StepResult StreamForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                                 const ResolvedChunks& chunks, const EngineOptions& options,
                                 const GradsReady& ready, const Progress& progress);

/// StreamBP's no-graph forward of one layer: K/V once, then queries chunk by chunk (keys
/// tile by tile), so no more than one chunk x key_chunk block of scores exists at a time.
torch::Tensor StreamLayerForward(DecoderLayerImpl& layer, const torch::Tensor& x, const Rope& rope,
                                 const Batch& batch, int64_t chunk, int64_t key_chunk,
                                 int64_t sliding_window);

}  // namespace streambp::engine
