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

/// Rows of a linear's products per thread below which it is not split (LinearSplitThreads).
constexpr int64_t kLinearSplitRows = 64;

/// The threads a linear over `rows` positions into `out` features splits its products among
/// on the CPU: y and dX by rows, dW by output features, each thread with one-thread BLAS, so
/// the threads meet once per product instead of inside it (OpenBLAS's threads wait for each
/// other at every block of a product). The same products per element: one thread's values bit
/// for bit where the BLAS sums a row the same way whatever width it is handed (OpenBLAS's AVX-512
/// kernels, and float64), within float32 rounding on its AVX2 kernels (docs/architecture.md: Engines).
/// 1 (one call, as LibTorch runs it) on a GPU, with one thread, inside a parallel region, for
/// fewer than kLinearSplitRows rows or features per thread, or without OpenMP.
int64_t LinearSplitThreads(int64_t rows, int64_t out, const torch::Device& device);

/// y = x W^T (+ b) with the rows split as LinearSplitThreads says (else torch's linear).
torch::Tensor LinearRows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

/// A parameter's gradient tensor, made (zeros) if it has none yet, for in-place accumulation.
torch::Tensor GradientOf(const torch::Tensor& parameter);

/// y = x W^T (+ b), differentiable in x; W's (and b's) gradients added into their .grad in
/// the backward when they require one. Without the product (an output only backpropagated,
/// ProjectionImpl::backward_only), y holds zeros; the backward is the same.
torch::Tensor LinearAddingWeightGradients(const torch::Tensor& x, const torch::Tensor& weight,
                                          const torch::Tensor& bias, bool product = true);

}  // namespace streambp
