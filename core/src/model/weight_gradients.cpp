#include "weight_gradients.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

namespace streambp {
namespace {

thread_local bool t_in_place = false;

// y = x W^T + b. Custom functions take defined tensors only: without a bias, the bias-free
// function below.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    // A leaf saved for the backward is the parameter itself: its .grad is the one to add to.
    ctx->save_for_backward({x, weight, bias});
    return torch::nn::functional::linear(x, weight, bias);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {Backward(ctx->needs_input_grad(0), saved[0], saved[1], saved[2], grads[0]), torch::Tensor(),
            torch::Tensor()};
  }

  // dL/dx (when wanted); W.grad += dY^T X, b.grad += the column sums of dY.
  static torch::Tensor Backward(bool want_dx, const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias, const torch::Tensor& grad) {
    const int64_t out = weight.size(0), in = weight.size(1);
    const auto dy = grad.reshape({-1, out});
    torch::Tensor dx;
    if (want_dx) dx = dy.mm(weight).view(x.sizes());
    torch::NoGradGuard no_grad;
    if (weight.requires_grad()) GradientOf(weight).addmm_(dy.t(), x.reshape({-1, in}));
    if (bias.defined() && bias.requires_grad()) GradientOf(bias).add_(dy.sum(0));
    return dx;
  }
};

class LinearNoBiasFunction : public torch::autograd::Function<LinearNoBiasFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return torch::nn::functional::linear(x, weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {LinearFunction::Backward(ctx->needs_input_grad(0), saved[0], saved[1], torch::Tensor(), grads[0]),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor GradientOf(const torch::Tensor& parameter) {
  auto& grad = parameter.mutable_grad();
  if (!grad.defined()) grad = torch::zeros_like(parameter);
  return grad;
}

InPlaceWeightGradients::InPlaceWeightGradients() : previous_(t_in_place) { t_in_place = true; }
InPlaceWeightGradients::~InPlaceWeightGradients() { t_in_place = previous_; }
bool InPlaceWeightGradients::active() { return t_in_place; }

torch::Tensor LinearAddingWeightGradients(const torch::Tensor& x, const torch::Tensor& weight,
                                          const torch::Tensor& bias) {
  // Names the product for profilers with the sequence number its autograd node takes, so
  // that its backward is charged where its forward ran (the bench's breakdown).
  at::RecordFunction record(at::RecordScope::FUNCTION);
  if (record.isActive()) record.before("streambp::linear", at::sequence_number::peek());
  return bias.defined() ? LinearFunction::apply(x, weight, bias) : LinearNoBiasFunction::apply(x, weight);
}

}  // namespace streambp
