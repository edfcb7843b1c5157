// The analytic memory model of a step. It counts the tensors each engine keeps alive at
// its peak (see the engines' comments); streambp-bench compares it with measurements.
#include "streambp/estimate.h"

#include <algorithm>
#include <limits>

#include <torch/torch.h>

#include "streambp/context_parallel.h"
#include "streambp/error.h"

namespace streambp {
namespace {

// Sizes are computed in double and saturate at int64's maximum, so absurd lengths give an
// absurd (refused) estimate instead of an overflow that looks small.
int64_t Bytes(double x) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<int64_t>::max());
  if (!(x < kMax)) return std::numeric_limits<int64_t>::max();
  return x <= 0 ? 0 : static_cast<int64_t>(x);
}

double ParameterCount(const ModelConfig& c) {
  const double d = c.hidden_size, L = c.num_hidden_layers, kvd = c.kv_dim(), qd = c.q_dim();
  const double V = c.vocab_size;
  double params = V * d * (c.tie_word_embeddings ? 1 : 2) + d;
  params += L * (d * qd + 2 * d * kvd + qd * d + 2 * d);
  // Every expert's weights live on the device, even if a step routes to few.
  params += FeedForwardParameters(c, /*active=*/false);
  if (c.qk_norm) params += L * 2 * c.head_dim;
  if (c.sandwich_norms) params += L * 2 * d;  // Gemma3's pre/post-feedforward norms
  if (c.attention_bias) params += L * (qd + 2 * kvd);
  return params;
}

// A rank's positions under context parallel: the largest share, T/P rounded up.
int64_t RankLength(int64_t seq_len, int64_t context_parallel) {
  const int64_t P = std::max<int64_t>(context_parallel, 1);
  return (std::max<int64_t>(seq_len, 1) + P - 1) / P;
}

// The share of the whole sequence's K/V (and their gradients) one rank holds under context
// parallel: all of them when the ranks gather K/V, its kv heads' when they exchange heads
// (max(1, KVH / P) of the KVH).
double KeysValuesShare(const ModelConfig& c, int64_t context_parallel, EngineOptions::ContextExchange exchange) {
  if (context_parallel <= 1) return 1.0;
  bool heads = false;
  try {
    heads = ContextExchangesHeads(c, static_cast<int>(context_parallel), exchange);
  } catch (const Error&) {  // heads asked for where they do not split: the step refuses it
  }
  if (!heads) return 1.0;
  const double kv_heads = static_cast<double>(c.num_key_value_heads);
  return std::max(1.0, kv_heads / static_cast<double>(context_parallel)) / kv_heads;
}

// The flash kernel's backward on CUDA (bfloat16/float16 with a head size it takes, on the
// layers without a window; docs/gpu.md: Attention on CUDA) returns dK and dV over all the keys
// of its call: for the query chunk that ends at T, T positions. With grouped-query K/V it
// first writes them per query head and sums them after, so 2 B T (q_dim + kv_dim) elements are
// alive at once; without, dK and dV and the float32 copy the sink adds. One H200 measured a
// stream step of Qwen3-8B at T = 376832 at 1.67x an estimate without this term.
double FlashBackwardBytes(const ModelConfig& c, torch::Dtype dtype, c10::DeviceType device, double B, double T) {
  if (device != c10::DeviceType::CUDA || (dtype != torch::kBFloat16 && dtype != torch::kFloat16)) return 0.0;
  if (c.head_dim % 8 != 0 || c.head_dim > 256) return 0.0;
  bool global = false;
  for (int64_t i = 0; i < c.num_hidden_layers && !global; ++i) global = c.window(i) == 0;
  if (!global) return 0.0;
  const double e = static_cast<double>(c10::elementSize(dtype)), qd = c.q_dim(), kvd = c.kv_dim();
  return c.num_kv_groups() > 1 ? 2 * B * T * (qd + kvd) * e : 2 * B * T * kvd * e + B * T * kvd * 4;
}

}  // namespace

double FeedForwardParameters(const ModelConfig& c, bool active) {
  const double d = c.hidden_size, sparse = static_cast<double>(c.sparse_layers());
  const double experts = static_cast<double>(active ? c.num_experts_per_tok : c.num_experts);
  return (static_cast<double>(c.num_hidden_layers) - sparse) * 3 * d * static_cast<double>(c.intermediate_size) +
         sparse * (d * static_cast<double>(c.num_experts) + 3 * d * static_cast<double>(c.moe_intermediate_size) * experts);
}

double FeedForwardBytesPerRow(const ModelConfig& c, double e, double f) {
  const double sparse = static_cast<double>(c.sparse_layers());
  const double dense = sparse < static_cast<double>(c.num_hidden_layers) ? 5 * c.intermediate_size * e : 0.0;
  if (sparse == 0) return dense;
  const double k = c.num_experts_per_tok, d = c.hidden_size;
  const double moe = 3 * c.num_experts * f + k * (4 * d + 5 * c.moe_intermediate_size) * e;
  return std::max(dense, moe);
}

int64_t MemoryEstimate::total() const {
  return Bytes(static_cast<double>(weights_bytes) + static_cast<double>(gradient_bytes) +
               static_cast<double>(optimizer_bytes) + static_cast<double>(activation_bytes));
}

MemoryEstimate EstimateStepMemory(const ModelConfig& c, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                                  const EngineOptions& engine, const std::string& optimizer, const LoraConfig* lora,
                                  int64_t context_parallel) {
  if (context_parallel < 1) throw InvalidArgument("context_parallel must be >= 1, got " + std::to_string(context_parallel));
  if (context_parallel > 1 && engine.kind != EngineKind::kStream) {
    throw InvalidArgument("context parallel runs the stream engine only (engine " + EngineName(engine.kind) + ")");
  }
  const double e = static_cast<double>(c10::elementSize(dtype));
  const double f = dtype == torch::kFloat64 ? 8 : 4;  // softmax, norms and logits precision
  const double B = std::max<int64_t>(rows, 1), T = std::max<int64_t>(seq_len, 1), d = c.hidden_size;
  const double L = c.num_hidden_layers;
  const double H = c.num_attention_heads, kvd = c.kv_dim(), qd = c.q_dim(), F = c.intermediate_size;
  const double V = c.vocab_size;
  const double params = ParameterCount(c);
  MemoryEstimate m;
  // What trains (and has gradients and optimizer state): the model, or an adapter.
  const double trained = lora ? static_cast<double>(LoraParameterCount(c, *lora)) : params;
  const double te = lora ? (dtype == torch::kFloat64 ? 8.0 : 4.0) : e;
  m.weights_bytes = Bytes(params * e + (lora ? trained * te : 0.0));
  m.gradient_bytes = Bytes(trained * te);
  m.optimizer_bytes = optimizer == "adamw" ? Bytes(2 * trained * std::max(te, 4.0))
                      : optimizer == "sgd" ? Bytes(trained * std::max(te, 4.0))
                                           : 0;
  // Context parallel: the engine resolves its chunks for a rank's positions.
  const double P = static_cast<double>(context_parallel);
  const int64_t local_len = RankLength(seq_len, context_parallel);
  const auto chunks = ResolveChunks(engine, local_len, c, dtype);
  m.chunk = chunks.chunk;
  m.logits_chunk = chunks.logits_chunk;
  const double lc = chunks.logits_chunk;
  // lm_head + loss of one logits chunk: the logits and their gradient at f bytes, and one
  // more B x lc x V tensor of slack (streambp-bench measured ~2.1 of them alive at the
  // head's peak since the head takes the product's gradient as autograd passes it, without
  // retain_grad's copy; 3 before); below float32 the head's product in the model's dtype
  // too, before its upcast (bfloat16 measured: the estimate was 0.90x without it).
  const double logits_bytes = 3 * f + (e < f ? e : 0.0);
  const double head = logits_bytes * B * lc * V + 2 * B * lc * d * e;
  // One layer's graph for q positions against k keys: the attention's working set, Q, the
  // attention output, MLP activations, and `kv_copies` B x k x d_kv buffers of keys.
  // Materialized attention: scores, masked scores, probabilities and a gradient (4, as
  // measured) and the q x k mask. Tiled (query blocks of q_block x key tiles of `tile`): one
  // tile's scores/probabilities and its gradient (3) and its mask, plus the output and dQ
  // kept in the compute dtype for all q rows.
  auto layer_graph = [&](double q, double k, bool tiled, double q_block, double tile, double kv_copies) {
    const double attention = tiled ? 3 * B * H * q_block * tile * f + B * q_block * tile + 2 * B * q * qd * f
                                   : 4 * B * H * q * k * f + B * q * k;
    const double mlp = B * q * FeedForwardBytesPerRow(c, e, f);
    // Norm and residual outputs, projections, the q/k norms' saved tensors, and (tiled) the
    // scaled queries and contiguous K/V the attention keeps (measured on qwen3-shaped models).
    // Gemma3's two more norms keep their inputs and outputs: 4 more d-wide rows.
    const double per_row = (tiled ? 7 * d + 4 * qd + 2 * kvd + (c.qk_norm ? 3 * qd + 3 * kvd : 0) : 6 * d + 3 * qd) +
                           (c.sandwich_norms ? 4 * d : 0);
    const double projections = B * q * per_row * e + kv_copies * B * k * kvd * e;
    // Adapters: each adapted projection's input in the adapter's dtype and its r-wide A x.
    const double adapter = lora ? B * q * (5 * d + qd + F + 7 * static_cast<double>(lora->r)) * te : 0.0;
    return attention + mlp + projections + adapter;
  };
  // Td: a layer's input over this rank's positions; Tkv: K or V over the whole sequence.
  const double Tl = static_cast<double>(local_len);
  const double Td = B * Tl * d * e, Tkv = B * T * kvd * e;
  // K^, V^ (the model's dtype) and dK^, dV^ (the stream engine's grad sinks: float32, or
  // float64 for a float64 model) over the whole sequence.
  // Context parallel: every rank's (K/V gathered) or its kv heads' share (heads exchanged).
  const double kv_share = KeysValuesShare(c, context_parallel, engine.context_exchange);
  const double all_kv_and_grads = 2 * Tkv + 2 * B * T * kvd * std::max(e, 4.0);
  const double kv_and_grads = all_kv_and_grads * kv_share;
  // Alive through the whole step: the RoPE tables (cos, sin) and the batch's int64 tensors.
  const double per_step = B * T * (2 * c.head_dim * e + 6 * 8);
  const double tile = std::min<double>(chunks.key_chunk, T);
  // A stream layer's backward on CUDA: the flash backward's dK/dV over the whole sequence
  // (context parallel with heads exchanged: a rank's share of the heads). Kept attention
  // runs the tiled kernel, which has no such transient.
  const double flash = engine.keep_attention ? 0.0 : FlashBackwardBytes(c, dtype, engine.device, B, T) * kv_share;
  // Context parallel: the rank's own K/V (before the exchange) and its rows' dK/dV (after
  // it) beside the whole-sequence ones; heads exchanged, a chunk's queries and outputs in
  // the exchange's buffers (sent, received, and both ways again for the outputs).
  const double own_kv = context_parallel > 1 ? all_kv_and_grads / P : 0.0;
  const double exchange = kv_share < 1.0 ? 4 * B * static_cast<double>(chunks.chunk) * qd * e : 0.0;
  // The stream engine's top layer with the head inside it (objectives without a sequence
  // pass; the larger of the two is what the estimate takes): `stored` layer inputs (on the
  // device dL/dx takes the top one's place), K^, V^, dK^, dV^; a chunk's attention half
  // (x1, its gradient, the kept output and log-sum-exp, the normalized rows); one block of at
  // most logits-chunk rows through the feed-forward (its graph, y and dL/dy) and the head.
  const double block = std::min<double>(lc, chunks.chunk);
  const double block_head = logits_bytes * B * block * V + 2 * B * block * d * e;
  const bool fused_top = context_parallel == 1 && !engine.recompute_kv_per_chunk && !c.sparse_layer(c.num_hidden_layers - 1);
  auto top_with_head = [&](double stored) {
    if (!fused_top) return 0.0;
    return stored * Td + kv_and_grads + B * chunks.chunk * (3 * d * e + (qd + H) * f) +
           B * block * (FeedForwardBytesPerRow(c, e, f) + 4 * d * e) + block_head;
  };
  if (engine.kind == EngineKind::kFull) {
    m.activation_bytes = Bytes(L * layer_graph(T, T, false, T, T, 4) + 2 * Td + 3 * B * T * V * f);
  } else if (engine.kind == EngineKind::kCheckpoint) {
    const double graph = engine.tiled_attention ? layer_graph(T, T, true, chunks.chunk, tile, 4)
                                                : layer_graph(T, T, false, T, T, 4);
    // Stored: the inputs of layers 1..L-1 (layer 0's is the embedding, looked up again) and h_last.
    m.activation_bytes = Bytes(L * Td + 2 * Td + std::max(graph, head) + (engine.tiled_attention ? per_step : 0));
  } else if (!engine.offload_layer_inputs) {
    // The head runs with the inputs of layers 1..L-1 (layer 0's is the embedding, looked up
    // again) and h_last (dL/dh_last takes its place chunk by chunk) alive; a layer's backward
    // with the inputs below it, g (dx takes its place chunk by chunk), K^, V^, dK^, dV^ (the
    // attention adds its K/V gradients there in place) and one chunk.
    // keep_attention: every layer's attention output and log-sum-exp (compute dtype) from
    // the forward on, each freed after its layer's backward (the top layer's backward has them all).
    const double kept = engine.keep_attention ? L * B * Tl * (qd + H) * f : 0.0;
    const double head_phase = L * Td + head + kept;
    const double layer_phase = (L - 1) * Td + Td + kv_and_grads + own_kv + exchange + kept + flash +
                               layer_graph(chunks.chunk, T, true, chunks.chunk, tile, 0);
    m.activation_bytes = Bytes(std::max({head_phase, layer_phase, top_with_head(L - 1) + kept}) + per_step);
  } else {
    // Layer inputs and h_last in the second tier. On the device: the forward's x (being
    // copied out), y and K/V; the head's dL/dh_last; a layer's g/dx, K^, V^, dK^, dV^ and one
    // chunk; and two chunks of rows read back (the one in use, the one prefetched).
    const double rows = 2 * B * std::max<double>(chunks.chunk, lc) * d * e;
    const double forward_phase =
        2 * Td + 2 * Tkv * kv_share + own_kv / 2 + exchange + layer_graph(chunks.chunk, T, true, chunks.chunk, tile, 0);
    const double head_phase = Td + head;
    const double layer_phase =
        Td + kv_and_grads + own_kv + exchange + flash + layer_graph(chunks.chunk, T, true, chunks.chunk, tile, 0);
    m.activation_bytes =
        Bytes(std::max({forward_phase, head_phase, layer_phase, top_with_head(1)}) + rows + per_step);
    m.offloaded_bytes = Bytes(L * Td);  // the inputs of layers 1..L-1 and h_last
  }
  m.key_chunk = chunks.key_chunk;
  return m;
}

MemoryEstimate EstimateForwardMemory(const ModelConfig& c, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                                     int64_t logits_chunk, c10::DeviceType device, int64_t context_parallel) {
  // TokenLogprobs: the no-grad StreamBP forward (x, y, K, V of the whole batch and one query
  // chunk's working set), then the head chunk by chunk, and the float64 [rows, T] result.
  // Context parallel: x, y and the chunks of a rank's positions; K, V of the whole sequence
  // (gathered) beside the rank's own.
  if (context_parallel < 1) throw InvalidArgument("context_parallel must be >= 1, got " + std::to_string(context_parallel));
  const double e = static_cast<double>(c10::elementSize(dtype)), f = dtype == torch::kFloat64 ? 8 : 4;
  const double B = std::max<int64_t>(rows, 1), T = std::max<int64_t>(seq_len, 1), d = c.hidden_size;
  const double H = c.num_attention_heads, kvd = c.kv_dim(), V = c.vocab_size;
  const int64_t local_len = RankLength(seq_len, context_parallel);
  const double Tl = static_cast<double>(local_len);
  const auto defaults = DefaultChunks(c, dtype, local_len, device);
  const double q = std::min<double>(defaults.chunk, Tl), tile = std::min<double>(defaults.key_chunk, T);
  const double lc = std::min<double>(logits_chunk > 0 ? logits_chunk : defaults.logits_chunk, Tl);
  MemoryEstimate m;
  m.weights_bytes = Bytes(ParameterCount(c) * e);
  const double own_kv = context_parallel > 1 ? 2 * B * Tl * kvd * e : 0.0;
  const double kv_share = KeysValuesShare(c, context_parallel, EngineOptions::ContextExchange::kAuto);
  const double exchange = kv_share < 1.0 ? 4 * B * q * c.q_dim() * e : 0.0;
  const double layer = 3 * B * Tl * d * e + 2 * B * T * kvd * e * kv_share + own_kv + exchange +
                       3 * B * H * q * tile * f + B * q * FeedForwardBytesPerRow(c, e, f);
  const double head = (3 * f + (e < f ? e : 0.0)) * B * lc * V + B * Tl * d * e;  // as the step's head
  m.activation_bytes = Bytes(std::max(layer, head) + 2 * B * T * 8);
  m.chunk = static_cast<int64_t>(q);
  m.logits_chunk = static_cast<int64_t>(lc);
  m.key_chunk = static_cast<int64_t>(tile);
  return m;
}

MemoryEstimate EstimateSampleMemory(const ModelConfig& c, torch::Dtype dtype, int64_t prompts,
                                    int64_t longest_prompt, int64_t n, int64_t max_tokens) {
  // Prefill of P prompts (left-padded to the longest, L): as the no-grad forward, plus the
  // K/V cache of every layer. Decode of B = P n rows up to L + M positions: the cache of
  // every layer, one layer's cache copied by the append, the attention scores of one step,
  // and the logits of every row (float32, then float64 log-probs and probabilities on the CPU).
  const double e = static_cast<double>(c10::elementSize(dtype)), f = dtype == torch::kFloat64 ? 8 : 4;
  const double P = std::max<int64_t>(prompts, 1), Lp = std::max<int64_t>(longest_prompt, 1);
  const double B = P * std::max<int64_t>(n, 1), M = std::max<int64_t>(max_tokens, 1), NL = c.num_hidden_layers;
  const double kvd = c.kv_dim(), H = c.num_attention_heads, V = c.vocab_size;
  const auto prefill = EstimateForwardMemory(c, dtype, prompts, longest_prompt, 1);
  const double prefill_cache = 2 * NL * P * Lp * kvd * e;
  const double cache = 2 * NL * B * (Lp + M) * kvd * e;
  const double decode = cache + 2 * B * (Lp + M) * kvd * e + 3 * B * H * (Lp + M) * f + B * V * (f + 3 * 8);
  MemoryEstimate m;
  m.weights_bytes = prefill.weights_bytes;
  m.activation_bytes = Bytes(std::max(static_cast<double>(prefill.activation_bytes) + prefill_cache,
                                      decode + prefill_cache));
  return m;
}

EngineOptions ChooseChunks(const ModelConfig& config, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                           int64_t budget_bytes, const std::string& optimizer, const LoraConfig* lora,
                           const EngineOptions& like, int64_t context_parallel) {
  // From the defaults for this length (a rank's positions under context parallel) down: every
  // size halves at each try (a logits chunk or key tile already at its smallest stays there).
  const int64_t local_len = RankLength(seq_len, context_parallel);
  const auto defaults = DefaultChunks(config, dtype, local_len, like.device);
  auto sizes = [&](int64_t halvings) {
    EngineOptions o = like;
    o.chunk = std::max<int64_t>(defaults.chunk >> halvings, 16);
    o.logits_chunk = std::max<int64_t>(defaults.logits_chunk >> halvings, 16);
    o.key_chunk = std::max<int64_t>(defaults.key_chunk >> halvings, 16);
    // As ResolveChunks: the stream engine's logits chunk is at most its query chunk.
    if (o.kind == EngineKind::kStream) o.logits_chunk = std::min(o.logits_chunk, o.chunk);
    return o;
  };
  for (int64_t halvings = 0;; ++halvings) {
    auto o = sizes(halvings);
    const bool smallest = o.chunk == 16 && o.logits_chunk == 16 && o.key_chunk == 16;
    if (budget_bytes <= 0 ||
        EstimateStepMemory(config, dtype, rows, seq_len, o, optimizer, lora, context_parallel).total() <=
            budget_bytes) {
      return o;
    }
    if (smallest) {
      // keep_attention buys time with memory: where no sizes fit with it, it is dropped.
      if (like.keep_attention) {
        EngineOptions without = like;
        without.keep_attention = false;
        return ChooseChunks(config, dtype, rows, seq_len, budget_bytes, optimizer, lora, without, context_parallel);
      }
      return o;  // the smallest tiles when nothing fits
    }
  }
}

}  // namespace streambp
