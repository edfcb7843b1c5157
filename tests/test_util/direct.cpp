#include "test_util/direct.h"

#include "streambp/gradients.h"

namespace streambp::testing {

DirectResult DirectLossAndGrads(CausalLM& model, const Batch& batch,
                                const std::function<torch::Tensor(const torch::Tensor& logits)>& loss_fn) {
  ZeroGradients(*model);
  torch::AutoGradMode grad(true);
  const int64_t T = batch.length();
  auto x = model->embed(batch.input_ids);
  auto rope = model->rope_tables(batch.position_ids, x);
  for (size_t i = 0; i < model->layer_list.size(); ++i) {
    auto mask = AttentionMask(batch, 0, T, T, model->config().window(static_cast<int64_t>(i)));
    x = model->layer_list[i]->forward(x, rope, mask);
  }
  auto loss = loss_fn(model->logits(x));
  DirectResult r;
  r.loss = loss.item<double>();
  loss.backward();
  r.grads = CollectGradients(*model);
  ZeroGradients(*model);
  return r;
}

torch::Tensor DirectTokenLogprobs(const torch::Tensor& logits, const Batch& batch, double temperature) {
  auto logp = torch::log_softmax(logits / temperature, -1);
  return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1);
}

torch::Tensor SequenceTargetMask(const Batch& batch, int64_t i) {
  return ((batch.sequence_ids == i) & batch.target_mask).to(torch::kFloat64);
}

}  // namespace streambp::testing
