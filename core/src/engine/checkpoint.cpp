// checkpoint: gradient checkpointing per layer. The forward keeps each layer's input (but
// layer 0's, the token embedding, which is looked up again) and no graph; the backward recomputes one whole layer with a graph at a time. Attention is
// materialized (T x T scores, as PyTorch eager computes it) or, with tiled attention,
// visited in query blocks x key tiles with an online softmax (the role FlashAttention plays
// under torch.utils.checkpoint on GPUs): the strongest checkpointing baseline.
#include <map>

#include "../model/weight_gradients.h"
#include "engine_common.h"

namespace streambp::engine {

StepResult CheckpointForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                                     const ResolvedChunks& chunks, bool tiled_attention,
                                     const GradsReady& ready, const Progress& progress) {
  objective.begin(batch);
  const int64_t T = batch.length();
  std::vector<torch::Tensor> inputs;
  torch::Tensor h_last;
  Rope rope;
  // One attention structure per window the layers use (global, and the sliding one).
  std::map<int64_t, AttentionPattern> masks;
  auto mask = [&](int64_t layer) -> const AttentionPattern& {
    const int64_t window = model.config().window(layer);
    auto it = masks.find(window);
    if (it == masks.end()) {
      it = masks
               .emplace(window, tiled_attention ? AttentionPattern::Causal(batch, 0, T, T, window)
                                                : AttentionPattern(AttentionMask(batch, 0, T, T, window)))
               .first;
    }
    return it->second;
  };
  const AttentionTiling tiling = tiled_attention ? AttentionTiling{chunks.key_chunk, chunks.chunk} : AttentionTiling{};
  {
    torch::NoGradGuard no_grad;
    auto x = model.embed(batch.input_ids);
    rope = model.rope_tables(batch.position_ids, x);
    const int64_t layers = static_cast<int64_t>(model.layer_list.size());
    for (int64_t i = 0; i < layers; ++i) {
      Report(progress, EngineProgress::Phase::kForward, i, layers);
      inputs.push_back(i > 0 ? x : torch::Tensor());  // layer 0's: the embedding, looked up again
      x = model.layer_list[i]->forward(x, rope, mask(i), tiling);
    }
    h_last = x;
  }
  auto head = HeadForwardBackward(model, h_last, batch, objective, chunks.logits_chunk, true, progress);
  h_last = torch::Tensor();
  if (ready) ready(-2);
  auto grad = std::move(head.grad_h);  // not held past the top layer's backward
  InPlaceWeightGradients in_place;  // each layer's weight gradients straight into .grad
  for (int64_t i = static_cast<int64_t>(model.layer_list.size()) - 1; i >= 0; --i) {
    Report(progress, EngineProgress::Phase::kBackward, i, static_cast<int64_t>(model.layer_list.size()));
    torch::AutoGradMode grad_mode(true);
    auto x = (i > 0 ? inputs[i] : model.embed(batch.input_ids)).detach().requires_grad_(true);
    inputs[i] = torch::Tensor();
    model.layer_list[i]->backward(x, rope, mask(i), tiling, grad);  // the recompute and its backward
    grad = x.grad();
    if (ready) ready(i);
  }
  model.embed_backward(batch.input_ids, grad);
  if (ready) ready(-1);
  return MakeResult(objective, batch, head.loss);
}

}  // namespace streambp::engine
