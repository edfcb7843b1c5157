#pragma once
// Helpers shared by the objectives (internal to streambp_core).
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/objective.h"
#include "../model/softmax_rows.h"

namespace streambp::objectives {

/// log p(target) of every position of a chunk, on the graph of `logits` (one extra B x c
/// tensor, no second B x c x V one): model/softmax_rows.h.
using ::streambp::TargetLogprobs;

/// Sums values [B, c] into [n] by sequence id (ids of -1, padding, are dropped), on the
/// values' device. Padding adds an exact 0 to sequence 0 instead of being selected out, so
/// nothing waits for the device to know a size.
inline torch::Tensor SumPerSequence(const torch::Tensor& values, const torch::Tensor& sequence_ids, int64_t n) {
  auto ids = sequence_ids.reshape(-1).to(values.device());
  auto v = values.reshape(-1).masked_fill(ids < 0, 0);
  auto out = torch::zeros({n}, v.options());
  return out.index_add(0, ids.clamp_min(0), v);
}

/// `sum` + `part`, where an undefined `sum` is none yet.
inline torch::Tensor Accumulate(const torch::Tensor& sum, const torch::Tensor& part) {
  return sum.defined() ? sum + part : part;
}

/// Gathers per-sequence values [n] onto positions [B, c] (0 at padding).
inline torch::Tensor PerPosition(const torch::Tensor& per_sequence, const torch::Tensor& sequence_ids) {
  auto ids = sequence_ids.clamp_min(0);
  auto out = per_sequence.index({ids.reshape(-1)}).view(sequence_ids.sizes());
  return out.masked_fill(sequence_ids < 0, 0.0);
}

/// Reads typed options from a JSON object, rejecting unknown keys with the known ones listed.
class OptionReader {
 public:
  OptionReader(const std::string& objective, const nlohmann::json& options);
  double number(const char* key, double fallback);
  bool boolean(const char* key, bool fallback);
  std::string choice(const char* key, const std::string& fallback, const std::vector<std::string>& allowed);
  /// Throws InvalidArgument for any key not read.
  void done() const;

 private:
  std::string objective_;
  nlohmann::json options_;
  std::vector<std::string> known_;
};

/// Running sums for metrics over the micro-batches of a step.
class MetricSums {
 public:
  void add(const std::string& name, double sum, double count) {
    if (!pending_.empty()) return push(name, Kind::kAdd, torch::tensor(sum, torch::kFloat64), torch::tensor(count, torch::kFloat64));
    auto& e = sums_[name];
    e.first += sum;
    e.second += count;
  }
  void max(const std::string& name, double value) {
    if (!pending_.empty()) return push(name, Kind::kMax, torch::tensor(value, torch::kFloat64), torch::tensor(1.0, torch::kFloat64));
    auto it = maxima_.find(name);
    if (it == maxima_.end() || value > it->second) maxima_[name] = value;
  }
  /// The same with values still where the logits are (0-dim tensors): kept and added in
  /// order when the metrics are read, all in one copy, so a step never waits for the device
  /// per chunk. `if_counted`: skipped when the count is 0.
  void add(const std::string& name, const torch::Tensor& sum, const torch::Tensor& count, bool if_counted = false) {
    push(name, if_counted ? Kind::kAddIfCounted : Kind::kAdd, sum, count);
  }
  /// A maximum taken only when `present` (a count) is not 0.
  void max(const std::string& name, const torch::Tensor& value, const torch::Tensor& present) {
    push(name, Kind::kMax, value, present);
  }
  /// A plain sum (reported as it is, added up over the ranks of a split step).
  void total(const std::string& name, double value) { totals_[name] += value; }
  /// The metrics; with `merge`, the sums over the ranks of a split step first
  /// (Objective::finish_merged).
  Metrics means(const MetricMerge* merge = nullptr) {
    flush();
    if (merge != nullptr && *merge) {
      MetricParts parts{std::move(sums_), std::move(totals_), std::move(maxima_)};
      (*merge)(parts);
      sums_ = std::move(parts.means);
      totals_ = std::move(parts.totals);
      maxima_ = std::move(parts.maxima);
    }
    Metrics m;
    for (const auto& [k, v] : sums_) m[k] = v.second > 0 ? v.first / v.second : 0.0;
    for (const auto& [k, v] : totals_) m[k] = v;
    for (const auto& [k, v] : maxima_) m[k] = v;
    return m;
  }
  void clear() {
    sums_.clear();
    totals_.clear();
    maxima_.clear();
    pending_.clear();
  }

 private:
  enum class Kind { kAdd, kAddIfCounted, kMax };
  struct Pending {
    std::string name;
    Kind kind;
    torch::Tensor a, b;
  };
  void push(const std::string& name, Kind kind, const torch::Tensor& a, const torch::Tensor& b) {
    pending_.push_back({name, kind, a.detach().to(torch::kFloat64).reshape({}), b.detach().to(torch::kFloat64).reshape({})});
  }
  void flush() {
    if (pending_.empty()) return;
    std::vector<torch::Tensor> values;
    for (const auto& p : pending_) {
      values.push_back(p.a.to(pending_.front().a.device()));
      values.push_back(p.b.to(pending_.front().a.device()));
    }
    const auto host = torch::stack(values).cpu();
    const double* v = host.data_ptr<double>();
    auto entries = std::move(pending_);
    pending_.clear();
    for (size_t i = 0; i < entries.size(); ++i) {
      const double a = v[2 * i], b = v[2 * i + 1];
      if (entries[i].kind == Kind::kMax) {
        if (b != 0) max(entries[i].name, a);
      } else if (entries[i].kind == Kind::kAdd || b != 0) {
        add(entries[i].name, a, b);
      }
    }
  }

  std::map<std::string, std::pair<double, double>> sums_;
  std::map<std::string, double> totals_;
  std::map<std::string, double> maxima_;
  std::vector<Pending> pending_;  // in the order they were added
};

}  // namespace streambp::objectives
