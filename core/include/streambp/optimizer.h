#pragma once
/// Optimizers and learning-rate schedules of the Trainer (docs/architecture.md: API semantics). The state is plain
/// tensors keyed by Hugging Face parameter name, so that it serializes as safetensors and
/// can be sharded by name.
///
/// The math is PyTorch's, operation for operation:
///  - adamw (torch.optim.AdamW): p *= 1 - lr wd; m = b1 m + (1 - b1) g;
///    v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
///  - sgd (torch.optim.SGD, dampening 0, no Nesterov): g += wd p; with momentum,
///    buf = g on the first step, else buf = momentum buf + g, and g = buf; p -= lr g.
/// Parameters stored in a reduced precision (bfloat16, float16) are updated through float32
/// master copies held here, with float32 state; the parameters are rounded copies of the
/// masters. float32 and float64 parameters are updated in place, with state in their dtype.
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/types.h>

#include "streambp/safetensors.h"

namespace streambp {

struct OptimizerOptions {
  std::string name = "adamw";               ///< adamw | sgd
  double lr = 1e-5;                         ///< peak learning rate (the schedule scales it)
  std::array<double, 2> betas{0.9, 0.999};  ///< adamw: moment decay rates, each in [0, 1)
  double eps = 1e-8;                        ///< adamw: added to the denominator
  double weight_decay = 0.0;                ///< adamw: decoupled; sgd: L2 added to the gradient
  double momentum = 0.0;                    ///< sgd only: momentum factor in [0, 1)

  /// Throws InvalidArgument naming the bad field.
  void Validate() const;
  /// Reads the fields present in `j` (an object); an unknown key is InvalidArgument.
  static OptimizerOptions FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

/// The Adam parameters of one optimizer step, given with the step instead of taken from the
/// configuration (Tinker's AdamParams; docs/api.md OptimStep): the learning rate (no schedule
/// applies), the moment decay rates, eps, decoupled weight decay and the gradient clipping
/// norm (0 = no clipping). The defaults are Tinker's. Only for an adamw optimizer; its state
/// (moments, step counts) carries on across steps whatever each step's parameters were.
struct AdamStepParams {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-12;
  double weight_decay = 0.0;
  double grad_clip_norm = 0.0;

  /// InvalidArgument naming the field ("adam_params.beta2 must be in [0, 1), got 1").
  void Validate() const;
  /// `base` (an adamw configuration) with these values. FailedPrecondition when `base` is
  /// not adamw.
  OptimizerOptions Apply(const OptimizerOptions& base) const;
  /// Every field; FromJson reads the fields present (the others keep the defaults).
  nlohmann::json ToJson() const;
  static AdamStepParams FromJson(const nlohmann::json& j);
};

/// The learning-rate multiplier as a function of the optimizer step s (0-based: the first
/// update uses s = 0), as in Hugging Face transformers:
///   s < warmup_steps:  s / max(1, warmup_steps)
///   constant:          1
///   linear:            max(0, (total - s) / max(1, total - warmup))
///   cosine:            f = 0.5 (1 + cos(pi p)), p = (s - warmup) / max(1, total - warmup);
///                      f (1 - min_lr_ratio) + min_lr_ratio
/// One deliberate difference: past total_steps the multiplier stays at its final value
/// (HF's cosine would rise again).
struct ScheduleOptions {
  std::string type = "constant";  ///< constant | linear | cosine
  int64_t warmup_steps = 0;       ///< steps of linear warmup from 0
  int64_t total_steps = 0;        ///< length of the decay; required (> 0) for linear and cosine
  double min_lr_ratio = 0.0;      ///< cosine: floor of the multiplier, in [0, 1]

  void Validate() const;
  static ScheduleOptions FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

/// The multiplier of the learning rate at optimizer step `step` (see ScheduleOptions).
double LrMultiplier(const ScheduleOptions& schedule, int64_t step);

/// A named parameter: the tensor is the model's own (updated in place).
using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

/// AdamW or SGD over named parameters. Not thread-safe; owned by one Trainer.
class Optimizer {
 public:
  /// Validates the options and creates float32 master copies of the reduced-precision
  /// parameters of `params` (which must stay the same tensors for the optimizer's life).
  Optimizer(const OptimizerOptions& options, const NamedParameters& params);

  /// One update at learning rate `lr`: every parameter whose .grad is defined is updated
  /// with grad x `grad_scale` (the clipping coefficient; 1 = unscaled); parameters without
  /// a gradient are left alone (their state too), as in PyTorch. Gradients are read, not
  /// changed. Runs without autograd.
  void step(double lr, double grad_scale = 1.0);

  const OptimizerOptions& options() const { return options_; }
  void set_options(const OptimizerOptions& options);  ///< e.g. a new lr on resume (validated)

  /// The whole state as tensors: "<kind>/<parameter name>" with kind exp_avg, exp_avg_sq
  /// (adamw), momentum_buffer (sgd), master (reduced-precision parameters), and step
  /// (int64 [1]: the updates this parameter received).
  TensorMap state() const;
  /// Restores a state written by state(): validates every name, shape and dtype against
  /// the parameters first (InvalidArgument naming the tensor), then copies it in, and sets
  /// the reduced-precision parameters from their masters.
  void load_state(const TensorMap& state);

 private:
  struct ParamState {
    int64_t step = 0;
    torch::Tensor exp_avg, exp_avg_sq;  // adamw
    torch::Tensor momentum_buffer;      // sgd with momentum
    torch::Tensor master;               // float32 copy of a reduced-precision parameter
  };
  void step_adamw(torch::Tensor& w, const torch::Tensor& g, ParamState& s, double lr);
  void step_sgd(torch::Tensor& w, torch::Tensor g, ParamState& s, double lr);

  OptimizerOptions options_;
  NamedParameters params_;
  std::map<std::string, ParamState> state_;
};

}  // namespace streambp
