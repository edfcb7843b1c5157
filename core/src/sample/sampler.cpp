// KV-cached sampling. The decoder's two halves (keys_values, forward_queries) serve
// incremental decoding directly: the cache is the K/V of every position so far.
#include "streambp/sampler.h"

#include <algorithm>

#include <torch/torch.h>

#include "streambp/engine.h"
#include "streambp/error.h"

namespace streambp {

std::vector<SampledCompletion> SampleCompletions(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                                 const SampleOptions& o) {
  const int64_t vocab = model->config().vocab_size;
  if (prompts.empty()) throw InvalidArgument("prompts is empty");
  if (o.n < 1) throw InvalidArgument("n must be >= 1");
  if (o.max_tokens < 1) throw InvalidArgument("max_tokens must be >= 1");
  if (!(o.temperature >= 0)) throw InvalidArgument("temperature must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw InvalidArgument("top_p must be in (0, 1]");
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw InvalidArgument("prompts[" + std::to_string(i) + "] is empty");
    for (size_t t = 0; t < prompts[i].size(); ++t) {
      if (prompts[i][t] < 0 || prompts[i][t] >= vocab) {
        throw InvalidArgument("prompts[" + std::to_string(i) + "].tokens[" + std::to_string(t) + "] = " +
                              std::to_string(prompts[i][t]) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
      }
    }
    longest = std::max<int64_t>(longest, prompts[i].size());
  }
  for (int64_t s : o.stop_tokens) {
    if (s < 0 || s >= vocab) throw InvalidArgument("stop token " + std::to_string(s) + " is outside the vocabulary");
  }
  torch::NoGradGuard no_grad;
  auto& m = *model;
  const auto device = m.embed_tokens->weight.device();
  const int64_t P = prompts.size(), L = longest;
  auto ids = torch::zeros({P, L}, torch::kInt64);
  auto pos = torch::zeros({P, L}, torch::kInt64);
  auto valid = torch::zeros({P, L}, torch::kBool);
  std::vector<int64_t> next_pos(P);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t n = prompts[p].size(), pad = L - n;
    for (int64_t t = 0; t < n; ++t) {
      ids[p][pad + t] = prompts[p][t];
      pos[p][pad + t] = t;
      valid[p][pad + t] = true;
    }
    next_pos[p] = n;
  }
  ids = ids.to(device);
  pos = pos.to(device);
  valid = valid.to(device);
  // Prefill, chunk by chunk over the queries and tile by tile over the keys (as StreamBP's
  // forward), so a long prompt never materializes L x L scores: causal over real tokens,
  // a padding query sees only itself.
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto chunk_mask = [&](int64_t s, int64_t e) {  // [P, e - s, e]
    auto qi = torch::arange(s, e, opts).view({-1, 1});
    auto kj = torch::arange(0, e, opts).view({1, -1});
    auto allowed = (kj <= qi).unsqueeze(0) & valid.slice(1, 0, e).unsqueeze(1);
    auto self = (kj == qi).unsqueeze(0) & valid.slice(1, s, e).logical_not().unsqueeze(2);
    return allowed | self;
  };
  auto x = m.embed(ids);
  auto rope = m.rotary().tables(pos, x);
  std::vector<KeysValues> cache;
  for (auto& layer : m.layer_list) {
    auto kv = layer->keys_values(x, rope);
    auto y = torch::empty_like(x);
    for (int64_t s = 0; s < L; s += kDefaultChunk) {
      const int64_t e = std::min(L, s + kDefaultChunk);
      Rope rope_q{rope.cos.slice(1, s, e), rope.sin.slice(1, s, e)};
      KeysValues prefix{kv.k.slice(2, 0, e), kv.v.slice(2, 0, e)};
      y.slice(1, s, e).copy_(layer->forward_queries(x.slice(1, s, e), rope_q, prefix, chunk_mask(s, e), kDefaultKeyChunk));
    }
    x = y;
    cache.push_back(kv);
  }
  auto logits = m.logits(x.slice(1, L - 1, L)).squeeze(1);  // [P, V]
  // n completions per prompt: repeat the prompt's state.
  const int64_t B = P * o.n;
  if (o.n > 1) {
    for (auto& kv : cache) {
      kv.k = kv.k.repeat_interleave(o.n, 0);
      kv.v = kv.v.repeat_interleave(o.n, 0);
    }
    valid = valid.repeat_interleave(o.n, 0);
    logits = logits.repeat_interleave(o.n, 0);
  }
  std::vector<int64_t> row_pos(B);
  for (int64_t b = 0; b < B; ++b) row_pos[b] = next_pos[b / o.n];
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<SampledCompletion> out(B);
  for (int64_t b = 0; b < B; ++b) out[b].prompt_index = b / o.n;
  std::vector<bool> finished(B, false);
  int64_t remaining = B;
  for (int64_t step = 0; step < o.max_tokens && remaining > 0; ++step) {
    auto z = logits.to(torch::kFloat64).cpu();
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
      tokens = at::multinomial(probs, 1, false, gen).squeeze(-1);
    }
    auto tok = tokens.accessor<int64_t, 1>();
    auto lp = logp.accessor<double, 2>();
    for (int64_t b = 0; b < B; ++b) {
      if (finished[b]) continue;
      out[b].tokens.push_back(tok[b]);
      out[b].logprobs.push_back(lp[b][tok[b]]);
      if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), tok[b]) != o.stop_tokens.end()) {
        finished[b] = true;
        out[b].finish_reason = "stop";
        --remaining;
      }
    }
    if (remaining == 0 || step + 1 == o.max_tokens) break;
    // Decode one token for every row (finished rows too: their results are ignored).
    auto new_pos = torch::tensor(row_pos, torch::kInt64).view({B, 1}).to(device);
    for (auto& p : row_pos) ++p;
    auto xt = m.embed(tokens.view({B, 1}).to(device));
    auto rope_t = m.rotary().tables(new_pos, xt);
    valid = torch::cat({valid, torch::ones({B, 1}, valid.options())}, 1);
    auto step_mask = valid.unsqueeze(1);  // [B, 1, keys]
    for (size_t l = 0; l < m.layer_list.size(); ++l) {
      auto& layer = m.layer_list[l];
      auto kv_new = layer->keys_values(xt, rope_t);
      cache[l].k = torch::cat({cache[l].k, kv_new.k}, 2);
      cache[l].v = torch::cat({cache[l].v, kv_new.v}, 2);
      xt = layer->forward_queries(xt, rope_t, cache[l], step_mask);
    }
    logits = m.logits(xt).squeeze(1);
  }
  for (auto& c : out) {
    if (c.finish_reason.empty()) c.finish_reason = "length";
  }
  return out;
}

}  // namespace streambp
