#include "streambp/batch.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "streambp/error.h"

namespace streambp {

Layout ParseLayout(const std::string& name) {
  if (name == "right") return Layout::kRightPad;
  if (name == "left") return Layout::kLeftPad;
  if (name == "packed" || name == "pack") return Layout::kPacked;
  throw InvalidArgument("unknown layout '" + name + "' (known: right, left, packed)");
}

std::string LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kRightPad: return "right";
    case Layout::kLeftPad: return "left";
    case Layout::kPacked: return "packed";
  }
  return "?";
}

int64_t Sequence::num_targets() const {
  if (tokens.size() < 2) return 0;
  if (loss_mask.empty()) return static_cast<int64_t>(tokens.size()) - 1;
  int64_t n = 0;
  for (size_t i = 1; i < loss_mask.size(); ++i) n += loss_mask[i] != 0;
  return n;
}

int64_t Batch::num_targets() const { return target_mask.sum().item<int64_t>(); }

Batch Batch::to(const torch::Device& device) const {
  Batch b = *this;
  b.input_ids = input_ids.to(device);
  b.position_ids = position_ids.to(device);
  b.sequence_ids = sequence_ids.to(device);
  b.targets = targets.to(device);
  b.target_mask = target_mask.to(device);
  for (auto* t : {&b.sampler_logprobs, &b.advantages, &b.ref_logprobs, &b.token_weights, &b.routed_experts,
                  &b.top_k_targets, &b.top_k_weights}) {
    if (t->defined()) *t = t->to(device);
  }
  for (auto& [name, t] : b.inputs) t = t.to(device);
  return b;
}

void ValidateSequences(const std::vector<Sequence>& sequences, int64_t vocab_size,
                       int64_t max_length) {
  if (sequences.empty()) throw InvalidArgument("batch is empty: give at least one sequence");
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    const std::string where = "sequence " + std::to_string(i);
    if (s.tokens.empty()) throw InvalidArgument(where + ": tokens is empty");
    if (!s.loss_mask.empty() && s.loss_mask.size() != s.tokens.size()) {
      throw InvalidArgument(where + ": loss_mask has " + std::to_string(s.loss_mask.size()) +
                            " entries but tokens has " + std::to_string(s.tokens.size()));
    }
    if (max_length > 0 && static_cast<int64_t>(s.tokens.size()) > max_length) {
      throw InvalidArgument(where + ": " + std::to_string(s.tokens.size()) +
                            " tokens exceed the maximum sequence length " + std::to_string(max_length));
    }
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      if (s.tokens[t] < 0 || s.tokens[t] >= vocab_size) {
        throw InvalidArgument(where + ": tokens[" + std::to_string(t) + "] = " +
                              std::to_string(s.tokens[t]) + " is outside the vocabulary [0, " +
                              std::to_string(vocab_size) + ")");
      }
    }
    for (size_t t = 0; t < s.loss_mask.size(); ++t) {
      if (s.loss_mask[t] > 1) {
        throw InvalidArgument(where + ": loss_mask[" + std::to_string(t) + "] must be 0 or 1");
      }
    }
    const std::pair<const char*, const std::vector<double>*> per_token[] = {
        {"sampler_logprobs", &s.sampler_logprobs}, {"advantages", &s.advantages}, {"ref_logprobs", &s.ref_logprobs},
        {"token_weights", &s.token_weights}};
    auto check = [&](const std::string& field, const std::vector<double>& values) {
      if (values.empty()) return;
      if (values.size() != s.tokens.size()) {
        throw InvalidArgument(where + ": " + field + " has " + std::to_string(values.size()) +
                              " entries but tokens has " + std::to_string(s.tokens.size()));
      }
      for (size_t t = 0; t < values.size(); ++t) {
        if (!std::isfinite(values[t])) {
          throw InvalidArgument(where + ": " + field + "[" + std::to_string(t) + "] is not finite");
        }
      }
    };
    for (const auto& [field, values] : per_token) check(field, *values);
    for (const auto& [name, values] : s.inputs) check("inputs." + name, values);
    if (s.top_k < 0) throw InvalidArgument(where + ": top_k must be >= 0");
    const size_t candidates = s.tokens.size() * static_cast<size_t>(s.top_k);
    if (s.top_k_targets.size() != candidates || s.top_k_weights.size() != candidates) {
      throw InvalidArgument(where + ": top_k_targets and top_k_weights need tokens x top_k = " +
                            std::to_string(candidates) + " entries each, got " + std::to_string(s.top_k_targets.size()) +
                            " and " + std::to_string(s.top_k_weights.size()));
    }
    for (size_t e = static_cast<size_t>(s.top_k); e < candidates; ++e) {
      std::string at = "[";  // built up: GCC 12 warns on "literal" + to_string() at -O3
      at += std::to_string(e / s.top_k) + "][" + std::to_string(e % s.top_k) + "]";
      if (s.top_k_targets[e] < 0 || s.top_k_targets[e] >= vocab_size) {
        throw InvalidArgument(where + ": top_k_targets" + at + " = " + std::to_string(s.top_k_targets[e]) +
                              " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
      }
      if (!std::isfinite(s.top_k_weights[e])) throw InvalidArgument(where + ": top_k_weights" + at + " is not finite");
    }
    if (!std::isfinite(s.reward)) throw InvalidArgument(where + ": reward is not finite");
    if (s.ref_logp && !std::isfinite(*s.ref_logp)) throw InvalidArgument(where + ": ref_logp is not finite");
  }
}

Batch MakeBatch(const std::vector<Sequence>& sequences, Layout layout, int64_t pack_length) {
  if (sequences.empty()) throw InvalidArgument("batch is empty: give at least one sequence");
  int64_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].tokens.empty()) {
      throw InvalidArgument("sequence " + std::to_string(i) + ": tokens is empty");
    }
    longest = std::max<int64_t>(longest, sequences[i].tokens.size());
  }
  // Each row is a list of (sequence index, start column).
  std::vector<std::vector<std::pair<size_t, int64_t>>> rows;
  int64_t T = longest;
  if (layout == Layout::kPacked) {
    T = pack_length > 0 ? pack_length : longest;
    std::vector<int64_t> used;
    for (size_t i = 0; i < sequences.size(); ++i) {
      const int64_t n = sequences[i].tokens.size();
      if (n > T) {
        throw InvalidArgument("sequence " + std::to_string(i) + ": " + std::to_string(n) +
                              " tokens do not fit a packed row of " + std::to_string(T));
      }
      size_t r = 0;
      while (r < rows.size() && used[r] + n > T) ++r;
      if (r == rows.size()) {
        rows.emplace_back();
        used.push_back(0);
      }
      rows[r].emplace_back(i, used[r]);
      used[r] += n;
    }
  } else {
    for (size_t i = 0; i < sequences.size(); ++i) {
      const int64_t n = sequences[i].tokens.size();
      rows.push_back({{i, layout == Layout::kLeftPad ? T - n : 0}});
    }
  }
  const int64_t B = rows.size();
  auto ids = torch::zeros({B, T}, torch::kInt64);
  auto pos = torch::zeros({B, T}, torch::kInt64);
  auto seq = torch::full({B, T}, -1, torch::kInt64);
  auto tgt = torch::zeros({B, T}, torch::kInt64);
  auto tmask = torch::zeros({B, T}, torch::kBool);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto pos_a = pos.accessor<int64_t, 2>();
  auto seq_a = seq.accessor<int64_t, 2>();
  auto tgt_a = tgt.accessor<int64_t, 2>();
  auto tmask_a = tmask.accessor<bool, 2>();
  // Per-token side inputs, moved to the predicting positions.
  auto side = [&](std::vector<double> Sequence::*field) {
    bool any = false;
    for (const auto& s : sequences) any = any || !(s.*field).empty();
    return any ? torch::zeros({B, T}, torch::kFloat64) : torch::Tensor();
  };
  std::vector<double> Sequence::*fields[] = {&Sequence::sampler_logprobs, &Sequence::advantages,
                                             &Sequence::ref_logprobs, &Sequence::token_weights};
  constexpr int kSides = 4;
  torch::Tensor side_tensors[kSides];
  for (int f = 0; f < kSides; ++f) side_tensors[f] = side(fields[f]);
  std::map<std::string, torch::Tensor> named;  // Sequence::inputs, by name
  for (size_t i = 0; i < sequences.size(); ++i) {
    for (const auto& [name, values] : sequences[i].inputs) {
      if (!values.empty() && values.size() != sequences[i].tokens.size()) {
        throw InvalidArgument("sequence " + std::to_string(i) + ": inputs." + name + " has " +
                              std::to_string(values.size()) + " entries but tokens has " +
                              std::to_string(sequences[i].tokens.size()));
      }
      if (!named.count(name)) named[name] = torch::zeros({B, T}, torch::kFloat64);
    }
  }
  std::map<std::string, torch::TensorAccessor<double, 2>> named_a;
  for (auto& [name, t] : named) named_a.emplace(name, t.accessor<double, 2>());
  // Routing replay: the same number of entries per token in every sequence that has them
  // (whether that number fits the model is the engines' check, ValidateBatch).
  int64_t per_token = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& r = sequences[i].routed_experts;
    if (r.empty()) continue;
    const int64_t n = sequences[i].tokens.size(), size = r.size();
    if (size % n != 0 || (per_token > 0 && size / n != per_token)) {
      throw InvalidArgument("sequence " + std::to_string(i) + ": routed_experts has " + std::to_string(size) +
                            " entries for " + std::to_string(n) + " tokens; expected tokens x sparse layers x "
                            "num_experts_per_tok" + (per_token > 0 ? " (" + std::to_string(per_token) + " per token, as "
                            "the batch's other sequences)" : std::string()));
    }
    per_token = size / n;
  }
  torch::Tensor routed = per_token > 0 ? torch::full({B, T, per_token}, -1, torch::kInt64) : torch::Tensor();
  // 2-D targets: K = the largest top_k; a sequence with fewer candidates gets weight 0 for the rest.
  int64_t top_k = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    const size_t candidates = s.tokens.size() * static_cast<size_t>(std::max<int64_t>(s.top_k, 0));
    if (s.top_k < 0 || s.top_k_targets.size() != candidates || s.top_k_weights.size() != candidates) {
      throw InvalidArgument("sequence " + std::to_string(i) + ": top_k_targets and top_k_weights need tokens x top_k "
                            "entries each");
    }
    top_k = std::max(top_k, s.top_k);
  }
  torch::Tensor top_targets = top_k > 0 ? torch::zeros({B, T, top_k}, torch::kInt64) : torch::Tensor();
  torch::Tensor top_weights = top_k > 0 ? torch::zeros({B, T, top_k}, torch::kFloat64) : torch::Tensor();
  Batch batch;
  batch.num_sequences = sequences.size();
  batch.whole_rows = std::all_of(rows.begin(), rows.end(), [](const auto& row) {
    return row.size() == 1 && row.front().second == 0;
  });
  auto runs = std::make_shared<std::vector<std::vector<int64_t>>>();
  for (const auto& row : rows) {  // a row's sequences are in order and adjacent; padding before or after
    auto& starts = runs->emplace_back();
    int64_t end = 0;
    for (const auto& [i, start] : row) {
      if (start > end) starts.push_back(end);  // padding before (left padding)
      starts.push_back(start);
      end = start + static_cast<int64_t>(sequences[i].tokens.size());
    }
    if (end < T) starts.push_back(end);  // padding after
    starts.push_back(T);
  }
  batch.runs = std::move(runs);
  batch.sequences = sequences;
  for (const auto& s : sequences) batch.lengths.push_back(s.tokens.size());
  for (int64_t r = 0; r < B; ++r) {
    for (const auto& [i, start] : rows[r]) {
      const auto& s = sequences[i];
      const int64_t n = s.tokens.size();
      if (!s.routed_experts.empty()) {
        auto given = torch::tensor(s.routed_experts, torch::kInt32).to(torch::kInt64).view({n, per_token});
        routed[r].slice(0, start, start + n).copy_(given);
      }
      if (s.top_k > 0 && n > 1) {
        // Token t's candidates go to position t - 1, which predicts it.
        const int64_t k = s.top_k;
        auto ids_k = torch::tensor(s.top_k_targets, torch::kInt64).view({n, k}).slice(0, 1);
        auto w_k = torch::tensor(s.top_k_weights, torch::kFloat64).view({n, k}).slice(0, 1);
        top_targets[r].slice(0, start, start + n - 1).slice(1, 0, k).copy_(ids_k);
        top_weights[r].slice(0, start, start + n - 1).slice(1, 0, k).copy_(w_k);
      }
      for (int64_t t = 0; t < n; ++t) {
        ids_a[r][start + t] = s.tokens[t];
        pos_a[r][start + t] = t;
        seq_a[r][start + t] = static_cast<int64_t>(i);
        if (t + 1 < n) {
          tgt_a[r][start + t] = s.tokens[t + 1];
          tmask_a[r][start + t] = s.loss_mask.empty() || s.loss_mask[t + 1] != 0;
          for (int f = 0; f < kSides; ++f) {
            const auto& values = s.*fields[f];
            if (!values.empty()) side_tensors[f][r][start + t] = values[t + 1];
          }
          for (const auto& [name, values] : s.inputs) {
            if (!values.empty()) named_a.at(name)[r][start + t] = values[t + 1];
          }
        }
      }
    }
  }
  batch.input_ids = ids;
  batch.position_ids = pos;
  batch.sequence_ids = seq;
  batch.targets = tgt;
  batch.target_mask = tmask;
  batch.sampler_logprobs = side_tensors[0];
  batch.advantages = side_tensors[1];
  batch.ref_logprobs = side_tensors[2];
  batch.token_weights = side_tensors[3];
  batch.inputs = std::move(named);
  batch.routed_experts = routed;
  batch.top_k_targets = top_targets;
  batch.top_k_weights = top_weights;
  return batch;
}

std::vector<std::vector<size_t>> GroupUnits(const std::vector<Sequence>& sequences) {
  std::vector<std::vector<size_t>> units;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t g = sequences[i].group;
    if (!units.empty() && g >= 0 && sequences[units.back().back()].group == g) {
      units.back().push_back(i);
    } else {
      units.push_back({i});
    }
  }
  return units;
}

std::vector<std::vector<size_t>> SplitMicroBatches(const std::vector<Sequence>& sequences, Layout layout,
                                                   int64_t max_tokens) {
  const auto units = GroupUnits(sequences);
  std::vector<std::vector<size_t>> out;
  if (max_tokens <= 0) {
    out.emplace_back();
    for (size_t i = 0; i < sequences.size(); ++i) out.back().push_back(i);
    return out;
  }
  // Padded size of a candidate micro-batch: packed rows of the longest sequence, or one
  // row per sequence padded to the longest.
  auto padded = [&](const std::vector<size_t>& idx) {
    int64_t longest = 0;
    for (size_t i : idx) longest = std::max<int64_t>(longest, sequences[i].tokens.size());
    if (layout != Layout::kPacked) return longest * static_cast<int64_t>(idx.size());
    // First fit into rows of the longest length, as MakeBatch packs.
    std::vector<int64_t> used;
    for (size_t i : idx) {
      const int64_t n = sequences[i].tokens.size();
      size_t r = 0;
      while (r < used.size() && used[r] + n > longest) ++r;
      if (r == used.size()) used.push_back(0);
      used[r] += n;
    }
    return longest * static_cast<int64_t>(used.size());
  };
  std::vector<size_t> current;
  for (const auto& unit : units) {
    std::vector<size_t> candidate = current;
    candidate.insert(candidate.end(), unit.begin(), unit.end());
    if (!current.empty() && padded(candidate) > max_tokens) {
      out.push_back(current);
      current = unit;
    } else {
      current = candidate;
    }
  }
  if (!current.empty()) out.push_back(current);
  return out;
}

torch::Tensor AttentionMask(const Batch& batch, int64_t q_start, int64_t q_end, int64_t k_end,
                            int64_t sliding_window) {
  return AttentionPattern::Causal(batch, q_start, q_end, k_end, sliding_window).dense();
}

AttentionPattern::AttentionPattern(torch::Tensor given) : mask(std::move(given)) {
  TORCH_CHECK(mask.dim() == 3, "attention mask must be [B, queries, keys], got ", mask.sizes());
  q_end = mask.size(1);
  k_end = mask.size(2);
}

AttentionPattern AttentionPattern::Causal(const Batch& batch, int64_t q_start, int64_t q_end, int64_t k_end,
                                          int64_t sliding_window) {
  TORCH_CHECK(0 <= q_start && q_start <= q_end && q_end <= batch.length() && k_end <= batch.length(),
              "attention pattern: queries [", q_start, ", ", q_end, ") or keys [0, ", k_end,
              ") outside the batch's ", batch.length(), " positions");
  AttentionPattern p;
  p.sequence_ids = batch.sequence_ids;
  p.q_start = q_start;
  p.q_end = q_end;
  p.k_end = k_end;
  p.window = sliding_window;
  p.whole_rows = batch.whole_rows;
  p.runs = batch.runs;
  return p;
}

torch::Tensor AttentionPattern::block(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
  if (mask.defined()) return mask.slice(1, q0, q1).slice(2, k0, k1);
  const int64_t qa = q_start + q0, qb = q_start + q1;
  auto q_seq = sequence_ids.slice(1, qa, qb).unsqueeze(2);  // [B, c, 1]
  auto k_seq = sequence_ids.slice(1, k0, k1).unsqueeze(1);  // [B, 1, k]
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(sequence_ids.device());
  auto qi = torch::arange(qa, qb, opts).view({-1, 1});
  auto kj = torch::arange(k0, k1, opts).view({1, -1});
  auto allowed = kj <= qi;
  if (window > 0) allowed = allowed & (qi - kj < window);
  return (q_seq == k_seq) & allowed.unsqueeze(0);
}

int64_t AttentionPattern::key_start(int64_t q0, int64_t q1) const {
  if (mask.defined()) return 0;
  const int64_t qa = q_start + q0;
  int64_t start = window > 0 ? std::max<int64_t>(0, qa - window + 1) : 0;
  if (runs && !runs->empty()) {
    // Later queries of the block are in the same run or a later one: no row's keys before its
    // first query's run are seen by any of them.
    int64_t earliest = qa;
    for (const auto& row : *runs) {
      const auto after = std::upper_bound(row.begin(), row.end(), qa);  // row: {0, ..., T}, qa < T
      if (after != row.begin()) earliest = std::min(earliest, *std::prev(after));
    }
    start = std::max(start, earliest);
  }
  return std::min(start, key_limit(q0, q1));
}

int64_t AttentionPattern::key_limit(int64_t q0, int64_t q1) const {
  (void)q0;
  if (mask.defined()) return k_end;
  return std::min(k_end, q_start + q1);
}

}  // namespace streambp
