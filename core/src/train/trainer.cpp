// The Trainer's step: validation, reference log-probs, micro-batches through the engine,
// gradient norm, non-finite check, clipping, schedule and the optimizer update.
#include "streambp/trainer.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/gradients.h"
#include "train_internal.h"

namespace streambp {
namespace train {

torch::Dtype ModelDtype(const CausalLMImpl& model) {
  return model.named_hf_parameters().front().second.scalar_type();
}

void Freeze(CausalLMImpl& model) {
  for (auto& p : model.parameters()) {
    p.requires_grad_(false);
    p.mutable_grad() = torch::Tensor();
  }
}

CausalLM ModelFromTensors(const ModelConfig& config, const TensorMap& tensors, torch::Dtype dtype,
                          const torch::Device& device) {
  CheckDtypeOnDevice(dtype, device);
  CausalLM model(config);
  model->to(dtype);
  model->to(device);
  model->load_hf_tensors(tensors);
  return model;
}

CausalLM MakeReference(const CausalLMImpl& model, const ReferenceOptions& options) {
  const auto dtype = ModelDtype(model);
  const auto device = model.named_hf_parameters().front().second.device();
  CausalLM reference{nullptr};
  if (options.dir.empty()) {
    reference = ModelFromTensors(model.config(), model.hf_tensors(), dtype, device);
  } else {
    reference = LoadModel(options.dir, dtype, device);
    const auto& a = model.config();
    const auto& b = reference->config();
    if (a.vocab_size != b.vocab_size) {
      throw InvalidArgument("reference.dir: the reference model in " + options.dir + " has vocabulary " +
                            std::to_string(b.vocab_size) + ", the policy " + std::to_string(a.vocab_size));
    }
  }
  Freeze(*reference);
  return reference;
}

}  // namespace train

Trainer::Trainer(CausalLM model, CausalLM reference, const TrainerOptions& options)
    : model_(std::move(model)),
      reference_(std::move(reference)),
      options_(options),
      generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {
  for (auto& p : model_->parameters()) p.requires_grad_(true);
  ZeroGradients(*model_);
  optimizer_ = std::make_unique<Optimizer>(options_.optimizer, model_->named_hf_parameters());
}

Trainer::~Trainer() = default;

std::unique_ptr<Trainer> Trainer::Create(CausalLM model, const TrainerOptions& options) {
  if (!model) throw InvalidArgument("Trainer::Create: no model");
  options.Validate();
  CausalLM reference{nullptr};
  if (options.reference.use_reference_model) reference = train::MakeReference(*model, options.reference);
  return std::unique_ptr<Trainer>(new Trainer(std::move(model), std::move(reference), options));
}

double Trainer::current_lr() const { return options_.optimizer.lr * LrMultiplier(options_.schedule, step_); }

void Trainer::zero_gradients() {
  ZeroGradients(*model_);
  pending_ = false;
  nonfinite_loss_ = false;
}

std::vector<Sequence> Trainer::with_reference_logprobs(const std::vector<Sequence>& sequences,
                                                       int64_t logits_chunk) {
  std::vector<Sequence> out = sequences;
  if (logits_chunk <= 0) logits_chunk = kDefaultLogitsChunk;  // never T x V logits at once
  for (const auto& indices : SplitMicroBatches(sequences, options_.layout, options_.micro_batch_tokens)) {
    std::vector<Sequence> part;
    part.reserve(indices.size());
    for (size_t i : indices) part.push_back(sequences[i]);
    const auto batch = MakeBatch(part, options_.layout);
    const auto logprobs = TokenLogprobs(reference_, batch, logits_chunk).cpu().contiguous();
    const auto seq_ids = batch.sequence_ids.cpu().contiguous();
    const auto positions = batch.position_ids.cpu().contiguous();
    for (size_t k = 0; k < indices.size(); ++k) {
      out[indices[k]].ref_logprobs.assign(part[k].tokens.size(), 0.0);
    }
    const auto lp = logprobs.accessor<double, 2>();
    const auto sid = seq_ids.accessor<int64_t, 2>();
    const auto pos = positions.accessor<int64_t, 2>();
    // Slot (r, t) holds token pos[r][t] of sequence sid[r][t] and predicts the next one.
    for (int64_t r = 0; r < batch.rows(); ++r) {
      for (int64_t t = 0; t < batch.length(); ++t) {
        const int64_t s = sid[r][t];
        if (s < 0) continue;
        auto& ref = out[indices[s]].ref_logprobs;
        const int64_t next = pos[r][t] + 1;
        if (next < static_cast<int64_t>(ref.size())) ref[next] = lp[r][t];
      }
    }
  }
  return out;
}

StepResult Trainer::forward_backward(const std::vector<Sequence>& sequences, Objective& objective,
                                     const EngineOptions* engine) {
  // Everything that can be refused is refused before any computation.
  ValidateSequences(sequences, model_->config().vocab_size, options_.max_sequence_length);
  const EngineOptions& engine_options = engine ? *engine : options_.engine;
  if (engine_options.chunk < 0) throw InvalidArgument("engine.chunk must be >= 0 (0 = default)");
  if (engine_options.logits_chunk < -1) throw InvalidArgument("engine.logits_chunk must be >= -1 (-1 = default)");
  std::vector<Sequence> filled;
  const std::vector<Sequence>* step = &sequences;
  if (objective.needs_reference(sequences)) {
    if (!reference_) {
      throw InvalidArgument(objective.name() +
                            ": the objective needs reference log-probs: give them in the input or "
                            "enable the reference model");
    }
    filled = with_reference_logprobs(sequences, engine_options.logits_chunk);
    step = &filled;
  }
  objective.prepare(*step);

  StepResult total;
  try {
    const auto micro_batches = SplitMicroBatches(*step, options_.layout, options_.micro_batch_tokens);
    for (const auto& indices : micro_batches) {
      Batch batch;
      if (micro_batches.size() == 1) {
        batch = MakeBatch(*step, options_.layout);
      } else {
        std::vector<Sequence> part;
        part.reserve(indices.size());
        for (size_t i : indices) part.push_back((*step)[i]);
        batch = MakeBatch(part, options_.layout);
      }
      pending_ = true;  // from here on the model may carry gradients of this step
      const auto r = ForwardBackward(model_, batch, objective, engine_options);
      total.loss += r.loss;
      total.targets += r.targets;
      total.tokens += r.tokens;
      if (!std::isfinite(r.loss)) nonfinite_loss_ = true;
    }
    total.metrics = objective.finish();
  } catch (...) {
    zero_gradients();
    try {
      objective.finish();  // leave the objective ready for the next step
    } catch (...) {
    }
    throw;
  }
  return total;
}

OptimResult Trainer::optim_step() {
  if (!pending_) {
    throw FailedPrecondition("optim_step: there are no accumulated gradients (call forward_backward first)");
  }
  OptimResult result;
  result.lr = current_lr();
  // Total L2 norm as torch.nn.utils.clip_grad_norm_ computes it (norm of the per-tensor
  // norms), in float64.
  std::vector<torch::Tensor> norms;
  for (const auto& [name, p] : model_->named_hf_parameters()) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().to(torch::kFloat64).norm().cpu());
  }
  result.grad_norm = norms.empty() ? 0.0 : torch::stack(norms).norm().item<double>();
  if (nonfinite_loss_ || !std::isfinite(result.grad_norm)) {
    result.skipped = true;
    result.reason = nonfinite_loss_ ? "non-finite loss" : "non-finite gradient norm";
    result.step = step_;
    zero_gradients();
    return result;
  }
  double scale = 1.0;
  if (options_.max_grad_norm > 0) {
    const double coef = options_.max_grad_norm / (result.grad_norm + 1e-6);
    if (coef < 1.0) scale = coef;
  }
  try {
    optimizer_->step(result.lr, scale);
  } catch (...) {
    zero_gradients();
    throw;
  }
  zero_gradients();
  step_ += 1;
  policy_version_ += 1;
  result.step = step_;
  return result;
}

TrainResult Trainer::train_step(const std::vector<Sequence>& sequences, Objective& objective,
                                const EngineOptions* engine) {
  TrainResult r;
  r.forward = forward_backward(sequences, objective, engine);
  r.optim = optim_step();
  return r;
}

}  // namespace streambp
