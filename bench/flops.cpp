// The analytic GEMM FLOPs of a step (AnalyticFlops): what the bench's GFLOP/s and shares of
// the GEMM reference divide by, checked against the profiler's count (ctest bench.flops).
#include <algorithm>

#include <torch/torch.h>

#include "bench.h"
#include "streambp/estimate.h"

namespace streambp::bench {
namespace {

// (query, key) pairs the tiled kernel's products cover in one row of T positions for a layer
// with window w (T: none), query blocks of `chunk` and key tiles of `key_tile`
// (core/src/model/tiled_attention.cpp, written here from the geometry): a block's key tiles
// run from the first key its first query sees (the oldest in its window, its sequence's
// start: AttentionPattern::key_start) to its end; with `pieces`, a tile that masks some pair
// runs in four pieces of the block's rows, each over the keys from its first row's first key
// to its last row, where that covers at most 7/8 of the tile (pieces whose rows see none of
// their keys are skipped).
template <typename SequenceStart>
double VisitedPairs(int64_t T, int64_t chunk, int64_t key_tile, int64_t w, const SequenceStart& sequence_start,
                    bool pieces) {
  auto first_key = [&](int64_t q) { return std::max<int64_t>(sequence_start(q), q - w + 1); };
  auto sees_some = [&](int64_t a, int64_t b, int64_t k0, int64_t k1) {
    for (int64_t q = a; q < b; ++q) {
      if (std::max(first_key(q), k0) <= std::min(q, k1 - 1)) return true;
    }
    return false;
  };
  double pairs = 0;
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min<int64_t>(T, s + chunk), step = (e - s + 3) / 4;
    for (int64_t k0 = first_key(s); k0 < e; k0 += key_tile) {
      const int64_t k1 = std::min(e, k0 + key_tile);
      const double tile = static_cast<double>(e - s) * static_cast<double>(k1 - k0);
      const bool whole = k1 - 1 <= s && e - 1 - k0 < w && sequence_start(e - 1) <= k0;
      if (!pieces || whole || e - s < 2) {
        pairs += tile;
        continue;
      }
      double area = 0, seen = 0;
      for (int64_t a = s; a < e; a += step) {
        const int64_t b = std::min(e, a + step), pk0 = std::max(k0, first_key(a)), pk1 = std::min(k1, b);
        if (pk0 >= pk1) continue;
        const double piece = static_cast<double>(b - a) * static_cast<double>(pk1 - pk0);
        area += piece;
        if (sees_some(a, b, pk0, pk1)) seen += piece;
      }
      pairs += 8 * area <= 7 * tile ? seen : tile;
    }
  }
  return pairs;
}

}  // namespace

StepFlops AnalyticFlops(const ModelConfig& c, torch::Dtype dtype, int64_t B, int64_t T, const Variant& v,
                        bool sequence_pass, int64_t pack) {
  const double d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  const double V = c.vocab_size, L = c.num_hidden_layers, H = c.num_attention_heads, hd = c.head_dim;
  const double kv_params = 2 * d * kvd;
  // The feed-forward parameters a token goes through, per layer on average: a dense MLP's, or
  // a sparse layer's router and its k experts (the active parameters of a mixture of experts).
  const double active_ff = FeedForwardParameters(c, /*active=*/true) / L;
  const double layer_params = d * qd + kv_params + qd * d + active_ff;
  const double q_params = layer_params - kv_params;
  const double rows = static_cast<double>(B), n = static_cast<double>(B) * T;
  const double head = 2 * n * d * V;
  auto attention = [&](double pairs) { return 4 * rows * H * hd * pairs; };  // QK^T and PV
  const double square = attention(static_cast<double>(T) * T);
  const double seq_head = sequence_pass ? head : 0;
  // Query blocks (stream chunks, checkpoint:tiled's attention blocks) attend to the keys up to
  // their last position only, and a sliding layer's to the last W of them: per layer, the
  // (query, key) pairs the model defines (causal, within the window) and those the chunked
  // engines visit.
  const auto chunks = ResolveChunks(v.options, T, c, dtype);
  // Packed rows (SyntheticBatch): `pack` sequences of T / pack positions (the last the rest);
  // a query sees only its own sequence's keys.
  pack = std::clamp<int64_t>(pack, 1, T);
  const int64_t seq = T / pack;
  auto sequence_start = [&](int64_t p) { return std::min(p / seq, pack - 1) * seq; };
  // Pieces only where the products run in float32 or float64 (a bfloat16 step's tiles run whole).
  const bool pieces = dtype == torch::kFloat32 || dtype == torch::kFloat64;
  double causal_attention = 0, visited_attention = 0, top_visited = 0, prefix_rows = 0;
  for (int64_t s = 0; s < T; s += chunks.chunk) prefix_rows += static_cast<double>(std::min<int64_t>(T, s + chunks.chunk));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t w = c.window(l) > 0 ? std::min<int64_t>(c.window(l), T) : T;
    for (int64_t i = 0; i < pack; ++i) {  // per sequence of the row: causal within the window
      const double n = static_cast<double>(i + 1 < pack ? seq : T - (pack - 1) * seq);
      const double W = std::min(static_cast<double>(w), n);
      causal_attention += attention(W * (W + 1) / 2 + (n - W) * W);
    }
    top_visited = attention(VisitedPairs(T, chunks.chunk, chunks.key_chunk, w, sequence_start, pieces));
    visited_attention += top_visited;
  }
  // The recomputes backpropagate a layer's output without reading it: the down projection's
  // forward product is left out where no norm reads the MLP's output (a dense layer without
  // Gemma3's post-feedforward norm; DecoderLayerImpl::backward_queries_normed).
  double unread = 0, top_unread = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    top_unread = !c.sparse_layer(l) && !c.sandwich_norms ? 2 * n * d * static_cast<double>(c.intermediate_size) : 0.0;
    unread += top_unread;
  }
  StepFlops f;
  f.model = 3 * (L * 2 * n * layer_params + causal_attention + head);
  // Tiled attention's backward recomputes the probabilities: QK^T, dV, dP, dQ, dK = 2.5x
  // the forward's two products. Materialized attention computes every pair, window or not.
  if (v.engine == "full") {
    f.executed = 3 * (L * (2 * n * layer_params + square) + head);
  } else if (v.engine == "checkpoint" && v.options.tiled_attention) {
    f.executed = L * 4 * 2 * n * layer_params - unread + 4.5 * visited_attention + 3 * head + seq_head;
  } else if (v.engine == "checkpoint") {
    f.executed = 4 * L * (2 * n * layer_params + square) - unread + 3 * head + seq_head;
  } else {
    // Forward; then per layer K/V without a graph, each chunk recomputed with a graph and
    // backpropagated, and the K/V backward (recomputed with a graph, unread: V's projection
    // and K's where no k-norm reads it leave out their forward products,
    // AttentionImpl::keys_values).
    const double kv_unread = (c.qk_norm ? 1 : 2) * 2 * n * d * kvd;
    const double kv_backward = v.options.recompute_kv_per_chunk
                                   ? 3 * 2 * rows * prefix_rows * kv_params
                                   : 2 * n * kv_params + 3 * 2 * n * kv_params - kv_unread;
    // keep_attention: the backward runs the attention's backward from the kept output, without
    // its forward again (QK^T, dV, dP, dQ, dK after the forward's two: 3.5).
    const double attention_passes = v.options.keep_attention ? 3.5 : 4.5;
    f.executed = L * (2 * n * layer_params + kv_backward + 3 * 2 * n * q_params) - unread +
                 attention_passes * visited_attention + 3 * head + seq_head;
    // The top layer with the head inside its backward (a dense top layer, no sequence pass, not
    // the ablation; core/src/engine/stream.cpp: TopLayerWithHead): no forward before it; its
    // chunks run the attention half once without a graph (the forward's products) and again
    // with one, the attention's tiles replayed (q and o projections only), and the
    // feed-forward's output is read (the down projection's forward runs).
    const int64_t top = c.num_hidden_layers - 1;
    if (!sequence_pass && !v.options.recompute_kv_per_chunk && !c.sparse_layer(top)) {
      // Its attention: once without a graph, then (on CUDA, not replayed) with one, and backward.
      const double top_passes = v.options.device == c10::DeviceType::CPU ? 3.5 : 4.5;
      f.executed += 2 * n * 2 * d * qd + top_unread - 2 * n * layer_params + (top_passes - attention_passes) * top_visited;
    }
  }
  return f;
}

}  // namespace streambp::bench
