// stream: StreamBP (DESIGN §4). Per layer, given the stored input x and g = dL/dy:
//  1. K/V for the whole sequence from x, without a graph: the leaves K^, V^.
//  2. For each query chunk [s, e): recompute y[s:e] from x[s:e], K^[:e], V^[:e] with a
//     graph (queries never meet later keys; keys are visited tile by tile with an online
//     softmax, so scores are chunk x key_chunk) and backprop g[s:e]; this accumulates the
//     parameter gradients, dK^, dV^ and the chunk's part of dx. The chunk graph is freed.
//  3. Backprop (dK^, dV^) into dx and the k/v weights through K/V recomputed with a graph,
//     chunk by chunk: norm, projections and RoPE act on each position alone, so the
//     chunks' VJPs sum to the whole K/V VJP and no B x T K/V graph ever exists.
// The sum of the chunk VJPs is the VJP of the whole layer, so the gradients are exact.
// What lives across a layer's backward is x (stored), g, dx, K^, V^, dK^, dV^: the floor
// bytes·T·(L·d + 2d + 4·d_kv) of issue 6, plus one chunk's working set.
#include "engine_common.h"

namespace streambp::engine {
namespace {

torch::Tensor Leaf(const torch::Tensor& t) { return t.detach().requires_grad_(true); }

// Backprop of one layer by StreamBP; returns dL/dx. Takes g by value and drops it once
// the chunks are done (the caller passes it with std::move).
torch::Tensor StreamLayerBackward(DecoderLayerImpl& layer, const torch::Tensor& x_in,
                                  torch::Tensor grad_out, const Rope& rope, const Batch& batch,
                                  const ResolvedChunks& chunks, int64_t window, const Progress& progress,
                                  int64_t index, int64_t layers) {
  const int64_t T = x_in.size(1), chunk = chunks.chunk;
  const int64_t n_chunks = (T + chunk - 1) / chunk;
  KeysValues kv_hat;
  {
    torch::NoGradGuard no_grad;
    kv_hat = layer.keys_values(x_in, rope);
  }
  // dK^, dV^: every chunk's attention backward adds its part here in place (the grad sink),
  // in the attention's compute dtype.
  const auto cd = x_in.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  KeysValues grad_kv{torch::zeros(kv_hat.k.sizes(), kv_hat.k.options().dtype(cd)),
                     torch::zeros(kv_hat.v.sizes(), kv_hat.v.options().dtype(cd))};
  auto grad_x = torch::empty_like(x_in);
  torch::AutoGradMode grad_mode(true);
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    Report(progress, EngineProgress::Phase::kBackward, index, layers, s / chunk, n_chunks);
    auto x_q = Leaf(x_in.slice(1, s, e));
    KeysValues prefix{kv_hat.k.slice(2, 0, e), kv_hat.v.slice(2, 0, e)};
    auto y = layer.forward_queries(x_q, SliceRope(rope, s, e), prefix, AttentionPattern::Causal(batch, s, e, e, window),
                                   AttentionTiling{chunks.key_chunk, 0, &grad_kv});
    torch::autograd::backward({y}, {grad_out.slice(1, s, e).contiguous()});
    grad_x.slice(1, s, e).copy_(x_q.grad());
  }
  grad_out = torch::Tensor();
  kv_hat = KeysValues{};
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    auto x = Leaf(x_in.slice(1, s, e));
    KeysValues kv = layer.keys_values(x, SliceRope(rope, s, e));
    torch::autograd::backward({kv.k, kv.v}, {grad_kv.k.slice(2, s, e).to(kv.k.scalar_type()),
                                             grad_kv.v.slice(2, s, e).to(kv.v.scalar_type())});
    grad_x.slice(1, s, e).add_(x.grad());
  }
  return grad_x;
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
    auto kv = layer.keys_values(x_prefix, SliceRope(rope, 0, e));
    auto y = layer.forward_queries(x_q, SliceRope(rope, s, e), kv, AttentionPattern::Causal(batch, s, e, e, window),
                                   AttentionTiling{chunks.key_chunk});
    torch::autograd::backward({y}, {grad_out.slice(1, s, e).contiguous()});
    grad_x.slice(1, 0, e).add_(x_prefix.grad());
    grad_x.slice(1, s, e).add_(x_q.grad());
  }
  return grad_x;
}

}  // namespace

torch::Tensor StreamLayerForward(DecoderLayerImpl& layer, const torch::Tensor& x, const Rope& rope,
                                 const Batch& batch, int64_t chunk, int64_t key_chunk, int64_t window) {
  torch::NoGradGuard no_grad;
  const int64_t T = x.size(1);
  auto kv = layer.keys_values(x, rope);
  auto y = torch::empty_like(x);
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    KeysValues prefix{kv.k.slice(2, 0, e), kv.v.slice(2, 0, e)};
    y.slice(1, s, e).copy_(layer.forward_queries(x.slice(1, s, e), SliceRope(rope, s, e), prefix,
                                                 AttentionPattern::Causal(batch, s, e, e, window),
                                                 AttentionTiling{key_chunk}));
  }
  return y;
}

StepResult StreamForwardBackward(CausalLMImpl& model, const Batch& batch, Objective& objective,
                                 const ResolvedChunks& chunks, bool recompute_kv_per_chunk,
                                 const GradsReady& ready, const Progress& progress) {
  objective.begin(batch);
  const int64_t window = model.config().sliding_window.value_or(0);
  const int64_t layers = static_cast<int64_t>(model.layer_list.size());
  std::vector<torch::Tensor> inputs;
  torch::Tensor h_last;
  Rope rope;
  {
    torch::NoGradGuard no_grad;
    auto x = model.embed(batch.input_ids);
    rope = model.rotary().tables(batch.position_ids, x);
    for (int64_t i = 0; i < layers; ++i) {
      Report(progress, EngineProgress::Phase::kForward, i, layers);
      inputs.push_back(x);
      x = StreamLayerForward(*model.layer_list[i], x, rope, batch, chunks.chunk, chunks.key_chunk, window);
    }
    h_last = x;
  }
  auto head = HeadForwardBackward(model, h_last, batch, objective, chunks.logits_chunk, true, progress);
  h_last = torch::Tensor();
  if (ready) ready(-2);
  auto grad = std::move(head.grad_h);
  for (int64_t i = static_cast<int64_t>(model.layer_list.size()) - 1; i >= 0; --i) {
    auto& layer = *model.layer_list[i];
    if (recompute_kv_per_chunk) {
      Report(progress, EngineProgress::Phase::kBackward, i, layers);
      grad = PrefixRecomputeLayerBackward(layer, inputs[i], grad, rope, batch, chunks, window);
    } else {
      grad = StreamLayerBackward(layer, inputs[i], std::move(grad), rope, batch, chunks, window, progress, i, layers);
    }
    inputs[i] = torch::Tensor();
    if (ready) ready(i);
  }
  EmbeddingBackward(model, batch, grad);
  if (ready) ready(-1);
  return MakeResult(objective, batch, head.loss);
}

}  // namespace streambp::engine
