// The TrainingHost's work on the device: steps, log-probs, sampling, checkpoints, exports.
// Each method admits on the caller's thread (validation, budgets) and submits the work.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "admission.h"
#include "executor.h"
#include "host.h"
#include "host_session.h"
#include "streambp/context_parallel.h"
#include "streambp/error.h"
#include "streambp/top_logprobs.h"
#include "streambp/memory.h"
#include "streambp/sampler.h"
#include "weights_snapshot.h"

namespace streambp::server {
namespace {

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

constexpr int64_t kDecodeSlice = 16;  // decode steps of a Sample between turns of other sessions

// A packed batch's per-position values [rows, T] back to its sequences: sequence q gets one
// value per token but its last (the value at position t is about token t + 1). Slots of one
// sequence are contiguous in a packed row, in order.
std::vector<std::vector<double>> PerSequence(const Batch& batch, const torch::Tensor& values,
                                             const std::vector<Sequence>& sequences) {
  const auto v = values.to(torch::kCPU, torch::kFloat64).contiguous();
  const auto ids = batch.sequence_ids.cpu().contiguous();
  const auto lp = v.accessor<double, 2>();
  const auto sid = ids.accessor<int64_t, 2>();
  std::vector<std::vector<double>> out(sequences.size());
  for (int64_t r = 0; r < batch.rows(); ++r) {
    for (int64_t t = 0; t < batch.length(); ++t) {
      const int64_t q = sid[r][t];
      if (q >= 0 && out[q].size() + 1 < sequences[q].tokens.size()) out[q].push_back(lp[r][t]);
    }
  }
  return out;
}

// A sequence with 2-D targets (cross_entropy's top-k) gets the log-probs of its candidates
// instead of its next tokens': top_k values per position but its last, row-major.
void CandidateLogprobs(const Batch& batch, const torch::Tensor& values, const std::vector<Sequence>& sequences,
                       std::vector<std::vector<double>>& out) {
  const auto v = values.contiguous();
  const auto lp = v.accessor<double, 3>();
  const auto ids = batch.sequence_ids.cpu().contiguous();
  const auto sid = ids.accessor<int64_t, 2>();
  std::vector<size_t> seen(sequences.size(), 0);
  for (size_t q = 0; q < sequences.size(); ++q) {
    if (sequences[q].top_k > 0) out[q].clear();
  }
  for (int64_t r = 0; r < batch.rows(); ++r) {
    for (int64_t t = 0; t < batch.length(); ++t) {
      const int64_t q = sid[r][t];
      if (q < 0 || sequences[q].top_k == 0 || ++seen[q] >= sequences[q].tokens.size()) continue;
      for (int64_t j = 0; j < sequences[q].top_k; ++j) out[q].push_back(lp[r][t][j]);
    }
  }
}

}  // namespace

// --- Steps -----------------------------------------------------------------------------------

StepCommand TrainingHost::prepare_step(const CallContext& ctx, HostSession& s, StepRequest& request, StepKind kind,
                                       EngineOptions* resolved) {
  if (request.sequences.empty()) throw InvalidArgument("the batch is empty");
  StepCommand command;
  // Built once, here: an unknown objective or bad options are refused now, and this instance
  // runs the step (docs/architecture.md: One walk per step).
  command.built = CreateObjective(request.objective, request.objective_options);
  *resolved = admission_->resolve_engine(request.engine);
  const LoraConfig* lora = config_.sessions.enabled && !s.spec.full ? &s.spec.lora : nullptr;
  command.plan = std::make_shared<const StepPlan>(admission_->admit_step(
      request.sequences, request.engine.any_chunk(), resolved, lora, resident_bytes(s.spec.name)));
  command.session = ctx.session;
  command.kind = kind;
  command.sequences = std::move(request.sequences);
  command.objective = request.objective;
  command.options = request.objective_options;
  command.engine = *resolved;
  command.adam = request.adam;
  return command;
}

namespace {
// weighted_logprobs: the client's weights are dL/dlogp at one policy version; on another the
// gradient would be of a different loss, so the step is refused rather than run.
void CheckWeightsVersion(const HostSession& s, std::optional<int64_t> weights_version) {
  if (weights_version && *weights_version != s.version) {
    throw FailedPrecondition("the weights were computed at policy version " + std::to_string(*weights_version) +
                             ", but the policy is now at version " + std::to_string(s.version.load()) +
                             ": compute the log-probs again (ComputeLogprobs) and send new weights");
  }
}
}  // namespace

StepStats TrainingHost::run_forward_backward(const CallContext& ctx, HostSession& s, const StepCommand& command,
                                             const EngineOptions& resolved, OptimStats* optim) {
  if (!command.plan) throw std::logic_error("run_forward_backward: the command has no plan (admit_step makes it)");
  if ((command.kind == StepKind::kTrainStep) != (optim != nullptr)) {
    throw std::logic_error("run_forward_backward: a train_step command and only it reports an optimizer step");
  }
  const auto start = Clock::now();
  auto& trainer = use(s);
  // Gradients thrown away since (a failed step, a load) take their history with them.
  if (!trainer.has_pending_gradients()) s.accumulated = {};
  // The version these gradients are computed at (the log's forward_backward.policy_version).
  const int64_t version = trainer.policy_version();
  memory::ResetPeak();
  const int64_t live_before = memory::LiveBytes();
  const auto micro_batches = static_cast<int64_t>(command.plan->micro_batches.size());
  StepStats st;
  CommandResult r;
  std::optional<Clock::time_point> optim_start;
  {
    // One process: the budget is also a hard limit on allocations. Several ranks: admission
    // alone (an allocation refused on rank 0 mid-step would leave the other ranks waiting in
    // a collective until the group times out and breaks). The optimizer step of a train_step
    // runs outside it, as an OptimStep does.
    std::optional<memory::ScopedBudget> budget;
    budget.emplace(executor_->world_size() > 1 ? 0 : config_.limits.memory_budget_bytes);
    auto hooks = hooks_for(ctx, micro_batches);
    hooks.after_forward_backward = [&](const StepResult&) {
      st.peak_memory_bytes = memory::PeakBytes() - live_before;
      st.seconds = Since(start);
      budget.reset();
      optim_start = Clock::now();
      if (ctx.progress) ctx.progress(StepProgressEvent{"optimizer"});
    };
    try {
      r = executor_->run(command, hooks);
    } catch (const c10::OutOfMemoryError&) {
      on_memory_refusal("out_of_memory");
      throw;
    }
  }
  st.result = r.step;
  st.sequences = static_cast<int64_t>(command.sequences.size());
  st.micro_batches = micro_batches;
  int64_t longest = 0;
  for (const auto& q : command.sequences) longest = std::max<int64_t>(longest, q.tokens.size());
  st.engine = resolved.kind;
  // Context parallel: each rank's engine chunks its own positions (rank 0's reported).
  const int P = static_cast<int>(config_.parallel.context_parallel);
  const auto [first, last] = executor_->world_size() > 1 && P > 1 ? ContextShardRange(longest, 0, P)
                                                                  : std::pair<int64_t, int64_t>{0, longest};
  st.chunks = ResolveChunks(resolved, last - first, executor_->replica().model_config(), executor_->replica().dtype());
  if (!optim_start) {
    st.peak_memory_bytes = memory::PeakBytes() - live_before;
    st.seconds = Since(start);
  }
  st.queue_seconds = std::chrono::duration<double>(start - ctx.received).count();
  st.policy_version = version;
  if (telemetry_) telemetry_->on_forward_backward(s.spec.name, st);
  auto& a = s.accumulated;
  ++a.count;
  a.tokens += st.result.tokens;
  a.loss += st.result.loss;
  a.seconds += st.seconds;
  a.peak_memory_bytes = std::max(a.peak_memory_bytes, st.peak_memory_bytes);
  for (const auto& [name, value] : st.result.metrics) {
    auto& m = a.metrics[name];
    m.first += value;
    ++m.second;
  }
  if (optim) *optim = after_optim_step(s, "train", r.optim, *optim_start, 0);
  return st;
}

OptimStats TrainingHost::run_optim_step(HostSession& s, const std::string& source,
                                        const std::optional<AdamStepParams>& adam, int64_t groups_consumed) {
  const auto start = Clock::now();
  auto& trainer = use(s);
  // Refused here, before any rank sees the command; the gradients stay pending.
  if (adam) adam->Apply(trainer.options().optimizer);
  if (adam && !trainer.has_pending_gradients()) {
    throw FailedPrecondition("optim_step: there are no accumulated gradients (call forward_backward first)");
  }
  return after_optim_step(s, source, executor_->run(OptimStepCommand{s.spec.name, adam}).optim, start,
                          groups_consumed);
}

OptimStats TrainingHost::after_optim_step(HostSession& s, const std::string& source, const OptimResult& result,
                                          Clock::time_point start, int64_t groups_consumed) {
  const auto& trainer = executor_->replica().trainer(s.spec.name);
  OptimStats o;
  o.optim = result;
  if (!o.optim.skipped) ++s.weights_generation;
  o.policy_version = trainer.policy_version();
  o.step = trainer.step();
  publish_state(s);
  if (telemetry_) telemetry_->on_optim_step(s.spec.name, o, Since(start));
  record_history(s, source, o, Since(start), groups_consumed);
  return o;
}

void TrainingHost::forward_backward(CallContext ctx, StepRequest request, Done<StepStats> done) {
  std::shared_ptr<HostSession> s;
  std::shared_ptr<StepCommand> command;
  auto resolved = std::make_shared<EngineOptions>();
  try {
    check_admitted(ctx);
    s = find(ctx.session);
    command = std::make_shared<StepCommand>(prepare_step(ctx, *s, request, StepKind::kForwardBackward, resolved.get()));
    if (request.return_logprobs) {  // its own forward pass, before the step
      admission_->admit_forward(command->sequences, "the forward pass of return_logprobs",
                                "leave return_logprobs off (ComputeLogprobs gives them in smaller calls) or send fewer "
                                "or shorter sequences",
                                resident_bytes(s->spec.name));
    }
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  const auto weights_version = request.weights_policy_version;
  const bool return_logprobs = request.return_logprobs;
  // A cached answer is kept by its size: the log-probs are 8 bytes a token.
  size_t candidates = 0;  // 2-D targets: their log-probs come back too
  for (const auto& q : command->sequences) candidates += q.top_k_targets.size();
  const size_t answer_bytes = 256 + (return_logprobs ? (static_cast<size_t>(request.tokens) + candidates) * 8 : 0);
  submit<StepStats>(
      ctx, s, true,
      [this, ctx, s, command, resolved, weights_version, return_logprobs] {
        CheckWeightsVersion(*s, weights_version);
        // The log-probs first, at the weights the gradients are computed on (a forward-backward
        // does not move them): if this pass fails, no gradient has been added yet.
        std::vector<std::vector<double>> logprobs;
        if (return_logprobs) {
          auto& trainer = use(*s);
          memory::ScopedBudget budget(config_.limits.memory_budget_bytes);
          auto batch = MakeBatch(command->sequences, Layout::kPacked);
          const int64_t chunk = std::max<int64_t>(config_.trainer.engine.logits_chunk, 0);
          logprobs = PerSequence(batch, trainer.token_logprobs(batch, false, chunk, 1.0), command->sequences);
          if (batch.top_k_targets.defined()) {  // after token_logprobs: the session's weights are active
            CandidateLogprobs(batch, TopKTargetLogprobs(trainer.model(), batch, chunk, 1.0), command->sequences, logprobs);
          }
        }
        auto stats = run_forward_backward(ctx, *s, *command, *resolved);
        stats.logprobs = std::move(logprobs);
        return Share(std::move(stats));
      },
      std::move(done), answer_bytes);
}

void TrainingHost::train_step(CallContext ctx, StepRequest request, Done<TrainStats> done) {
  std::shared_ptr<HostSession> s;
  std::shared_ptr<StepCommand> command;
  auto resolved = std::make_shared<EngineOptions>();
  try {
    check_admitted(ctx);
    s = find(ctx.session);
    if (request.adam) request.adam->Validate();
    // One command for the ranks: the step's last forward-backward (with several ranks the
    // gradient sum starts during its backward) and the optimizer step that waits for it.
    command = std::make_shared<StepCommand>(prepare_step(ctx, *s, request, StepKind::kTrainStep, resolved.get()));
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  const auto weights_version = request.weights_policy_version;
  submit<TrainStats>(
      ctx, s, true,
      [this, ctx, s, command, resolved, weights_version] {
        CheckWeightsVersion(*s, weights_version);
        // An optimizer that cannot take adam_params is refused before the forward pass.
        if (command->adam) command->adam->Apply(use(*s).options().optimizer);
        const auto start = Clock::now();
        TrainStats t;
        t.forward = run_forward_backward(ctx, *s, *command, *resolved, &t.optim);
        if (!t.optim.optim.skipped) announce(*s, "train", &t.forward.result, 0);
        if (telemetry_) telemetry_->on_train_step(s->spec.name, t, "train", Since(start));
        return Share(std::move(t));
      },
      std::move(done));
}

void TrainingHost::optim_step(CallContext ctx, std::optional<AdamStepParams> adam, Done<OptimStats> done) {
  std::shared_ptr<HostSession> s;
  try {
    check_admitted(ctx);
    s = find(ctx.session);
    if (adam) adam->Validate();
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<OptimStats>(
      ctx, s, true,
      [this, s, adam] {
        auto o = run_optim_step(*s, "optim_step", adam);
        if (!o.optim.skipped) announce(*s, "train", nullptr, 0);
        return Share(std::move(o));
      },
      std::move(done));
}

// --- Reads on the device -----------------------------------------------------------------------

void TrainingHost::compute_logprobs(CallContext ctx, LogprobsRequest request, Done<LogprobsReply> done) {
  auto req = std::make_shared<LogprobsRequest>(std::move(request));
  std::shared_ptr<HostSession> s;
  try {
    check_admitted(ctx);
    s = find(ctx.session, true);
    if (req->sequences.empty()) throw InvalidArgument("sequences is empty");
    if (!(req->temperature >= 1e-3 && req->temperature <= 1e3)) {
      throw InvalidArgument("temperature must be in [0.001, 1000] (default 1)");
    }
    const bool reference_from_base = config_.sessions.enabled && !s->spec.full;
    if (req->reference && !config_.trainer.reference.use_reference_model && !reference_from_base) {
      throw FailedPrecondition("the server has no reference model (trainer.reference.use_reference_model is false)");
    }
    admission_->admit_logprobs(*req, resident_bytes(s->spec.name));
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<LogprobsReply>(
      ctx, s, false,
      [this, req, s] {
        memory::ScopedBudget budget(config_.limits.memory_budget_bytes);
        auto& trainer = use(*s);
        auto batch = MakeBatch(req->sequences, Layout::kPacked);
        const int64_t chunk = std::max<int64_t>(config_.trainer.engine.logits_chunk, 0);  // 0: DefaultChunks'
        torch::Tensor logp;
        if (req->reference && !trainer.has_reference() && !trainer.adapter()) {
          throw FailedPrecondition("the server has no reference model (trainer.reference.use_reference_model is false)");
        }
        if (req->reference && !trainer.has_reference()) {
          // An adapter session without a reference option: the base is the reference.
          ScopedAdapter base(*trainer.model(), nullptr);
          logp = TokenLogprobs(trainer.model(), batch, chunk, req->temperature).contiguous();
        } else {
          logp = trainer.token_logprobs(batch, req->reference, chunk, req->temperature).contiguous();
        }
        TopLogprobs top;
        if (req->top_k > 0) {
          if (req->reference) throw InvalidArgument("top_k is for the policy: give reference = false");
          // After token_logprobs: the session's weights are active on the model.
          top = TopKLogprobs(trainer.model(), batch, req->top_k, chunk, req->temperature);
        }
        LogprobsReply reply;
        reply.logprobs = PerSequence(batch, logp, req->sequences);
        const int64_t k = req->top_k;
        if (k > 0) {
          reply.top_k = k;
          reply.top_ids.resize(req->sequences.size());
          reply.top_logprobs.resize(req->sequences.size());
          const auto ids = batch.sequence_ids.cpu().contiguous();
          const auto sid = ids.accessor<int64_t, 2>();
          top.ids = top.ids.contiguous();
          top.logprobs = top.logprobs.contiguous();
          const auto top_ids = top.ids.accessor<int64_t, 3>();
          const auto top_lp = top.logprobs.accessor<double, 3>();
          // As PerSequence: k entries per position but a sequence's last.
          std::vector<size_t> seen(req->sequences.size(), 0);
          for (int64_t r = 0; r < batch.rows(); ++r) {
            for (int64_t t = 0; t < batch.length(); ++t) {
              const int64_t q = sid[r][t];
              if (q < 0 || ++seen[q] >= req->sequences[q].tokens.size()) continue;
              for (int64_t j = 0; j < k; ++j) {
                reply.top_ids[q].push_back(static_cast<int32_t>(top_ids[r][t][j]));
                reply.top_logprobs[q].push_back(top_lp[r][t][j]);
              }
            }
          }
        }
        reply.policy_version = trainer.policy_version();
        reply.fp64 = req->fp64;
        return Share(std::move(reply));
      },
      std::move(done));
}

void TrainingHost::sample(CallContext ctx, SampleRequest request, Done<SampleReply> done) {
  auto req = std::make_shared<SampleRequest>(std::move(request));
  std::shared_ptr<HostSession> s;
  try {
    check_admitted(ctx);
    s = find(ctx.session, true);
    auto& o = req->options;
    if (req->prompts.empty()) throw InvalidArgument("prompts is empty");
    if (o.max_tokens <= 0) throw InvalidArgument("max_tokens must be > 0");
    if (o.n < 1 || o.n > 256) throw InvalidArgument("n must be in [1, 256] (0 = 1)");
    if (!(o.temperature >= 0 && o.temperature <= 1e3)) throw InvalidArgument("temperature must be in [0, 1000]");
    if (o.temperature > 0 && o.temperature < 1e-3) {
      throw InvalidArgument("temperature must be 0 (greedy) or >= 0.001");
    }
    if (!(o.top_p > 0 && o.top_p <= 1)) throw InvalidArgument("top_p must be in (0, 1]");
    for (size_t i = 0; i < o.stop_tokens.size(); ++i) {
      if (o.stop_tokens[i] < 0 || o.stop_tokens[i] >= limits_.vocab_size) {
        throw InvalidArgument("stop_tokens[" + std::to_string(i) + "] = " + std::to_string(o.stop_tokens[i]) +
                              " is outside the vocabulary [0, " + std::to_string(limits_.vocab_size) + ")");
      }
    }
    if (!req->ignore_eos) {  // the model's end tokens end a completion too
      for (int64_t id : info_.eos_token_ids) {
        if (id < limits_.vocab_size && std::find(o.stop_tokens.begin(), o.stop_tokens.end(), id) == o.stop_tokens.end()) {
          o.stop_tokens.push_back(id);
        }
      }
    }
    if (req->decode_text && !limits_.text) throw FailedPrecondition(limits_.text_unavailable);
    for (size_t i = 0; i < req->prompts.size(); ++i) {
      if (static_cast<int64_t>(req->prompts[i].size()) + o.max_tokens > limits_.max_sequence_length) {
        throw InvalidArgument("prompts[" + std::to_string(i) + "]: prompt + max_tokens exceed the maximum sequence "
                              "length " + std::to_string(limits_.max_sequence_length));
      }
    }
    admission_->admit_sample(*req, resident_bytes(s->spec.name));
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  // Generation in slices: the job yields between them, so other sessions' jobs take turns.
  auto run = std::make_shared<std::unique_ptr<SampleRun>>();
  DeviceWorker::Job job;
  job.lane = ctx.session;
  job.method = ctx.method;
  job.deadline = ctx.deadline;
  job.cancelled = ctx.cancelled;
  job.run = [this, s, req, run, done, ctx] {
    try {
      if (s->deleted) throw NotFound("no session named '" + s->spec.name + "'");
      if (ctx.cancelled && ctx.cancelled()) throw Cancelled("the client went away; sampling was abandoned");
      memory::ScopedBudget budget(config_.limits.memory_budget_bytes);
      auto& trainer = use(*s);
      trainer.activate();
      if (!*run) *run = std::make_unique<SampleRun>(trainer.model(), req->prompts, req->options);
      if (!(*run)->step(kDecodeSlice)) return false;  // more to come, after other sessions' turns
      SampleReply reply;
      reply.completions = (*run)->take();
      reply.policy_version = trainer.policy_version();
      reply.num_experts = limits_.num_experts;
      reply.sparse_layers = limits_.sparse_layers;
      reply.experts_per_token = limits_.experts_per_token;
      if (req->decode_text) {
        for (const auto& c : reply.completions) reply.texts.push_back(limits_.text->decode(c.tokens, true));
      }
      run->reset();
      done({Share(std::move(reply)), nullptr});
    } catch (...) {
      run->reset();
      done({nullptr, std::current_exception()});
    }
    return true;
  };
  job.drop = [done, run](std::exception_ptr e) {
    run->reset();
    done({nullptr, e});
  };
  const auto submitted = worker_->submit(std::move(job));
  if (submitted == DeviceWorker::Submit::kAccepted) return;
  done({nullptr, std::make_exception_ptr(submitted == DeviceWorker::Submit::kStopped
                                             ? static_cast<Error>(Unavailable("the server is shutting down"))
                                             : static_cast<Error>(ResourceExhausted(
                                                   "the request queue is full; retry with backoff")))});
}

}  // namespace streambp::server
