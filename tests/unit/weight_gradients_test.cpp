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

// Whether this machine's BLAS, on one thread, gives the rows [r0, r1) of an [n, k] x [k, m]
// product the same values when it computes them alone as when it computes the whole, for cuts
// at multiples of 64 (where LinearSplitThreads cuts its parts). OpenBLAS's AVX-512 kernels
// and its double-precision ones do; its AVX2 single-precision kernels (Haswell, Zen) change
// their order of summation with the width they are handed, so a split there is one thread's
// product to float32 rounding, not bit for bit.
bool BlasCutsInvariant(torch::Dtype dtype) {
  testing::RestoreThreads restore;
  at::set_num_threads(1);
  // y and dX: rows of a [320, 192] x [192, 192] product; dW: features of dY^T X, [192, 320] x [320, 160].
  const auto a = Random({320, 192}, 36).to(dtype), b = Random({192, 192}, 37).to(dtype);
  const auto x = Random({320, 160}, 38).to(dtype);
  const auto whole = at::mm(a, b), whole_w = at::mm(a.t(), x);
  for (const auto& [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{{0, 64}, {64, 128}, {128, 192}, {192, 320}}) {
    if (!torch::equal(at::mm(a.slice(0, r0, r1), b), whole.slice(0, r0, r1))) return false;
    if (r1 <= 192 && !torch::equal(at::mm(a.slice(1, r0, r1).t(), x), whole_w.slice(0, r0, r1))) return false;
  }
  return true;
}

// On two or three threads a projection's products are split among them (y and dX by rows, dW
// by output features): the output and every gradient equal one thread's bit for bit, in
// float32 and float64, with and without a bias, a non-contiguous input, a gradient already
// there, and the forward without a graph (the stream engine's forward and K/V passes) —
// where the BLAS itself gives a cut product's rows the whole product's values
// (BlasCutsInvariant; in float64 every OpenBLAS kernel set does); elsewhere within float32
// rounding of them (1e-5 of the largest).
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

  int compared = 0, bitwise = 0;
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const bool exact = BlasCutsInvariant(dtype);
    if (!exact) {
      std::printf("this BLAS's %s products depend on where their rows are cut: split vs one thread within rounding\n",
                  c10::toString(dtype));
    }
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
          const double largest = one[i].abs().max().item<double>();
          ASSERT_GT(largest, 0) << what;
          if (exact) {
            EXPECT_TRUE(torch::equal(got[i], one[i])) << what << ": max difference "
                                                     << (got[i] - one[i]).abs().max().item<double>();
          } else {
            EXPECT_LE((got[i] - one[i]).abs().max().item<double>(), 1e-5 * largest) << what;
          }
        }
        ++compared;
        bitwise += exact ? 1 : 0;
      }
    }
  }
  EXPECT_EQ(compared, 8);
  EXPECT_GE(bitwise, 4);  // float64 bit for bit on every kernel set
}

}  // namespace
}  // namespace streambp
