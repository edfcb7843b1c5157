#pragma once
/// Reading, clearing and comparing the gradients a step accumulated in a model.
#include <string>

#include "streambp/model.h"
#include "streambp/safetensors.h"

namespace streambp {

/// Copies of every parameter's .grad under HF names (zeros where a parameter has none).
TensorMap CollectGradients(const CausalLMImpl& model);

/// Sets every parameter's gradient to undefined (the next backward starts from zero).
void ZeroGradients(CausalLMImpl& model);

/// The same for any named tensors (an adapter's): copies of the gradients by name (zeros
/// where there is none), and clearing them.
TensorMap CollectGradients(const std::vector<std::pair<std::string, torch::Tensor>>& params);
void ZeroGradients(const std::vector<std::pair<std::string, torch::Tensor>>& params);

/// Difference of `other` against the reference `ref`, tensor by tensor:
/// max_abs = max |other - ref|; relative = max |other - ref| / max |ref| for each tensor
/// (a tensor whose reference is all zeros counts its absolute difference), and
/// max_relative is the largest over tensors; `worst` names that tensor.
struct GradientDiff {
  double max_abs = 0.0;
  double max_relative = 0.0;
  std::string worst;
};
/// Throws InvalidArgument if the two maps do not have the same names and shapes.
GradientDiff CompareGradients(const TensorMap& ref, const TensorMap& other);

/// Default tolerance on max_relative for engines that should agree: float64 1e-10,
/// float32 1e-4, bfloat16/float16 5e-2.
double GradientTolerance(torch::Dtype dtype);

}  // namespace streambp
