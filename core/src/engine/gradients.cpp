#include "streambp/gradients.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "streambp/error.h"

namespace streambp {

TensorMap CollectGradients(const CausalLMImpl& model) {
  TensorMap out;
  for (const auto& [name, p] : model.named_hf_parameters()) {
    out[name] = p.grad().defined() ? p.grad().detach().clone() : torch::zeros_like(p);
  }
  return out;
}

void ZeroGradients(CausalLMImpl& model) {
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
}

TensorMap CollectGradients(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  TensorMap out;
  for (const auto& [name, p] : params) {
    out[name] = p.grad().defined() ? p.grad().detach().clone() : torch::zeros_like(p);
  }
  return out;
}

void ZeroGradients(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  for (const auto& [name, p] : params) {
    auto t = p;
    t.mutable_grad() = torch::Tensor();
  }
}

GradientDiff CompareGradients(const TensorMap& ref, const TensorMap& other) {
  if (ref.size() != other.size()) {
    throw InvalidArgument("gradient sets differ: " + std::to_string(ref.size()) + " vs " +
                          std::to_string(other.size()) + " tensors");
  }
  GradientDiff d;
  for (const auto& [name, r] : ref) {
    auto it = other.find(name);
    if (it == other.end()) throw InvalidArgument("gradient " + name + " missing from the comparison");
    if (it->second.sizes() != r.sizes()) throw InvalidArgument("gradient " + name + " has a different shape");
    auto rr = r.to(torch::kFloat64);
    const double diff = (it->second.to(torch::kFloat64) - rr).abs().max().item<double>();
    const double scale = rr.abs().max().item<double>();
    const double rel = scale > 0 ? diff / scale : diff;
    // A NaN anywhere must surface as NaN, never be hidden by a comparison.
    if (std::isnan(diff) || std::isnan(d.max_abs)) {
      if (!std::isnan(d.max_abs)) d.worst = name;
      d.max_abs = d.max_relative = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    d.max_abs = std::max(d.max_abs, diff);
    if (d.worst.empty() || rel > d.max_relative) {
      d.max_relative = rel;
      d.worst = name;
    }
  }
  return d;
}

double GradientTolerance(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat64: return 1e-10;
    case torch::kFloat32: return 1e-4;
    default: return 5e-2;
  }
}

}  // namespace streambp
