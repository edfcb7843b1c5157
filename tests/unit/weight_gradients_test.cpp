// Weight gradients added in place (docs/architecture.md: Engines): a projection under
// InPlaceWeightGradients gives the input gradient autograd gives, and adds to its weight's
// and bias's .grad what autograd's own linear backward computes, chunk after chunk.
#include <thread>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../core/src/model/weight_gradients.h"
#include "streambp/model.h"
#include "test_util/fixtures.h"

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

// backward_only (an output only backpropagated): under InPlaceWeightGradients the product is
// left out (zeros where it would be) and the backward is forward's, bit for bit: dX, and the
// .grad added to W and b, with and without a bias, for a trained and a frozen weight.
// Without the guard, or without a graph, it is forward: the product, autograd's backward.
TEST(InPlaceWeightGradients, BackwardOnlyLeavesOutTheProductNotTheGradients) {
  int compared = 0;
  for (const bool with_bias : {true, false}) {
    for (const bool frozen : {false, true}) {
      Projection p(6, 4, with_bias);
      p->to(torch::kFloat64);
      {
        torch::NoGradGuard no_grad;
        p->weight.copy_(Random({4, 6}, 51));
        if (with_bias) p->bias.copy_(Random({4}, 52));
      }
      p->weight.requires_grad_(!frozen);
      if (with_bias) p->bias.requires_grad_(!frozen);
      const auto x0 = Random({2, 6, 5}, 53).transpose(1, 2);
      const auto g = Random({2, 5, 4}, 54);
      const std::string what = std::string(with_bias ? "bias" : "no bias") + (frozen ? ", frozen" : ", trained");
      auto run = [&](bool product) {
        p->weight.mutable_grad() = torch::Tensor();
        if (with_bias) p->bias.mutable_grad() = torch::Tensor();
        auto x = x0.detach().requires_grad_(true);
        InPlaceWeightGradients in_place;
        auto y = product ? p->forward(x) : p->backward_only(x);
        torch::autograd::backward({y}, {g});
        std::vector<torch::Tensor> got{y.detach(), x.grad()};
        if (!frozen) got.push_back(p->weight.grad());
        if (!frozen && with_bias) got.push_back(p->bias.grad());
        return got;
      };
      const auto forward = run(true), only = run(false);
      EXPECT_GT(forward[0].abs().max().item<double>(), 0.1) << what;
      EXPECT_TRUE(torch::equal(only[0], torch::zeros_like(forward[0]))) << what << ": the product ran";
      ASSERT_EQ(only.size(), forward.size()) << what;
      for (size_t i = 1; i < only.size(); ++i) {
        ASSERT_TRUE(only[i].defined()) << what << " gradient " << i;
        EXPECT_GT(forward[i].abs().max().item<double>(), 0.1) << what << " gradient " << i;
        EXPECT_TRUE(torch::equal(only[i], forward[i]))
            << what << " gradient " << i << ": max difference " << (only[i] - forward[i]).abs().max().item<double>();
      }
      if (frozen) {
        EXPECT_FALSE(p->weight.grad().defined()) << what;
      }
      ++compared;
      // No guard (autograd's linear) or no graph: forward itself.
      auto x = x0.detach().requires_grad_(true);
      auto y = p->backward_only(x);
      EXPECT_EQ(y.grad_fn()->name().find("streambp"), std::string::npos) << what << ": " << y.grad_fn()->name();
      EXPECT_TRUE(torch::equal(y, p->forward(x))) << what;
      torch::NoGradGuard no_grad;
      InPlaceWeightGradients in_place;
      EXPECT_TRUE(torch::equal(p->backward_only(x0), p->forward(x0))) << what;
    }
  }
  EXPECT_EQ(compared, 4);
}

// On two or three threads a projection's products are split among them (y and dX by rows, dW
// by output features): the output and every gradient equal one thread's bit for bit, in
// float32 and float64, with and without a bias, a non-contiguous input, a gradient already
// there, and the forward without a graph (the stream engine's forward and K/V passes).
TEST(InPlaceWeightGradients, SplitAmongThreadsEqualsOneThread) {
  testing::RestoreThreads restore;
  const auto cpu = torch::Device(torch::kCPU);
  at::set_num_threads(2);
  EXPECT_EQ(LinearSplitThreads(2 * kLinearSplitRows, 2 * kLinearSplitRows, cpu), 2);
  EXPECT_EQ(LinearSplitThreads(2 * kLinearSplitRows - 1, 512, cpu), 1);
  EXPECT_EQ(LinearSplitThreads(512, 2 * kLinearSplitRows - 1, cpu), 1);
  at::set_num_threads(3);
  EXPECT_EQ(LinearSplitThreads(320, 192, cpu), 3);
  at::set_num_threads(1);
  EXPECT_EQ(LinearSplitThreads(4096, 4096, cpu), 1);

  int compared = 0;
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const bool with_bias : {true, false}) {
      Projection p(192, 192, with_bias);
      p->to(dtype);
      {
        torch::NoGradGuard no_grad;
        p->weight.copy_(Random({192, 192}, 31));
        if (with_bias) p->bias.copy_(Random({192}, 32));
      }
      const auto x0 = Random({2, 192, 160}, 33).to(dtype).transpose(1, 2);  // rows 320, non-contiguous
      const auto weight = Random({2, 160, 192}, 34).to(dtype);
      const auto earlier = Random({192, 192}, 35).to(dtype);
      auto run = [&](int threads) {
        at::set_num_threads(threads);
        std::vector<torch::Tensor> got;
        {
          torch::NoGradGuard no_grad;
          got.push_back(p->forward(x0));
        }
        p->weight.mutable_grad() = earlier.clone();
        if (with_bias) p->bias.mutable_grad() = torch::Tensor();
        auto x = x0.detach().requires_grad_(true);
        InPlaceWeightGradients in_place;
        auto y = p->forward(x);
        torch::autograd::backward({y}, {weight});
        got.insert(got.end(), {y.detach(), x.grad(), p->weight.grad().clone()});
        if (with_bias) got.push_back(p->bias.grad().clone());
        return got;
      };
      const auto one = run(1);
      for (int threads : {2, 3}) {
        const auto got = run(threads);
        ASSERT_EQ(got.size(), one.size());
        for (size_t i = 0; i < one.size(); ++i) {
          const std::string what = std::string(c10::toString(dtype)) + (with_bias ? " bias" : " no bias") +
                                   " threads " + std::to_string(threads) + " tensor " + std::to_string(i);
          ASSERT_GT(one[i].abs().max().item<double>(), 0) << what;
          EXPECT_TRUE(torch::equal(got[i], one[i])) << what << ": max difference "
                                                   << (got[i] - one[i]).abs().max().item<double>();
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 8);
}

}  // namespace
}  // namespace streambp
