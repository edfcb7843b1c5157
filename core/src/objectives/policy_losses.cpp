// Tinker's built-in losses: importance_sampling, ppo, cispo, dro and cross_entropy
// (docs/architecture.md: Objectives; the formulas are in streambp/objective.h). Each is a sum
// over target tokens of a function of that token's log-prob, so every chunk's term is exact on
// its own and the engines need nothing else.
#include <cmath>

#include "common.h"

namespace streambp {
namespace {

using objectives::MetricSums;
using objectives::TargetLogprobs;

enum class Loss { kImportanceSampling, kPpo, kCispo, kDro, kCrossEntropy };

Loss ParseLoss(const std::string& name) {
  if (name == "importance_sampling") return Loss::kImportanceSampling;
  if (name == "ppo") return Loss::kPpo;
  if (name == "cispo") return Loss::kCispo;
  if (name == "dro") return Loss::kDro;
  if (name == "cross_entropy") return Loss::kCrossEntropy;
  throw InvalidArgument("unknown policy loss '" + name + "' (known: importance_sampling, ppo, cispo, dro, cross_entropy)");
}

class PolicyLossObjective final : public Objective {
 public:
  explicit PolicyLossObjective(const PolicyLossOptions& o) : o_(o), loss_(ParseLoss(o.loss)) {
    if (clipped()) {
      if (!std::isfinite(o_.clip_low_threshold) || !std::isfinite(o_.clip_high_threshold) ||
          !(o_.clip_low_threshold >= 0) || !(o_.clip_low_threshold <= o_.clip_high_threshold)) {
        throw InvalidArgument(o_.loss + ": clip_low_threshold and clip_high_threshold must be finite with 0 <= low <= "
                              "high, got " + std::to_string(o_.clip_low_threshold) + " and " +
                              std::to_string(o_.clip_high_threshold));
      }
    }
    if (loss_ == Loss::kDro && !(std::isfinite(o_.beta) && o_.beta >= 0)) {
      throw InvalidArgument("dro: beta must be a finite number >= 0");
    }
  }
  std::string name() const override { return o_.loss; }

  void prepare(const std::vector<Sequence>& step) override {
    if (step.empty()) throw InvalidArgument(o_.loss + ": the batch is empty");
    for (size_t i = 0; i < step.size(); ++i) {
      const auto& s = step[i];
      auto need = [&](const std::vector<double>& v, const char* what) {
        if (v.size() != s.tokens.size()) {
          throw InvalidArgument(o_.loss + ": sequence " + std::to_string(i) + " has " + std::to_string(v.size()) +
                                " " + what + " for " + std::to_string(s.tokens.size()) +
                                " tokens (one per token; the first is unused)");
        }
      };
      if (loss_ == Loss::kCrossEntropy) {
        // 1-D: a weight per target token; 2-D: top-k candidates with their weights instead
        // (MakeBatch checks their sizes). A sequence with both has both terms.
        if (s.top_k == 0 || !s.token_weights.empty()) need(s.token_weights, "weights");
      } else {
        need(s.sampler_logprobs, "sampler log-probs");
        need(s.advantages, "advantages");
        for (size_t t = 1; t < s.sampler_logprobs.size(); ++t) {
          if (s.sampler_logprobs[t] > 0) {
            throw InvalidArgument(o_.loss + ": sequence " + std::to_string(i) + " has a positive sampler log-prob (" +
                                  std::to_string(s.sampler_logprobs[t]) + " at token " + std::to_string(t) +
                                  "): a log-probability is <= 0");
          }
        }
      }
    }
    metrics_.clear();
    prepared_ = true;
  }

  void begin(const Batch& batch) override {
    if (!prepared_) prepare(batch.sequences);
    const auto device = batch.target_mask.device();
    if (loss_ == Loss::kCrossEntropy) {
      if (!batch.token_weights.defined() && !batch.top_k_targets.defined()) {
        throw InvalidArgument("cross_entropy: the batch has no token weights and no top-k targets");
      }
      weights_ = batch.token_weights.defined() ? batch.token_weights.to(device) : torch::Tensor();
      top_targets_ = batch.top_k_targets.defined() ? batch.top_k_targets.to(device) : torch::Tensor();
      top_weights_ = batch.top_k_weights.defined() ? batch.top_k_weights.to(device) : torch::Tensor();
      return;
    }
    if (!batch.sampler_logprobs.defined() || !batch.advantages.defined()) {
      throw InvalidArgument(o_.loss + ": the batch has no sampler log-probs or advantages");
    }
    sampler_ = batch.sampler_logprobs.to(device);
    advantages_ = batch.advantages.to(device);
  }

  torch::Tensor chunk_loss(const LogitsChunk& chunk) override {
    if (loss_ == Loss::kCrossEntropy) return cross_entropy(chunk);
    const auto lp = TargetLogprobs(chunk.logits, chunk.targets);
    const auto mask = chunk.target_mask;
    const auto dtype = lp.scalar_type();
    auto zero = torch::zeros_like(lp);
    const auto q = sampler_.slice(1, chunk.start, chunk.end).to(dtype);
    const auto a = advantages_.slice(1, chunk.start, chunk.end).to(dtype);
    // lp - q only at targets: elsewhere 0, so r = 1 there and no exp overflows into a
    // gradient that the mask would multiply by zero (0 * inf = NaN).
    const auto log_ratio = torch::where(mask, lp - q, zero);
    torch::Tensor objective;
    switch (loss_) {
      case Loss::kImportanceSampling:
        objective = torch::exp(log_ratio) * a;
        break;
      case Loss::kPpo: {
        const auto r = torch::exp(log_ratio);
        objective = torch::min(r * a, r.clamp(o_.clip_low_threshold, o_.clip_high_threshold) * a);
        break;
      }
      case Loss::kCispo:
        objective = torch::exp(log_ratio).detach().clamp(o_.clip_low_threshold, o_.clip_high_threshold) * a * lp;
        break;
      case Loss::kDro:
        objective = lp * a - 0.5 * o_.beta * log_ratio * log_ratio;
        break;
      case Loss::kCrossEntropy:  // cross_entropy()
        break;
    }
    record(log_ratio.detach(), mask);
    return -torch::where(mask, objective, zero).sum();
  }

  Metrics finish() override {
    prepared_ = false;
    return metrics_.means();
  }
  Metrics finish_merged(const MetricMerge& merge) override {
    prepared_ = false;
    return metrics_.means(&merge);
  }

 private:
  bool clipped() const { return loss_ == Loss::kPpo || loss_ == Loss::kCispo; }

  // -sum w lp over the next tokens (1-D weights), plus -sum_j w_j log p(candidate_j) over the
  // top-k candidates of each position (2-D targets); one logsumexp serves both. The gathers
  // come first: autograd runs the later logsumexp's backward first, before any gather's
  // B x c x V gradient exists (objectives/common.h: TargetLogprobs).
  torch::Tensor cross_entropy(const LogitsChunk& chunk) {
    torch::Tensor target_logit, candidate_logits;
    if (weights_.defined()) target_logit = chunk.logits.gather(-1, chunk.targets.unsqueeze(-1)).squeeze(-1);
    if (top_targets_.defined()) {
      candidate_logits = chunk.logits.gather(-1, top_targets_.slice(1, chunk.start, chunk.end));  // [B, c, K]
    }
    const auto lse = chunk.logits.logsumexp(-1);  // [B, c]
    const auto dtype = lse.scalar_type();
    auto per_position = torch::zeros_like(lse);
    if (weights_.defined()) {
      per_position = per_position + weights_.slice(1, chunk.start, chunk.end).to(dtype) * (target_logit - lse);
    }
    if (top_targets_.defined()) {
      const auto lp = candidate_logits - lse.unsqueeze(-1);  // [B, c, K]
      per_position = per_position + (top_weights_.slice(1, chunk.start, chunk.end).to(dtype) * lp).sum(-1);
    }
    return -torch::where(chunk.target_mask, per_position, torch::zeros_like(per_position)).sum();
  }

  // The train/sampler mismatch of a chunk's targets, kept on the device until finish().
  void record(const torch::Tensor& log_ratio, const torch::Tensor& mask) {
    torch::NoGradGuard no_grad;
    const auto d = log_ratio.to(torch::kFloat64);
    const auto r = torch::exp(d);
    const auto m = mask.to(torch::kFloat64);
    const auto n = m.sum();
    metrics_.add("sampler_kl_k3", ((r - 1 - d) * m).sum(), n, true);
    metrics_.add("ratio_mean", (r * m).sum(), n, true);
    metrics_.max("ratio_max", r.masked_fill(~mask, -1.0).max(), n);
    if (clipped()) {
      const auto outside = (r < o_.clip_low_threshold).logical_or(r > o_.clip_high_threshold).logical_and(mask);
      metrics_.add("clip_fraction", outside.to(torch::kFloat64).sum(), n, true);
    }
  }

  PolicyLossOptions o_;
  Loss loss_;
  torch::Tensor sampler_, advantages_, weights_, top_targets_, top_weights_;
  MetricSums metrics_;
  bool prepared_ = false;
};

}  // namespace

std::unique_ptr<Objective> MakePolicyLossObjective(const PolicyLossOptions& options) {
  return std::make_unique<PolicyLossObjective>(options);
}

}  // namespace streambp
