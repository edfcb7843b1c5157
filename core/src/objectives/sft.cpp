// sft: token cross-entropy on the selected targets, normalized over the whole step.
#include <torch/torch.h>

#include "common.h"
#include "streambp/error.h"

namespace streambp {
namespace {

class SftObjective final : public Objective {
 public:
  explicit SftObjective(const SftOptions& options) : options_(options) {}
  std::string name() const override { return "sft"; }

  void prepare(const std::vector<Sequence>& step) override {
    int64_t targets = 0;
    for (const auto& s : step) targets += s.num_targets();
    if (options_.normalizer > 0) {
      normalizer_ = options_.normalizer;
    } else if (targets > 0) {
      normalizer_ = static_cast<double>(targets);
    } else {
      throw InvalidArgument(
          "sft: the batch selects no target tokens (every loss_mask is 0, or every sequence has "
          "a single token); nothing to train on");
    }
    correct_ = counted_ = torch::Tensor();
    prepared_ = true;
  }

  void begin(const Batch& batch) override {
    if (!prepared_) prepare(batch.sequences);
  }

  torch::Tensor chunk_loss(const LogitsChunk& chunk) override {
    // log p(target) = logit[target] - logsumexp(logits): keeps no second c x V tensor alive.
    // The accuracy's argmax comes from the same read of the logits (on the CPU's fused path).
    torch::Tensor is_top;
    auto token_logp = objectives::TargetLogprobs(chunk.logits, chunk.targets, &is_top);
    auto mask = chunk.target_mask.to(token_logp.scalar_type());
    {
      torch::NoGradGuard no_grad;
      // Counted where the logits are, read in finish(): no wait for the device per chunk.
      auto hit = (is_top & chunk.target_mask).sum();
      auto counted = chunk.target_mask.sum();
      correct_ = correct_.defined() ? correct_ + hit : hit;
      counted_ = counted_.defined() ? counted_ + counted : counted;
    }
    return -(token_logp * mask).sum() / normalizer_;
  }

  Metrics finish() override { return finish_merged(nullptr); }
  Metrics finish_merged(const MetricMerge& merge) override {
    prepared_ = false;
    const int64_t correct = correct_.defined() ? correct_.item<int64_t>() : 0;
    const int64_t counted = counted_.defined() ? counted_.item<int64_t>() : 0;
    correct_ = counted_ = torch::Tensor();
    objectives::MetricSums metrics;
    metrics.add("token_accuracy", static_cast<double>(correct), static_cast<double>(counted));
    metrics.max("normalizer", normalizer_);  // the whole step's, the same on every rank
    return metrics.means(&merge);
  }

 private:
  SftOptions options_;
  double normalizer_ = 1.0;
  torch::Tensor correct_, counted_;  // int64 sums over the chunks, on the logits' device
  bool prepared_ = false;
};

}  // namespace

std::unique_ptr<Objective> MakeSftObjective(const SftOptions& options) {
  return std::make_unique<SftObjective>(options);
}

}  // namespace streambp
