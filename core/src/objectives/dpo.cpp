// dpo: Direct Preference Optimization over (chosen, rejected) pairs (docs/architecture.md: Objectives).
#include <cmath>
#include <map>

#include "common.h"

namespace streambp {
namespace {

namespace F = torch::nn::functional;
using objectives::MetricSums;
using objectives::PerPosition;
using objectives::SumPerSequence;
using objectives::TargetLogprobs;

class DpoObjective final : public Objective {
 public:
  explicit DpoObjective(const DpoOptions& o) : o_(o) {
    if (!(o_.beta > 0)) throw InvalidArgument("dpo: beta must be > 0");
    if (!(o_.label_smoothing >= 0 && o_.label_smoothing < 0.5)) {
      throw InvalidArgument("dpo: label_smoothing must be in [0, 0.5)");
    }
    if (o_.normalizer < 0) throw InvalidArgument("dpo: normalizer must be >= 0");
  }
  std::string name() const override { return "dpo"; }
  bool needs_sequence_pass() const override { return true; }

  bool needs_reference(const std::vector<Sequence>& step) const override {
    for (const auto& s : step) {
      if (!s.ref_logp && s.ref_logprobs.empty()) return true;
    }
    return false;
  }

  void prepare(const std::vector<Sequence>& step) override {
    const auto pairs = Pairs(step);
    normalizer_ = o_.normalizer > 0 ? o_.normalizer : static_cast<double>(pairs.size());
    metrics_.clear();
    prepared_ = true;
  }

  void begin(const Batch& batch) override {
    if (!prepared_) prepare(batch.sequences);
    const auto& seqs = batch.sequences;
    const auto pairs = Pairs(seqs);
    const int64_t n = seqs.size();
    std::vector<int64_t> chosen, rejected;
    for (const auto& [group, idx] : pairs) {
      chosen.push_back(idx.first);
      rejected.push_back(idx.second);
    }
    chosen_ = torch::tensor(chosen, torch::kInt64);
    rejected_ = torch::tensor(rejected, torch::kInt64);
    // Reference sums: given per sequence, or summed from per-token reference log-probs.
    torch::Tensor from_tokens;
    if (batch.ref_logprobs.defined()) {
      from_tokens = SumPerSequence(batch.ref_logprobs.cpu() * batch.target_mask.cpu(), batch.sequence_ids.cpu(), n);
    }
    std::vector<double> ref(n), length(n);
    for (int64_t i = 0; i < n; ++i) {
      length[i] = static_cast<double>(seqs[i].num_targets());
      if (seqs[i].ref_logp) {
        ref[i] = *seqs[i].ref_logp;
      } else if (from_tokens.defined() && !seqs[i].ref_logprobs.empty()) {
        ref[i] = from_tokens[i].item<double>();
      } else {
        throw InvalidArgument("dpo: sequence " + std::to_string(i) +
                              " has no reference log-probs: give ref_chosen_logp/ref_rejected_logp, or "
                              "let the server compute them with its reference model");
      }
    }
    ref_ = torch::tensor(ref, torch::kFloat64);
    length_ = torch::tensor(length, torch::kFloat64);
    policy_ = torch::Tensor();  // summed on the chunks' device, read once the pass ends
    n_ = n;
  }

  void observe(const LogitsChunk& chunk) override {
    auto logp = TargetLogprobs(chunk.logits, chunk.targets) * chunk.target_mask;
    policy_ = objectives::Accumulate(policy_, SumPerSequence(logp.to(torch::kFloat64), chunk.sequence_ids, n_));
  }

  std::vector<torch::Tensor> sequence_pass_sums() override {
    if (!policy_.defined()) policy_ = torch::zeros({n_}, torch::kFloat64);
    return {policy_};
  }
  double sequence_pass_loss() const override { return batch_loss_; }

  void end_sequence_pass() override {
    torch::AutoGradMode grad(true);
    policy_ = policy_.defined() ? policy_.cpu() : torch::zeros({n_}, torch::kFloat64);
    weights_on_device_ = torch::Tensor();
    auto s = policy_.clone().requires_grad_(true);
    auto policy = s, ref = ref_;
    if (o_.loss_type == "ipo") {
      policy = s / length_;
      ref = ref_ / length_;
    }
    auto pc = policy.index({chosen_}), pr = policy.index({rejected_});
    auto rc = ref.index({chosen_}), rr = ref.index({rejected_});
    auto losses = Losses((pc - pr) - (rc - rr));
    auto loss = losses.sum() / normalizer_;
    loss.backward();
    weights_ = s.grad().detach();
    batch_loss_ = loss.item<double>();
    torch::NoGradGuard no_grad;
    auto chosen_rewards = o_.beta * (pc - rc).detach();
    auto rejected_rewards = o_.beta * (pr - rr).detach();
    const double pairs = static_cast<double>(chosen_.numel());
    metrics_.add("rewards/chosen", chosen_rewards.sum().item<double>(), pairs);
    metrics_.add("rewards/rejected", rejected_rewards.sum().item<double>(), pairs);
    metrics_.add("rewards/margins", (chosen_rewards - rejected_rewards).sum().item<double>(), pairs);
    metrics_.add("rewards/accuracies", (chosen_rewards > rejected_rewards).sum().item<double>(), pairs);
    metrics_.add("logps/chosen", policy_.index({chosen_}).sum().item<double>(), pairs);
    metrics_.add("logps/rejected", policy_.index({rejected_}).sum().item<double>(), pairs);
  }

  torch::Tensor chunk_loss(const LogitsChunk& chunk) override {
    auto logp = TargetLogprobs(chunk.logits, chunk.targets);
    if (!weights_on_device_.defined()) weights_on_device_ = weights_.to(logp.device());
    auto w = PerPosition(weights_on_device_, chunk.sequence_ids).to(logp.scalar_type());
    return (logp * w * chunk.target_mask).sum();
  }

  std::optional<double> batch_loss() const override { return batch_loss_; }

  Metrics finish() override {
    prepared_ = false;
    return metrics_.means();
  }
  Metrics finish_merged(const MetricMerge& merge) override {
    prepared_ = false;
    return metrics_.means(&merge);
  }

 private:
  torch::Tensor Losses(const torch::Tensor& z) const {
    const double b = o_.beta, ls = o_.label_smoothing;
    if (o_.loss_type == "sigmoid") return -F::logsigmoid(b * z) * (1 - ls) - F::logsigmoid(-b * z) * ls;
    if (o_.loss_type == "ipo") return (z - 1 / (2 * b)).pow(2);
    if (o_.loss_type == "hinge") return torch::relu(1 - b * z);
    return (-F::logsigmoid(b * z) * (1 - ls) + F::logsigmoid(-b * z) * ls) / (1 - 2 * ls);  // robust
  }

  // group id -> (index of chosen, index of rejected); every sequence must be in a full pair.
  static std::map<int64_t, std::pair<int64_t, int64_t>> Pairs(const std::vector<Sequence>& seqs) {
    if (seqs.empty()) throw InvalidArgument("dpo: the batch is empty");
    std::map<int64_t, std::pair<int64_t, int64_t>> pairs;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& s = seqs[i];
      const std::string where = "dpo: sequence " + std::to_string(i);
      if (s.group < 0) throw InvalidArgument(where + " is not part of a pair (no group id)");
      if (s.role != 0 && s.role != 1) throw InvalidArgument(where + ": role must be 0 (chosen) or 1 (rejected)");
      if (s.num_targets() == 0) throw InvalidArgument(where + ": the completion is empty");
      auto [it, fresh] = pairs.try_emplace(s.group, -1, -1);
      auto& slot = s.role == 0 ? it->second.first : it->second.second;
      if (slot >= 0) {
        throw InvalidArgument(where + ": pair " + std::to_string(s.group) + " has two " +
                              (s.role == 0 ? "chosen" : "rejected") + " sequences");
      }
      slot = static_cast<int64_t>(i);
    }
    for (const auto& [g, p] : pairs) {
      if (p.first < 0 || p.second < 0) {
        throw InvalidArgument("dpo: pair " + std::to_string(g) + " lacks its " +
                              (p.first < 0 ? "chosen" : "rejected") + " sequence");
      }
    }
    return pairs;
  }

  DpoOptions o_;
  double normalizer_ = 1.0;
  bool prepared_ = false;
  int64_t n_ = 0;
  torch::Tensor chosen_, rejected_, ref_, length_, policy_, weights_;
  torch::Tensor weights_on_device_;  // weights_ where the chunks are, copied once per pass
  double batch_loss_ = 0.0;
  MetricSums metrics_;
};

}  // namespace

std::unique_ptr<Objective> MakeDpoObjective(const DpoOptions& options) {
  return std::make_unique<DpoObjective>(options);
}

}  // namespace streambp
