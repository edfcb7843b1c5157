// The attention backends and the order they are tried in (docs/architecture.md: Attention
// backends). Each decides for itself whether it computes a call exactly.
#include "streambp/attention.h"

#include <atomic>
#include <limits>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "fused_attention.h"
#include "tiled_attention.h"

namespace streambp {

bool AttentionCall::tiled() const {
  const int64_t C = q.size(2) / groups, L = k.size(2);
  return (tiling.key_tile > 0 && L > tiling.key_tile) || (tiling.query_tile > 0 && C > tiling.query_tile) ||
         tiling.grad_sink != nullptr || tiling.kept != nullptr || tiling.always;
}

namespace {

class Fused final : public AttentionBackend {
 public:
  const char* name() const override { return "fused"; }
  torch::Tensor attend(const AttentionCall& c) const override {
    // Only where the caller tiles: untiled calls are the plain baselines, which stay as
    // PyTorch eager computes them.
    // Kept outputs are the tiled kernel's (its output and log-sum-exp layout).
    if (!c.tiled() || c.tiling.kept != nullptr) return {};
    return FusedAttention(c.q, c.k, c.v, c.pattern, c.groups, c.scale, c.tiling);
  }
};

class Tiled final : public AttentionBackend {
 public:
  const char* name() const override { return "tiled"; }
  torch::Tensor attend(const AttentionCall& c) const override {
    if (!c.tiled()) return {};
    return TiledAttention(c.q, c.k, c.v, c.pattern, c.groups, c.scale, c.tiling);
  }
};

// The reference: every score of the call at once, masked, softmax in float32 (float64 for
// float64 inputs) as HF computes it, the probabilities back in q's dtype.
class Materialized final : public AttentionBackend {
 public:
  const char* name() const override { return "materialized"; }
  torch::Tensor attend(const AttentionCall& c) const override {
    // Its dK/dV go through autograd; it keeps no log-sum-exp.
    if (c.tiling.grad_sink != nullptr || c.tiling.kept != nullptr) return {};
    const int64_t B = c.q.size(0), KVH = c.q.size(1), G = c.groups, C = c.q.size(2) / G, L = c.k.size(2);
    auto scores = torch::matmul(c.q, c.k.transpose(-1, -2));  // [B, KVH, C*G, L]
    scores.mul_(c.scale);
    scores = scores.view({B, KVH, C, G, L});
    scores.masked_fill_(c.pattern.dense().logical_not().reshape({B, 1, C, 1, L}),
                        -std::numeric_limits<double>::infinity());
    const auto dtype = c.q.scalar_type();
    const auto compute = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    auto probs = torch::softmax(scores, -1, compute).to(dtype);
    return torch::matmul(probs.view({B, KVH, C * G, L}), c.v);
  }
};

}  // namespace

const std::vector<const AttentionBackend*>& AttentionBackends() {
  static const Fused fused;
  static const Tiled tiled;
  static const Materialized materialized;
  static const std::vector<const AttentionBackend*> all{&fused, &tiled, &materialized};
  return all;
}

namespace {
std::atomic<const AttentionBackend*>& FirstBackend() {
  static std::atomic<const AttentionBackend*> first{nullptr};
  return first;
}
}  // namespace

ScopedAttentionBackend::ScopedAttentionBackend(const AttentionBackend* backend) {
  const AttentionBackend* none = nullptr;
  TORCH_CHECK(FirstBackend().compare_exchange_strong(none, backend), "ScopedAttentionBackend: one at a time");
}

ScopedAttentionBackend::~ScopedAttentionBackend() { FirstBackend().store(nullptr); }

AttentionResult Attend(const AttentionCall& call) {
  RECORD_USER_SCOPE("streambp::attention");
  if (const auto* first = FirstBackend().load()) {
    auto out = first->attend(call);
    if (out.defined()) return {std::move(out), first->name()};
  }
  for (const auto* backend : AttentionBackends()) {
    auto out = backend->attend(call);
    if (out.defined()) return {std::move(out), backend->name()};
  }
  TORCH_CHECK(false, "no attention backend took the call");  // unreachable: materialized takes the rest
}

}  // namespace streambp
