// The TrainingHost: its lifecycle, and the one path of every call that touches the model
// (admitted on the caller's thread, run on the device thread through the Executor).
#include "host.h"

#include <filesystem>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "admission.h"
#include "cpu_pool.h"
#include "executor.h"
#include "host_session.h"
#include "request_cache.h"
#include "rollout_queue.h"
#include "streambp/error.h"
#include "streambp/memory.h"
#include "streambp/model.h"
#include "streambp/runtime.h"

namespace streambp::server {
namespace {

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

TrainingHost::TrainingHost(const ServerConfig& config) : config_(config) {}

std::unique_ptr<TrainingHost> TrainingHost::Create(const ServerConfig& config, Hooks hooks) {
  config.Validate();
  CheckModelSource(config.model_source());  // a bad folder, architecture, device or dtype, named, before anything starts
  RegisterBuiltinObjectives();
  memory::InstallTrackingAllocator();
  std::unique_ptr<TrainingHost> h(new TrainingHost(config));
  auto dist = DistOptions::FromEnv();
  const torch::Device device = RankDevice(config.model.device, dist);
  h->config_.trainer.engine.device = device.type();  // admission and GetInfo size chunks as the steps will
  const auto& c = h->config_;
  CreateObjective("grpo", c.rollouts.grpo);  // bad rollout options fail at start, not at the first step
  std::shared_ptr<Communicator> comm;
  CheckParallelLayout(c, dist);
  if (dist.enabled()) {
    if (dist.backend.empty()) dist.backend = device.is_cuda() ? "nccl" : "gloo";
    comm = Communicator::Create(dist);  // the other ranks run RunFollower
    CheckParallelAgreement(c, *comm);
    if (c.parallel.context_parallel > 1) {
      spdlog::info("rank 0 of {}: context parallel {} x data parallel {} over {} (every sequence's positions split "
                   "over {} ranks)",
                   dist.world_size, c.parallel.context_parallel, dist.world_size / c.parallel.context_parallel,
                   dist.backend, c.parallel.context_parallel);
    } else {
      spdlog::info("rank 0 of {}: data parallel over {}, ZeRO stage {}", dist.world_size, dist.backend, dist.zero_stage);
    }
  }
  h->executor_ = MakeExecutor(Replica::Create(c, device, comm), comm, std::move(hooks.on_command));
  auto& replica = h->executor_->replica();
  if (!c.checkpoint_dir.empty()) CleanStaging(c.checkpoint_dir);
  h->run_id_ = std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "-" +
               std::to_string(::getpid());
  h->limits_.vocab_size = replica.model_config().vocab_size;
  h->limits_.num_experts = replica.model_config().num_experts;
  h->limits_.sparse_layers = replica.model_config().sparse_layers();
  h->limits_.experts_per_token = replica.model_config().num_experts_per_tok;
  h->limits_.max_sequence_length = c.limits.max_sequence_length;
  h->limits_.max_tokens_per_request = c.limits.max_tokens_per_request;
  h->limits_.max_text_bytes = c.limits.max_text_bytes;
  h->limits_.text = TextCodec::FromDir(c.model.dir, c.model.chat_format, replica.model_config().vocab_size,
                                       &h->limits_.text_unavailable);
  if (h->limits_.text) {
    const auto t = h->limits_.text->report();
    spdlog::info("tokenizer: {} tokens, chat format {}", t.vocab_size, t.chat_format.empty() ? "none" : t.chat_format);
  } else if (!c.model.dir.empty()) {
    spdlog::info("text requests disabled: {}", h->limits_.text_unavailable);
  }
  h->admission_ = std::make_unique<Admission>(h->config_, replica.model_config(), replica.dtype());
  h->admission_->on_refusal = [raw = h.get()](const std::string& reason) { raw->on_memory_refusal(reason); };
  h->cache_ = std::make_unique<RequestCache>(static_cast<size_t>(c.limits.request_id_cache),
                                             static_cast<size_t>(c.limits.request_id_cache_bytes));
  h->worker_ = std::make_unique<DeviceWorker>(
      static_cast<size_t>(c.limits.queue_depth),
      static_cast<size_t>(c.sessions.enabled ? std::min(c.sessions.queue_depth, c.limits.queue_depth) : c.limits.queue_depth));
  h->cpu_ = std::make_unique<CpuPool>(static_cast<size_t>(c.limits.text_workers), static_cast<size_t>(c.limits.text_queue),
                                      c.limits.text_memory_bytes);
  h->open_sessions();  // the default session (resuming the newest checkpoint), or those on disk

  auto& info = h->info_;
  info.sessions = c.sessions.enabled;
  info.model = replica.model_config();
  for (const auto& p : replica.base()->parameters()) info.num_parameters += p.numel();
  info.dtype = DtypeName(replica.dtype());
  info.device = c.model.device;
  info.engine = c.trainer.engine;
  info.world_size = h->executor_->world_size();
  info.context_parallel = info.world_size > 1 ? static_cast<int>(c.parallel.context_parallel) : 1;
  info.optimizer = c.trainer.optimizer.name;
  info.learning_rate = c.trainer.optimizer.lr;
  info.max_sequence_length = c.limits.max_sequence_length;
  info.max_tokens_per_request = c.limits.max_tokens_per_request;
  info.reference_model = c.trainer.reference.use_reference_model;
  info.eos_token_ids = ModelEosTokenIds(info.model, c.model.dir);
  h->side_files_ = std::make_shared<const SideFiles>(ReadModelSideFiles(c.model.dir));
  if (h->limits_.text) {
    info.tokenizer = h->limits_.text->report();
  } else {
    info.tokenizer.unavailable = h->limits_.text_unavailable;
  }

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
  const bool ranks = h->executor_->world_size() > 1;
  if (ranks || c.sessions.enabled) {
    const double ping = ranks ? comm->options().timeout_seconds / 4 : 1e9;
    // Sessions: idle ones written out, and the folders of sampler snapshots past their TTL
    // removed (an expired snapshot is refused, unlisted and uncounted from the moment it
    // expires; this only frees its disk).
    const double idle = !c.sessions.enabled         ? 1e9
                        : c.sessions.idle_seconds > 0 ? std::clamp(c.sessions.idle_seconds / 4, 1.0, 60.0)
                                                      : 60.0;
    h->background_ = std::thread([raw, period = std::chrono::duration<double>(std::min(ping, idle)), ranks] {
      std::unique_lock<std::mutex> lock(raw->background_mutex_);
      while (!raw->background_cv_.wait_for(lock, period, [raw] { return raw->draining_.load(); })) {
        DeviceWorker::Job job;
        job.lane = "~background";
        job.method = "Background";
        job.run = [raw, ranks] {
          try {
            if (ranks) raw->executor_->run(PingCommand{});
            if (raw->config_.sessions.enabled) {
              if (raw->config_.sessions.idle_seconds > 0) raw->evict_idle();
              raw->expire_snapshots();
            }
          } catch (const std::exception& e) {
            if (ranks) raw->mark_broken(e.what());
          }
          return true;
        };
        job.drop = [](std::exception_ptr) {};
        raw->worker_->submit(std::move(job));
      }
    });
  }
  for (const auto& [name, s] : h->sessions_) h->schedule_rollout_step(s);  // groups replayed from the logs
  h->started_ = true;
  return h;
}

TrainingHost::~TrainingHost() {
  if (started_) {
    shutdown();
    return;
  }
  // Create() failed part way (a model that does not load, a device that is not there): stop
  // only what was started; the members go with the object.
  if (cpu_) cpu_->stop();
  if (worker_) worker_->stop();
  {
    std::lock_guard<std::mutex> io(io_mutex_);
    io_stopping_ = true;
  }
  io_cv_.notify_all();
  if (io_thread_.joinable()) io_thread_.join();
  draining_ = true;
  background_cv_.notify_all();
  if (background_.joinable()) background_.join();
}

// --- State -----------------------------------------------------------------------------

std::shared_ptr<HostSession> TrainingHost::find(const std::string& name, bool snapshot_ok) const {
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  auto it = sessions_.find(name);
  if (it != sessions_.end() && it->second->is_snapshot() && it->second->ready && !it->second->deleted) {
    const auto& s = *it->second;
    const std::string what = "snapshot '" + s.snapshot_info.name + "' of session '" + s.snapshot_of + "'";
    if (!snapshot_ok) throw NotFound("no session named '" + name + "' (" + what + " is for Sample, ComputeLogprobs and ExportWeights)");
    if (s.expired(UnixNow())) throw NotFound(what + " has expired (its TTL); save a new one");
    return it->second;
  }
  if (const auto at = name.find('@'); snapshot_ok && at != std::string::npos && (it == sessions_.end() || !it->second->ready)) {
    throw NotFound("session '" + name.substr(0, at) + "' has no snapshot named '" + name.substr(at + 1) +
                   "' (ListSnapshots)");
  }
  if (it == sessions_.end() || !it->second->ready || it->second->deleted || it->second->is_snapshot()) {
    if (name.empty() && config_.sessions.enabled) {
      throw InvalidArgument("session is empty: this server hosts sessions; name one (CreateSession, ListSessions)");
    }
    throw NotFound(name.empty() ? "no default session" : "no session named '" + name + "'");
  }
  return it->second;
}

HostInfo TrainingHost::info() const {
  HostInfo i = info_;
  if (!config_.sessions.enabled) {
    auto s = find("");
    i.policy_version = s->version;
    i.step = s->step;
    i.pending_micro_batches = s->pending;
  }
  return i;
}

int64_t TrainingHost::step(const std::string& session) const { return find(session)->step; }
int64_t TrainingHost::policy_version(const std::string& session) const { return find(session)->version; }

void TrainingHost::publish_state(HostSession& s) {
  auto& replica = executor_->replica();
  if (!replica.resident(s.spec.name)) return;
  auto& t = replica.trainer(s.spec.name);
  s.step = t.step();
  s.version = t.policy_version();
  s.pending = t.has_pending_gradients() ? 1 : 0;
  s.device_bytes = replica.session_bytes(s.spec.name);
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

RolloutStats TrainingHost::rollout_stats(const std::string& session) const {
  auto s = find(session);
  auto stats = s->rollouts->stats();
  stats.invalid = s->invalid_groups;
  stats.policy_version = s->version;
  return stats;
}

void TrainingHost::announce(HostSession& s, const std::string& source, const StepResult* forward,
                            int64_t groups_consumed) {
  PolicyUpdate u;
  u.policy_version = s.version;
  u.step = s.step;
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
  u.groups_dropped = s.dropped_since_update.exchange(0);
  s.hub.publish(u);
}

std::string TrainingHost::checkpoint_path(const HostSession& s, const std::string& name) const {
  auto base = std::filesystem::path(config_.checkpoint_dir);
  if (!s.spec.name.empty()) base /= s.spec.name;  // checkpoint_dir/<session>/<name>
  return (base / name).string();
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

ApplyHooks TrainingHost::hooks_for(const CallContext& ctx, int64_t micro_batches) {
  ApplyHooks hooks;
  const bool ranks = executor_->world_size() > 1;  // every rank must then run a command to its end
  if (ranks && !ctx.progress) return hooks;
  // Micro-batches run forward ... backward one after the other: a forward after a backward
  // is the next one.
  auto micro = std::make_shared<std::pair<int64_t, bool>>(0, false);  // (index, in backward)
  hooks.on_progress = [this, ranks, micro, micro_batches, progress = ctx.progress, cancelled = ctx.cancelled,
                       deadline = ctx.deadline](const EngineProgress& p) {
    if (progress) {
      if (p.phase == EngineProgress::Phase::kForward && micro->second) {
        ++micro->first;
        micro->second = false;
      }
      if (p.phase == EngineProgress::Phase::kBackward) micro->second = true;
      StepProgressEvent e;
      e.state = PhaseName(p.phase);
      e.layer = p.layer;
      e.num_layers = p.layers;
      e.micro_batch = std::min(micro->first, std::max<int64_t>(micro_batches, 1) - 1);
      e.micro_batches = micro_batches;
      progress(e);
    }
    if (ranks) return;
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
void TrainingHost::submit(const CallContext& ctx, const std::shared_ptr<HostSession>& session, bool mutating,
                          std::function<std::shared_ptr<const T>()> work, Done<T> done, size_t answer_bytes) {
  std::string key = ctx.cache_key;  // begun by the caller, or keyed here by the session's incarnation
  if (key.empty() && mutating && !ctx.request_id.empty()) {
    key = session->incarnation + "/" + ctx.method + "/" + ctx.request_id;
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
  job.lane = ctx.session;
  job.method = ctx.method;
  job.deadline = ctx.deadline;
  job.cancelled = ctx.cancelled;
  if (ctx.progress) {
    job.on_position = [progress = ctx.progress](size_t ahead) {
      StepProgressEvent e;
      e.state = "queued";
      e.queue_position = static_cast<int64_t>(ahead);
      progress(e);
    };
  }
  job.run = [this, work, finish, session, progress = ctx.progress] {
    std::shared_ptr<const T> value;
    std::exception_ptr error;
    try {
      if (session->deleted) {
        throw NotFound(session->is_snapshot() ? "snapshot '" + session->snapshot_info.name + "' of session '" +
                                                    session->snapshot_of + "' was deleted"
                                              : "no session named '" + session->spec.name + "'");
      }
      if (progress) progress(StepProgressEvent{"started"});
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
    if (!session->deleted) publish_state(*session);
    finish(error, value, true);
    return true;
  };
  job.drop = [finish](std::exception_ptr e) { finish(e, nullptr, false); };
  switch (worker_->submit(std::move(job))) {
    case DeviceWorker::Submit::kAccepted:
      return;
    case DeviceWorker::Submit::kFull:
      finish(std::make_exception_ptr(ResourceExhausted("the request queue is full (" +
                                                       std::to_string(worker_->capacity()) +
                                                       " waiting, limits.queue_depth); retry with backoff")),
             nullptr, false);
      return;
    case DeviceWorker::Submit::kLaneFull:
      finish(std::make_exception_ptr(ResourceExhausted(
                 (ctx.session.empty() ? std::string("the request queue") : "session '" + ctx.session + "'") +
                 " has " + std::to_string(worker_->lane_capacity()) +
                 " requests waiting (sessions.queue_depth); retry with backoff")),
             nullptr, false);
      return;
    case DeviceWorker::Submit::kStopped:
      finish(std::make_exception_ptr(Unavailable("the server is shutting down; retry against its replacement")),
             nullptr, false);
      return;
  }
}

// The instantiations the other files of the host use.
template void TrainingHost::submit<StepStats>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                              std::function<std::shared_ptr<const StepStats>()>, Done<StepStats>, size_t);
template void TrainingHost::submit<TrainStats>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                               std::function<std::shared_ptr<const TrainStats>()>, Done<TrainStats>,
                                               size_t);
template void TrainingHost::submit<OptimStats>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                               std::function<std::shared_ptr<const OptimStats>()>, Done<OptimStats>,
                                               size_t);
template void TrainingHost::submit<LogprobsReply>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                                  std::function<std::shared_ptr<const LogprobsReply>()>,
                                                  Done<LogprobsReply>, size_t);
template void TrainingHost::submit<CheckpointReply>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                                    std::function<std::shared_ptr<const CheckpointReply>()>,
                                                    Done<CheckpointReply>, size_t);
template void TrainingHost::submit<ExportReply>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                                std::function<std::shared_ptr<const ExportReply>()>, Done<ExportReply>,
                                                size_t);
template void TrainingHost::submit<SessionReport>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                                  std::function<std::shared_ptr<const SessionReport>()>,
                                                  Done<SessionReport>, size_t);
template void TrainingHost::submit<SnapshotReport>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                                   std::function<std::shared_ptr<const SnapshotReport>()>,
                                                   Done<SnapshotReport>, size_t);
template void TrainingHost::submit<std::string>(const CallContext&, const std::shared_ptr<HostSession>&, bool,
                                                std::function<std::shared_ptr<const std::string>()>, Done<std::string>,
                                                size_t);

// --- Shutdown ----------------------------------------------------------------------------------

std::string TrainingHost::shutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (shut_down_) return shutdown_checkpoint_;
  draining_ = true;
  spdlog::info("draining: no new requests; the running step finishes (up to shutdown.grace_seconds)");
  {
    std::lock_guard<std::mutex> bg(background_mutex_);
  }
  background_cv_.notify_all();
  if (background_.joinable()) background_.join();
  cpu_->stop();  // waiting text work answered Unavailable; running work ends (it may still queue a job)
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
  std::vector<std::shared_ptr<HostSession>> all;
  {
    std::lock_guard<std::mutex> s(sessions_mutex_);
    for (auto& [name, session] : sessions_) all.push_back(session);
  }
  for (auto& s : all) s->hub.close_all();
  const bool healthy = broken_reason().empty();
  if (config_.sessions.enabled && healthy) {
    // Every resident session to its state folder: a restart resumes them all.
    for (auto& s : all) {
      if (!s->resident || s->deleted || !s->ready) continue;
      try {
        evict(*s);
      } catch (const std::exception& e) {
        spdlog::error("could not write session {} to disk: {}", s->spec.name, e.what());
      }
    }
  }
  if (!config_.sessions.enabled && config_.shutdown.checkpoint_on_exit && !config_.checkpoint_dir.empty() && healthy) {
    try {
      auto& trainer = executor_->replica().trainer();
      if (trainer.has_pending_gradients()) executor_->run(ZeroGradientsCommand{""});
      const std::string name = "shutdown-" + std::to_string(trainer.step());
      executor_->run(SaveCommand{"", checkpoint_path(*all.front(), name)});
      shutdown_checkpoint_ = name;
      spdlog::info("wrote checkpoint {} on shutdown", name);
    } catch (const std::exception& e) {
      spdlog::error("could not write the shutdown checkpoint: {}", e.what());
    }
  }
  if (executor_->world_size() > 1 && healthy) {
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
