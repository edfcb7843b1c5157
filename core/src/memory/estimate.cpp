// The analytic memory model of a step. It counts the tensors each engine keeps alive at
// its peak (see the engines' comments); streambp-bench compares it with measurements.
#include "streambp/estimate.h"

#include <algorithm>

#include <torch/torch.h>

namespace streambp {

MemoryEstimate EstimateStepMemory(const ModelConfig& c, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                                  const EngineOptions& engine, const std::string& optimizer) {
  const int64_t e = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t f = dtype == torch::kFloat64 ? 8 : 4;  // softmax, norms and logits precision
  const int64_t B = rows, T = seq_len, d = c.hidden_size, L = c.num_hidden_layers;
  const int64_t H = c.num_attention_heads, kvd = c.kv_dim(), qd = c.q_dim(), F = c.intermediate_size;
  const int64_t V = c.vocab_size;
  int64_t params = V * d * (c.tie_word_embeddings ? 1 : 2) + d;
  params += L * (d * qd + 2 * d * kvd + qd * d + 3 * d * F + 2 * d);
  if (c.qk_norm) params += L * 2 * c.head_dim;
  if (c.attention_bias) params += L * (qd + 2 * kvd);
  MemoryEstimate m;
  m.weights_bytes = params * e;
  m.gradient_bytes = params * e;
  m.optimizer_bytes = optimizer == "adamw" ? 2 * params * std::max<int64_t>(e, 4)
                      : optimizer == "sgd" ? params * std::max<int64_t>(e, 4)
                                           : 0;
  const auto chunks = ResolveChunks(engine, T);
  m.chunk = chunks.chunk;
  m.logits_chunk = chunks.logits_chunk;
  const int64_t lc = chunks.logits_chunk;
  // lm_head + loss of one logits chunk: logits, log-softmax, their gradients, at f bytes
  // (streambp-bench measured ~4 B x lc x V tensors alive at the head's peak).
  const int64_t head = 4 * B * lc * V * f + 2 * B * lc * d * e;
  // One layer's graph for q positions against k keys visited in tiles of `tile`: scores,
  // probabilities and their gradient for one tile (f bytes), the mask over all k keys,
  // Q/attention output/MLP activations, and `kv_copies` B x k x d_kv buffers of keys.
  auto layer_graph = [&](int64_t q, int64_t k, int64_t tile, int64_t kv_copies) {
    // Materialized: scores, masked scores, probabilities and a gradient (4, as measured);
    // tiled: one tile's scores/probabilities and its gradient (3).
    const int64_t attention = (tile < k ? 3 : 4) * B * H * q * tile * f + B * q * k;
    const int64_t mlp = 5 * B * q * F * e;
    const int64_t projections = B * q * (6 * d + 3 * qd) * e + kv_copies * B * k * kvd * e;
    return attention + mlp + projections;
  };
  const int64_t Td = B * T * d * e, Tkv = B * T * kvd * e;
  if (engine.kind == EngineKind::kFull) {
    m.activation_bytes = L * layer_graph(T, T, T, 4) + 2 * Td + 3 * B * T * V * f;
  } else if (engine.kind == EngineKind::kCheckpoint) {
    m.activation_bytes = (L + 1) * Td + 3 * Td + std::max(layer_graph(T, T, T, 4), head);
  } else {
    // The head runs with every layer input, h_last and dL/dh_last alive; a layer's backward
    // with the inputs below it, g, dx, K^, V^, dK^, dV^ and one chunk, whose prefix key and
    // value gradients (2 x d_kv) are transient.
    const int64_t head_phase = (L + 2) * Td + head;
    const int64_t layer_phase = L * Td + 2 * Td + 4 * Tkv +
                                layer_graph(chunks.chunk, T, std::min(chunks.key_chunk, T), 2);
    m.activation_bytes = std::max(head_phase, layer_phase);
  }
  m.key_chunk = chunks.key_chunk;
  return m;
}

EngineOptions ChooseChunks(const ModelConfig& config, torch::Dtype dtype, int64_t rows, int64_t seq_len,
                           int64_t budget_bytes, const std::string& optimizer) {
  EngineOptions best{EngineKind::kStream, 16, 16};
  for (int64_t chunk = kDefaultChunk; chunk >= 16; chunk /= 2) {
    EngineOptions o{EngineKind::kStream, chunk, std::min<int64_t>(2 * chunk, kDefaultLogitsChunk)};
    o.key_chunk = std::min<int64_t>(2 * chunk, kDefaultKeyChunk);
    if (budget_bytes <= 0 || EstimateStepMemory(config, dtype, rows, seq_len, o, optimizer).total() <= budget_bytes) {
      return o;
    }
  }
  return best;
}

}  // namespace streambp
