// KV-cached sampling. The decoder's two halves (keys_values, forward_queries) serve
// incremental decoding directly: the cache is the K/V of every position so far. A SampleRun
// keeps the cache between slices of decode steps, so a server can interleave other work.
#include "streambp/sampler.h"

#include <algorithm>
#include <functional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "streambp/engine.h"
#include "streambp/error.h"

namespace streambp {

struct SampleRun::State {
  CausalLM model{nullptr};
  std::vector<std::vector<int64_t>> prompts;
  SampleOptions o;
  bool prefilled = false;
  bool finished_all = false;
  int64_t step = 0;  // tokens produced per row so far
  int64_t B = 0;
  std::vector<KeysValues> cache;
  torch::Tensor valid;   // [B, keys]
  torch::Tensor logits;  // [B, V] of the next token
  std::vector<int64_t> row_pos;
  std::vector<SampledCompletion> out;
  std::vector<bool> finished;
  int64_t remaining = 0;
  at::Generator gen;
  int64_t routing_width = 0;  // sparse layers x k when recording, else 0
};

namespace {

// Entries [rows, tokens, width] recorded by the layers into `replay` while `body` runs: the
// routers' choices for the rows of one prefill chunk or decode step (their calls start at
// query position 0 of what they are given, so the buffer covers exactly those rows).
torch::Tensor Recorded(CausalLMImpl& m, int64_t rows, int64_t tokens, int64_t width, const torch::Device& device,
                       const std::function<void()>& body) {
  RoutingReplay recording{torch::full({rows, tokens, width}, -1, torch::TensorOptions().dtype(torch::kInt32).device(device)),
                          /*record=*/true};
  {
    ScopedRoutingReplay routing(m, &recording);
    body();
  }
  return recording.experts;
}

}  // namespace

SampleRun::SampleRun(CausalLM model, std::vector<std::vector<int64_t>> prompts, SampleOptions o)
    : state_(std::make_unique<State>()) {
  const int64_t vocab = model->config().vocab_size;
  if (prompts.empty()) throw InvalidArgument("prompts is empty");
  if (o.n < 1) throw InvalidArgument("n must be >= 1");
  if (o.max_tokens < 1) throw InvalidArgument("max_tokens must be >= 1");
  if (!(o.temperature >= 0)) throw InvalidArgument("temperature must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw InvalidArgument("top_p must be in (0, 1]");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw InvalidArgument("prompts[" + std::to_string(i) + "] is empty");
    for (size_t t = 0; t < prompts[i].size(); ++t) {
      if (prompts[i][t] < 0 || prompts[i][t] >= vocab) {
        throw InvalidArgument("prompts[" + std::to_string(i) + "].tokens[" + std::to_string(t) + "] = " +
                              std::to_string(prompts[i][t]) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
      }
    }
  }
  for (int64_t s : o.stop_tokens) {
    if (s < 0 || s >= vocab) throw InvalidArgument("stop token " + std::to_string(s) + " is outside the vocabulary");
  }
  state_->model = std::move(model);
  state_->prompts = std::move(prompts);
  state_->o = std::move(o);
  state_->gen = at::make_generator<at::CPUGeneratorImpl>(state_->o.seed);
  if (state_->o.record_routing) {
    const auto& c = state_->model->config();
    state_->routing_width = c.sparse_layers() * c.num_experts_per_tok;
  }
}

SampleRun::~SampleRun() = default;

bool SampleRun::done() const { return state_->finished_all; }

std::vector<SampledCompletion> SampleRun::take() {
  for (auto& c : state_->out) {
    if (c.finish_reason.empty()) c.finish_reason = "length";
    // The last token was produced, never fed: the router's choice.
    if (state_->routing_width > 0) c.routed_experts.resize(c.routed_experts.size() + state_->routing_width, -1);
  }
  return std::move(state_->out);
}

bool SampleRun::step(int64_t decode_steps) {
  auto& st = *state_;
  if (st.finished_all) return true;
  torch::NoGradGuard no_grad;
  auto& m = *st.model;
  const auto& o = st.o;
  const auto device = m.embed_tokens->weight.device();
  if (!st.prefilled) {
    int64_t longest = 0;
    for (const auto& p : st.prompts) longest = std::max<int64_t>(longest, p.size());
    const int64_t P = st.prompts.size(), L = longest;
    auto ids = torch::zeros({P, L}, torch::kInt64);
    auto pos = torch::zeros({P, L}, torch::kInt64);
    auto valid = torch::zeros({P, L}, torch::kBool);
    std::vector<int64_t> next_pos(P);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t n = st.prompts[p].size(), pad = L - n;
      for (int64_t t = 0; t < n; ++t) {
        ids[p][pad + t] = st.prompts[p][t];
        pos[p][pad + t] = t;
        valid[p][pad + t] = true;
      }
      next_pos[p] = n;
    }
    ids = ids.to(device);
    pos = pos.to(device);
    valid = valid.to(device);
    // Prefill, chunk by chunk over the queries and tile by tile over the keys (as
    // StreamBP's forward), so a long prompt never materializes L x L scores: causal over
    // real tokens and, in a sliding layer, within its window (rows are left-padded, so
    // index differences are position differences); a padding query sees only itself.
    auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device);
    auto chunk_mask = [&](int64_t s, int64_t e, int64_t window) {  // [P, e - s, e]
      auto qi = torch::arange(s, e, opts).view({-1, 1});
      auto kj = torch::arange(0, e, opts).view({1, -1});
      auto causal = kj <= qi;
      if (window > 0) causal = causal & (qi - kj < window);
      auto allowed = causal.unsqueeze(0) & valid.slice(1, 0, e).unsqueeze(1);
      auto self = (kj == qi).unsqueeze(0) & valid.slice(1, s, e).logical_not().unsqueeze(2);
      return allowed | self;
    };
    auto x = m.embed(ids);
    auto rope = m.rope_tables(pos, x);
    const auto chunks = DefaultChunks(m.config(), x.scalar_type(), L);  // as the memory estimate's
    const int64_t width = st.routing_width;
    // Recording: the chunks' choices, one [P, chunk, width] tensor per chunk of each layer's
    // queries (a sparse layer writes its own k columns), gathered per prompt below.
    std::vector<torch::Tensor> recorded(static_cast<size_t>((L + chunks.chunk - 1) / chunks.chunk));
    for (size_t l = 0; l < m.layer_list.size(); ++l) {
      auto& layer = m.layer_list[l];
      const int64_t window = m.config().window(static_cast<int64_t>(l));
      auto kv = layer->keys_values(x, rope);
      auto y = torch::empty_like(x);
      for (int64_t s = 0; s < L; s += chunks.chunk) {
        const int64_t e = std::min(L, s + chunks.chunk);
        Rope rope_q = rope.slice(s, e);
        KeysValues prefix{kv.k.slice(2, 0, e), kv.v.slice(2, 0, e)};
        auto run = [&] {
          y.slice(1, s, e).copy_(layer->forward_queries(x.slice(1, s, e), rope_q, prefix, chunk_mask(s, e, window),
                                                        {chunks.key_chunk}));
        };
        if (width == 0) {
          run();
          continue;
        }
        auto chosen = Recorded(m, P, e - s, width, device, run);
        auto& slot = recorded[static_cast<size_t>(s / chunks.chunk)];
        slot = slot.defined() ? torch::max(slot, chosen) : chosen;  // each layer fills its own columns
      }
      x = y;
      // A sliding layer's next queries see only the last `window` keys: the cache keeps those.
      if (window > 0 && L > window) kv = KeysValues{kv.k.slice(2, L - window).clone(), kv.v.slice(2, L - window).clone()};
      st.cache.push_back(kv);
    }
    st.logits = m.logits(x.slice(1, L - 1, L)).squeeze(1);  // [P, V]
    // n completions per prompt: repeat the prompt's state.
    st.B = P * o.n;
    if (o.n > 1) {
      for (auto& kv : st.cache) {
        kv.k = kv.k.repeat_interleave(o.n, 0);
        kv.v = kv.v.repeat_interleave(o.n, 0);
      }
      valid = valid.repeat_interleave(o.n, 0);
      st.logits = st.logits.repeat_interleave(o.n, 0);
    }
    st.valid = valid;
    st.row_pos.resize(st.B);
    for (int64_t b = 0; b < st.B; ++b) st.row_pos[b] = next_pos[b / o.n];
    st.out.resize(st.B);
    for (int64_t b = 0; b < st.B; ++b) st.out[b].prompt_index = b / o.n;
    if (width > 0) {
      const auto all = torch::cat(recorded, 1).cpu().contiguous();  // [P, L, width], left-padded
      for (int64_t b = 0; b < st.B; ++b) {
        const int64_t p = b / o.n, n = static_cast<int64_t>(st.prompts[p].size());
        const auto rows = all[p].slice(0, L - n, L).contiguous();
        st.out[b].routed_experts.assign(rows.data_ptr<int32_t>(), rows.data_ptr<int32_t>() + n * width);
      }
    }
    st.finished.assign(st.B, false);
    st.remaining = st.B;
    st.prefilled = true;
    return false;  // the prefill is a slice of its own
  }
  const int64_t B = st.B;
  for (int64_t k = 0; k < decode_steps && !st.finished_all; ++k) {
    auto z = st.logits.to(torch::kFloat64).cpu();
    if (o.temperature > 0) z = z / o.temperature;
    auto logp = torch::log_softmax(z, -1);
    torch::Tensor tokens;
    if (o.temperature == 0) {
      tokens = z.argmax(-1);
    } else {
      auto probs = logp.exp();
      if (o.top_p < 1.0) {
        auto [sorted, order] = probs.sort(-1, /*descending=*/true);
        auto before = sorted.cumsum(-1) - sorted;  // mass of the strictly more likely tokens
        sorted = sorted.masked_fill(before >= o.top_p, 0.0);
        probs = torch::zeros_like(probs).scatter(-1, order, sorted);
      }
      tokens = at::multinomial(probs, 1, false, st.gen).squeeze(-1);
    }
    auto tok = tokens.accessor<int64_t, 1>();
    auto lp = logp.accessor<double, 2>();
    for (int64_t b = 0; b < B; ++b) {
      if (st.finished[b]) continue;
      st.out[b].tokens.push_back(tok[b]);
      st.out[b].logprobs.push_back(lp[b][tok[b]]);
      if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), tok[b]) != o.stop_tokens.end()) {
        st.finished[b] = true;
        st.out[b].finish_reason = "stop";
        --st.remaining;
      }
    }
    ++st.step;
    if (st.remaining == 0 || st.step == o.max_tokens) {
      st.finished_all = true;
      st.cache.clear();
      st.logits = torch::Tensor();
      break;
    }
    // Decode one token for every row (finished rows too: their results are ignored).
    auto new_pos = torch::tensor(st.row_pos, torch::kInt64).view({B, 1}).to(device);
    for (auto& p : st.row_pos) ++p;
    auto xt = m.embed(tokens.view({B, 1}).to(device));
    auto rope_t = m.rope_tables(new_pos, xt);
    st.valid = torch::cat({st.valid, torch::ones({B, 1}, st.valid.options())}, 1);
    const int64_t keys = st.valid.size(1);
    auto decode = [&] {
      for (size_t l = 0; l < m.layer_list.size(); ++l) {
        auto& layer = m.layer_list[l];
        const int64_t window = m.config().window(static_cast<int64_t>(l));
        auto h = layer->input_layernorm(xt);  // once, for the new key and the query
        auto kv_new = layer->keys_values_normed(h, rope_t);
        auto& cache = st.cache[l];
        const int64_t kept = cache.k.size(2);
        if (window > 0 && kept + 1 > window) {  // the oldest key leaves the window
          cache.k = torch::cat({cache.k.slice(2, kept + 1 - window), kv_new.k}, 2);
          cache.v = torch::cat({cache.v.slice(2, kept + 1 - window), kv_new.v}, 2);
        } else {
          cache.k = torch::cat({cache.k, kv_new.k}, 2);
          cache.v = torch::cat({cache.v, kv_new.v}, 2);
        }
        // The cache holds the last cache.k.size(2) keys: their padding flags are the last ones.
        auto step_mask = st.valid.slice(1, keys - cache.k.size(2), keys).unsqueeze(1);  // [B, 1, cached keys]
        xt = layer->forward_queries_normed(xt, h, rope_t, cache, step_mask);
      }
    };
    if (st.routing_width == 0) {
      decode();
    } else {  // the experts of the token each unfinished row just fed
      const auto chosen = Recorded(m, B, 1, st.routing_width, device, decode).cpu().contiguous();
      const auto* ids = chosen.data_ptr<int32_t>();
      for (int64_t b = 0; b < B; ++b) {
        if (st.finished[b]) continue;
        auto& r = st.out[b].routed_experts;
        r.insert(r.end(), ids + b * st.routing_width, ids + (b + 1) * st.routing_width);
      }
    }
    st.logits = m.logits(xt).squeeze(1);
  }
  return st.finished_all;
}

std::vector<SampledCompletion> SampleCompletions(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                                 const SampleOptions& options) {
  SampleRun run(model, prompts, options);
  while (!run.step(int64_t{1} << 40)) {
  }
  return run.take();
}

}  // namespace streambp
