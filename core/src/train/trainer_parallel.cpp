// The Trainer's parallel parts (docs/architecture.md: Layers dist, Context parallel): joining
// the data- and context-parallel groups, a data-parallel rank's shard of a step, and the
// gradient sums over the ranks.
#include <algorithm>

#include <torch/torch.h>

#include "streambp/context_parallel.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/trainer.h"

namespace streambp {

void Trainer::set_context_parallel(std::shared_ptr<Communicator> group) {
  cp_ = std::move(group);
  if (!cp_ || cp_->world_size() <= 1) return;
  // Every rank starts from rank 0's trainable weights (collective: all ranks call this).
  std::vector<torch::Tensor> all;
  for (auto& [name, p] : trainable()) all.push_back(p.detach());
  cp_->broadcast(all, 0);
}

void Trainer::set_communicator(std::shared_ptr<Communicator> communicator) {
  comm_ = std::move(communicator);
  owner_.clear();
  if (!comm_) return;
  // Parameters are dealt to ranks greedily by size, largest first, so shares are even.
  const auto params = trainable();
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].second.numel() > params[b].second.numel(); });
  std::vector<int64_t> load(comm_->world_size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[params[i].first] = r;
    load[r] += params[i].second.numel();
  }
  // Every rank starts from rank 0's weights.
  std::vector<torch::Tensor> all;
  for (auto& [name, p] : trainable()) all.push_back(p.detach());
  comm_->broadcast(all, 0);
}

int64_t Trainer::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : optimizer_->state()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

// Data x context parallel: every data-parallel rank's micro-batches, from the whole step
// every rank holds, at least as long as the context group is wide; refused on every rank
// alike before any collective (a context group that refused alone would leave the others
// waiting in their next collective).
void Trainer::check_context_shards(const std::vector<Sequence>& sequences) const {
  const int64_t P = cp_->world_size();
  // A micro-batch is at least as long as its longest sequence: with none shorter than P (the
  // usual step) no shard needs to be looked at.
  if (std::all_of(sequences.begin(), sequences.end(),
                  [P](const Sequence& s) { return static_cast<int64_t>(s.tokens.size()) >= P; })) {
    return;
  }
  for (int d = 0; d < comm_->world_size(); ++d) {
    std::vector<Sequence> shard;
    for (size_t i : local_shard(sequences, d)) shard.push_back(sequences[i]);
    if (shard.empty()) continue;
    for (const auto& indices : SplitMicroBatches(shard, options_.layout, options_.micro_batch_tokens)) {
      int64_t longest = 0;
      for (size_t i : indices) longest = std::max<int64_t>(longest, shard[i].tokens.size());
      if (longest >= P) continue;
      std::vector<Sequence> part;
      for (size_t i : indices) part.push_back(shard[i]);
      const int64_t length = MakeBatch(part, options_.layout).length();
      if (length < P) {
        throw InvalidArgument("a micro-batch of data-parallel rank " + std::to_string(d) + " is " +
                              std::to_string(length) + " positions long, fewer than the " + std::to_string(P) +
                              " context-parallel ranks it is split over: make every sequence at least " +
                              std::to_string(P) + " tokens long");
      }
    }
  }
}

// Whole groups (a DPO pair, a GRPO group) in contiguous blocks of about equal tokens.
std::vector<size_t> Trainer::local_shard(const std::vector<Sequence>& sequences, int me) const {
  const auto units = GroupUnits(sequences);
  int64_t total = 0;
  for (const auto& s : sequences) total += static_cast<int64_t>(s.tokens.size());
  const int n = comm_->world_size();
  std::vector<size_t> mine;
  int64_t before = 0;
  for (const auto& unit : units) {
    int64_t tokens = 0;
    for (size_t i : unit) tokens += static_cast<int64_t>(sequences[i].tokens.size());
    // The rank whose share of the tokens contains this unit's midpoint computes it.
    const int64_t mid2 = 2 * before + tokens;  // twice the midpoint, to stay in integers
    const int r = std::min<int>(n - 1, static_cast<int>(mid2 * n / (2 * std::max<int64_t>(total, 1))));
    if (r == me) mine.insert(mine.end(), unit.begin(), unit.end());
    before += tokens;
  }
  return mine;
}

namespace {

// The decoder layer of an HF parameter name ("model.layers.3.mlp.up_proj.weight" -> 3),
// -1 for the others (embedding, final norm, lm_head).
int64_t LayerOf(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const auto dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return -1;
  return std::stoll(name.substr(kPrefix.size(), dot - kPrefix.size()));
}

}  // namespace

// Groups of the overlapped sum: decoder layer i is group i; group L holds the embedding
// (and a tied lm_head); group L + 1 the final norm and an untied lm_head, final as soon as
// the chunked head's backward is done (the engine reports it as -2, before any layer).
void Trainer::add_to_overlapped(int64_t layer) {
  const int64_t layers = static_cast<int64_t>(model_->layer_list.size());
  const int64_t rest = layers, head = layers + 1;
  auto params = trainable();
  auto group_of = [&](const std::string& name) {
    const int64_t l = LayerOf(name);
    if (l >= 0 && l < layers) return l;
    return name == "model.norm.weight" || name == "lm_head.weight" ? head : rest;
  };
  auto add_group = [&](int64_t group) {
    if (overlapped_groups_[group]) return;
    overlapped_groups_[group] = true;
    for (auto& [name, p] : params) {
      if (group_of(name) != group) continue;
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // unused: zeros
      overlapped_->add(p.grad(), comm_->options().zero_stage >= 2 ? owner_.at(name) : -1);
    }
  };
  if (layer >= 0 && layer < layers) {
    add_group(layer);
    return;
  }
  if (layer == -2) {
    add_group(head);
    return;
  }
  // The rest, in the hook's order (head, decreasing layers, then the embedding), so that
  // every rank adds the same tensors to the same buckets in the same order.
  add_group(head);
  for (int64_t l = layers - 1; l >= 0; --l) add_group(l);
  add_group(rest);
  overlapped_->flush();
}

// Sums the step's gradients over the ranks: one all-reduce per bucket (ZeRO-2: a reduce
// to each parameter's owner, the others drop theirs). Missing gradients count as zeros.
void Trainer::reduce_gradients() {
  auto params = trainable();
  for (auto& [name, p] : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
  if (comm_->options().zero_stage >= 2) {
    std::vector<std::vector<torch::Tensor>> by_owner(comm_->world_size());
    for (auto& [name, p] : params) by_owner[owner_.at(name)].push_back(p.grad());
    for (int r = 0; r < comm_->world_size(); ++r) comm_->reduce_sum(by_owner[r], r);
    for (auto& [name, p] : params) {
      if (owner_.at(name) != comm_->rank()) p.mutable_grad() = torch::Tensor();
    }
    return;
  }
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : params) grads.push_back(p.grad());
  comm_->all_reduce_sum(grads);
}

}  // namespace streambp
