// stream: StreamBP (docs/architecture.md: Engines). Per layer, given the stored input x and g = dL/dy:
//  1. K/V for the whole sequence from x, without a graph: the leaves K^, V^.
//  2. For each query chunk [s, e), the last first: h = norm(x[s:e]) once with a graph;
//     recompute y[s:e] from x[s:e], h, K^[:e], V^[:e] with a graph (queries never meet later
//     keys; keys are visited tile by tile with an online softmax, so scores are chunk x
//     key_chunk; y's value is never read, so the MLP's down projection runs its backward
//     alone: DecoderLayerImpl::backward_queries_normed) and backprop g[s:e]; this accumulates the parameter gradients, dK^ and dV^
//     (rows [0, e)), dh and the residual's part of dx. Every chunk after this one has run,
//     so dK^[s:e], dV^[s:e] are complete: backprop them through the chunk's K/V recomputed
//     from h (projections and RoPE act on each position alone, so the chunks' VJPs sum to
//     the whole K/V VJP and no B x T K/V graph ever exists; nothing reads these K/V, so V's
//     projection, and K's without a k-norm, leave out their forward products), then dh
//     through the norm. The chunk's graphs are freed.
// The sum of the chunk VJPs is the VJP of the whole layer, so the gradients are exact. The
// input norm runs once per chunk in each pass; queries and K/V share it.
// What lives across a layer's backward is x (stored), g (which becomes dx chunk by chunk),
// K^, V^, dK^, dV^: bytes·T·(L·d + 4·d_kv) at the top layer (the inputs of layers 1..L-1
// and g; layer 0's input is the token embedding, looked up again when its backward reads
// it), plus one chunk's working set. With the
// layer inputs offloaded (issue 17) the stored inputs and the final hidden states live in
// a second tier (a scratch file, pinned host memory) and come back a chunk at a time, so
// the device holds bytes·T·(d + 4·d_kv) plus the chunk (the forward: x, y, K, V); the
// arithmetic is the same, so the gradients are bit-identical.
// Context parallel (a SequenceShard): x, g and the chunks are the rank's positions; K^, V^
// (and dK^, dV^) are the whole sequence's, of all heads when gathered, of the rank's heads
// when heads are exchanged (each chunk's attention then goes through the exchange). A
// rank's dK^, dV^ are complete only after every rank's queries ran, so there the K/V
// backward is a third pass, in order, after the exchange of dK^, dV^.
#include "engine_common.h"
#include "../model/weight_gradients.h"
#include "layer_store.h"
#include "streambp/error.h"

namespace streambp::engine {
namespace {

torch::Tensor Leaf(const torch::Tensor& t) { return t.detach().requires_grad_(true); }

// The engine's slots: 0..L-1 the layer inputs, L the final hidden states. Layer 0's input
// is the embedding of the tokens: not stored, but looked up again a chunk at a time when the
// backward reads it (B x T x d less at the peak, and in the second tier). Slots 1..L live in
// `inner`'s slots 0..L-1.
class LayerInputs final : public LayerStore {
 public:
  LayerInputs(CausalLMImpl& model, const torch::Tensor& input_ids, std::unique_ptr<LayerStore> inner)
      : model_(model), ids_(input_ids), inner_(std::move(inner)) {}
  void put(int64_t i, torch::Tensor x) override {
    if (i > 0) inner_->put(i - 1, std::move(x));
  }
  torch::Tensor read(int64_t i, int64_t s, int64_t e) override {
    if (i > 0) return inner_->read(i - 1, s, e);
    torch::NoGradGuard no_grad;
    return model_.embed(ids_.slice(1, s, e));
  }
  void prefetch(int64_t i, int64_t s, int64_t e) override {
    if (i > 0) inner_->prefetch(i - 1, s, e);
  }
  void drop(int64_t i) override {
    if (i > 0) inner_->drop(i - 1);
  }
  int64_t offloaded_bytes() const override { return inner_->offloaded_bytes(); }
  bool on_device() const override { return inner_->on_device(); }

 private:
  CausalLMImpl& model_;
  torch::Tensor ids_;
  std::unique_ptr<LayerStore> inner_;
};

// Writes the K/V of positions [s, s + c) into `all`, the buffers of all T positions
// (allocated at the first write).
void PutKeysValues(KeysValues& all, const KeysValues& part, int64_t T, int64_t s) {
  if (!all.k.defined()) {
    auto sizes = part.k.sizes().vec();
    sizes[2] = T;
    all = {torch::empty(sizes, part.k.options()), torch::empty(sizes, part.v.options())};
  }
  const int64_t e = s + part.k.size(2);
  all.k.slice(2, s, e).copy_(part.k);
  all.v.slice(2, s, e).copy_(part.v);
}

// K/V of all T positions without a graph, chunk by chunk (norm, projections and RoPE act on
// each position alone), so no B x T intermediate of their computation exists; `rows(s, e)`
// gives the layer input's rows [s, e), in order.
KeysValues KeysValuesInChunks(DecoderLayerImpl& layer, int64_t T, int64_t chunk, const Rope& rope,
                              const std::function<torch::Tensor(int64_t, int64_t)>& rows) {
  torch::NoGradGuard no_grad;
  KeysValues out;
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    PutKeysValues(out, layer.keys_values(rows(s, e), rope.slice(s, e)), T, s);
  }
  return out;
}

// dK^, dV^ zeroed: every chunk's attention backward adds its part here in place (the grad
// sink), in the attention's compute dtype.
KeysValues GradSink(const KeysValues& kv_hat, const torch::Tensor& grad) {
  const auto cd = grad.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  return {torch::zeros(kv_hat.k.sizes(), kv_hat.k.options().dtype(cd)),
          torch::zeros(kv_hat.v.sizes(), kv_hat.v.options().dtype(cd))};
}

// The end of a query chunk [s, e) of a layer's backward, its queries' part done: chunks [s, T)
// have all attended to keys [s, e), so their dK^, dV^ are complete; they go through the
// chunk's K/V recomputed from its normalized rows h_q, then dh (both paths) through the norm
// h = norm(x_q), and dL/dx_q is written into rows [s, e) of `grad`.
void ChunkKeysValuesBackward(DecoderLayerImpl& layer, const torch::Tensor& h, const torch::Tensor& h_q,
                             const torch::Tensor& x_q, const Rope& rope_q, const KeysValues& grad_kv, int64_t s,
                             int64_t e, torch::Tensor& grad) {
  KeysValues kv = layer.keys_values_normed(h_q, rope_q, /*read=*/false);
  torch::autograd::backward({kv.k, kv.v}, {grad_kv.k.slice(2, s, e).to(kv.k.scalar_type()),
                                           grad_kv.v.slice(2, s, e).to(kv.v.scalar_type())});
  torch::autograd::backward({h}, {h_q.grad()});
  grad.slice(1, s, e).copy_(x_q.grad());
}

// Backprop of one layer by StreamBP on the whole sequence; returns dL/dx. The layer's input
// is read from `store` chunk by chunk, in two passes (K/V in order, then the chunks from the
// last), so a second tier never brings more than a chunk of it to the device; `then` is
// prefetched after the last read. Takes g by value (the caller passes it with std::move) and
// returns dx in the same buffer: chunk c reads only g[s:e] and then overwrites it with its
// part of dx, so g and dx never both exist.
torch::Tensor WholeLayerBackward(DecoderLayerImpl& layer, LayerStore& store, int64_t slot, torch::Tensor grad,
                                 const Rope& rope, const Batch& batch, const ResolvedChunks& chunks, int64_t window,
                                 const Progress& progress, int64_t layers, ChunkReader::Next then,
                                 const KeptAttention* kept) {
  const int64_t T = grad.size(1), chunk = chunks.chunk;
  const int64_t n_chunks = (T + chunk - 1) / chunk;
  ChunkReader reader(store, slot, T, chunk, 2, then, /*last_reversed=*/true);
  int64_t s = 0, e = 0;
  KeysValues kv_hat = KeysValuesInChunks(layer, T, chunk, rope, [&](int64_t, int64_t) { return reader.next(&s, &e); });
  KeysValues grad_kv = GradSink(kv_hat, grad);
  torch::AutoGradMode grad_mode(true);
  for (int64_t step = 0; step < n_chunks; ++step) {
    auto x_q = Leaf(reader.next(&s, &e));
    Report(progress, EngineProgress::Phase::kBackward, slot, layers, step, n_chunks);
    const auto rope_q = rope.slice(s, e);
    auto h = layer.input_layernorm(x_q);
    auto h_q = Leaf(h);  // dh from the queries and from the chunk's K/V meet here
    AttentionTiling tiling{chunks.key_chunk, 0, &grad_kv};
    AttentionKept rows;
    if (kept) {  // the forward's attention output and log-sum-exp: its tiles do not run again
      rows = kept->positions(s, e, /*replay=*/true);
      tiling.kept = &rows;
    }
    layer.backward_queries_normed(x_q, h_q, rope_q, {kv_hat.k.slice(2, 0, e), kv_hat.v.slice(2, 0, e)},
                                  AttentionPattern::Causal(batch, s, e, e, window), tiling,
                                  grad.slice(1, s, e).contiguous());
    // g[s:e] is done with: dx[s:e] takes its place.
    ChunkKeysValuesBackward(layer, h, h_q, x_q, rope_q, grad_kv, s, e, grad);
  }
  return grad;
}

// The top layer's backward with the lm_head + loss inside it (docs/architecture.md: Engines):
// the forward stopped below the top layer, so its output exists only here, a chunk at a
// time. Per query chunk [s, e), the last first, as WholeLayerBackward: the attention half
// x1 = x + attention(norm x) without a graph, its output and log-sum-exp kept for the
// chunk; then, in blocks of at most logits-chunk rows, the feed-forward half
// y = x1 + mlp(norm x1) with a graph, the head's loss term and dL/dy of the block (HeadSteps)
// and y's backward into dL/dx1; then the attention half again with a graph, its tiles
// replayed from the kept output (the same values, bit for bit), backpropagated from dL/dx1.
// The top layer's forward thus runs once, where the other layers' run twice. Returns dL/dx
// and adds the loss terms into *loss.
torch::Tensor TopLayerWithHead(CausalLMImpl& model, LayerStore& store, int64_t slot, const Rope& rope,
                               const Batch& batch, Objective& objective, const ResolvedChunks& chunks,
                               const Progress& progress, ChunkReader::Next then, double* loss) {
  auto& layer = *model.layer_list[slot];
  const auto& config = model.config();
  const int64_t T = batch.length(), chunk = chunks.chunk, layers = slot + 1, window = config.window(slot);
  const int64_t n_chunks = (T + chunk - 1) / chunk;
  ChunkReader reader(store, slot, T, chunk, 2, then, /*last_reversed=*/true);
  int64_t s = 0, e = 0;
  KeysValues kv_hat = KeysValuesInChunks(layer, T, chunk, rope, [&](int64_t, int64_t) { return reader.next(&s, &e); });
  HeadSteps head(model, batch, objective, /*want_grad=*/true);
  // dL/dx. On the device it takes x's place chunk by chunk: the K/V pass is over, and a
  // chunk's rows are read for the last time by the chunk itself.
  torch::Tensor grad = store.on_device() ? store.read(slot, 0, T) : torch::Tensor();
  KeysValues grad_kv;
  torch::AutoGradMode grad_mode(true);
  for (int64_t step = 0; step < n_chunks; ++step) {
    auto x_q = Leaf(reader.next(&s, &e));
    if (!grad.defined()) grad = torch::empty({x_q.size(0), T, x_q.size(2)}, x_q.options());
    if (!grad_kv.k.defined()) grad_kv = GradSink(kv_hat, grad);
    Report(progress, EngineProgress::Phase::kBackward, slot, layers, step, n_chunks);
    const auto rope_q = rope.slice(s, e);
    const auto pattern = AttentionPattern::Causal(batch, s, e, e, window);
    const KeysValues keys{kv_hat.k.slice(2, 0, e), kv_hat.v.slice(2, 0, e)};
    auto h = layer.input_layernorm(x_q);
    auto h_q = Leaf(h);  // dh from the queries and from the chunk's K/V meet here
    // On CUDA the attention runs its fused kernel again instead (a kept output takes the
    // tiled kernel).
    const bool replay = x_q.is_cpu();
    const auto kept = replay ? KeptAttention::Make(config, x_q.size(0), e - s, x_q) : KeptAttention{};
    torch::Tensor x1;
    {
      torch::NoGradGuard no_grad;
      AttentionTiling tiling{chunks.key_chunk};
      tiling.always = true;  // as the graph's call below
      const auto rows = replay ? kept.positions(0, e - s, /*replay=*/false) : AttentionKept{};
      if (replay) tiling.kept = &rows;
      x1 = layer.attention_residual(x_q, h_q, rope_q, keys, pattern, tiling);
    }
    auto grad_x1 = torch::empty_like(x1);
    const int64_t block = chunks.logits_chunk;  // at most the chunk (ResolveChunks)
    for (int64_t b = 0; b < e - s; b += block) {
      const int64_t b_end = std::min(e - s, b + block);
      auto x1_b = Leaf(x1.slice(1, b, b_end));
      auto y = layer.feedforward_residual(x1_b, s + b);
      auto grad_y = head.step(y.detach(), s + b, s + b_end);
      torch::autograd::backward({y}, {grad_y});
      grad_x1.slice(1, b, b_end).copy_(x1_b.grad());
    }
    x1 = torch::Tensor();
    {
      AttentionTiling tiling{chunks.key_chunk, 0, &grad_kv};
      const auto rows = replay ? kept.positions(0, e - s, /*replay=*/true) : AttentionKept{};
      if (replay) tiling.kept = &rows;
      torch::autograd::backward({layer.attention_residual(x_q, h_q, rope_q, keys, pattern, tiling)}, {grad_x1});
    }
    ChunkKeysValuesBackward(layer, h, h_q, x_q, rope_q, grad_kv, s, e, grad);
  }
  *loss += head.loss();
  return grad;
}

// Backprop of one layer by StreamBP on this rank's positions of a context-parallel group;
// returns dL/dx. As WholeLayerBackward, but in three passes (K/V, the chunks in order, the
// K/V backward after the ranks' dK^, dV^ are summed).
torch::Tensor ShardLayerBackward(DecoderLayerImpl& layer, LayerStore& store, int64_t slot, torch::Tensor grad,
                                 const Rope& rope, const Batch& batch, const ResolvedChunks& chunks, int64_t window,
                                 const Progress& progress, int64_t layers, ChunkReader::Next then,
                                 const SequenceShard& shard) {
  // T: this rank's positions, from `offset` in the batch.
  const int64_t T = grad.size(1), chunk = chunks.chunk, offset = shard.begin;
  const int64_t n_chunks = (T + chunk - 1) / chunk;
  // Heads exchanged: every rank runs the group's chunks (empty ones past its own).
  const int64_t n_steps = shard.chunks(chunk);
  ChunkReader reader(store, slot, T, chunk, 3, then);
  int64_t s = 0, e = 0;
  KeysValues kv_hat = KeysValuesInChunks(layer, T, chunk, rope, [&](int64_t, int64_t) { return reader.next(&s, &e); });
  // Every rank's keys, in the batch's order (heads exchanged: this rank's heads of them).
  kv_hat = shard.gather_kv(kv_hat);
  KeysValues grad_kv = GradSink(kv_hat, grad);
  torch::AutoGradMode grad_mode(true);
  for (int64_t c = 0; c < n_steps; ++c) {
    torch::Tensor x_q;
    if (c < n_chunks) {
      x_q = Leaf(reader.next(&s, &e));
    } else {
      s = e = T;
      x_q = Leaf(grad.new_empty({grad.size(0), 0, grad.size(2)}));
    }
    Report(progress, EngineProgress::Phase::kBackward, slot, layers, c, n_steps);
    const int64_t qs = offset + s, qe = offset + e;  // the chunk's positions in the batch
    AttentionTiling tiling{chunks.key_chunk, 0, &grad_kv};
    std::unique_ptr<HeadExchange> heads;
    KeysValues keys{kv_hat.k.slice(2, 0, qe), kv_hat.v.slice(2, 0, qe)};
    if (shard.exchange) {
      heads = shard.exchange(c, chunk, batch, kv_hat, &grad_kv, window, chunks.key_chunk);
      tiling.heads = heads.get();
      keys = kv_hat;
    }
    layer.backward_queries(x_q, rope.slice(s, e), keys, AttentionPattern::Causal(batch, qs, qe, qe, window), tiling,
                           grad.slice(1, s, e).contiguous());
    // g[s:e] is done with: dx[s:e] takes its place.
    if (e > s) grad.slice(1, s, e).copy_(x_q.grad());
  }
  kv_hat = KeysValues{};
  // Every rank's queries saw this rank's keys: their dK/dV parts summed, this rank's rows.
  grad_kv = shard.reduce_grad_kv(grad_kv);
  for (int64_t c = 0; c < n_chunks; ++c) {
    auto x = Leaf(reader.next(&s, &e));
    KeysValues kv = layer.keys_values(x, rope.slice(s, e), /*read=*/false);
    torch::autograd::backward({kv.k, kv.v}, {grad_kv.k.slice(2, s, e).to(kv.k.scalar_type()),
                                             grad_kv.v.slice(2, s, e).to(kv.v.scalar_type())});
    grad.slice(1, s, e).add_(x.grad());
  }
  return grad;
}

// The ablation: K/V recomputed with a graph over the whole prefix [0, e) for every chunk,
// as the reference implementation does (O(T^2 / chunk) projection work).
torch::Tensor PrefixRecomputeLayerBackward(DecoderLayerImpl& layer, const torch::Tensor& x_in,
                                           const torch::Tensor& grad_out, const Rope& rope,
                                           const Batch& batch, const ResolvedChunks& chunks,
                                           int64_t window) {
  torch::AutoGradMode grad_mode(true);
  const int64_t T = x_in.size(1), chunk = chunks.chunk;
  auto grad_x = torch::zeros_like(x_in);
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    auto x_prefix = Leaf(x_in.slice(1, 0, e));
    auto x_q = Leaf(x_in.slice(1, s, e));
    auto kv = layer.keys_values(x_prefix, rope.slice(0, e));
    layer.backward_queries(x_q, rope.slice(s, e), kv, AttentionPattern::Causal(batch, s, e, e, window),
                           AttentionTiling{chunks.key_chunk}, grad_out.slice(1, s, e).contiguous());
    grad_x.slice(1, 0, e).add_(x_prefix.grad());
    grad_x.slice(1, s, e).add_(x_q.grad());
  }
  return grad_x;
}

}  // namespace

KeptAttention KeptAttention::Make(const ModelConfig& config, int64_t rows, int64_t T, const torch::Tensor& like) {
  const auto cd = like.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto options = like.options().dtype(cd);
  const int64_t G = config.num_kv_groups(), BK = rows * config.num_key_value_heads;
  return {torch::empty({BK, T * G, config.head_dim}, options), torch::empty({BK, T * G, 1}, options), G};
}

AttentionKept KeptAttention::positions(int64_t s, int64_t e, bool replay) const {
  return {out.slice(1, s * groups, e * groups), lse.slice(1, s * groups, e * groups), replay};
}

torch::Tensor StreamLayerForward(DecoderLayerImpl& layer, const torch::Tensor& x, const Rope& rope,
                                 const Batch& batch, int64_t chunk, int64_t key_chunk, int64_t window,
                                 const SequenceShard* shard, const KeptAttention* kept) {
  torch::NoGradGuard no_grad;
  const int64_t T = x.size(1), offset = shard ? shard->begin : 0;
  auto y = torch::empty_like(x);
  TORCH_CHECK(!(shard && kept), "StreamLayerForward: kept attention does not run context parallel");
  if (!shard) {
    // Chunk c's queries need keys [0, e) only: its K/V are computed just before them, from
    // the same normalized rows.
    KeysValues kv;
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t e = std::min(T, s + chunk);
      const auto x_q = x.slice(1, s, e);
      const auto rope_q = rope.slice(s, e);
      const auto h = layer.input_layernorm(x_q);
      PutKeysValues(kv, layer.keys_values_normed(h, rope_q), T, s);
      AttentionTiling tiling{key_chunk};
      tiling.always = true;  // as the backward recomputes it
      AttentionKept rows;
      if (kept) {
        rows = kept->positions(s, e, /*replay=*/false);
        tiling.kept = &rows;
      }
      y.slice(1, s, e).copy_(layer.forward_queries_normed(x_q, h, rope_q, {kv.k.slice(2, 0, e), kv.v.slice(2, 0, e)},
                                                          AttentionPattern::Causal(batch, s, e, e, window), tiling));
    }
    return y;
  }
  auto kv = KeysValuesInChunks(layer, T, chunk, rope, [&](int64_t s, int64_t e) { return x.slice(1, s, e); });
  kv = shard->gather_kv(kv);
  const int64_t n_steps = shard->chunks(chunk);
  for (int64_t c = 0; c < n_steps; ++c) {
    // Heads exchanged: past this rank's positions, an empty chunk for the others' queries.
    const int64_t s = std::min(T, c * chunk), e = std::min(T, s + chunk), qs = offset + s, qe = offset + e;
    AttentionTiling tiling{key_chunk};
    tiling.always = true;  // as the backward recomputes it
    std::unique_ptr<HeadExchange> heads;
    KeysValues keys{kv.k.slice(2, 0, qe), kv.v.slice(2, 0, qe)};
    if (shard->exchange) {
      heads = shard->exchange(c, chunk, batch, kv, nullptr, window, key_chunk);
      tiling.heads = heads.get();
      keys = kv;
    }
    y.slice(1, s, e).copy_(layer.forward_queries(x.slice(1, s, e), rope.slice(s, e), keys,
                                                 AttentionPattern::Causal(batch, qs, qe, qe, window), tiling));
  }
  return y;
}

StepResult StreamForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                                 const ResolvedChunks& chunks, const EngineOptions& options,
                                 const GradsReady& ready, const Progress& progress, const SequenceShard* shard) {
  objective.begin(batch);  // the whole batch: the step's normalizers on every rank
  const auto& config = model.config();
  const int64_t layers = static_cast<int64_t>(model.layer_list.size());
  // This rank's positions [begin, begin + T) of the batch (all of them without a shard).
  const int64_t begin = shard ? shard->begin : 0;
  const int64_t T = shard ? shard->length() : batch.length();
  if (shard && options.recompute_kv_per_chunk) {
    throw InvalidArgument("recompute_kv_per_chunk (the ablation) does not run context parallel");
  }
  if (options.keep_attention) {
    const char* other = shard                            ? "context parallel"
                        : options.offload_layer_inputs   ? "offload_layer_inputs"
                        : options.recompute_kv_per_chunk ? "recompute_kv_per_chunk (the ablation)"
                                                         : nullptr;
    if (other != nullptr) {
      throw InvalidArgument(std::string("keep_attention does not run with ") + other +
                            ": it keeps every layer's attention output on the device; choose one");
    }
  }
  // The top layer runs with the head inside its backward (TopLayerWithHead) where the loss
  // terms need no pass over the whole sequence first and nothing but the head needs the top
  // layer's forward: not context parallel (a rank's chunks need the others' sums), not in the
  // ablation, and not on a sparse top layer (its forward collects the load-balancing
  // statistics the backward uses).
  const bool top_with_head = !shard && !options.recompute_kv_per_chunk && !objective.needs_sequence_pass() &&
                             !config.sparse_layer(layers - 1);
  const int64_t forward_layers = top_with_head ? layers - 1 : layers;
  // Selective recompute: each layer's attention output and log-sum-exp, from its forward to
  // its backward.
  std::vector<KeptAttention> kept(options.keep_attention ? layers : 0);
  const auto ids = batch.input_ids.slice(1, begin, begin + T);
  // Slots 0..L-1: the layer inputs; slot L: the final hidden states.
  std::unique_ptr<LayerStore> store;
  Rope rope;
  {
    torch::NoGradGuard no_grad;
    auto x = model.embed(ids);
    rope = model.rope_tables(batch.position_ids.slice(1, begin, begin + T), x);
    store = std::make_unique<LayerInputs>(model, ids,
                                          options.offload_layer_inputs
                                              ? LayerStore::Offloaded(options.scratch_dir, layers, x)
                                              : LayerStore::OnDevice(layers));
    for (int64_t i = 0; i < forward_layers; ++i) {
      Report(progress, EngineProgress::Phase::kForward, i, layers);
      store->put(i, x);  // copied out (second tier) while the layer computes; layer 0's: nothing
      if (!kept.empty()) kept[i] = KeptAttention::Make(config, batch.rows(), T, x);
      x = StreamLayerForward(*model.layer_list[i], x, rope, batch, chunks.chunk, chunks.key_chunk, config.window(i),
                             shard, kept.empty() ? nullptr : &kept[i]);
    }
    store->put(forward_layers, std::move(x));
    // The load-balancing loss's statistics are the whole step's before any gradient uses them.
    if (shard && model.router_aux_loss() != nullptr) {
      shard->all_reduce({model.router_aux_loss()->counts, model.router_aux_loss()->probs});
    }
  }
  auto first_chunk = [&](int64_t slot) { return ChunkReader::Next{slot, 0, std::min(T, chunks.chunk)}; };
  // Each chunk's weight gradients go straight into .grad (docs/architecture.md: Engines).
  InPlaceWeightGradients in_place;
  double loss = 0.0;
  torch::Tensor grad;
  if (top_with_head) {
    grad = TopLayerWithHead(model, *store, layers - 1, rope, batch, objective, chunks, progress,
                            layers > 1 ? first_chunk(layers - 2) : ChunkReader::Next{}, &loss);
    store->drop(layers - 1);
    if (!kept.empty()) kept[layers - 1] = KeptAttention{};
    if (ready) {  // the head's gradients, then the top layer's
      ready(-2);
      ready(layers - 1);
    }
  } else {
    auto head = HeadForwardBackward(model, *store, layers, batch, objective, chunks.logits_chunk, true, progress,
                                    options.recompute_kv_per_chunk ? ChunkReader::Next{} : first_chunk(layers - 1),
                                    shard);
    store->drop(layers);
    if (ready) ready(-2);
    grad = std::move(head.grad_h);
    loss = head.loss;
  }
  for (int64_t i = forward_layers - 1; i >= 0; --i) {
    auto& layer = *model.layer_list[i];
    const int64_t window = config.window(i);
    if (options.recompute_kv_per_chunk) {
      Report(progress, EngineProgress::Phase::kBackward, i, layers);
      grad = PrefixRecomputeLayerBackward(layer, store->read(i, 0, T), grad, rope, batch, chunks, window);
    } else if (shard) {
      grad = ShardLayerBackward(layer, *store, i, std::move(grad), rope, batch, chunks, window, progress, layers,
                                i > 0 ? first_chunk(i - 1) : ChunkReader::Next{}, *shard);
    } else {
      grad = WholeLayerBackward(layer, *store, i, std::move(grad), rope, batch, chunks, window, progress, layers,
                                i > 0 ? first_chunk(i - 1) : ChunkReader::Next{}, kept.empty() ? nullptr : &kept[i]);
    }
    store->drop(i);
    if (!kept.empty()) kept[i] = KeptAttention{};
    if (ready) ready(i);
  }
  model.embed_backward(ids, grad);
  if (ready) ready(-1);
  auto result = MakeResult(objective, batch, loss);
  if (shard) {  // this rank's part of the loss and counts, so that the ranks' results add up
    // A loss that is not the sum of the chunk terms is known only where it comes from the
    // sequence pass (on every rank alike: all refuse, none waits in the step's sums).
    if (objective.batch_loss() && !objective.needs_sequence_pass()) {
      throw InvalidArgument("objective '" + objective.name() +
                            "' reports a loss other than the sum of its chunk terms without a sequence pass: it "
                            "cannot run context parallel");
    }
    // What the sequence pass computed from the whole step's sums is on every rank: the
    // first shard counts it.
    if (begin > 0 && objective.batch_loss()) result.loss -= objective.sequence_pass_loss();
    result.targets = batch.target_mask.slice(1, begin, begin + T).sum().item<int64_t>();
    result.tokens = (batch.sequence_ids.slice(1, begin, begin + T) >= 0).sum().item<int64_t>();
  }
  result.offloaded_bytes = store->offloaded_bytes();
  return result;
}

}  // namespace streambp::engine
