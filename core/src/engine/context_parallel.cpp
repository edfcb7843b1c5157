// Context parallel over the stream engine (docs/architecture.md: Context parallel): the
// shard's exchanges as c10d collectives, and the step's sums.
#include "streambp/context_parallel.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <string>
#include <tuple>

#include "engine_common.h"
#include "streambp/error.h"

namespace streambp {

std::pair<int64_t, int64_t> ContextShardRange(int64_t seq_len, int rank, int ranks) {
  return {seq_len * rank / ranks, seq_len * (rank + 1) / ranks};
}

namespace {

// Times `calls` collectives into `stats` (when given).
class Timed {
 public:
  Timed(ContextParallelStats* stats, int64_t calls)
      : stats_(stats), calls_(calls), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    if (stats_ == nullptr) return;
    stats_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    stats_->collectives += calls_;
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  ContextParallelStats* stats_;
  int64_t calls_;
  std::chrono::steady_clock::time_point t0_;
};

int64_t Bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// All-gather along the position dimension (2) of [B, KVH, rows, hd]: each rank's rows in
// turn, broadcast from their owner (c10d's Gloo has no all-gather of unequal parts).
KeysValues GatherKeysValues(const KeysValues& local, Communicator& group, int64_t seq_len,
                            ContextParallelStats* stats) {
  auto sizes = local.k.sizes().vec();
  sizes[2] = seq_len;
  KeysValues whole{torch::empty(sizes, local.k.options()), torch::empty(sizes, local.v.options())};
  Timed timed(stats, group.world_size());
  for (int r = 0; r < group.world_size(); ++r) {
    const auto [s, e] = ContextShardRange(seq_len, r, group.world_size());
    torch::Tensor k, v;
    if (r == group.rank()) {
      k = local.k.contiguous();
      v = local.v.contiguous();
    } else {
      sizes[2] = e - s;
      k = torch::empty(sizes, local.k.options());
      v = torch::empty(sizes, local.v.options());
    }
    group.broadcast({k, v}, r);
    if (stats) stats->kv_bytes += Bytes(k) + Bytes(v);
    whole.k.slice(2, s, e).copy_(k);
    whole.v.slice(2, s, e).copy_(v);
  }
  return whole;
}

// Reduce-scatter along dimension 2: the sum over the ranks of each rank's rows, delivered to
// their owner (a reduce per owner); returns this rank's rows.
KeysValues ReduceGradKeysValues(const KeysValues& whole, Communicator& group, ContextParallelStats* stats) {
  const int64_t T = whole.k.size(2);
  KeysValues mine;
  Timed timed(stats, group.world_size());
  for (int r = 0; r < group.world_size(); ++r) {
    const auto [s, e] = ContextShardRange(T, r, group.world_size());
    auto k = whole.k.slice(2, s, e).contiguous();
    auto v = whole.v.slice(2, s, e).contiguous();
    group.reduce_sum({k, v}, r);
    if (stats) stats->grad_kv_bytes += Bytes(k) + Bytes(v);
    if (r == group.rank()) mine = {k, v};
  }
  return mine;
}

// This rank's shard of `batch` and its exchanges through `group` (InvalidArgument, on every
// rank alike, for a batch shorter than the group).
engine::SequenceShard RankShard(CausalLM& model, const Batch& batch, Communicator& group,
                                ContextParallelStats* stats) {
  const int P = group.world_size();
  const int64_t T = batch.length();
  if (T < P) {
    throw InvalidArgument("context parallel over " + std::to_string(P) + " ranks needs batches of at least " +
                          std::to_string(P) + " positions, got " + std::to_string(T));
  }
  if (stats) stats->layers = static_cast<int64_t>(model->layer_list.size());
  engine::SequenceShard shard;
  std::tie(shard.begin, shard.end) = ContextShardRange(T, group.rank(), P);
  shard.gather_kv = [&group, stats, T](const KeysValues& local) { return GatherKeysValues(local, group, T, stats); };
  shard.reduce_grad_kv = [&group, stats](const KeysValues& whole) { return ReduceGradKeysValues(whole, group, stats); };
  shard.all_reduce = [&group, stats](const std::vector<torch::Tensor>& tensors) {
    Timed timed(stats, 1);
    for (const auto& t : tensors) {
      if (stats) stats->other_bytes += Bytes(t);
    }
    group.all_reduce_sum(tensors);
  };
  return shard;
}

}  // namespace

StepResult ContextParallelForwardBackward(CausalLM& model, const Batch& batch, Objective& objective,
                                          const EngineOptions& options, Communicator& group,
                                          ContextParallelStats* stats) {
  if (options.kind != EngineKind::kStream) {
    throw InvalidArgument("context parallel runs the stream engine only (engine " + EngineName(options.kind) + ")");
  }
  if (options.recompute_kv_per_chunk) {
    throw InvalidArgument("recompute_kv_per_chunk (the ablation) does not run context parallel");
  }
  const auto shard = RankShard(model, batch, group, stats);
  auto result = engine::ForwardBackwardShard(model, batch, objective, options, &shard);
  // The step's sums (the load-balancing loss is in the first shard's loss only).
  Timed timed(stats, 1);
  if (stats) stats->other_bytes += 5 * static_cast<int64_t>(sizeof(double));
  const auto sums = group.all_reduce_scalars({result.loss, static_cast<double>(result.targets),
                                              static_cast<double>(result.tokens),
                                              static_cast<double>(result.routing_decisions),
                                              static_cast<double>(result.routing_mismatches)});
  result.loss = sums[0];
  result.targets = static_cast<int64_t>(sums[1]);
  result.tokens = static_cast<int64_t>(sums[2]);
  result.routing_decisions = static_cast<int64_t>(sums[3]);
  result.routing_mismatches = static_cast<int64_t>(sums[4]);
  return result;
}

torch::Tensor ContextParallelTokenLogprobs(CausalLM& model, const Batch& batch, int64_t logits_chunk,
                                           double temperature, Communicator& group, ContextParallelStats* stats) {
  const auto shard = RankShard(model, batch, group, stats);
  auto mine = engine::ShardTokenLogprobs(model, batch, logits_chunk, temperature, shard);
  // Every other rank's columns are 0 here: the sum is the whole batch's (exactly).
  Timed timed(stats, 1);
  auto staged = mine.to(group.device());
  if (stats) stats->other_bytes += Bytes(staged);
  group.all_reduce_sum({staged});
  return staged.cpu();
}

MetricMerge MergeMetricsOver(Communicator& group) {
  // Three collectives whatever the group's size: the longest list of names, every rank's list
  // (an all-gather written as a sum: each rank fills its own row of zeros), and the sums,
  // counts and every rank's maxima (gathered the same way) in one all-reduce.
  return [&group](MetricParts& parts) {
    const int P = group.world_size();
    if (P <= 1) return;
    std::string mine;
    auto list = [&mine](char kind, const std::string& name) {
      mine += kind;
      mine += name;
      mine += '\n';
    };
    for (const auto& [name, v] : parts.means) list('m', name);
    for (const auto& [name, v] : parts.totals) list('t', name);
    for (const auto& [name, v] : parts.maxima) list('x', name);
    const auto longest = static_cast<size_t>(group.all_reduce_scalar(static_cast<double>(mine.size()), /*max=*/true));
    // The union of the names: a rank whose share had no target for a metric has none of it.
    std::set<std::string> names;
    if (longest > 0) {
      std::vector<double> rows(static_cast<size_t>(P) * longest, 0.0);
      for (size_t i = 0; i < mine.size(); ++i) {
        rows[static_cast<size_t>(group.rank()) * longest + i] = static_cast<unsigned char>(mine[i]);
      }
      rows = group.all_reduce_scalars(rows);
      for (int r = 0; r < P; ++r) {
        std::string theirs;
        for (size_t i = 0; i < longest; ++i) {
          const double c = rows[static_cast<size_t>(r) * longest + i];
          if (c == 0) break;
          theirs += static_cast<char>(static_cast<unsigned char>(c));
        }
        size_t at = 0;
        for (size_t end = theirs.find('\n'); end != std::string::npos; at = end + 1, end = theirs.find('\n', at)) {
          names.insert(theirs.substr(at, end - at));
        }
      }
    }
    // In the names' order (the same on every rank): means as (sum, count), totals, then for
    // each maximum P slots of (present, value), this rank's in its own.
    std::vector<double> values;
    for (const auto& key : names) {
      const std::string name = key.substr(1);
      if (key[0] == 'm') {
        const auto it = parts.means.find(name);
        values.push_back(it == parts.means.end() ? 0.0 : it->second.first);
        values.push_back(it == parts.means.end() ? 0.0 : it->second.second);
      } else if (key[0] == 't') {
        const auto it = parts.totals.find(name);
        values.push_back(it == parts.totals.end() ? 0.0 : it->second);
      } else {
        const auto it = parts.maxima.find(name);
        for (int r = 0; r < P; ++r) {
          const bool own = r == group.rank() && it != parts.maxima.end();
          values.push_back(own ? 1.0 : 0.0);
          values.push_back(own ? it->second : 0.0);
        }
      }
    }
    const auto sums = group.all_reduce_scalars(values);
    size_t i = 0;
    for (const auto& key : names) {
      const std::string name = key.substr(1);
      if (key[0] == 'm') {
        parts.means[name] = {sums[i], sums[i + 1]};
        i += 2;
      } else if (key[0] == 't') {
        parts.totals[name] = sums[i++];
      } else {
        double best = -std::numeric_limits<double>::infinity();
        for (int r = 0; r < P; ++r, i += 2) {
          if (sums[i] > 0) best = std::max(best, sums[i + 1]);
        }
        parts.maxima[name] = best;  // some rank has it: the name came from one
      }
    }
  };
}

void SumGradients(const std::vector<torch::Tensor>& params, Communicator& group) {
  std::vector<torch::Tensor> trained;
  for (const auto& p : params) {
    if (p.requires_grad()) trained.push_back(p);
  }
  // Which parameters have a gradient on some rank (an expert no rank's tokens reached keeps
  // none, as in one process).
  std::vector<double> flags(trained.size(), 0.0);
  for (size_t i = 0; i < trained.size(); ++i) flags[i] = trained[i].grad().defined() ? 1.0 : 0.0;
  // Staged where the backend moves tensors (NCCL: the rank's GPU).
  auto staged = torch::tensor(flags, torch::kFloat64).to(group.device());
  group.all_reduce_sum({staged});
  const auto present = staged.cpu();
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < trained.size(); ++i) {
    if (present[static_cast<int64_t>(i)].item<double>() == 0) continue;
    auto& p = trained[i];
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  group.all_reduce_sum(grads);
}

}  // namespace streambp
