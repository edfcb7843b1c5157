#pragma once
/// The TrainingHost: everything the server does, in core types, without gRPC (DESIGN §1).
/// It owns the model (through its Executor: one process, or rank 0 of many), the device
/// worker that runs jobs one at a time, the request-id cache, the rollout queue and its
/// log, the policy hub and admission. The gRPC edge converts a request, calls one method
/// here and finishes the call when `done` runs.
///
/// Lifecycle: Create() builds the model and trainer (resuming the newest checkpoint when
/// configured) and starts the device thread; shutdown() drains: no new calls, the running
/// job finishes (or, when shutdown.grace_seconds runs out, is abandoned at its next chunk
/// boundary and rolled back), waiting jobs are answered Unavailable, then the optional
/// shutdown checkpoint is written and the other ranks are stopped.
///
/// Thread-safety: every public method may be called from any thread. Methods that take a
/// `Done` return at once; `done` runs exactly once, on the device thread, the host's I/O
/// thread or the caller's (for refusals before queuing). Errors are core exceptions
/// (streambp/error.h) in the Outcome; nothing a caller sends can crash the host or change
/// the model when it is refused.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config.h"
#include "device_worker.h"
#include "policy_hub.h"
#include "telemetry.h"
#include "types.h"

namespace streambp::server {

class Admission;
class Executor;
class RequestCache;
class RolloutQueue;
struct ApplyHooks;
struct StepCommand;
enum class StepKind;

class TrainingHost {
 public:
  struct Hooks {
    /// Sees the encoding of every command before it runs (a recorded session for tests).
    std::function<void(const std::string&)> on_command;
  };

  /// Throws InvalidArgument / NotFound for a bad config or model.
  static std::unique_ptr<TrainingHost> Create(const ServerConfig& config, Hooks hooks = {});
  ~TrainingHost();
  TrainingHost(const TrainingHost&) = delete;
  TrainingHost& operator=(const TrainingHost&) = delete;

  // --- Reads, answered at once ---------------------------------------------------------
  HostInfo info() const;
  const ServerConfig& config() const { return config_; }
  const InputLimits& limits() const { return limits_; }
  EstimateReply estimate(int64_t rows, int64_t seq_len, const EngineRequest& engine) const;
  RolloutStats rollout_stats() const;
  int64_t step() const { return step_; }
  int64_t policy_version() const { return version_; }
  /// Non-empty once a rank is gone: every call is then answered Unavailable with it.
  std::string broken_reason() const;

  // --- Work on the device ----------------------------------------------------------------
  void forward_backward(CallContext ctx, StepRequest request, Done<StepStats> done);
  void train_step(CallContext ctx, StepRequest request, Done<TrainStats> done);
  void optim_step(CallContext ctx, Done<OptimStats> done);
  void compute_logprobs(CallContext ctx, LogprobsRequest request, Done<LogprobsReply> done);
  void sample(CallContext ctx, SampleRequest request, Done<SampleReply> done);
  /// `name` empty: "step-<step>". A name inside checkpoint_dir ([A-Za-z0-9._-]).
  void save_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done);
  /// `name` empty: the newest complete checkpoint.
  void load_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done);
  /// The current weights (one shared snapshot per version); `version` != 0 and not the
  /// current one: served anyway, with a note.
  void export_weights(CallContext ctx, int64_t version, Done<ExportReply> done);

  // --- The RL loop -----------------------------------------------------------------------
  /// Validates, queues and (with a log) makes the groups durable on the host's I/O thread,
  /// then answers one ack per item, in order; starts a server-side step when enough are
  /// queued.
  void push_rollouts(CallContext ctx, std::vector<PushItem> items, Done<std::vector<RolloutAck>> done);
  /// Registers a watcher (Unavailable while draining).
  void watch_policy(PolicySink* sink, int64_t since);
  void unwatch_policy(PolicySink* sink);

  // --- Bounded resources of streaming calls -----------------------------------------------
  /// A slot held for the life of a stream; released when the last copy goes.
  using Lease = std::shared_ptr<void>;
  /// ResourceExhausted when limits.max_streams streams are open.
  Lease acquire_stream();
  /// ResourceExhausted when limits.max_concurrent_exports exports are running.
  Lease acquire_export();

  /// Drains and stops (see above). Idempotent; returns the shutdown checkpoint's name or "".
  std::string shutdown();
  bool draining() const { return draining_; }

  /// The device worker (tests hold jobs with pause()/resume()).
  DeviceWorker& worker() { return *worker_; }
  /// Observer of the work (metrics); set before serving, not owned.
  void set_telemetry(HostTelemetry* telemetry) { telemetry_ = telemetry; }

 private:
  explicit TrainingHost(const ServerConfig& config);
  template <class T>
  void submit(CallContext ctx, bool mutating, std::function<std::shared_ptr<const T>()> work, Done<T> done,
              size_t answer_bytes = 256);
  void check_admitted(const CallContext& ctx) const;
  ApplyHooks hooks_for(const CallContext& ctx);
  StepStats run_forward_backward(const CallContext& ctx, const StepCommand& command, const EngineOptions& resolved);
  OptimStats run_optim_step(const std::string& session);
  StepCommand prepare_step(const CallContext& ctx, StepRequest& request, StepKind kind, EngineOptions* resolved);
  void publish_state();
  void announce(const std::string& source, const StepResult* forward, int64_t groups_consumed);
  void schedule_rollout_step();
  void run_rollout_step();
  std::string checkpoint_path(const std::string& name) const;
  void mark_broken(const std::string& reason);
  void on_memory_refusal(const std::string& reason);

  ServerConfig config_;
  InputLimits limits_;
  std::unique_ptr<Executor> executor_;  // touched on the device thread only (and at shutdown)
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<DeviceWorker> worker_;
  std::unique_ptr<RequestCache> cache_;
  std::unique_ptr<RolloutQueue> rollouts_;
  PolicyHub hub_;
  HostTelemetry* telemetry_ = nullptr;
  HostInfo info_;  // the parts that never change

  std::atomic<int64_t> step_{0}, version_{0}, pending_{0};
  std::atomic<int64_t> weights_generation_{0};     // +1 whenever the weights change
  std::shared_ptr<const WeightsSnapshot> snapshot_;  // device thread
  int64_t snapshot_generation_ = -1;
  std::atomic<bool> draining_{false}, abort_running_{false};
  std::atomic<int64_t> streams_{0}, exports_{0};
  std::atomic<int64_t> invalid_groups_{0}, dropped_since_update_{0};
  std::atomic<bool> rollout_step_scheduled_{false};
  std::string run_id_;  // this process's id in the audit log
  void audit(const nlohmann::json& record);

  mutable std::mutex broken_mutex_;
  std::string broken_reason_;

  // The I/O thread: rollout pushes (validation and the log's fsync) in order.
  std::mutex io_mutex_;
  std::condition_variable io_cv_;
  std::deque<std::function<void()>> io_jobs_;
  bool io_stopping_ = false;
  std::thread io_thread_;

  // Data parallel: a ping every quarter of the timeout keeps idle ranks in their collective.
  std::thread heartbeat_;
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_cv_;

  std::mutex shutdown_mutex_;
  bool shut_down_ = false;
  std::string shutdown_checkpoint_;
};

/// A checkpoint name: [A-Za-z0-9._-]+, not starting with '.', at most 128 characters.
/// InvalidArgument otherwise (it is a name inside the checkpoint directory, never a path).
void ValidateCheckpointName(const std::string& name);

}  // namespace streambp::server
