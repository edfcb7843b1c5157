// Weight gradients added in place (docs/architecture.md: Engines): a projection under
// InPlaceWeightGradients gives the input gradient autograd gives, and adds to its weight's
// and bias's .grad what autograd's own linear backward computes, chunk after chunk.
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../core/src/model/weight_gradients.h"
#include "streambp/model.h"

namespace streambp {
namespace {

torch::Tensor Random(std::vector<int64_t> sizes, int64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(sizes, torch::dtype(torch::kFloat64));
}

// dL/dx, dL/dW, dL/db of L = sum(weight * linear(x, W, b)) by autograd's own linear.
std::vector<torch::Tensor> Reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                     const torch::Tensor& weight) {
  auto xr = x.detach().requires_grad_(true), wr = w.detach().requires_grad_(true), br = b.detach().requires_grad_(true);
  auto y = torch::nn::functional::linear(xr, wr, br);
  return torch::autograd::grad({(y * weight).sum()}, {xr, wr, br});
}

TEST(InPlaceWeightGradients, ChunksAddWhatAutogradComputes) {
  for (const bool with_bias : {true, false}) {
    Projection p(6, 4, with_bias);
    p->to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;
      p->weight.copy_(Random({4, 6}, 1));
      if (with_bias) p->bias.copy_(Random({4}, 2));
    }
    const auto bias = with_bias ? p->bias : torch::zeros({4}, torch::kFloat64);
    // A gradient already there (an earlier micro-batch) is added to.
    p->weight.mutable_grad() = Random({4, 6}, 3);
    const auto before = p->weight.grad().clone();
    torch::Tensor dw_sum = before.clone(), db_sum = torch::zeros({4}, torch::kFloat64);
    InPlaceWeightGradients in_place;
    ASSERT_TRUE(InPlaceWeightGradients::active());
    for (int64_t chunk = 0; chunk < 3; ++chunk) {
      // A non-contiguous input (a transposed view), as a layer's permuted attention output is.
      auto x = Random({2, 6, 5 + chunk}, 10 + chunk).transpose(1, 2).requires_grad_(true);
      const auto weight = Random({2, 5 + chunk, 4}, 20 + chunk);
      auto y = p->forward(x);
      ASSERT_TRUE(y.grad_fn() != nullptr);
      EXPECT_NE(y.grad_fn()->name().find("streambp"), std::string::npos) << y.grad_fn()->name();
      torch::autograd::backward({y}, {weight});
      const auto ref = Reference(x, p->weight, bias, weight);
      dw_sum += ref[1];
      db_sum += ref[2];
      const std::string what = std::string(with_bias ? "bias" : "no bias") + ", chunk " + std::to_string(chunk);
      EXPECT_LE((x.grad() - ref[0]).abs().max().item<double>(), 1e-14) << what;
      EXPECT_LE((p->weight.grad() - dw_sum).abs().max().item<double>(), 1e-13) << what;
      if (with_bias) {
        EXPECT_LE((p->bias.grad() - db_sum).abs().max().item<double>(), 1e-13) << what;
      }
    }
    EXPECT_GT((p->weight.grad() - before).abs().max().item<double>(), 1e-3);  // it did add
  }
}

TEST(InPlaceWeightGradients, FrozenWeightsAndOtherThreadsUseAutograd) {
  Projection p(3, 2, /*bias=*/false);
  p->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    p->weight.copy_(Random({2, 3}, 4));
  }
  auto x = Random({1, 4, 3}, 5).requires_grad_(true);
  {
    // Without the guard: autograd's linear, so autograd::grad reaches the weight.
    auto y = p->forward(x);
    EXPECT_EQ(y.grad_fn()->name().find("streambp"), std::string::npos) << y.grad_fn()->name();
    auto grads = torch::autograd::grad({y.sum()}, {p->weight});
    EXPECT_TRUE(grads[0].defined());
    EXPECT_FALSE(p->weight.grad().defined());
  }
  InPlaceWeightGradients in_place;
  bool other_thread = true;
  std::thread([&] { other_thread = InPlaceWeightGradients::active(); }).join();
  EXPECT_FALSE(other_thread);
  // A frozen base (an adapter trains): the input's gradient only, no .grad made.
  p->weight.requires_grad_(false);
  auto y = p->forward(x);
  torch::autograd::backward({y}, {torch::ones_like(y)});
  EXPECT_FALSE(p->weight.grad().defined());
  EXPECT_LE((x.grad() - torch::ones({1, 4, 2}, torch::kFloat64).matmul(p->weight)).abs().max().item<double>(), 1e-15);
}

}  // namespace
}  // namespace streambp
