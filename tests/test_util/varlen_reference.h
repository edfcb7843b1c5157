#pragma once
// A variable-length attention kernel written from its contract (streambp/attention.h:
// VarlenKernel) in float64, and a backend that sends what CUDA's fused backend would send to
// flash's varlen entry (tiled calls over rows that are not whole) through it: on the CPU,
// the planning, the sink and the engines around VarlenAttention are checked with it.
#include <atomic>
#include <vector>

#include <torch/types.h>

#include "streambp/attention.h"

namespace streambp::testing {

/// Each segment's softmax(q kᵀ · scale) v over its own keys, materialized: query a of nq at
/// key position nk - nq + a, seeing the keys at or before it (within the window); the
/// backward by autograd through the same.
class ReferenceVarlenKernel final : public VarlenKernel {
 public:
  std::vector<torch::Tensor> forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const Segments& s, double scale) const override;
  std::vector<torch::Tensor> backward(const torch::Tensor& g, const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const std::vector<torch::Tensor>& forward_result,
                                      const Segments& s, double scale) const override;
};

/// Takes tiled calls without kept attention over rows that are not whole (what the fused
/// backend takes on CUDA in builds with STREAMBP_FLASH_VARLEN), through the reference kernel;
/// `taken` counts them.
class ReferenceVarlenBackend final : public AttentionBackend {
 public:
  const char* name() const override { return "varlen-reference"; }
  torch::Tensor attend(const AttentionCall& c) const override;
  mutable std::atomic<int> taken{0};

 private:
  ReferenceVarlenKernel kernel_;
};

}  // namespace streambp::testing
