// The TrainingHost: one path for every call that touches the model (admit on the caller's
// thread, run on the device thread through the Executor), and the RL loop's queue.
#include "host.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "admission.h"
#include "executor.h"
#include "request_cache.h"
#include "rollout_input.h"
#include "rollout_queue.h"
#include "streambp/error.h"
#include "streambp/memory.h"
#include "streambp/model.h"
#include "streambp/runtime.h"
#include "streambp/safetensors.h"
#include "weights_snapshot.h"

namespace streambp::server {
namespace {

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <class T>
std::shared_ptr<const T> Share(T value) {
  return std::make_shared<const T>(std::move(value));
}

bool IsUnavailable(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code() == ErrorCode::kUnavailable;
  } catch (...) {
    return false;
  }
}

}  // namespace

void ValidateCheckpointName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 128 && name.front() != '.';
  for (char ch : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-');
  }
  if (!ok) {
    throw InvalidArgument("checkpoint name '" + name.substr(0, 200) +
                          "' is not allowed: use letters, digits, '.', '_' and '-', not starting with '.' (a name "
                          "inside the server's checkpoint directory, never a path)");
  }
}

TrainingHost::TrainingHost(const ServerConfig& config) : config_(config) {}

std::unique_ptr<TrainingHost> TrainingHost::Create(const ServerConfig& config, Hooks hooks) {
  config.Validate();
  RegisterBuiltinObjectives();
  memory::InstallTrackingAllocator();
  std::unique_ptr<TrainingHost> h(new TrainingHost(config));
  const auto& c = h->config_;
  auto dist = DistOptions::FromEnv();
  const torch::Device device = RankDevice(c.model.device, dist);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw InvalidArgument("config: model.device is " + c.model.device + " but no CUDA device is available (this build: " +
                          (GetRuntimeInfo().cuda ? "CUDA" : "CPU only") + ")");
  }
  CreateObjective("grpo", c.rollouts.grpo);  // bad rollout options fail at start, not at the first step
  std::shared_ptr<Communicator> comm;
  if (dist.enabled()) {
    if (dist.backend.empty()) dist.backend = device.is_cuda() ? "nccl" : "gloo";
    comm = Communicator::Create(dist);  // the other ranks run RunFollower
    spdlog::info("rank 0 of {}: data parallel over {}, ZeRO stage {}", dist.world_size, dist.backend, dist.zero_stage);
  }
  h->executor_ = MakeExecutor(Replica::Create(c, device, comm), comm, std::move(hooks.on_command));
  auto& replica = h->executor_->replica();
  if (!c.checkpoint_dir.empty()) CleanStaging(c.checkpoint_dir);
  if (c.resume) {
    const std::string newest = FindNewestCheckpoint(c.checkpoint_dir);
    if (!newest.empty()) {
      h->executor_->run(LoadCommand{"", h->checkpoint_path(newest)});
      spdlog::info("resumed from checkpoint {} (step {}, policy version {})", newest, replica.trainer().step(),
                   replica.trainer().policy_version());
    }
  }
  RolloutOptions ro;
  ro.groups_per_step = c.rollouts.groups_per_step;
  ro.max_staleness = c.rollouts.max_staleness;
  ro.max_queue = c.rollouts.max_queue;
  ro.log_path = c.rollouts.log;
  ro.max_group_id_bytes = c.limits.max_request_id_bytes;
  h->rollouts_ = std::make_unique<RolloutQueue>(ro, replica.trainer().policy_version());
  h->run_id_ = std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "-" +
               std::to_string(::getpid());
  h->audit({{"resumed", replica.trainer().policy_version()}});
  h->limits_ = InputLimits{replica.model_config().vocab_size, c.limits.max_sequence_length,
                           c.limits.max_tokens_per_request};
  h->admission_ = std::make_unique<Admission>(h->config_, replica.model_config(), replica.dtype());
  h->admission_->on_refusal = [raw = h.get()](const std::string& reason) { raw->on_memory_refusal(reason); };
  h->cache_ = std::make_unique<RequestCache>(static_cast<size_t>(c.limits.request_id_cache),
                                             static_cast<size_t>(c.limits.request_id_cache_bytes));
  h->worker_ = std::make_unique<DeviceWorker>(static_cast<size_t>(c.limits.queue_depth),
                                              static_cast<size_t>(c.limits.queue_depth));

  auto& info = h->info_;
  info.model = replica.model_config();
  for (const auto& p : replica.trainer().model()->parameters()) info.num_parameters += p.numel();
  info.dtype = DtypeName(replica.dtype());
  info.device = c.model.device;
  info.engine = c.trainer.engine;
  info.world_size = h->executor_->world_size();
  info.optimizer = c.trainer.optimizer.name;
  info.learning_rate = c.trainer.optimizer.lr;
  info.max_sequence_length = c.limits.max_sequence_length;
  info.max_tokens_per_request = c.limits.max_tokens_per_request;
  info.reference_model = c.trainer.reference.use_reference_model;

  h->publish_state();
  h->announce("start", nullptr, 0);
  TrainingHost* raw = h.get();
  h->io_thread_ = std::thread([raw] {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(raw->io_mutex_);
        raw->io_cv_.wait(lock, [raw] { return raw->io_stopping_ || !raw->io_jobs_.empty(); });
        if (raw->io_jobs_.empty()) return;
        job = std::move(raw->io_jobs_.front());
        raw->io_jobs_.pop_front();
      }
      job();
    }
  });
  if (h->executor_->world_size() > 1) {
    h->heartbeat_ = std::thread([raw, period = std::chrono::duration<double>(comm->options().timeout_seconds / 4)] {
      std::unique_lock<std::mutex> lock(raw->heartbeat_mutex_);
      while (!raw->heartbeat_cv_.wait_for(lock, period, [raw] { return raw->draining_.load(); })) {
        DeviceWorker::Job job;
        job.method = "Heartbeat";
        job.run = [raw] {
          try {
            raw->executor_->run(PingCommand{});
          } catch (const std::exception& e) {
            raw->mark_broken(e.what());
          }
          return true;
        };
        job.drop = [](std::exception_ptr) {};
        raw->worker_->submit(std::move(job));
      }
    });
  }
  h->schedule_rollout_step();  // groups replayed from the log
  return h;
}

TrainingHost::~TrainingHost() { shutdown(); }

// --- State -----------------------------------------------------------------------------

HostInfo TrainingHost::info() const {
  HostInfo i = info_;
  i.policy_version = version_;
  i.step = step_;
  i.pending_micro_batches = pending_;
  return i;
}

void TrainingHost::publish_state() {
  auto& t = executor_->replica().trainer();
  step_ = t.step();
  version_ = t.policy_version();
  pending_ = t.has_pending_gradients() ? 1 : 0;
}

std::string TrainingHost::broken_reason() const {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  return broken_reason_;
}

void TrainingHost::mark_broken(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (!broken_reason_.empty()) return;
    broken_reason_ = reason.empty() ? "a rank is gone" : reason;
  }
  spdlog::error("the process group is broken; answering UNAVAILABLE from now on: {}", reason);
}

void TrainingHost::on_memory_refusal(const std::string& reason) {
  if (telemetry_) telemetry_->on_memory_refusal(reason);
}

EstimateReply TrainingHost::estimate(int64_t rows, int64_t seq_len, const EngineRequest& engine) const {
  return admission_->estimate(rows, seq_len, engine);
}

RolloutStats TrainingHost::rollout_stats() const {
  auto s = rollouts_->stats();
  s.invalid = invalid_groups_;
  s.policy_version = version_;
  return s;
}

void TrainingHost::announce(const std::string& source, const StepResult* forward, int64_t groups_consumed) {
  PolicyUpdate u;
  u.policy_version = version_;
  u.step = step_;
  u.source = source;
  if (forward) {
    u.loss = forward->loss;
    u.tokens = forward->tokens;
    auto get = [&](const char* k) {
      auto it = forward->metrics.find(k);
      return it == forward->metrics.end() ? 0.0 : it->second;
    };
    u.reward_mean = get("reward_mean");
    u.kl = get("kl");
    u.clip_fraction = get("clip_ratio/region_mean");
    u.metrics = forward->metrics;
  }
  u.groups_consumed = groups_consumed;
  u.groups_dropped = dropped_since_update_.exchange(0);
  hub_.publish(u);
}

std::string TrainingHost::checkpoint_path(const std::string& name) const {
  return (std::filesystem::path(config_.checkpoint_dir) / name).string();
}

// --- The common path ---------------------------------------------------------------------

void TrainingHost::check_admitted(const CallContext& ctx) const {
  if (draining_) throw Unavailable("the server is shutting down; retry against its replacement");
  if (const auto reason = broken_reason(); !reason.empty()) {
    throw Unavailable("a rank of this server is gone: " + reason);
  }
  if (static_cast<int64_t>(ctx.request_id.size()) > config_.limits.max_request_id_bytes) {
    throw InvalidArgument("request_id is " + std::to_string(ctx.request_id.size()) + " bytes; at most " +
                          std::to_string(config_.limits.max_request_id_bytes) + " (limits.max_request_id_bytes)");
  }
}

ApplyHooks TrainingHost::hooks_for(const CallContext& ctx) {
  ApplyHooks hooks;
  if (executor_->world_size() > 1) return hooks;  // every rank must run a command to its end
  hooks.on_progress = [this, cancelled = ctx.cancelled, deadline = ctx.deadline](const EngineProgress&) {
    if (abort_running_) {
      throw Unavailable("the server is shutting down (shutdown.grace_seconds ran out); the step was abandoned and "
                        "rolled back");
    }
    if (cancelled && cancelled()) {
      throw Cancelled("the client went away; the step was abandoned at a chunk boundary and rolled back (pending "
                      "gradients cleared)");
    }
    if (std::chrono::system_clock::now() > deadline) {
      throw DeadlineExceeded("the deadline passed during the step; it was abandoned and rolled back (pending "
                             "gradients cleared)");
    }
  };
  return hooks;
}

template <class T>
void TrainingHost::submit(CallContext ctx, bool mutating, std::function<std::shared_ptr<const T>()> work,
                          Done<T> done, size_t answer_bytes) {
  std::string key;
  if (mutating && !ctx.request_id.empty()) {
    key = ctx.method + "/" + ctx.request_id;
    try {
      const bool fresh = cache_->begin(key, ctx.digest, [done](std::exception_ptr e, std::shared_ptr<const void> v) {
        done(Outcome<T>{std::static_pointer_cast<const T>(v), e});
      });
      if (!fresh) return;
    } catch (...) {
      done(Outcome<T>{nullptr, std::current_exception()});
      return;
    }
  }
  auto finish = [this, key, done, answer_bytes](std::exception_ptr e, std::shared_ptr<const T> v, bool applied) {
    if (!key.empty()) cache_->complete(key, e, v, answer_bytes, applied);
    done(Outcome<T>{v, e});
  };
  DeviceWorker::Job job;
  job.method = ctx.method;
  job.deadline = ctx.deadline;
  job.cancelled = ctx.cancelled;
  job.run = [this, work, finish] {
    std::shared_ptr<const T> value;
    std::exception_ptr error;
    try {
      value = work();
    } catch (...) {
      error = std::current_exception();
      if (executor_->world_size() > 1 && IsUnavailable(error)) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          mark_broken(e.what());
        }
      }
    }
    publish_state();
    finish(error, value, true);
    return true;
  };
  job.drop = [finish](std::exception_ptr e) { finish(e, nullptr, false); };
  switch (worker_->submit(std::move(job))) {
    case DeviceWorker::Submit::kAccepted:
      return;
    case DeviceWorker::Submit::kFull:
    case DeviceWorker::Submit::kLaneFull:
      finish(std::make_exception_ptr(ResourceExhausted(
                 "the request queue is full (" + std::to_string(worker_->capacity()) +
                 " waiting, limits.queue_depth); retry with backoff")),
             nullptr, false);
      return;
    case DeviceWorker::Submit::kStopped:
      finish(std::make_exception_ptr(Unavailable("the server is shutting down; retry against its replacement")),
             nullptr, false);
      return;
  }
}

// --- Steps -----------------------------------------------------------------------------------

StepCommand TrainingHost::prepare_step(const CallContext& ctx, StepRequest& request, StepKind kind,
                                       EngineOptions* resolved) {
  check_admitted(ctx);
  if (request.sequences.empty()) throw InvalidArgument("the batch is empty");
  CreateObjective(request.objective, request.objective_options);  // unknown objective or options: refused now
  *resolved = admission_->resolve_engine(request.engine);
  admission_->admit_step(request.sequences, request.tokens, request.engine.any_chunk(), resolved);
  StepCommand command;
  command.kind = kind;
  command.sequences = std::move(request.sequences);
  command.objective = request.objective;
  command.options = request.objective_options;
  command.engine = *resolved;
  return command;
}

StepStats TrainingHost::run_forward_backward(const CallContext& ctx, const StepCommand& command,
                                             const EngineOptions& resolved) {
  const auto start = Clock::now();
  memory::ResetPeak();
  const int64_t live_before = memory::LiveBytes();
  CommandResult r;
  {
    memory::ScopedBudget budget(config_.limits.memory_budget_bytes);
    try {
      r = executor_->run(command, hooks_for(ctx));
    } catch (const c10::OutOfMemoryError&) {
      on_memory_refusal("out_of_memory");
      throw;
    }
  }
  StepStats s;
  s.result = r.step;
  s.sequences = static_cast<int64_t>(command.sequences.size());
  const auto& topts = executor_->replica().trainer_options();
  s.micro_batches =
      static_cast<int64_t>(SplitMicroBatches(command.sequences, topts.layout, topts.micro_batch_tokens).size());
  int64_t longest = 0;
  for (const auto& q : command.sequences) longest = std::max<int64_t>(longest, q.tokens.size());
  s.engine = resolved.kind;
  s.chunks = ResolveChunks(resolved, longest);
  s.peak_memory_bytes = memory::PeakBytes() - live_before;
  s.seconds = Since(start);
  s.queue_seconds = std::chrono::duration<double>(start - ctx.received).count();
  if (telemetry_) telemetry_->on_forward_backward(s);
  return s;
}

OptimStats TrainingHost::run_optim_step(const std::string& session) {
  const auto start = Clock::now();
  OptimStats o;
  o.optim = executor_->run(OptimStepCommand{session}).optim;
  if (!o.optim.skipped) ++weights_generation_;
  auto& t = executor_->replica().trainer(session);
  o.policy_version = t.policy_version();
  o.step = t.step();
  publish_state();
  if (telemetry_) telemetry_->on_optim_step(o, Since(start));
  return o;
}

void TrainingHost::forward_backward(CallContext ctx, StepRequest request, Done<StepStats> done) {
  std::shared_ptr<StepCommand> command;
  auto resolved = std::make_shared<EngineOptions>();
  try {
    command = std::make_shared<StepCommand>(prepare_step(ctx, request, StepKind::kForwardBackward, resolved.get()));
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<StepStats>(
      ctx, true,
      [this, ctx, command, resolved] {
        auto stats = run_forward_backward(ctx, *command, *resolved);
        stats.policy_version = version_;
        return Share(std::move(stats));
      },
      std::move(done));
}

void TrainingHost::train_step(CallContext ctx, StepRequest request, Done<TrainStats> done) {
  std::shared_ptr<StepCommand> command;
  auto resolved = std::make_shared<EngineOptions>();
  try {
    // The step's last forward-backward: with several ranks the gradient sum starts during
    // its backward, and the optimizer step waits for it.
    command =
        std::make_shared<StepCommand>(prepare_step(ctx, request, StepKind::kForwardBackwardLast, resolved.get()));
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<TrainStats>(
      ctx, true,
      [this, ctx, command, resolved] {
        const auto start = Clock::now();
        TrainStats t;
        t.forward = run_forward_backward(ctx, *command, *resolved);
        t.forward.policy_version = version_;
        t.optim = run_optim_step("");
        if (!t.optim.optim.skipped) announce("train", &t.forward.result, 0);
        if (telemetry_) telemetry_->on_train_step(t, "train", Since(start));
        return Share(std::move(t));
      },
      std::move(done));
}

void TrainingHost::optim_step(CallContext ctx, Done<OptimStats> done) {
  try {
    check_admitted(ctx);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<OptimStats>(
      ctx, true,
      [this] {
        auto o = run_optim_step("");
        if (!o.optim.skipped) announce("train", nullptr, 0);
        return Share(std::move(o));
      },
      std::move(done));
}

// --- Reads on the device -----------------------------------------------------------------------

void TrainingHost::compute_logprobs(CallContext ctx, LogprobsRequest request, Done<LogprobsReply> done) {
  auto req = std::make_shared<LogprobsRequest>(std::move(request));
  try {
    check_admitted(ctx);
    if (req->sequences.empty()) throw InvalidArgument("sequences is empty");
    if (!(req->temperature >= 1e-3 && req->temperature <= 1e3)) {
      throw InvalidArgument("temperature must be in [0.001, 1000] (default 1)");
    }
    if (req->reference && !config_.trainer.reference.use_reference_model) {
      throw FailedPrecondition("the server has no reference model (trainer.reference.use_reference_model is false)");
    }
    admission_->admit_logprobs(*req);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<LogprobsReply>(
      ctx, false,
      [this, req] {
        memory::ScopedBudget budget(config_.limits.memory_budget_bytes);
        auto& trainer = executor_->replica().trainer();
        auto batch = MakeBatch(req->sequences, Layout::kPacked);
        const int64_t chunk = config_.trainer.engine.logits_chunk > 0 ? config_.trainer.engine.logits_chunk
                                                                       : kDefaultLogitsChunk;
        auto logp = trainer.token_logprobs(batch, req->reference, chunk, req->temperature).contiguous();
        auto ids = batch.sequence_ids.cpu().contiguous();
        auto lp = logp.accessor<double, 2>();
        auto sid = ids.accessor<int64_t, 2>();
        LogprobsReply reply;
        reply.logprobs.resize(req->sequences.size());
        // Slots of one sequence are contiguous in a packed row, in order.
        for (int64_t r = 0; r < batch.rows(); ++r) {
          for (int64_t t = 0; t < batch.length(); ++t) {
            const int64_t s = sid[r][t];
            if (s < 0) continue;
            auto& out = reply.logprobs[s];
            if (static_cast<int64_t>(out.size()) + 1 < static_cast<int64_t>(req->sequences[s].tokens.size())) {
              out.push_back(lp[r][t]);
            }
          }
        }
        reply.policy_version = trainer.policy_version();
        return Share(std::move(reply));
      },
      std::move(done));
}

void TrainingHost::sample(CallContext ctx, SampleRequest request, Done<SampleReply> done) {
  auto req = std::make_shared<SampleRequest>(std::move(request));
  try {
    check_admitted(ctx);
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
    for (size_t i = 0; i < req->prompts.size(); ++i) {
      if (static_cast<int64_t>(req->prompts[i].size()) + o.max_tokens > limits_.max_sequence_length) {
        throw InvalidArgument("prompts[" + std::to_string(i) + "]: prompt + max_tokens exceed the maximum sequence "
                              "length " + std::to_string(limits_.max_sequence_length));
      }
    }
    admission_->admit_sample(*req);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<SampleReply>(
      ctx, false,
      [this, req] {
        memory::ScopedBudget budget(config_.limits.memory_budget_bytes);
        auto& trainer = executor_->replica().trainer();
        SampleReply reply;
        reply.completions = trainer.sample(req->prompts, req->options);
        reply.policy_version = trainer.policy_version();
        return Share(std::move(reply));
      },
      std::move(done));
}

// --- State on disk ----------------------------------------------------------------------------

namespace {

// Errors name the checkpoint, never the server's paths (those go to the log).
[[noreturn]] void RethrowWithoutPaths(const std::string& dir, const std::string& what) {
  try {
    throw;
  } catch (const Error& e) {
    std::string message = e.what();
    spdlog::warn("{}: {}", what, message);
    for (size_t at; !dir.empty() && (at = message.find(dir)) != std::string::npos;) {
      message.replace(at, dir.size(), "<checkpoint_dir>");
    }
    throw Error(e.code(), message);
  }
}

}  // namespace

void TrainingHost::save_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done) {
  try {
    check_admitted(ctx);
    if (config_.checkpoint_dir.empty()) {
      throw FailedPrecondition("no checkpoint directory is configured (checkpoint_dir in the server config)");
    }
    if (!name.empty()) ValidateCheckpointName(name);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<CheckpointReply>(
      ctx, true,
      [this, name] {
        auto& trainer = executor_->replica().trainer();
        if (trainer.has_pending_gradients()) {
          throw FailedPrecondition("gradients are pending: call OptimStep (or TrainStep) before saving a checkpoint");
        }
        CheckpointReply r;
        r.name = name.empty() ? "step-" + std::to_string(trainer.step()) : name;
        const auto dir = checkpoint_path(r.name);
        try {
          executor_->run(SaveCommand{"", dir});
        } catch (...) {
          RethrowWithoutPaths(config_.checkpoint_dir, "saving checkpoint " + r.name);
        }
        for (const auto& f : std::filesystem::directory_iterator(dir)) {
          if (f.is_regular_file()) r.bytes += static_cast<int64_t>(f.file_size());
        }
        r.step = trainer.step();
        r.policy_version = trainer.policy_version();
        return Share(std::move(r));
      },
      std::move(done));
}

void TrainingHost::load_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done) {
  try {
    check_admitted(ctx);
    if (config_.checkpoint_dir.empty()) {
      throw FailedPrecondition("no checkpoint directory is configured (checkpoint_dir in the server config)");
    }
    if (!name.empty()) ValidateCheckpointName(name);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<CheckpointReply>(
      ctx, true,
      [this, name] {
        CheckpointReply r;
        r.name = name.empty() ? FindNewestCheckpoint(config_.checkpoint_dir) : name;
        if (r.name.empty()) throw NotFound("no complete checkpoint in the checkpoint directory yet");
        const auto dir = checkpoint_path(r.name);
        if (!std::filesystem::is_directory(dir)) throw NotFound("no checkpoint named '" + r.name + "'");
        try {
          executor_->run(LoadCommand{"", dir});
        } catch (...) {
          RethrowWithoutPaths(config_.checkpoint_dir, "loading checkpoint " + r.name);
        }
        ++weights_generation_;
        publish_state();
        announce("load", nullptr, 0);
        auto& trainer = executor_->replica().trainer();
        r.step = trainer.step();
        r.policy_version = trainer.policy_version();
        return Share(std::move(r));
      },
      std::move(done));
}

void TrainingHost::export_weights(CallContext ctx, int64_t version, Done<ExportReply> done) {
  try {
    check_admitted(ctx);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<ExportReply>(
      ctx, false,
      [this, version] {
        auto& trainer = executor_->replica().trainer();
        const int64_t generation = weights_generation_;
        if (!snapshot_ || snapshot_generation_ != generation) {
          snapshot_.reset();  // the old version's bytes go before the new ones are made
          snapshot_ = Share(MakeWeightsSnapshot(trainer.model(), trainer.policy_version()));
          snapshot_generation_ = generation;
        }
        ExportReply r;
        r.snapshot = snapshot_;
        if (version != 0 && version != snapshot_->policy_version) {
          r.note = "version " + std::to_string(version) + " is not available; serving the current version " +
                   std::to_string(snapshot_->policy_version);
        }
        return Share(std::move(r));
      },
      std::move(done));
}

// --- Leases ------------------------------------------------------------------------------------

namespace {

TrainingHost::Lease Acquire(std::atomic<int64_t>& counter, int64_t limit, const std::string& what) {
  if (counter.fetch_add(1) >= limit) {
    --counter;
    throw ResourceExhausted(what + ": " + std::to_string(limit) + " are running; retry later");
  }
  return TrainingHost::Lease(nullptr, [&counter](void*) { --counter; });
}

}  // namespace

TrainingHost::Lease TrainingHost::acquire_stream() {
  return Acquire(streams_, config_.limits.max_streams, "too many open streams (limits.max_streams)");
}

TrainingHost::Lease TrainingHost::acquire_export() {
  return Acquire(exports_, config_.limits.max_concurrent_exports,
                 "too many weight exports at once (limits.max_concurrent_exports)");
}

// --- Rollouts ----------------------------------------------------------------------------------

void TrainingHost::watch_policy(PolicySink* sink, int64_t since) {
  if (draining_) throw Unavailable("the server is shutting down; retry against its replacement");
  hub_.subscribe(sink, since);
}

void TrainingHost::unwatch_policy(PolicySink* sink) { hub_.unsubscribe(sink); }

void TrainingHost::push_rollouts(CallContext ctx, std::vector<PushItem> items, Done<std::vector<RolloutAck>> done) {
  try {
    check_admitted(ctx);
    if (items.empty()) throw InvalidArgument("groups is empty");
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  auto work = [this, items = std::move(items), done]() mutable {
    std::vector<RolloutAck> acks(items.size());
    std::vector<RolloutGroup> valid;
    std::vector<int> indices;
    std::vector<size_t> slots;
    const int64_t current = version_;
    auto objective = CreateObjective("grpo", config_.rollouts.grpo);
    for (size_t i = 0; i < items.size(); ++i) {
      auto& item = items[i];
      auto& ack = acks[i];
      ack.index = item.index;
      ack.policy_version = current;
      try {
        if (!item.group) throw InvalidArgument(item.error);
        ack.group_id = item.group->group_id;
        const std::string field = "groups[" + std::to_string(item.index) + "]";
        if (item.group->policy_version > current) {
          throw InvalidArgument(field + ".policy_version " + std::to_string(item.group->policy_version) +
                                " is from the future (the current version is " + std::to_string(current) + ")");
        }
        objective->prepare(RolloutSequences(*item.group, 0, limits_, field));  // e.g. a group of one
        valid.push_back(std::move(*item.group));
        indices.push_back(item.index);
        slots.push_back(i);
      } catch (const std::exception& e) {
        ++invalid_groups_;
        ack.status = RolloutStatus::kInvalid;
        ack.message = e.what();
      }
    }
    bool any_accepted = false;
    if (!valid.empty()) {
      auto queued = rollouts_->push(std::move(valid), indices, current);
      for (size_t k = 0; k < queued.size(); ++k) {
        any_accepted = any_accepted || queued[k].status == RolloutStatus::kAccepted;
        if (queued[k].status == RolloutStatus::kStale) ++dropped_since_update_;
        if (queued[k].status == RolloutStatus::kInvalid) ++invalid_groups_;
        acks[slots[k]] = std::move(queued[k]);
      }
    }
    const int64_t depth = rollouts_->stats().queue_depth;
    for (auto& a : acks) {
      if (a.status == RolloutStatus::kInvalid && a.queue_depth == 0) a.queue_depth = depth;
    }
    done({std::make_shared<const std::vector<RolloutAck>>(std::move(acks)), nullptr});
    if (any_accepted) schedule_rollout_step();
  };
  {
    std::lock_guard<std::mutex> lock(io_mutex_);
    if (io_stopping_) {
      done({nullptr, std::make_exception_ptr(Unavailable("the server is shutting down; retry later"))});
      return;
    }
    io_jobs_.push_back(std::move(work));
  }
  io_cv_.notify_one();
}

void TrainingHost::schedule_rollout_step() {
  if (!rollouts_->ready() || draining_) return;
  bool expected = false;
  if (!rollout_step_scheduled_.compare_exchange_strong(expected, true)) return;
  DeviceWorker::Job job;
  job.method = "RolloutStep";
  job.run = [this] {
    bool again = false;
    try {
      again = true;
      run_rollout_step();
    } catch (const std::exception& e) {
      again = false;
      spdlog::error("rollout step failed: {}", e.what());
    }
    publish_state();
    rollout_step_scheduled_ = false;
    if (again) schedule_rollout_step();
    return true;
  };
  job.drop = [this](std::exception_ptr) { rollout_step_scheduled_ = false; };
  if (worker_->submit(std::move(job)) != DeviceWorker::Submit::kAccepted) rollout_step_scheduled_ = false;
}

void TrainingHost::run_rollout_step() {
  const auto start = Clock::now();
  int64_t dropped = 0;
  auto groups = rollouts_->take(version_, &dropped);
  dropped_since_update_ += dropped;
  if (groups.empty()) return;
  StepCommand command;
  command.kind = StepKind::kForwardBackwardLast;
  command.objective = "grpo";
  command.options = config_.rollouts.grpo;
  int64_t tokens = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto seqs = RolloutSequences(groups[g].group, static_cast<int64_t>(g), limits_, "group " + groups[g].id);
    for (auto& s : seqs) {
      tokens += static_cast<int64_t>(s.tokens.size());
      command.sequences.push_back(std::move(s));
    }
  }
  CallContext ctx;
  ctx.method = "RolloutStep";
  ctx.received = start;
  TrainStats t;
  bool committed = false;
  try {
    EngineOptions engine = admission_->resolve_engine({});
    admission_->admit_step(command.sequences, tokens, false, &engine);
    command.engine = engine;
    t.forward = run_forward_backward(ctx, command, engine);
    t.forward.policy_version = version_;
    // The step and its "consumed" record commit together: the record (naming the version
    // this step produces) first; if it cannot be written the step is not applied and the
    // groups stay queued for the next try.
    try {
      rollouts_->commit(groups, version_ + 1);
      committed = true;
    } catch (const std::exception& e) {
      executor_->run(ZeroGradientsCommand{""});
      publish_state();
      spdlog::error("rollout step not applied: the rollout log cannot be written ({}); {} groups stay queued",
                    e.what(), groups.size());
      rollouts_->restore(std::move(groups));
      rollouts_->set_last_step_seconds(Since(start));
      throw;
    }
    t.optim = run_optim_step("");
  } catch (...) {
    rollouts_->set_last_step_seconds(Since(start));
    if (groups.empty()) throw;  // restored above
    // Groups that cannot be trained (refused, or the step failed) are dropped and counted,
    // never retried forever. Recorded as consumed: by the version the failed step would
    // have made (already written), or by the current one.
    invalid_groups_ += static_cast<int64_t>(groups.size());
    if (!committed) {
      try {
        rollouts_->commit(groups, version_);
      } catch (const std::exception& e) {
        spdlog::warn("rollout log: could not record {} dropped groups ({}); a restart may try them again",
                     groups.size(), e.what());
      }
    }
    throw;
  }
  rollouts_->set_last_step_seconds(Since(start));
  if (telemetry_) telemetry_->on_train_step(t, "rollouts", Since(start));
  if (t.optim.optim.skipped) {
    spdlog::warn("rollout step skipped: {}", t.optim.optim.reason);
    return;
  }
  announce("rollouts", &t.forward.result, static_cast<int64_t>(groups.size()));
  {
    std::vector<std::string> ids;
    for (const auto& g : groups) ids.push_back(g.id);
    audit({{"version", version_.load()}, {"ids", ids}});
  }
  const int64_t every = config_.rollouts.checkpoint_every;
  if (every > 0 && version_ % every == 0) {
    const std::string name = "policy-v" + std::to_string(version_.load());
    try {
      executor_->run(SaveCommand{"", checkpoint_path(name)});
    } catch (const std::exception& e) {
      spdlog::error("could not write checkpoint {}: {}", name, e.what());
    }
  }
  spdlog::info("rollout step: policy version {} from {} groups ({} tokens) in {:.2f} s", version_.load(),
               groups.size(), tokens, Since(start));
}

void TrainingHost::audit(const nlohmann::json& record) {
  if (config_.rollouts.audit_log.empty()) return;
  nlohmann::json line = record;
  line["run"] = run_id_;
  const std::string text = line.dump() + "\n";
  const int fd = ::open(config_.rollouts.audit_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("rollouts.audit_log: cannot open: {}", std::strerror(errno));
    return;
  }
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(fd) != 0) {
    spdlog::warn("rollouts.audit_log: cannot write: {}", std::strerror(errno));
  }
  ::close(fd);
}

// --- Shutdown ----------------------------------------------------------------------------------

std::string TrainingHost::shutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (shut_down_) return shutdown_checkpoint_;
  draining_ = true;
  spdlog::info("draining: no new requests; the running step finishes (up to shutdown.grace_seconds)");
  {
    std::lock_guard<std::mutex> hb(heartbeat_mutex_);
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Past the grace, the running step is abandoned at its next chunk boundary.
  std::mutex grace_mutex;
  std::condition_variable grace_cv;
  bool stopped = false;
  std::thread grace([&] {
    std::unique_lock<std::mutex> g(grace_mutex);
    if (!grace_cv.wait_for(g, std::chrono::duration<double>(config_.shutdown.grace_seconds), [&] { return stopped; })) {
      abort_running_ = true;
      spdlog::warn("shutdown.grace_seconds ({}) ran out: abandoning the running step", config_.shutdown.grace_seconds);
    }
  });
  worker_->stop();
  {
    std::lock_guard<std::mutex> g(grace_mutex);
    stopped = true;
  }
  grace_cv.notify_all();
  grace.join();
  {
    std::lock_guard<std::mutex> io(io_mutex_);
    io_stopping_ = true;
  }
  io_cv_.notify_all();
  if (io_thread_.joinable()) io_thread_.join();
  hub_.close_all();
  auto& trainer = executor_->replica().trainer();
  if (config_.shutdown.checkpoint_on_exit && !config_.checkpoint_dir.empty() && broken_reason().empty()) {
    try {
      if (trainer.has_pending_gradients()) executor_->run(ZeroGradientsCommand{""});
      const std::string name = "shutdown-" + std::to_string(trainer.step());
      executor_->run(SaveCommand{"", checkpoint_path(name)});
      shutdown_checkpoint_ = name;
      spdlog::info("wrote checkpoint {} on shutdown", name);
    } catch (const std::exception& e) {
      spdlog::error("could not write the shutdown checkpoint: {}", e.what());
    }
  }
  if (executor_->world_size() > 1 && broken_reason().empty()) {
    try {
      executor_->run(StopCommand{});  // the other ranks finish too
    } catch (const std::exception& e) {
      spdlog::warn("could not tell the other ranks to stop: {}", e.what());
    }
  }
  shut_down_ = true;
  return shutdown_checkpoint_;
}

}  // namespace streambp::server
