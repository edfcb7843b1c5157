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
#include "streambp/attention.h"
#include "streambp/error.h"

namespace streambp {

std::pair<int64_t, int64_t> ContextShardRange(int64_t seq_len, int rank, int ranks) {
  return {seq_len * rank / ranks, seq_len * (rank + 1) / ranks};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

// --- Heads exchanged (Ulysses) ---

// The heads rank j attends: kv heads [kv0, kv0 + kv_n) and, of each, the query heads
// [g0, g0 + g_n) of its group.
struct HeadShare {
  int64_t kv0, kv_n, g0, g_n;
};

// Every rank's share, in rank order (kv heads major, query heads minor); empty when the
// heads do not split over P ranks.
std::vector<HeadShare> ShareHeads(int64_t kv_heads, int64_t groups, int P) {
  std::vector<HeadShare> out;
  if (kv_heads % P == 0) {
    const int64_t n = kv_heads / P;
    for (int j = 0; j < P; ++j) out.push_back({j * n, n, 0, groups});
  } else if (P % kv_heads == 0 && groups % (P / kv_heads) == 0) {
    // Fewer kv heads than ranks: each kv head is replicated on R ranks, which split its group.
    const int64_t R = P / kv_heads, n = groups / R;
    for (int j = 0; j < P; ++j) out.push_back({j / R, 1, (j % R) * n, n});
  }
  return out;
}

// What ExchangeFunction moves: counts of elements to and from every rank.
struct Route {
  Communicator* group;
  std::vector<int64_t> send, recv;
  ContextParallelStats* stats;
};

torch::Tensor AllToAll(const Route& route, const torch::Tensor& send) {
  Timed timed(route.stats, 1);
  if (route.stats) route.stats->head_bytes += Bytes(send);
  return route.group->all_to_all(send.contiguous(), route.send, route.recv);
}

// An all-to-all inside a chunk's graph: its backward is the all-to-all the other way. Every
// rank's backward reaches it in the same order (one per exchange, each chunk's in turn).
struct ExchangeFunction : public torch::autograd::Function<ExchangeFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& send, const Route& route) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(route.group));
    ctx->saved_data["stats"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(route.stats));
    ctx->saved_data["send"] = route.send;
    ctx->saved_data["recv"] = route.recv;
    ctx->saved_data["dtype"] = static_cast<int64_t>(send.scalar_type());
    return AllToAll(route, send);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Route back{reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt())),
               ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector(),
               reinterpret_cast<ContextParallelStats*>(static_cast<intptr_t>(ctx->saved_data["stats"].toInt()))};
    int64_t received = 0;
    for (auto n : back.send) received += n;
    // Every rank takes part, whatever gradient reached this one.
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    auto g = grads[0].defined() ? grads[0] : torch::zeros({received}, torch::dtype(dtype));
    return {AllToAll(back, g), torch::Tensor()};
  }
};

// Query chunk c of every rank, through the heads: this rank's queries go to the ranks of
// their heads; this rank attends its heads' queries of every rank's chunk c against its
// heads' K/V of the whole sequence (under each rank's own causal, document and window
// pattern); the outputs go back. Each rank's chunk c are its rows [c x chunk, ...) (`ranges`:
// their positions in the batch, empty past a rank's part).
class HeadsOverRanks final : public HeadExchange {
 public:
  HeadsOverRanks(Communicator& group, const std::vector<HeadShare>& shares, const Batch& batch,
                 std::vector<std::pair<int64_t, int64_t>> ranges, const KeysValues& kv, const KeysValues* sink,
                 int64_t window, int64_t key_chunk, ContextParallelStats* stats)
      : group_(group), shares_(shares), batch_(batch), ranges_(std::move(ranges)), kv_(kv), sink_(sink),
        window_(window), key_chunk_(key_chunk), stats_(stats) {}

  torch::Tensor attend(const torch::Tensor& qg, int64_t groups, double scale) const override {
    const int P = group_.world_size(), me = group_.rank();
    const int64_t B = qg.size(0), KVH = qg.size(1), hd = qg.size(3), G = groups, C = qg.size(2) / G;
    const auto& mine = shares_[static_cast<size_t>(me)];
    const auto q5 = qg.view({B, KVH, C, G, hd});
    // To rank j: its heads of this rank's C positions, [B, kv_n, C, g_n, hd]; from rank r:
    // this rank's heads of r's positions.
    Route route{&group_, {}, {}, stats_};
    std::vector<torch::Tensor> parts;
    for (int j = 0; j < P; ++j) {
      const auto& h = shares_[static_cast<size_t>(j)];
      parts.push_back(q5.slice(1, h.kv0, h.kv0 + h.kv_n).slice(3, h.g0, h.g0 + h.g_n).reshape({-1}));
      route.send.push_back(parts.back().numel());
      route.recv.push_back(B * mine.kv_n * Rows(j) * mine.g_n * hd);
    }
    const auto received = ExchangeFunction::apply(torch::cat(parts), route);
    std::vector<torch::Tensor> outs;
    int64_t at = 0;
    for (int r = 0; r < P; ++r) {
      const auto [s, e] = ranges_[static_cast<size_t>(r)];
      const int64_t n = route.recv[static_cast<size_t>(r)];
      if (e > s) {
        const auto q = received.slice(0, at, at + n).view({B, mine.kv_n, (e - s) * mine.g_n, hd});
        const KeysValues prefix{kv_.k.slice(2, 0, e), kv_.v.slice(2, 0, e)};
        const auto pattern = AttentionPattern::Causal(batch_, s, e, e, window_);
        const AttentionTiling tiling{key_chunk_, 0, sink_};
        outs.push_back(
            Attend(AttentionCall{q, prefix.k, prefix.v, pattern, mine.g_n, scale, tiling}).out.reshape({-1}));
      }
      at += n;
    }
    // The outputs back to their positions' ranks: from rank j, j's heads of this rank's rows.
    const Route back{&group_, route.recv, route.send, stats_};
    const auto returned = ExchangeFunction::apply(outs.empty() ? received.new_empty({0}) : torch::cat(outs), back);
    // Reassembled as [B, KVH, C, G, hd]: the ranks of one kv head block side by side along the
    // query heads, the blocks along the kv heads.
    std::vector<torch::Tensor> blocks, same_kv;
    at = 0;
    for (int j = 0; j < P; ++j) {
      const auto& h = shares_[static_cast<size_t>(j)];
      const int64_t n = route.send[static_cast<size_t>(j)];
      same_kv.push_back(returned.slice(0, at, at + n).view({B, h.kv_n, C, h.g_n, hd}));
      at += n;
      if (j + 1 == P || shares_[static_cast<size_t>(j + 1)].kv0 != h.kv0) {
        blocks.push_back(same_kv.size() == 1 ? same_kv[0] : torch::cat(same_kv, 3));
        same_kv.clear();
      }
    }
    return (blocks.size() == 1 ? blocks[0] : torch::cat(blocks, 1)).reshape({B, KVH, C * G, hd});
  }

 private:
  int64_t Rows(int r) const { return ranges_[static_cast<size_t>(r)].second - ranges_[static_cast<size_t>(r)].first; }

  Communicator& group_;
  const std::vector<HeadShare>& shares_;
  const Batch& batch_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  KeysValues kv_;
  const KeysValues* sink_;
  int64_t window_, key_chunk_;
  ContextParallelStats* stats_;
};

// This rank's heads of the whole sequence's K/V [B, kv_n, T, hd] from every rank's rows of
// all heads (an all-to-all of K and V together).
KeysValues ScatterHeads(const KeysValues& local, Communicator& group, const std::vector<HeadShare>& shares,
                        int64_t seq_len, ContextParallelStats* stats) {
  const int P = group.world_size();
  const auto& mine = shares[static_cast<size_t>(group.rank())];
  const int64_t B = local.k.size(0), hd = local.k.size(3);
  std::vector<torch::Tensor> parts;
  std::vector<int64_t> send, recv;
  for (int j = 0; j < P; ++j) {
    const auto& h = shares[static_cast<size_t>(j)];
    parts.push_back(local.k.slice(1, h.kv0, h.kv0 + h.kv_n).reshape({-1}));
    parts.push_back(local.v.slice(1, h.kv0, h.kv0 + h.kv_n).reshape({-1}));
    send.push_back(2 * parts.back().numel());
    const auto [s, e] = ContextShardRange(seq_len, j, P);
    recv.push_back(2 * B * mine.kv_n * (e - s) * hd);
  }
  torch::Tensor received;
  {
    Timed timed(stats, 1);
    auto all = torch::cat(parts);
    if (stats) stats->kv_bytes += Bytes(all);
    received = group.all_to_all(all, send, recv);
  }
  KeysValues whole{torch::empty({B, mine.kv_n, seq_len, hd}, local.k.options()),
                   torch::empty({B, mine.kv_n, seq_len, hd}, local.v.options())};
  int64_t at = 0;
  for (int r = 0; r < P; ++r) {
    const auto [s, e] = ContextShardRange(seq_len, r, P);
    const int64_t n = recv[static_cast<size_t>(r)] / 2;
    whole.k.slice(2, s, e).copy_(received.slice(0, at, at + n).view({B, mine.kv_n, e - s, hd}));
    whole.v.slice(2, s, e).copy_(received.slice(0, at + n, at + 2 * n).view({B, mine.kv_n, e - s, hd}));
    at += 2 * n;
  }
  return whole;
}

// The other way for the gradients: every rank's dK/dV of its heads [B, kv_n, T, hd] to the
// ranks that own the positions, summed there (a kv head shared by R ranks gets R parts) into
// all heads of this rank's rows [B, KVH, rows, hd].
KeysValues GatherHeadGradients(const KeysValues& sink, Communicator& group, const std::vector<HeadShare>& shares,
                               int64_t kv_heads, ContextParallelStats* stats) {
  const int P = group.world_size(), me = group.rank();
  const int64_t B = sink.k.size(0), T = sink.k.size(2), hd = sink.k.size(3);
  const auto [s0, e0] = ContextShardRange(T, me, P);
  std::vector<torch::Tensor> parts;
  std::vector<int64_t> send, recv;
  for (int r = 0; r < P; ++r) {
    const auto [s, e] = ContextShardRange(T, r, P);
    parts.push_back(sink.k.slice(2, s, e).reshape({-1}));
    parts.push_back(sink.v.slice(2, s, e).reshape({-1}));
    send.push_back(2 * parts.back().numel());
    recv.push_back(2 * B * shares[static_cast<size_t>(r)].kv_n * (e0 - s0) * hd);
  }
  torch::Tensor received;
  {
    Timed timed(stats, 1);
    auto all = torch::cat(parts);
    if (stats) stats->grad_kv_bytes += Bytes(all);
    received = group.all_to_all(all, send, recv);
  }
  KeysValues mine{torch::zeros({B, kv_heads, e0 - s0, hd}, sink.k.options()),
                  torch::zeros({B, kv_heads, e0 - s0, hd}, sink.v.options())};
  int64_t at = 0;
  for (int j = 0; j < P; ++j) {
    const auto& h = shares[static_cast<size_t>(j)];
    const int64_t n = recv[static_cast<size_t>(j)] / 2;
    mine.k.slice(1, h.kv0, h.kv0 + h.kv_n).add_(received.slice(0, at, at + n).view({B, h.kv_n, e0 - s0, hd}));
    mine.v.slice(1, h.kv0, h.kv0 + h.kv_n).add_(received.slice(0, at + n, at + 2 * n).view({B, h.kv_n, e0 - s0, hd}));
    at += 2 * n;
  }
  return mine;
}

// This rank's shard of `batch` and its exchanges through `group` (InvalidArgument, on every
// rank alike, for a batch shorter than the group, or heads asked for that do not split).
engine::SequenceShard RankShard(CausalLM& model, const Batch& batch, Communicator& group, ContextParallelStats* stats,
                                EngineOptions::ContextExchange exchange) {
  const int P = group.world_size();
  const int64_t T = batch.length();
  if (T < P) {
    throw InvalidArgument("context parallel over " + std::to_string(P) + " ranks needs batches of at least " +
                          std::to_string(P) + " positions, got " + std::to_string(T));
  }
  const auto& config = model->config();
  const bool heads = ContextExchangesHeads(config, P, exchange);
  if (stats) stats->layers = static_cast<int64_t>(model->layer_list.size());
  engine::SequenceShard shard;
  std::tie(shard.begin, shard.end) = ContextShardRange(T, group.rank(), P);
  shard.longest = (T + P - 1) / P;
  if (heads) {
    // Every rank's share, kept by the exchanges (which live no longer than the step).
    auto shares = std::make_shared<const std::vector<HeadShare>>(
        ShareHeads(config.num_key_value_heads, config.num_kv_groups(), P));
    const int64_t kv_heads = config.num_key_value_heads;
    shard.gather_kv = [&group, stats, T, shares](const KeysValues& local) {
      return ScatterHeads(local, group, *shares, T, stats);
    };
    shard.reduce_grad_kv = [&group, stats, shares, kv_heads](const KeysValues& sink) {
      return GatherHeadGradients(sink, group, *shares, kv_heads, stats);
    };
    shard.exchange = [&group, stats, T, P, shares](int64_t c, int64_t chunk, const Batch& on_device,
                                                   const KeysValues& kv, const KeysValues* sink, int64_t window,
                                                   int64_t key_chunk) {
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (int r = 0; r < P; ++r) {
        const auto [begin, end] = ContextShardRange(T, r, P);
        const int64_t rows = end - begin;
        ranges.emplace_back(begin + std::min(rows, c * chunk), begin + std::min(rows, (c + 1) * chunk));
      }
      return std::unique_ptr<HeadExchange>(std::make_unique<HeadsOverRanks>(
          group, *shares, on_device, std::move(ranges), kv, sink, window, key_chunk, stats));
    };
  } else {
    shard.gather_kv = [&group, stats, T](const KeysValues& local) { return GatherKeysValues(local, group, T, stats); };
    shard.reduce_grad_kv = [&group, stats](const KeysValues& whole) {
      return ReduceGradKeysValues(whole, group, stats);
    };
  }
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
  const auto shard = RankShard(model, batch, group, stats, options.context_exchange);
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
  const auto shard = RankShard(model, batch, group, stats, EngineOptions::ContextExchange::kAuto);
  auto mine = engine::ShardTokenLogprobs(model, batch, logits_chunk, temperature, shard);
  // Every other rank's columns are 0 here: the sum is the whole batch's (exactly).
  Timed timed(stats, 1);
  auto staged = mine.to(group.device());
  if (stats) stats->other_bytes += Bytes(staged);
  group.all_reduce_sum({staged});
  return staged.cpu();
}

EngineOptions::ContextExchange ParseContextExchange(const std::string& name) {
  using Exchange = EngineOptions::ContextExchange;
  if (name == "auto") return Exchange::kAuto;
  if (name == "heads") return Exchange::kHeads;
  if (name == "kv") return Exchange::kKeysValues;
  throw InvalidArgument("unknown context exchange '" + name + "' (known: auto, heads, kv)");
}

bool ContextExchangesHeads(const ModelConfig& config, int ranks, EngineOptions::ContextExchange requested) {
  using Exchange = EngineOptions::ContextExchange;
  if (requested == Exchange::kKeysValues || ranks <= 1) return false;
  const bool split = !ShareHeads(config.num_key_value_heads, config.num_kv_groups(), ranks).empty();
  if (!split && requested == Exchange::kHeads) {
    throw InvalidArgument("context parallel over heads needs the " + std::to_string(config.num_attention_heads) +
                          " query heads divisible by the " + std::to_string(ranks) + " ranks and the " +
                          std::to_string(config.num_key_value_heads) +
                          " kv heads dividing or divided by them; exchange keys and values instead");
  }
  return split;
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
