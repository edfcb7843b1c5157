// The Trainer's step: validation, reference log-probs, micro-batches through the engine,
// gradient norm, non-finite check, clipping, schedule and the optimizer update.
#include "streambp/trainer.h"

#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "streambp/context_parallel.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
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

Trainer::Trainer(CausalLM model, CausalLM reference, const TrainerOptions& options,
                 std::shared_ptr<LoraAdapter> adapter)
    : model_(std::move(model)),
      reference_(std::move(reference)),
      adapter_(std::move(adapter)),
      options_(options),
      generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {
  if (adapter_) {
    // The base is frozen: no gradient, no optimizer state; only A and B train.
    for (auto& p : model_->parameters()) p.requires_grad_(false);
    ZeroGradients(*model_);
    for (auto& [name, p] : adapter_->named_parameters()) p.requires_grad_(true);
    reference_from_base_ = options_.reference.use_reference_model && !reference_;
  } else {
    for (auto& p : model_->parameters()) p.requires_grad_(true);
  }
  activate();
  ZeroGradients(trainable());
  optimizer_ = std::make_unique<Optimizer>(options_.optimizer, trainable());
}

Trainer::~Trainer() = default;

std::unique_ptr<Trainer> Trainer::Create(CausalLM model, const TrainerOptions& options,
                                         std::shared_ptr<LoraAdapter> adapter) {
  if (!model) throw InvalidArgument("Trainer::Create: no model");
  options.Validate();
  if (adapter) adapter->check_fits(model->config());
  CausalLM reference{nullptr};
  // With an adapter the reference is the base with the adapter off (no copy), unless a
  // reference model folder is given.
  if (options.reference.use_reference_model && (!adapter || !options.reference.dir.empty())) {
    reference = train::MakeReference(*model, options.reference);
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(model), std::move(reference), options, std::move(adapter)));
}

std::vector<std::pair<std::string, torch::Tensor>> Trainer::trainable() const {
  return adapter_ ? adapter_->named_parameters() : model_->named_hf_parameters();
}

void Trainer::activate() { model_->set_adapter(adapter_); }

double Trainer::current_lr() const { return options_.optimizer.lr * LrMultiplier(options_.schedule, step_); }

void Trainer::zero_gradients() {
  overlapped_.reset();  // abandons a sum in flight (a failed step)
  ZeroGradients(trainable());
  pending_ = false;
  nonfinite_loss_ = false;
}

torch::Tensor Trainer::token_logprobs(const Batch& batch, bool reference, int64_t logits_chunk, double temperature) {
  if (!reference) {
    activate();
    return TokenLogprobs(model_, batch, logits_chunk, temperature);
  }
  if (reference_) return TokenLogprobs(reference_, batch, logits_chunk, temperature);
  if (!reference_from_base_) {
    throw FailedPrecondition("there is no reference model (trainer.reference.use_reference_model is false)");
  }
  ScopedAdapter base(*model_, nullptr);
  return TokenLogprobs(model_, batch, logits_chunk, temperature);
}

std::vector<SampledCompletion> Trainer::sample(const std::vector<std::vector<int64_t>>& prompts,
                                               const SampleOptions& options) {
  activate();
  return SampleCompletions(model_, prompts, options);
}

std::vector<Sequence> Trainer::with_reference_logprobs(const std::vector<Sequence>& sequences,
                                                       const std::vector<std::vector<size_t>>& micro_batches,
                                                       int64_t logits_chunk, double temperature) {
  std::vector<Sequence> out = sequences;
  // Context parallel: the reference's pass split over the ranks as the step is (each rank
  // holds its positions' activations, not the whole sequence's); docs/architecture.md.
  auto cp_reference = [&](const Batch& batch) {
    if (reference_) return ContextParallelTokenLogprobs(reference_, batch, logits_chunk, temperature, *cp_);
    if (!reference_from_base_) {
      throw FailedPrecondition("there is no reference model (trainer.reference.use_reference_model is false)");
    }
    ScopedAdapter base(*model_, nullptr);
    return ContextParallelTokenLogprobs(model_, batch, logits_chunk, temperature, *cp_);
  };
  for (const auto& indices : micro_batches) {  // the step's own micro-batches
    std::vector<Sequence> part;
    part.reserve(indices.size());
    for (size_t i : indices) part.push_back(sequences[i]);
    const auto batch = MakeBatch(part, options_.layout);
    const auto logprobs = (cp_ ? cp_reference(batch) : token_logprobs(batch, /*reference=*/true, logits_chunk, temperature))
                              .cpu()
                              .contiguous();
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

StepPlan PlanStep(const std::vector<Sequence>& sequences, int64_t vocab_size, const TrainerOptions& options) {
  ValidateSequences(sequences, vocab_size, options.max_sequence_length);
  StepPlan plan;
  plan.sequences = sequences.size();
  for (const auto& s : sequences) {
    plan.tokens += static_cast<int64_t>(s.tokens.size());
    plan.longest = std::max<int64_t>(plan.longest, s.tokens.size());
    plan.top_k = std::max(plan.top_k, s.top_k);
  }
  plan.micro_batches = SplitMicroBatches(sequences, options.layout, options.micro_batch_tokens);
  return plan;
}

StepResult Trainer::forward_backward(const std::vector<Sequence>& sequences, Objective& objective,
                                     const EngineOptions* engine, const StepPlan* plan) {
  return run_step(sequences, objective, engine, plan, /*overlap=*/false);
}

StepResult Trainer::run_step(const std::vector<Sequence>& sequences, Objective& objective,
                             const EngineOptions* engine, const StepPlan* given, bool overlap) {
  // Everything that can be refused is refused before any computation: PlanStep validates.
  StepPlan own;
  if (given && given->sequences != sequences.size()) {
    throw InvalidArgument("the step plan was made for " + std::to_string(given->sequences) +
                          " sequences but the step has " + std::to_string(sequences.size()));
  }
  if (!given) own = PlanStep(sequences, model_->config().vocab_size, options_);
  const StepPlan& plan = given ? *given : own;
  EngineOptions engine_options = engine ? *engine : options_.engine;
  if (engine_options.chunk < 0) throw InvalidArgument("engine.chunk must be >= 0 (0 = default)");
  if (engine_options.logits_chunk < -1) throw InvalidArgument("engine.logits_chunk must be >= -1 (-1 = default)");
  activate();
  const bool needs_reference = objective.needs_reference(sequences);
  if (needs_reference && !has_reference()) {
    throw InvalidArgument(objective.name() +
                          ": the objective needs reference log-probs: give them in the input or "
                          "enable the reference model");
  }
  const double aux_coef = RouterAuxCoefficient(engine_options, model_->config());
  // The whole step's normalizers and group statistics (they need no reference log-probs).
  objective.prepare(sequences);
  // The load-balancing loss of a step split into micro-batches and ranks: each part's
  // weighted by its share of the step's tokens.
  if (aux_coef > 0 && engine_options.aux_loss_step_tokens == 0) {
    for (const auto& s : sequences) engine_options.aux_loss_step_tokens += static_cast<int64_t>(s.tokens.size());
  }

  // Data parallel: this rank computes its shard of the step (normalized as the whole step),
  // and the reference model's log-probs of its shard only.
  const std::vector<Sequence>* step = &sequences;
  const std::vector<std::vector<size_t>>* micro_batches = &plan.micro_batches;
  std::vector<Sequence> shard;
  std::vector<std::vector<size_t>> shard_micro_batches;  // a rank's shard is split by itself
  if (comm_ && comm_->world_size() > 1) {
    if (cp_ && cp_->world_size() > 1) check_context_shards(sequences);
    for (size_t i : local_shard(sequences, comm_->rank())) shard.push_back(sequences[i]);
    step = &shard;
    if (!shard.empty()) shard_micro_batches = SplitMicroBatches(shard, options_.layout, options_.micro_batch_tokens);
    micro_batches = &shard_micro_batches;
  }
  std::vector<Sequence> filled;
  if (needs_reference) {
    try {
      filled = with_reference_logprobs(*step, *micro_batches, engine_options.logits_chunk,
                                       objective.reference_temperature());
    } catch (...) {
      // Nothing ran yet (the pending gradients stay); the objective is left ready for the next step.
      try {
        objective.finish();
      } catch (...) {
      }
      throw;
    }
    step = &filled;
  }

  StepResult total;
  try {
    pending_ = true;
    // Overlap: the last micro-batch's backward finishes each layer's gradients for the
    // step; its hook starts their sum over the ranks while earlier layers run.
    EngineOptions last_options = engine_options;
    if (overlap) {
      overlapped_ = std::make_unique<BucketedSum>(
          *comm_, options_.grad_bucket_bytes > 0 ? options_.grad_bucket_bytes : kDefaultGradBucketBytes);
      overlapped_groups_.assign(model_->layer_list.size() + 2, false);
      overlapped_in_backward_ = 0;
      last_options.on_grads_ready = [this, user = engine_options.on_grads_ready](int64_t layer) {
        if (user) user(layer);
        const int64_t before = overlapped_->buckets_launched();
        add_to_overlapped(layer);
        if (layer != -1) overlapped_in_backward_ += overlapped_->buckets_launched() - before;
      };
    }
    ContextParallelStats cp_stats;  // summed over the micro-batches
    for (size_t m = 0; m < micro_batches->size(); ++m) {
      const auto& indices = (*micro_batches)[m];
      Batch batch;
      if (micro_batches->size() == 1) {
        batch = MakeBatch(*step, options_.layout);
      } else {
        std::vector<Sequence> part;
        part.reserve(indices.size());
        for (size_t i : indices) part.push_back((*step)[i]);
        batch = MakeBatch(part, options_.layout);
      }
      pending_ = true;  // from here on the model may carry gradients of this step
      const bool last = m + 1 == micro_batches->size();
      const auto& opts = last ? last_options : engine_options;
      // Context parallel: the step's result on every rank; each rank's part of the gradients.
      const auto r = cp_ ? ContextParallelForwardBackward(model_, batch, objective, opts, *cp_, &cp_stats)
                         : ForwardBackward(model_, batch, objective, opts);
      total.loss += r.loss;
      total.targets += r.targets;
      total.tokens += r.tokens;
      total.offloaded_bytes = std::max(total.offloaded_bytes, r.offloaded_bytes);
      total.routing_decisions += r.routing_decisions;
      total.routing_mismatches += r.routing_mismatches;
      total.router_aux_loss += r.router_aux_loss;
      if (!std::isfinite(r.loss)) nonfinite_loss_ = true;
    }
    // An engine that did not call the hook for everything (or an empty shard): the rest
    // now, in the same order as the hook, so that every rank launches the same buckets.
    if (overlap) add_to_overlapped(-1);
    // The objective's metrics of the whole step: added up over the ranks that split it.
    std::vector<MetricMerge> merges;
    if (cp_ && cp_->world_size() > 1) merges.push_back(MergeMetricsOver(*cp_));
    if (comm_ && comm_->world_size() > 1) merges.push_back(MergeMetricsOver(*comm_));
    if (merges.empty()) {
      total.metrics = objective.finish();
    } else {
      total.metrics = objective.finish_merged([&merges](MetricParts& parts) {
        for (const auto& merge : merges) merge(parts);
      });
    }
    if (comm_ && comm_->world_size() > 1) {
      const auto sums = comm_->all_reduce_scalars(
          {total.loss, static_cast<double>(total.targets), static_cast<double>(total.tokens),
           static_cast<double>(total.routing_decisions), static_cast<double>(total.routing_mismatches),
           total.router_aux_loss});
      total.loss = sums[0];
      total.targets = static_cast<int64_t>(sums[1]);
      total.tokens = static_cast<int64_t>(sums[2]);
      total.routing_decisions = static_cast<int64_t>(sums[3]);
      total.routing_mismatches = static_cast<int64_t>(sums[4]);
      total.router_aux_loss = sums[5];
    }
    if (cp_) {  // what this rank exchanged (docs/architecture.md: Context parallel)
      const double layers = static_cast<double>(std::max<int64_t>(1, cp_stats.layers));
      total.metrics["context_parallel_kv_bytes_per_layer"] =
          static_cast<double>(cp_stats.kv_bytes + cp_stats.grad_kv_bytes) / layers;
      total.metrics["context_parallel_head_bytes_per_layer"] = static_cast<double>(cp_stats.head_bytes) / layers;
      total.metrics["context_parallel_seconds"] = cp_stats.seconds;
    }
    // HF's aux_loss (before the coefficient; the loss includes coef x it).
    if (aux_coef > 0) total.metrics["router_aux_loss"] = total.router_aux_loss;
    // Routing replay: the share of replayed expert choices the router would have made otherwise.
    if (total.routing_decisions > 0) {
      total.metrics["routing_mismatch"] =
          static_cast<double>(total.routing_mismatches) / static_cast<double>(total.routing_decisions);
    }
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

OptimResult Trainer::optim_step(const AdamStepParams* adam) {
  if (!pending_) {
    throw FailedPrecondition("optim_step: there are no accumulated gradients (call forward_backward first)");
  }
  // This step's optimizer options, checked before anything changes.
  const OptimizerOptions step_options = adam ? adam->Apply(optimizer_->options()) : optimizer_->options();
  const double max_grad_norm = adam ? adam->grad_clip_norm : options_.max_grad_norm;
  OptimResult result;
  result.lr = adam ? adam->lr : current_lr();
  const bool distributed = comm_ && comm_->world_size() > 1;
  if (distributed) {
    const auto before = comm_->stats();
    last_reduce_ = GradReduceInfo{};
    try {
      // Inside the try: a peer that fails here abandons the step like any later collective.
      nonfinite_loss_ = comm_->all_reduce_scalar(nonfinite_loss_ ? 1.0 : 0.0, /*max=*/true) > 0;
      if (overlapped_) {
        last_reduce_.overlapped = true;
        last_reduce_.buckets = overlapped_->buckets_launched();
        last_reduce_.buckets_in_backward = overlapped_in_backward_;
        last_reduce_.bytes = overlapped_->bytes_launched();
        overlapped_->finish();
        overlapped_.reset();
        if (comm_->options().zero_stage >= 2) {
          for (auto& [name, p] : trainable()) {
            if (owner_.at(name) != comm_->rank()) p.mutable_grad() = torch::Tensor();
          }
        }
      } else {
        reduce_gradients();
        for (const char* op : {"all_reduce", "reduce"}) {
          auto now = comm_->stats().by_op.find(op);
          if (now == comm_->stats().by_op.end()) continue;
          auto was = before.by_op.find(op);
          last_reduce_.buckets += now->second.calls - (was == before.by_op.end() ? 0 : was->second.calls);
          last_reduce_.bytes += now->second.bytes - (was == before.by_op.end() ? 0 : was->second.bytes);
        }
      }
    } catch (...) {
      zero_gradients();
      throw;
    }
    last_reduce_.wait_seconds = comm_->stats().seconds - before.seconds;
  }
  // Context parallel: the ranks' parts of the gradients, summed: the one-process gradient on
  // each. After the data-parallel sum (which an overlapped sum writes back into .grad), so
  // that with both every rank ends with the sum over all of them.
  if (cp_) {
    try {
      std::vector<torch::Tensor> params;
      for (auto& [name, p] : trainable()) params.push_back(p);
      SumGradients(params, *cp_);
    } catch (...) {
      zero_gradients();
      throw;
    }
  }
  // Total L2 norm as torch.nn.utils.clip_grad_norm_ computes it (norm of the per-tensor
  // norms), in float64. With ZeRO-2 each rank holds only its owned gradients: the squares
  // are summed over the ranks.
  std::vector<torch::Tensor> norms;
  for (const auto& [name, p] : trainable()) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().to(torch::kFloat64).norm().cpu());
  }
  if (distributed && comm_->options().zero_stage >= 2) {
    const double squares = norms.empty() ? 0.0 : torch::stack(norms).pow(2).sum().item<double>();
    try {
      result.grad_norm = std::sqrt(comm_->all_reduce_scalar(squares));
    } catch (...) {
      zero_gradients();
      throw;
    }
  } else {
    result.grad_norm = norms.empty() ? 0.0 : torch::stack(norms).norm().item<double>();
  }
  if (nonfinite_loss_ || !std::isfinite(result.grad_norm)) {
    result.skipped = true;
    result.reason = nonfinite_loss_ ? "non-finite loss" : "non-finite gradient norm";
    result.step = step_;
    zero_gradients();
    return result;
  }
  double scale = 1.0;
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (result.grad_norm + 1e-6);
    if (coef < 1.0) scale = coef;
  }
  // The step's options for this update only; the configured ones are back afterwards.
  const OptimizerOptions configured = optimizer_->options();
  struct Restore {
    Optimizer& optimizer;
    const OptimizerOptions& options;
    ~Restore() {
      try {
        optimizer.set_options(options);  // valid: it was accepted before
      } catch (...) {
      }
    }
  } restore{*optimizer_, configured};
  if (adam) optimizer_->set_options(step_options);
  try {
    if (distributed && comm_->options().zero_stage >= 1) {
      // Only the owned parameters are updated here (the optimizer skips parameters
      // without a gradient, so it keeps state for this rank's share only).
      for (auto& [name, p] : trainable()) {
        if (owner_.at(name) != comm_->rank()) p.mutable_grad() = torch::Tensor();
      }
    }
    optimizer_->step(result.lr, scale);
    if (distributed && comm_->options().zero_stage >= 1) {
      std::vector<std::vector<torch::Tensor>> by_owner(comm_->world_size());
      for (auto& [name, p] : trainable()) by_owner[owner_.at(name)].push_back(p.detach());
      try {
        for (int r = 0; r < comm_->world_size(); ++r) comm_->broadcast(by_owner[r], r);
      } catch (const Error& e) {
        // This rank's share is updated, a peer's is not: the ranks no longer hold one model.
        throw Error(e.code(), std::string(e.what()) +
                                  "; the update was applied to this rank's share of the weights only (ZeRO), so "
                                  "the ranks now differ: restart the group from the last checkpoint");
      }
    }
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

StepResult Trainer::forward_backward_last(const std::vector<Sequence>& sequences, Objective& objective,
                                          const EngineOptions* engine, const StepPlan* plan) {
  const bool overlap = comm_ && comm_->world_size() > 1 && options_.overlap_grad_reduce;
  return run_step(sequences, objective, engine, plan, overlap);
}

TrainResult Trainer::train_step(const std::vector<Sequence>& sequences, Objective& objective,
                                const EngineOptions* engine, const StepPlan* plan) {
  TrainResult r;
  r.forward = forward_backward_last(sequences, objective, engine, plan);
  r.optim = optim_step();
  return r;
}

}  // namespace streambp
