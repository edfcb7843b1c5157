// AdamW and SGD with state keyed by HF parameter name (PyTorch's math, op for op), and
// the learning-rate schedules.
#include "streambp/optimizer.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include <torch/torch.h>

#include "streambp/error.h"

namespace streambp {
namespace {

bool ReducedPrecision(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kFloat16;
}

std::string ShapeString(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void OptimizerOptions::Validate() const {
  if (name != "adamw" && name != "sgd") {
    throw InvalidArgument("optimizer.name: unknown optimizer '" + name + "' (known: adamw, sgd)");
  }
  if (!(std::isfinite(lr) && lr >= 0)) throw InvalidArgument("optimizer.lr must be a finite number >= 0");
  for (int i = 0; i < 2; ++i) {
    if (!(betas[i] >= 0 && betas[i] < 1)) {
      throw InvalidArgument("optimizer.betas[" + std::to_string(i) + "] must be in [0, 1)");
    }
  }
  if (!(std::isfinite(eps) && eps >= 0)) throw InvalidArgument("optimizer.eps must be a finite number >= 0");
  if (name == "adamw" && !(eps > 0)) {
    throw InvalidArgument("optimizer.eps must be > 0 for adamw (it divides by sqrt(v) + eps, and v is 0 for a "
                          "parameter whose gradient has been 0); the usual value is 1e-8");
  }
  if (!(std::isfinite(weight_decay) && weight_decay >= 0)) {
    throw InvalidArgument("optimizer.weight_decay must be a finite number >= 0");
  }
  if (!(momentum >= 0 && momentum < 1)) throw InvalidArgument("optimizer.momentum must be in [0, 1)");
  if (name == "adamw" && momentum != 0) {
    throw InvalidArgument("optimizer.momentum applies to sgd only (adamw uses betas)");
  }
}

void AdamStepParams::Validate() const {
  auto check = [](const char* field, double v, bool ok, const char* rule) {
    if (!ok) {
      std::ostringstream got;
      got << v;
      throw InvalidArgument(std::string("adam_params.") + field + " must be " + rule + ", got " + got.str());
    }
  };
  check("learning_rate", lr, std::isfinite(lr) && lr >= 0, "a finite number >= 0");
  check("beta1", beta1, beta1 >= 0 && beta1 < 1, "in [0, 1)");
  check("beta2", beta2, beta2 >= 0 && beta2 < 1, "in [0, 1)");
  check("eps", eps, std::isfinite(eps) && eps > 0, "a finite number > 0");
  check("weight_decay", weight_decay, std::isfinite(weight_decay) && weight_decay >= 0, "a finite number >= 0");
  check("grad_clip_norm", grad_clip_norm, std::isfinite(grad_clip_norm) && grad_clip_norm >= 0,
        "a finite number >= 0 (0 = no clipping)");
}

OptimizerOptions AdamStepParams::Apply(const OptimizerOptions& base) const {
  Validate();
  if (base.name != "adamw") {
    throw FailedPrecondition("adam_params: the optimizer is " + base.name +
                             ", not adamw; leave adam_params out or use an adamw optimizer");
  }
  OptimizerOptions o = base;
  o.lr = lr;
  o.betas = {beta1, beta2};
  o.eps = eps;
  o.weight_decay = weight_decay;
  o.Validate();
  return o;
}

void ScheduleOptions::Validate() const {
  if (type != "constant" && type != "linear" && type != "cosine") {
    throw InvalidArgument("schedule.type: unknown schedule '" + type + "' (known: constant, linear, cosine)");
  }
  if (warmup_steps < 0) throw InvalidArgument("schedule.warmup_steps must be >= 0");
  if (total_steps < 0) throw InvalidArgument("schedule.total_steps must be >= 0");
  if (type != "constant" && total_steps == 0) {
    throw InvalidArgument("schedule.total_steps must be > 0 for the " + type + " schedule");
  }
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    throw InvalidArgument("schedule.min_lr_ratio must be in [0, 1]");
}

double LrMultiplier(const ScheduleOptions& schedule, int64_t step) {
  const double s = static_cast<double>(step);
  if (step < schedule.warmup_steps) {
    return s / static_cast<double>(std::max<int64_t>(1, schedule.warmup_steps));
  }
  if (schedule.type == "constant") return 1.0;
  const double total = static_cast<double>(schedule.total_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, schedule.total_steps - schedule.warmup_steps));
  if (schedule.type == "linear") return std::max(0.0, (total - s) / span);
  // cosine (num_cycles 0.5), held at its floor past total_steps
  const double progress = std::min(1.0, (s - static_cast<double>(schedule.warmup_steps)) / span);
  double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress));
  factor = factor * (1 - schedule.min_lr_ratio) + schedule.min_lr_ratio;
  return std::max(0.0, factor);
}

Optimizer::Optimizer(const OptimizerOptions& options, const NamedParameters& params)
    : options_(options), params_(params) {
  options_.Validate();
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params_) {
    auto& s = state_[name];
    if (ReducedPrecision(p)) s.master = p.detach().to(torch::kFloat32).clone();
  }
}

void Optimizer::set_options(const OptimizerOptions& options) {
  options.Validate();
  if (options.name != options_.name) {
    throw InvalidArgument("optimizer.name: cannot change the optimizer from " + options_.name + " to " +
                          options.name + " (the state would not match)");
  }
  options_ = options;
}

void Optimizer::step(double lr, double grad_scale) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    const auto& grad = p.grad();
    if (!grad.defined()) continue;
    auto& s = state_.at(name);
    torch::Tensor w = s.master.defined() ? s.master : p;
    torch::Tensor g = grad.detach();
    if (g.scalar_type() != w.scalar_type()) g = g.to(w.scalar_type());
    if (grad_scale != 1.0) g = g.mul(grad_scale);
    if (options_.name == "adamw") {
      step_adamw(w, g, s, lr);
    } else {
      step_sgd(w, g, s, lr);
    }
    if (s.master.defined()) p.copy_(s.master);
  }
}

void Optimizer::step_adamw(torch::Tensor& w, const torch::Tensor& g, ParamState& s, double lr) {
  // torch.optim.AdamW (LibTorch's AdamW::step), in the same order of operations.
  if (options_.weight_decay != 0) w.mul_(1 - lr * options_.weight_decay);
  if (!s.exp_avg.defined()) {
    s.exp_avg = torch::zeros_like(w, torch::MemoryFormat::Preserve);
    s.exp_avg_sq = torch::zeros_like(w, torch::MemoryFormat::Preserve);
  }
  s.step += 1;
  const double beta1 = options_.betas[0];
  const double beta2 = options_.betas[1];
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step));
  s.exp_avg.mul_(beta1).add_(g, 1 - beta1);
  s.exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2);
  auto denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
  const double step_size = lr / bias_correction1;
  w.addcdiv_(s.exp_avg, denom, -step_size);
}

void Optimizer::step_sgd(torch::Tensor& w, torch::Tensor g, ParamState& s, double lr) {
  // torch.optim.SGD (LibTorch's SGD::step) with dampening 0 and no Nesterov.
  if (options_.weight_decay != 0) g = g.add(w, options_.weight_decay);
  if (options_.momentum != 0) {
    if (!s.momentum_buffer.defined()) {
      s.momentum_buffer = torch::clone(g).detach();
    } else {
      s.momentum_buffer.mul_(options_.momentum).add_(g, 1.0);
    }
    g = s.momentum_buffer;
  }
  s.step += 1;
  w.add_(g, -1 * lr);
}

TensorMap Optimizer::state() const {
  TensorMap out;
  for (const auto& [name, s] : state_) {
    out["step/" + name] = torch::tensor({s.step}, torch::kInt64);
    if (s.exp_avg.defined()) out["exp_avg/" + name] = s.exp_avg.detach().cpu().clone();
    if (s.exp_avg_sq.defined()) out["exp_avg_sq/" + name] = s.exp_avg_sq.detach().cpu().clone();
    if (s.momentum_buffer.defined())
      out["momentum_buffer/" + name] = s.momentum_buffer.detach().cpu().clone();
    if (s.master.defined()) out["master/" + name] = s.master.detach().cpu().clone();
  }
  return out;
}

void Optimizer::load_state(const TensorMap& state) {
  // Validate everything first so that a bad state leaves this optimizer as it was.
  std::map<std::string, const torch::Tensor*> by_param;
  std::map<std::string, ParamState> next;
  for (const auto& [name, p] : params_) {
    ParamState s;
    const auto working = ReducedPrecision(p) ? torch::kFloat32 : p.scalar_type();
    const auto fetch = [&](const std::string& kind, bool required) -> torch::Tensor {
      auto it = state.find(kind + "/" + name);
      if (it == state.end()) {
        if (required) throw InvalidArgument("optimizer state: " + kind + "/" + name + " is missing");
        return {};
      }
      const auto& t = it->second;
      const bool is_step = kind == "step";
      const auto want_dtype = is_step ? torch::kInt64 : working;
      const std::vector<int64_t> want_shape = is_step ? std::vector<int64_t>{1} : p.sizes().vec();
      if (t.sizes().vec() != want_shape) {
        throw InvalidArgument("optimizer state: " + kind + "/" + name + " has shape " +
                              ShapeString(t.sizes()) + ", expected " + ShapeString(want_shape));
      }
      if (t.scalar_type() != want_dtype) {
        throw InvalidArgument("optimizer state: " + kind + "/" + name + " has dtype " +
                              std::string(c10::toString(t.scalar_type())) + ", expected " +
                              std::string(c10::toString(want_dtype)));
      }
      return is_step ? t : t.to(p.device()).clone();
    };
    s.step = fetch("step", true).item<int64_t>();
    if (options_.name == "adamw") {
      s.exp_avg = fetch("exp_avg", false);
      s.exp_avg_sq = fetch("exp_avg_sq", s.exp_avg.defined());
    } else {
      s.momentum_buffer = fetch("momentum_buffer", false);
    }
    if (ReducedPrecision(p)) s.master = fetch("master", true);
    next[name] = std::move(s);
  }
  for (const auto& [key, t] : state) {
    const auto slash = key.find('/');
    const std::string kind = key.substr(0, slash);
    const std::string name = slash == std::string::npos ? "" : key.substr(slash + 1);
    const bool known_kind = kind == "step" || kind == "master" ||
                            (options_.name == "adamw" && (kind == "exp_avg" || kind == "exp_avg_sq")) ||
                            (options_.name == "sgd" && kind == "momentum_buffer");
    const bool fits = next.count(name) && (kind != "master" || next.at(name).master.defined());
    if (!known_kind || !fits) {
      throw InvalidArgument("optimizer state: unexpected tensor " + key + " for " + options_.name +
                            " over this model");
    }
  }
  state_ = std::move(next);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    const auto& s = state_.at(name);
    if (s.master.defined()) p.copy_(s.master);
  }
}

}  // namespace streambp
