// full: plain autograd through the whole model and the whole logits (the baseline
// without checkpointing).
#include "engine_common.h"

namespace streambp::engine {

StepResult FullForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                               const GradsReady& ready, const Progress& progress) {
  torch::AutoGradMode grad_mode(true);
  objective.begin(batch);
  const int64_t T = batch.length();
  auto x = model.embed(batch.input_ids);
  auto rope = model.rope_tables(batch.position_ids, x);
  const auto& config = model.config();
  auto global = AttentionMask(batch, 0, T, T, 0);
  auto windowed = config.sliding_window ? AttentionMask(batch, 0, T, T, *config.sliding_window) : torch::Tensor();
  const int64_t layers = static_cast<int64_t>(model.layer_list.size());
  for (int64_t i = 0; i < layers; ++i) {
    Report(progress, EngineProgress::Phase::kForward, i, layers);
    x = model.layer_list[i]->forward(x, rope, config.window(i) > 0 ? windowed : global);
  }
  Report(progress, EngineProgress::Phase::kHead, layers, layers);
  auto logits = model.logits(x);
  if (objective.needs_sequence_pass()) {
    objective.observe(MakeChunk(batch, logits.detach(), 0, T));
    objective.end_sequence_pass();
  }
  auto loss = objective.chunk_loss(MakeChunk(batch, logits, 0, T));
  const double loss_value = loss.item<double>();
  loss.backward();
  if (ready) {  // one backward for everything: nothing to overlap with
    ready(-2);
    for (int64_t i = static_cast<int64_t>(model.layer_list.size()) - 1; i >= 0; --i) ready(i);
    ready(-1);
  }
  return MakeResult(objective, batch, loss_value);
}

}  // namespace streambp::engine
