// Weight gradients added in place (docs/architecture.md: Engines). While an
// InPlaceWeightGradients lives on a thread, the plain projections that thread runs with a
// graph add their weight and bias gradients straight into the parameters' .grad in their
// backward (W.grad += dY^T X, one GEMM with beta = 1), instead of returning a fresh [out, in]
// gradient that autograd then adds (StreamBP's layers backprop chunk by chunk, so that would
// be one allocation and one extra pass over every weight per chunk). Only for engines that
// run torch::autograd::backward into the parameters: autograd::grad with respect to a weight
// would see no gradient.
#pragma once

#include <torch/types.h>

namespace streambp {

class InPlaceWeightGradients {
 public:
  InPlaceWeightGradients();
  ~InPlaceWeightGradients();
  InPlaceWeightGradients(const InPlaceWeightGradients&) = delete;
  InPlaceWeightGradients& operator=(const InPlaceWeightGradients&) = delete;
  /// Whether one lives on this thread.
  static bool active();

 private:
  bool previous_;
};

/// A parameter's gradient tensor, made (zeros) if it has none yet, for in-place accumulation.
torch::Tensor GradientOf(const torch::Tensor& parameter);

/// y = x W^T (+ b), differentiable in x; W's (and b's) gradients added into their .grad in
/// the backward when they require one.
torch::Tensor LinearAddingWeightGradients(const torch::Tensor& x, const torch::Tensor& weight,
                                          const torch::Tensor& bias);

}  // namespace streambp
