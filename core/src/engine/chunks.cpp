// The chunk sizes a step uses: DefaultChunks' rule (docs/architecture.md: Chunk sizes) and
// ResolveChunks, which fills in what EngineOptions leave unset.
#include <algorithm>
#include <functional>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/estimate.h"

namespace streambp {
namespace {

// The largest power of two in [lo, hi] for which fits(x) holds; lo when none does.
int64_t LargestFitting(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits) {
  int64_t x = lo;
  while (x * 2 <= hi && fits(x * 2)) x *= 2;
  return x;
}

}  // namespace

ResolvedChunks DefaultChunks(const ModelConfig& c, torch::Dtype dtype, int64_t seq_len, c10::DeviceType device) {
  const double e = static_cast<double>(c10::elementSize(dtype));
  const double f = dtype == torch::kFloat64 ? 8 : 4;  // softmax and logits precision
  const double T = static_cast<double>(std::max<int64_t>(seq_len, 1));
  const double d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), H = c.num_attention_heads;
  const double stored = T * (c.num_hidden_layers * d + 4 * kvd) * e;
  const double slack = stored / 4;
  // A query chunk's graph per position (MLP, norms and projections, the attention's output
  // and dQ) and its score tile: as the memory estimate counts them (core/src/memory/estimate.cpp).
  const double per_position = FeedForwardBytesPerRow(c, e, f) +
                              (7 * d + 4 * qd + 2 * kvd + (c.qk_norm ? 3 * qd + 3 * kvd : 0)) * e + 2 * qd * f;
  // On the CPU a stream step's time falls with the query chunk (each chunk runs the layer's
  // position-wise parts, the weight-gradient GEMMs over c rows and their accumulation, and a
  // few hundred small ops once), while a key tile only sizes the score tiles: the chunk grows
  // first, with key tiles as long as itself, into twice the room, then its key tiles grow, up to
  // kDefaultCpuKeyChunk (longer tiles leave the cache: at T = 8192, tiles of 512 made the step
  // ~6% slower than 256, 128 slower again). On CUDA (fused attention) the chunk grows with key
  // tiles of twice its length.
  const bool cuda = device == c10::DeviceType::CUDA;
  const double chunk_room = cuda ? slack : 2 * slack;
  auto fits_cost = [&](int64_t chunk, int64_t tile) {
    const double q = static_cast<double>(chunk), k = static_cast<double>(tile);
    return q * per_position + 3 * H * q * k * f + q * k;
  };
  auto fits = [&](int64_t chunk, int64_t tile) { return fits_cost(chunk, tile) <= chunk_room; };
  auto longest_tile = [](int64_t chunk) { return std::min<int64_t>(2 * chunk, kDefaultKeyChunk); };
  int64_t chunk = 0, key = 0;
  if (cuda) {
    chunk = LargestFitting(kMinDefaultChunk, kDefaultCudaChunk, [&](int64_t q) { return fits(q, longest_tile(q)); });
    key = longest_tile(chunk);
  } else {
    chunk = LargestFitting(kMinDefaultChunk, kDefaultChunk,
                           [&](int64_t q) { return fits(q, std::min(q, kDefaultCpuKeyChunk)); });
    const int64_t first = std::min(chunk, kDefaultCpuKeyChunk);
    key = LargestFitting(first, std::max(first, std::min(longest_tile(chunk), kDefaultCpuKeyChunk)),
                         [&](int64_t k) { return fits(chunk, k); });
  }
  // A logits chunk of c is counted at 4 c V floats (logits and their gradient, ~2 measured,
  // and slack); it may take S / 4. It may also take the room a layer's backward holds anyway:
  // the head runs while every stored layer input is alive, as that backward does, which holds
  // K^, V^ and their gradients over T and the chunk's working set besides. The stream
  // engine's top layer runs the head beside K^, V^ and their gradients, with the chunk's graph
  // down to its attention half's rows and one block's feed-forward and dL/dx in the stored
  // input's place: that room must hold it too. A chunk within both rooms (counted as the
  // memory estimate counts the head: below float32 the product before its upcast too, and two
  // c x d rows) costs the step no peak, and its GEMMs over more rows run faster (the small
  // preset at T = 8192: 128 rows where S / 4 allows 64, the head's GEMMs 11-22% faster on 2
  // cores, the peak unchanged). The larger of the two wins.
  const double layer_room = fits_cost(chunk, key) + 2 * T * kvd * (e + std::max(e, 4.0));
  const double top_room = fits_cost(chunk, key) + T * d * e - static_cast<double>(chunk) * (3 * d * e + (qd + H) * f);
  auto logits_fit = [&](int64_t lc) {
    const double rows = static_cast<double>(lc);
    const double head = (3 * f + (e < f ? e : 0.0)) * rows * c.vocab_size + 2 * rows * d * e;
    const double block = rows * (FeedForwardBytesPerRow(c, e, f) + 4 * d * e);
    return 4 * rows * c.vocab_size * f <= slack || (head <= layer_room && head + block <= top_room);
  };
  const int64_t logits = LargestFitting(kMinDefaultLogitsChunk, kDefaultLogitsChunk, logits_fit);
  const int64_t limit = std::max<int64_t>(seq_len, 1);
  return {std::min(chunk, limit), std::min(logits, limit), std::min(key, limit)};
}

ResolvedChunks ResolveChunks(const EngineOptions& options, int64_t seq_len, const ModelConfig& config,
                             torch::Dtype dtype) {
  if (options.chunk < 0) throw InvalidArgument("chunk must be >= 0 (0 = default)");
  if (options.logits_chunk < -1) throw InvalidArgument("logits_chunk must be >= -1");
  if (options.key_chunk < 0) throw InvalidArgument("key_chunk must be >= 0 (0 = default)");
  ResolvedChunks r{seq_len, seq_len, seq_len};
  const bool chunks_queries =
      options.kind == EngineKind::kStream || (options.kind == EngineKind::kCheckpoint && options.tiled_attention);
  if (chunks_queries) {
    const auto defaults = DefaultChunks(config, dtype, seq_len, options.device);
    r.chunk = options.chunk > 0 ? options.chunk : defaults.chunk;
    r.key_chunk = options.key_chunk > 0 ? options.key_chunk : defaults.key_chunk;
    r.logits_chunk = options.logits_chunk > 0    ? options.logits_chunk
                     : options.logits_chunk == 0 ? seq_len
                                                 : defaults.logits_chunk;
  } else if (options.kind == EngineKind::kCheckpoint) {
    r.logits_chunk = options.logits_chunk > 0 ? options.logits_chunk : seq_len;
  }
  r.chunk = std::clamp<int64_t>(r.chunk, 1, std::max<int64_t>(seq_len, 1));
  r.logits_chunk = std::clamp<int64_t>(r.logits_chunk, 1, std::max<int64_t>(seq_len, 1));
  r.key_chunk = std::clamp<int64_t>(r.key_chunk, 1, std::max<int64_t>(seq_len, 1));
  // The stream engine's top layer runs the head on its query chunk's rows (docs/architecture.md:
  // Engines): a logits chunk is at most a query chunk, on every path, so that the memory
  // estimate does not depend on the objective.
  if (options.kind == EngineKind::kStream) r.logits_chunk = std::min(r.logits_chunk, r.chunk);
  return r;
}

}  // namespace streambp
