// grpo: group-relative policy optimization and its variants (DAPO, Dr. GRPO, GSPO),
// with PPO clipping, k3 KL to a reference and truncated importance sampling (docs/architecture.md: Objectives).
#include <cmath>
#include <limits>
#include <map>

#include "common.h"

namespace streambp {
namespace {

using objectives::MetricSums;
using objectives::PerPosition;
using objectives::SumPerSequence;
using objectives::TargetLogprobs;

constexpr double kStdEpsilon = 1e-4;

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Unbiased (n - 1) standard deviation, as torch.std.
double UnbiasedStd(const std::vector<double>& v) {
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

class GrpoObjective final : public Objective {
 public:
  explicit GrpoObjective(const GrpoOptions& o) : o_(o) {
    if (!(o_.temperature > 0)) throw InvalidArgument("grpo: temperature must be > 0");
    if (!(o_.epsilon_low >= 0 && o_.epsilon_low < 1)) throw InvalidArgument("grpo: epsilon_low must be in [0, 1)");
    if (!(o_.epsilon_high >= 0)) throw InvalidArgument("grpo: epsilon_high must be >= 0");
    if (o_.tis_cap < 0) throw InvalidArgument("grpo: tis_cap must be >= 0 (0 = off)");
    if (o_.beta < 0) throw InvalidArgument("grpo: beta must be >= 0");
    if (o_.normalizer < 0 || o_.max_completion_length < 0) {
      throw InvalidArgument("grpo: normalizer and max_completion_length must be >= 0");
    }
  }
  std::string name() const override { return "grpo"; }
  bool needs_sequence_pass() const override { return o_.importance_sampling_level == "sequence"; }

  bool needs_reference(const std::vector<Sequence>& step) const override {
    if (o_.beta == 0) return false;
    for (const auto& s : step) {
      if (s.ref_logprobs.empty()) return true;
    }
    return false;
  }

  double reference_temperature() const override { return o_.temperature; }

  void prepare(const std::vector<Sequence>& step) override {
    if (step.empty()) throw InvalidArgument("grpo: the batch is empty");
    auto all_or_none = [&](const std::vector<double> Sequence::*field, const char* name) {
      size_t with = 0;
      for (const auto& s : step) with += !(s.*field).empty();
      if (with != 0 && with != step.size()) {
        throw InvalidArgument(std::string("grpo: ") + name + " given for " + std::to_string(with) + " of " +
                              std::to_string(step.size()) + " completions; give them for all or none");
      }
      return with != 0;
    };
    has_sampler_ = all_or_none(&Sequence::sampler_logprobs, "sampler log-probs");
    has_advantages_ = all_or_none(&Sequence::advantages, "advantages");
    all_or_none(&Sequence::ref_logprobs, "reference log-probs");
    if (o_.old_logprobs == "sampler" && !has_sampler_) {
      throw InvalidArgument("grpo: old_logprobs=sampler needs the sampler's log-probs of every completion");
    }
    if (has_advantages_ && o_.importance_sampling_level == "sequence") {
      throw InvalidArgument("grpo: importance_sampling_level=sequence needs per-completion rewards, "
                            "not per-token advantages");
    }
    int64_t completions = 0, tokens = 0, longest = 0;
    std::vector<double> rewards;
    std::map<int64_t, int64_t> group_sizes;
    for (size_t i = 0; i < step.size(); ++i) {
      const int64_t n = step[i].num_targets();
      if (n == 0) throw InvalidArgument("grpo: completion " + std::to_string(i) + " is empty");
      ++completions;
      tokens += n;
      longest = std::max(longest, n);
      rewards.push_back(step[i].reward);
      if (step[i].group >= 0) ++group_sizes[step[i].group];
    }
    if (!has_advantages_) {
      if (o_.scale_rewards == "group") {
        for (size_t i = 0; i < step.size(); ++i) {
          if (step[i].group < 0 || group_sizes[step[i].group] < 2) {
            throw InvalidArgument(
                "grpo: completion " + std::to_string(i) +
                " is alone in its group: with scale_rewards=group the group's standard deviation is "
                "undefined; send at least 2 completions per prompt, or use scale_rewards=batch or none");
          }
        }
      }
      if (o_.scale_rewards == "batch" && step.size() < 2) {
        throw InvalidArgument("grpo: scale_rewards=batch needs at least 2 completions in the step");
      }
      batch_std_ = step.size() > 1 ? UnbiasedStd(rewards) : 0.0;
    }
    if (o_.normalizer > 0) {
      normalizer_ = o_.normalizer;
    } else if (o_.loss_type == "grpo") {
      normalizer_ = static_cast<double>(completions);
    } else if (o_.loss_type == "dr_grpo") {
      const double length = o_.max_completion_length > 0 ? o_.max_completion_length : static_cast<double>(longest);
      normalizer_ = static_cast<double>(completions) * length;
    } else {
      normalizer_ = static_cast<double>(tokens);
    }
    metrics_.clear();
    metrics_.add("reward_mean", Mean(rewards) * rewards.size(), rewards.size());
    if (rewards.size() > 1) metrics_.add("reward_std", UnbiasedStd(rewards), 1);
    prepared_ = true;
  }

  void begin(const Batch& batch) override {
    if (!prepared_) prepare(batch.sequences);
    const auto& seqs = batch.sequences;
    const int64_t n = seqs.size();
    n_ = n;
    if (o_.beta != 0 && !batch.ref_logprobs.defined()) {
      throw InvalidArgument("grpo: beta > 0 needs reference log-probs: give them in the input or let the "
                            "server compute them with its reference model");
    }
    if (o_.old_logprobs == "sampler" && !batch.sampler_logprobs.defined()) {
      throw InvalidArgument("grpo: old_logprobs=sampler needs the sampler's log-probs");
    }
    tis_ = batch.sampler_logprobs.defined() && o_.old_logprobs == "current" && o_.tis_cap > 0;
    const auto device = batch.target_mask.device();
    auto seq_ids = batch.sequence_ids.cpu();
    // Advantages on the predicting positions.
    std::vector<double> length(n), advantage(n, 0.0);
    for (int64_t i = 0; i < n; ++i) length[i] = static_cast<double>(seqs[i].num_targets());
    if (batch.advantages.defined()) {
      advantages_ = batch.advantages.to(device);
    } else {
      std::map<int64_t, std::vector<double>> groups;
      for (const auto& s : seqs) groups[s.group].push_back(s.reward);
      for (int64_t i = 0; i < n; ++i) {
        const auto& g = groups[seqs[i].group];
        const double centered = seqs[i].reward - (seqs[i].group >= 0 ? Mean(g) : seqs[i].reward);
        if (o_.scale_rewards == "group") {
          advantage[i] = centered / (UnbiasedStd(g) + kStdEpsilon);
        } else if (o_.scale_rewards == "batch") {
          advantage[i] = centered / (batch_std_ + kStdEpsilon);
        } else {
          advantage[i] = centered;
        }
      }
      advantages_ = PerPosition(torch::tensor(advantage, torch::kFloat64), seq_ids).to(device);
    }
    auto mask = batch.target_mask.to(torch::kFloat64);
    auto per_seq_weight = torch::full({n}, 1.0 / normalizer_, torch::kFloat64);
    if (o_.loss_type == "grpo") per_seq_weight = per_seq_weight / torch::tensor(length, torch::kFloat64);
    aggregation_ = PerPosition(per_seq_weight, seq_ids).to(device) * mask;
    length_ = torch::tensor(length, torch::kFloat64);
    seq_advantage_ = torch::tensor(advantage, torch::kFloat64);
    sampler_ = batch.sampler_logprobs.defined() ? batch.sampler_logprobs.to(device) : torch::Tensor();
    ref_ = batch.ref_logprobs.defined() ? batch.ref_logprobs.to(device) : torch::Tensor();
    // Summed on the chunks' device, read once the sequence pass ends.
    log_ratio_sum_ = torch::Tensor();
    tis_mass_ = torch::Tensor();
    kl_value_ = torch::Tensor();
    sequence_loss_ = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      metrics_.add("advantage_mean", advantage[i], 1);
      metrics_.add("completion_length", length[i], 1);
    }
  }

  // GSPO's first pass: each completion's summed log-ratio, and the aggregation mass of its
  // tokens (times the importance weight, when truncated importance sampling is on).
  void observe(const LogitsChunk& chunk) override {
    auto logp = Logprobs(chunk).to(torch::kFloat64);
    auto mask = chunk.target_mask.to(torch::kFloat64);
    auto old = Slice(sampler_, chunk);
    auto log_ratio = o_.old_logprobs == "sampler" ? logp - old : torch::zeros_like(logp);
    const auto& ids = chunk.sequence_ids;
    log_ratio_sum_ = objectives::Accumulate(log_ratio_sum_, SumPerSequence(log_ratio * mask, ids, n_));
    auto mass = Slice(aggregation_, chunk);
    if (tis_) mass = mass * ImportanceWeight(logp, chunk);
    tis_mass_ = objectives::Accumulate(tis_mass_, SumPerSequence(mass, ids, n_));
  }

  std::vector<torch::Tensor> sequence_pass_sums() override {
    if (!log_ratio_sum_.defined()) log_ratio_sum_ = torch::zeros({n_}, torch::kFloat64);
    if (!tis_mass_.defined()) tis_mass_ = torch::zeros({n_}, torch::kFloat64);
    return {log_ratio_sum_, tis_mass_};
  }
  double sequence_pass_loss() const override { return sequence_loss_; }

  void end_sequence_pass() override {
    torch::AutoGradMode grad(true);
    const auto zeros = torch::zeros({n_}, torch::kFloat64);
    log_ratio_sum_ = log_ratio_sum_.defined() ? log_ratio_sum_.cpu() : zeros;
    tis_mass_ = tis_mass_.defined() ? tis_mass_.cpu() : zeros;
    sequence_weights_on_device_ = torch::Tensor();
    auto m = (log_ratio_sum_ / length_).requires_grad_(true);
    auto coef1 = torch::exp(m);
    auto coef2 = torch::clamp(coef1, 1 - o_.epsilon_low, 1 + o_.epsilon_high);
    auto f = -torch::min(coef1 * seq_advantage_, coef2 * seq_advantage_);
    auto loss = (f * tis_mass_).sum();
    loss.backward();
    // d loss / d logp_t = (d loss / d m_i) / len_i for every completion token of i.
    sequence_weights_ = (m.grad() / length_).detach();
    sequence_loss_ = loss.item<double>();
    torch::NoGradGuard no_grad;
    auto c = coef1.detach();
    ClipMetrics(c, seq_advantage_, length_);
  }

  torch::Tensor chunk_loss(const LogitsChunk& chunk) override {
    auto logp = Logprobs(chunk);
    const auto dtype = logp.scalar_type();
    auto mask = chunk.target_mask;
    auto agg = Slice(aggregation_, chunk).to(dtype);
    torch::Tensor loss;
    if (o_.importance_sampling_level == "sequence") {
      if (!sequence_weights_on_device_.defined()) sequence_weights_on_device_ = sequence_weights_.to(logp.device());
      auto w = PerPosition(sequence_weights_on_device_, chunk.sequence_ids).to(dtype);
      loss = (logp * w * mask).sum();
    } else {
      auto adv = Slice(advantages_, chunk).to(dtype);
      auto old = o_.old_logprobs == "sampler" ? Slice(sampler_, chunk).to(dtype) : logp.detach();
      auto coef1 = torch::exp(logp - old);
      auto coef2 = torch::clamp(coef1, 1 - o_.epsilon_low, 1 + o_.epsilon_high);
      auto per_token = -torch::min(coef1 * adv, coef2 * adv);
      if (tis_) per_token = per_token * ImportanceWeight(logp.detach(), chunk).to(dtype);
      loss = (per_token * agg).sum();
      torch::NoGradGuard no_grad;
      auto m = mask.to(torch::kFloat64);
      auto c = coef1.detach().to(torch::kFloat64);
      auto a = adv.to(torch::kFloat64);
      // Metrics stay on the device until finish() (MetricSums): no wait per chunk.
      const auto counted = m.sum();
      metrics_.add("clip_ratio/low_mean", (((c < 1 - o_.epsilon_low) & (a < 0)) * m).sum(), counted);
      metrics_.add("clip_ratio/high_mean", (((c > 1 + o_.epsilon_high) & (a > 0)) * m).sum(), counted);
      metrics_.add("clip_ratio/region_mean",
                   ((((c < 1 - o_.epsilon_low) & (a < 0)) | ((c > 1 + o_.epsilon_high) & (a > 0))) * m).sum(), counted);
    }
    if (o_.beta != 0) {
      auto d = Slice(ref_, chunk).to(dtype) - logp;
      auto kl = torch::exp(d) - d - 1;
      auto kl_term = o_.beta * (kl * agg).sum();
      loss = loss + kl_term;
      auto kl_value = kl_term.detach().to(torch::kFloat64);
      kl_value_ = kl_value_.defined() ? kl_value_ + kl_value : kl_value;
      torch::NoGradGuard no_grad;
      auto m = mask.to(torch::kFloat64);
      metrics_.add("kl", (kl.detach().to(torch::kFloat64) * m).sum(), m.sum());
    }
    if (o_.entropy) {
      torch::NoGradGuard no_grad;
      auto ent = RowEntropy(Scaled(chunk.logits));
      auto m = mask.to(ent.scalar_type());
      metrics_.add("entropy", (ent * m).sum(), m.sum());
    }
    return loss;
  }

  std::optional<double> batch_loss() const override {
    if (o_.importance_sampling_level != "sequence") return std::nullopt;
    return sequence_loss_ + (kl_value_.defined() ? kl_value_.item<double>() : 0.0);
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
  torch::Tensor Scaled(const torch::Tensor& logits) const {
    return o_.temperature == 1.0 ? logits : logits / o_.temperature;
  }
  torch::Tensor Logprobs(const LogitsChunk& chunk) const {
    return TargetLogprobs(Scaled(chunk.logits), chunk.targets);
  }
  static torch::Tensor Slice(const torch::Tensor& t, const LogitsChunk& chunk) {
    return t.defined() ? t.slice(1, chunk.start, chunk.end) : t;
  }
  // min(exp(logp_trainer - logp_sampler), cap) per token, recorded in the metrics.
  torch::Tensor ImportanceWeight(const torch::Tensor& logp, const LogitsChunk& chunk) {
    torch::NoGradGuard no_grad;
    auto raw = torch::exp(logp.to(torch::kFloat64) - Slice(sampler_, chunk));
    auto w = raw.clamp_max(o_.tis_cap);
    auto mask = chunk.target_mask;
    const auto counted = mask.sum();  // a chunk with no target adds nothing (MetricSums skips it)
    metrics_.add("is_ratio/mean", torch::where(mask, w, torch::zeros_like(w)).sum(), counted, /*if_counted=*/true);
    metrics_.max("is_ratio/max", raw.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity()).max(),
                 counted);
    return w;
  }
  void ClipMetrics(const torch::Tensor& coef, const torch::Tensor& adv, const torch::Tensor& weight) {
    auto low = ((coef < 1 - o_.epsilon_low) & (adv < 0)).to(torch::kFloat64);
    auto high = ((coef > 1 + o_.epsilon_high) & (adv > 0)).to(torch::kFloat64);
    const double total = weight.sum().item<double>();
    metrics_.add("clip_ratio/low_mean", (low * weight).sum().item<double>(), total);
    metrics_.add("clip_ratio/high_mean", (high * weight).sum().item<double>(), total);
    metrics_.add("clip_ratio/region_mean", ((low + high).clamp_max(1) * weight).sum().item<double>(), total);
  }

  GrpoOptions o_;
  bool prepared_ = false;
  bool has_sampler_ = false, has_advantages_ = false, tis_ = false;
  double batch_std_ = 0.0, normalizer_ = 1.0, sequence_loss_ = 0.0;
  torch::Tensor kl_value_;  // the KL terms' sum (sequence level), float64 where the logits are
  int64_t n_ = 0;
  torch::Tensor advantages_, aggregation_, length_, seq_advantage_, sampler_, ref_;
  torch::Tensor log_ratio_sum_, tis_mass_, sequence_weights_;
  torch::Tensor sequence_weights_on_device_;  // sequence_weights_ where the chunks are, copied once per pass
  MetricSums metrics_;
};

}  // namespace

std::unique_ptr<Objective> MakeGrpoObjective(const GrpoOptions& options) {
  return std::make_unique<GrpoObjective>(options);
}

}  // namespace streambp
