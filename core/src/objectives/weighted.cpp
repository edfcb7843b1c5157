// weighted_logprobs: a loss linear in the per-token log-probs, L = sum_t w_t log p(token_t),
// with the weights given by the client (docs/architecture.md: Objectives). A client that differentiates its own loss
// of the log-probs sends w = dL/dlogp; the gradient of L is then the gradient of its loss.
#include <cmath>

#include "common.h"

namespace streambp {
namespace {

using objectives::TargetLogprobs;

class WeightedLogprobsObjective final : public Objective {
 public:
  explicit WeightedLogprobsObjective(const WeightedLogprobsOptions& o) : o_(o) {
    if (!(o_.temperature > 0) || !std::isfinite(o_.temperature)) {
      throw InvalidArgument("weighted_logprobs: temperature must be > 0");
    }
  }
  std::string name() const override { return "weighted_logprobs"; }

  void prepare(const std::vector<Sequence>& step) override {
    if (step.empty()) throw InvalidArgument("weighted_logprobs: the batch is empty");
    for (size_t i = 0; i < step.size(); ++i) {
      if (step[i].top_k > 0) {
        throw InvalidArgument("weighted_logprobs: sequence " + std::to_string(i) + " has 2-D targets (top-k "
                              "candidates); they are for cross_entropy");
      }
      if (step[i].token_weights.size() != step[i].tokens.size()) {
        throw InvalidArgument("weighted_logprobs: sequence " + std::to_string(i) +
                              " has no token weights (one per token; the first is unused)");
      }
    }
    weight_sum_ = 0;
    prepared_ = true;
  }

  void begin(const Batch& batch) override {
    if (!prepared_) prepare(batch.sequences);
    if (!batch.token_weights.defined()) throw InvalidArgument("weighted_logprobs: the batch has no token weights");
    weights_ = batch.token_weights.to(batch.target_mask.device());
  }

  torch::Tensor chunk_loss(const LogitsChunk& chunk) override {
    const auto& logits = o_.temperature == 1.0 ? chunk.logits : chunk.logits / o_.temperature;
    auto logp = TargetLogprobs(logits, chunk.targets);
    auto w = weights_.slice(1, chunk.start, chunk.end).masked_fill(~chunk.target_mask, 0.0).to(logp.scalar_type());
    {
      torch::NoGradGuard no_grad;
      weight_sum_ += w.abs().sum().item<double>();
    }
    return (w * logp).sum();
  }

  Metrics finish() override { return finish_merged(nullptr); }
  Metrics finish_merged(const MetricMerge& merge) override {
    prepared_ = false;
    objectives::MetricSums metrics;
    metrics.total("weight_abs_sum", weight_sum_);
    return metrics.means(&merge);
  }

 private:
  WeightedLogprobsOptions o_;
  torch::Tensor weights_;
  double weight_sum_ = 0;
  bool prepared_ = false;
};

}  // namespace

std::unique_ptr<Objective> MakeWeightedLogprobsObjective(const WeightedLogprobsOptions& options) {
  return std::make_unique<WeightedLogprobsObjective>(options);
}

}  // namespace streambp
