#include "weight_gradients.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "cpu_threads.h"

namespace streambp {
namespace {

thread_local bool t_in_place = false;

// Part t of [0, n) in `parts`, its ends on multiples of 64: OpenBLAS's AVX-512 kernels take rows
// in blocks, and a block cut at another row would sum its edge in another order. (Its AVX2
// float32 kernels sum in an order that depends on the width of the call: these cuts do not keep
// their bits.)
std::pair<int64_t, int64_t> Part(int64_t n, int64_t t, int64_t parts) {
  constexpr int64_t kAlign = 64;
  auto end = [&](int64_t i) { return i == parts ? n : std::min(n, (n * i / parts + kAlign / 2) / kAlign * kAlign); };
  return {end(t), end(t + 1)};
}

// f(t) for t in [0, parts), one part per intra-op thread (OnRanges).
template <typename F>
void OnThreads(int64_t parts, const F& f) {
  OnRanges(parts, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) f(t);
  });
}

bool SameDtypes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return x.scalar_type() == weight.scalar_type() && (!bias.defined() || bias.scalar_type() == weight.scalar_type());
}

// y = x W^T + b. Custom functions take defined tensors only: without a bias, the bias-free
// function below.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool product) {
    // A leaf saved for the backward is the parameter itself: its .grad is the one to add to.
    ctx->save_for_backward({x, weight, bias});
    return product ? LinearRows(x, weight, bias) : Unread(x, weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {Backward(ctx->needs_input_grad(0), saved[0], saved[1], saved[2], grads[0]), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }

  // What stands for y when no one reads it: zeros of its shape.
  static torch::Tensor Unread(const torch::Tensor& x, const torch::Tensor& weight) {
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return torch::zeros(sizes, x.options());
  }

  // dL/dx (when wanted); W.grad += dY^T X, b.grad += the column sums of dY.
  static torch::Tensor Backward(bool want_dx, const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias, const torch::Tensor& grad) {
    const int64_t out = weight.size(0), in = weight.size(1);
    const auto dy = grad.reshape({-1, out});
    torch::NoGradGuard no_grad;
    const int64_t threads = dy.scalar_type() == weight.scalar_type() && x.scalar_type() == weight.scalar_type()
                                ? LinearSplitThreads(dy.size(0), out, dy.device())
                                : 1;
    torch::Tensor dx;
    if (threads == 1) {
      if (want_dx) dx = dy.mm(weight).view(x.sizes());
      if (weight.requires_grad()) GradientOf(weight).addmm_(dy.t(), x.reshape({-1, in}));
    } else {
      // dX by rows, dW by output features: each thread's part of both in one region.
      const auto x2 = x.reshape({-1, in});
      const auto gw = weight.requires_grad() ? GradientOf(weight) : torch::Tensor();
      if (want_dx) dx = torch::empty({dy.size(0), in}, dy.options());
      OnThreads(threads, [&](int64_t t) {
        if (want_dx) {
          const auto [r0, r1] = Part(dy.size(0), t, threads);
          auto rows = dx.slice(0, r0, r1);
          at::mm_out(rows, dy.slice(0, r0, r1), weight);
        }
        if (gw.defined()) {
          const auto [f0, f1] = Part(out, t, threads);
          gw.slice(0, f0, f1).addmm_(dy.slice(1, f0, f1).t(), x2);
        }
      });
      if (want_dx) dx = dx.view(x.sizes());
    }
    if (bias.defined() && bias.requires_grad()) GradientOf(bias).add_(dy.sum(0));
    return dx;
  }
};

class LinearNoBiasFunction : public torch::autograd::Function<LinearNoBiasFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, bool product) {
    ctx->save_for_backward({x, weight});
    return product ? LinearRows(x, weight, torch::Tensor()) : LinearFunction::Unread(x, weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {LinearFunction::Backward(ctx->needs_input_grad(0), saved[0], saved[1], torch::Tensor(), grads[0]),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t LinearSplitThreads(int64_t rows, int64_t out, const torch::Device& device) {
  const int64_t threads = CpuSplitThreads(device);
  const bool split = threads > 1 && rows >= kLinearSplitRows * threads && out >= kLinearSplitRows * threads;
  return split ? threads : 1;
}

torch::Tensor LinearRows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const int64_t in = weight.size(1), out = weight.size(0);
  if (!x.device().is_cpu() || x.dim() < 1 || x.size(-1) != in || !SameDtypes(x, weight, bias)) {
    return torch::nn::functional::linear(x, weight, bias);  // its own checks and messages
  }
  // The same products on one thread and on several: torch's linear adds a bias after the
  // product for some layouts (a non-contiguous input), addmm here always.
  const auto x2 = x.reshape({-1, in});
  const int64_t rows = x2.size(0), threads = LinearSplitThreads(rows, out, x.device());
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  if (threads == 1) return (bias.defined() ? at::addmm(bias, x2, weight.t()) : at::mm(x2, weight.t())).view(sizes);
  auto y = torch::empty({rows, out}, x.options());
  OnThreads(threads, [&](int64_t t) {
    const auto [r0, r1] = Part(rows, t, threads);
    auto part = y.slice(0, r0, r1);
    if (bias.defined()) {
      at::addmm_out(part, bias, x2.slice(0, r0, r1), weight.t());
    } else {
      at::mm_out(part, x2.slice(0, r0, r1), weight.t());
    }
  });
  return y.view(sizes);
}

torch::Tensor GradientOf(const torch::Tensor& parameter) {
  auto& grad = parameter.mutable_grad();
  if (!grad.defined()) grad = torch::zeros_like(parameter);
  return grad;
}

InPlaceWeightGradients::InPlaceWeightGradients() : previous_(t_in_place) { t_in_place = true; }
InPlaceWeightGradients::~InPlaceWeightGradients() { t_in_place = previous_; }
bool InPlaceWeightGradients::active() { return t_in_place; }

torch::Tensor LinearAddingWeightGradients(const torch::Tensor& x, const torch::Tensor& weight,
                                          const torch::Tensor& bias, bool product) {
  // Names the product for profilers with the sequence number its autograd node takes, so
  // that its backward is charged where its forward ran (the bench's breakdown).
  at::RecordFunction record(at::RecordScope::FUNCTION);
  if (record.isActive()) record.before("streambp::linear", at::sequence_number::peek());
  return bias.defined() ? LinearFunction::apply(x, weight, bias, product)
                        : LinearNoBiasFunction::apply(x, weight, product);
}

}  // namespace streambp
