#pragma once
/// The TrainingHost: everything the server does, in core types, without gRPC (docs/architecture.md: Layers).
/// It owns the base model and the sessions' trainers (through its Executor: one process,
/// or rank 0 of many), the device worker that runs jobs one at a time (round-robin across
/// sessions), the request-id cache, each session's rollout queue and policy hub, and
/// admission. The gRPC edge converts a request, calls one method here and finishes the call
/// when `done` runs.
///
/// Sessions (docs/architecture.md: API semantics): with sessions.enabled the base is frozen and shared; a session is
/// a LoRA adapter (or a full copy, where allowed) with its own optimizer, step, version,
/// rollout queue, watchers and checkpoints. At most sessions.max_resident_sessions are held
/// in device memory; the least recently used idle one is written to its state folder and
/// read back, bit-exact, on its next request. Without sessions there is one session, ""
/// (the whole model), and everything works as it always did.
///
/// Lifecycle: Create() builds the model (resuming the newest checkpoint when configured)
/// and finds the sessions on disk; shutdown() drains: no new calls, the running job finishes
/// (or, when shutdown.grace_seconds runs out, is abandoned at its next chunk boundary and
/// rolled back), waiting jobs are answered Unavailable, resident sessions are written to
/// disk, the optional shutdown checkpoint is written and the other ranks are stopped.
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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <thread>

#include "config.h"
#include "device_worker.h"
#include "policy_hub.h"
#include "streambp/optimizer.h"
#include "telemetry.h"
#include "types.h"

namespace streambp {
class Trainer;
}

namespace streambp::server {

class Admission;
class CpuPool;
class Executor;
class RequestCache;
class RolloutQueue;
struct ApplyHooks;
struct StepCommand;
struct HostSession;
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

  // --- Reads, answered at once (`session` "" = the default session) -------------------------
  HostInfo info() const;
  const ServerConfig& config() const { return config_; }
  const InputLimits& limits() const { return limits_; }
  bool sessions_enabled() const { return config_.sessions.enabled; }
  EstimateReply estimate(const std::string& session, int64_t rows, int64_t seq_len,
                         const EngineRequest& engine) const;
  RolloutStats rollout_stats(const std::string& session = "") const;
  int64_t step(const std::string& session = "") const;
  int64_t policy_version(const std::string& session = "") const;
  /// A session's training history: records with index > after_index, oldest first, at most
  /// `max` (<= 0: all kept), and the index range kept.
  HistoryReply history(const std::string& session, int64_t after_index, int64_t max) const;
  /// Non-empty once a rank is gone: every call is then answered Unavailable with it.
  std::string broken_reason() const;

  // --- Sessions ------------------------------------------------------------------------------
  void create_session(CallContext ctx, SessionRequest request, Done<SessionReport> done);
  void delete_session(CallContext ctx, std::string name, Done<std::string> done);
  /// NotFound for an unknown name.
  SessionReport session_report(const std::string& name) const;
  std::vector<SessionReport> list_sessions() const;

  // --- Sampler snapshots (host_snapshots.cpp; docs/api.md: Sampler snapshots) -----------------
  /// Freezes ctx.session's current weights as snapshot `name` (its adapter, or the model of a
  /// full session, with the optimizer state: the session's own state format). `ttl_seconds`
  /// 0 = sessions.snapshot_ttl_seconds. Bounded by sessions.max_snapshots and
  /// max_snapshot_bytes (ResourceExhausted, nothing kept; with `replace_oldest` the oldest
  /// are removed to make room instead); AlreadyExists for a taken name.
  void save_snapshot(CallContext ctx, std::string name, double ttl_seconds, bool replace_oldest,
                     Done<SnapshotReport> done);
  void delete_snapshot(CallContext ctx, std::string name, Done<std::string> done);
  /// ctx-free read: the session's live snapshots, oldest first.
  std::vector<SnapshotReport> list_snapshots(const std::string& session) const;

  // --- Work on the device (each names its session in ctx.session) ----------------------------
  void forward_backward(CallContext ctx, StepRequest request, Done<StepStats> done);
  void train_step(CallContext ctx, StepRequest request, Done<TrainStats> done);
  /// `adam`: this step's Adam parameters (unset: the session's optimizer and schedule).
  void optim_step(CallContext ctx, std::optional<AdamStepParams> adam, Done<OptimStats> done);
  void compute_logprobs(CallContext ctx, LogprobsRequest request, Done<LogprobsReply> done);
  /// Generation runs in slices of decode steps: other sessions' jobs take turns between them.
  void sample(CallContext ctx, SampleRequest request, Done<SampleReply> done);
  /// `name` empty: "step-<step>". A name inside the session's checkpoint folder.
  void save_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done);
  /// `name` empty: the newest complete checkpoint.
  void load_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done);
  /// The current weights (one shared snapshot per version): the model, or for an adapter
  /// session its PEFT adapter (`merged`: the base with the adapter folded in).
  void export_weights(CallContext ctx, int64_t version, bool merged, Done<ExportReply> done);

  // --- The RL loop ---------------------------------------------------------------------------
  /// Validates, queues and (with a log) makes the groups durable on the host's I/O thread,
  /// then answers one ack per item, in order; starts a server-side step of a session when
  /// enough of its groups are queued. Each item names its session (PushItem::session).
  void push_rollouts(CallContext ctx, std::vector<PushItem> items, Done<std::vector<RolloutAck>> done);
  /// Registers a watcher of a session's policy versions (Unavailable while draining,
  /// NotFound for an unknown session).
  void watch_policy(const std::string& session, PolicySink* sink, int64_t since);
  void unwatch_policy(const std::string& session, PolicySink* sink);

  // --- Read-only CPU work off the gRPC threads ------------------------------------------------
  /// Runs `work` on the host's CPU pool (limits.text_workers threads), with `ctx`'s deadline
  /// and cancellation polled inside it (streambp/interrupt.h); what it throws, and a call
  /// that is gone or late before it starts, goes to `fail`. `bytes` is the work's memory
  /// estimate: it starts only while it fits in limits.text_memory_bytes beside the running
  /// work. Throws ResourceExhausted when limits.text_queue jobs wait or `bytes` is over the
  /// whole budget, Unavailable while draining.
  void run_cpu(const CallContext& ctx, int64_t bytes, std::function<void()> work,
               std::function<void(std::exception_ptr)> fail);

  // --- Bounded resources of streaming calls ----------------------------------------------------
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

  // host.cpp: the common path.
  template <class T>
  void submit(const CallContext& ctx, const std::shared_ptr<HostSession>& session, bool mutating,
              std::function<std::shared_ptr<const T>()> work, Done<T> done, size_t answer_bytes = 256);
  void check_admitted(const CallContext& ctx) const;
  /// A ready session; sampler snapshots only when `snapshot_ok` (the reads that may target one).
  std::shared_ptr<HostSession> find(const std::string& name, bool snapshot_ok = false) const;
  std::shared_ptr<HostSession> admit_checkpoint_call(const CallContext& ctx, const std::string& name) const;
  /// Abandoning a step whose caller has gone, and its progress (`micro_batches` of the step).
  ApplyHooks hooks_for(const CallContext& ctx, int64_t micro_batches = 1);
  void publish_state(HostSession& s);
  void announce(HostSession& s, const std::string& source, const StepResult* forward, int64_t groups_consumed);
  std::string checkpoint_path(const HostSession& s, const std::string& name) const;
  void mark_broken(const std::string& reason);
  void on_memory_refusal(const std::string& reason);
  int64_t resident_bytes(const std::string& except) const;

  // host_steps.cpp
  /// Runs the command (with its admission plan) on the ranks. A kTrainStep command is the
  /// forward-backward and the optimizer step in one: `optim` gets the latter (recorded as
  /// after_optim_step records), and only such a command may pass it.
  StepStats run_forward_backward(const CallContext& ctx, HostSession& s, const StepCommand& command,
                                 const EngineOptions& resolved, OptimStats* optim = nullptr);
  /// Records the step in the session's history under `source` (train | optim_step | rollouts).
  OptimStats run_optim_step(HostSession& s, const std::string& source,
                            const std::optional<AdamStepParams>& adam = std::nullopt, int64_t groups_consumed = 0);
  /// What follows an optimizer step on rank 0: counters, state, telemetry and history.
  OptimStats after_optim_step(HostSession& s, const std::string& source, const OptimResult& result,
                              Clock::time_point start, int64_t groups_consumed);
  StepCommand prepare_step(const CallContext& ctx, HostSession& s, StepRequest& request, StepKind kind,
                           EngineOptions* resolved);

  // host_sessions.cpp: the registry and residency (device thread).
  void open_sessions();
  Trainer& use(HostSession& s);
  void evict(HostSession& s);
  void evict_idle();
  void write_spec(const HostSession& s) const;

  // host_snapshots.cpp
  void open_snapshots(const std::shared_ptr<HostSession>& parent);
  /// Device thread: its trainer dropped, its folder and entry removed.
  void remove_snapshot(const std::shared_ptr<HostSession>& snapshot);
  /// Device thread: snapshots past their TTL removed.
  void expire_snapshots();
  std::vector<std::shared_ptr<HostSession>> snapshots_of(const std::string& parent) const;

  // host_rollouts.cpp
  void schedule_rollout_step(const std::shared_ptr<HostSession>& s);
  void run_rollout_step(HostSession& s);
  void audit(const HostSession& s, const nlohmann::json& record);

  // The training history (host_history.cpp).
  void open_history(HostSession& s, bool fresh_model);
  void record_history(HostSession& s, const std::string& source, const OptimStats& optim, double optim_seconds,
                      int64_t groups_consumed = 0);

  ServerConfig config_;
  InputLimits limits_;
  std::unique_ptr<Executor> executor_;  // touched on the device thread only (and at shutdown)
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<DeviceWorker> worker_;
  std::unique_ptr<CpuPool> cpu_;
  std::unique_ptr<RequestCache> cache_;
  HostTelemetry* telemetry_ = nullptr;
  HostInfo info_;  // the parts that never change
  std::shared_ptr<const SideFiles> side_files_;  // the model folder's tokenizer etc., for exports
  std::string run_id_;  // this process's id in the audit log

  mutable std::mutex sessions_mutex_;
  std::map<std::string, std::shared_ptr<HostSession>> sessions_;

  std::atomic<bool> draining_{false}, abort_running_{false};
  std::atomic<int64_t> streams_{0}, exports_{0};

  mutable std::mutex broken_mutex_;
  std::string broken_reason_;

  // The I/O thread: rollout pushes (validation and the log's fsync) in order.
  std::mutex io_mutex_;
  std::condition_variable io_cv_;
  std::deque<std::function<void()>> io_jobs_;
  bool io_stopping_ = false;
  std::thread io_thread_;

  // Background: a ping every quarter of the timeout keeps idle ranks in their collective;
  // idle sessions are written to disk.
  std::thread background_;
  std::mutex background_mutex_;
  std::condition_variable background_cv_;

  std::mutex shutdown_mutex_;
  bool started_ = false;  ///< Create() finished: the destructor drains (else it stops what started)
  bool shut_down_ = false;
  std::string shutdown_checkpoint_;
};

/// The most records one GetHistory answer carries (a page; the next starts after its last).
constexpr int64_t kMaxHistoryPage = 10000;

/// A checkpoint name: [A-Za-z0-9._-]+, not starting with '.', at most 128 characters.
/// InvalidArgument otherwise (it is a name inside the checkpoint directory, never a path).
void ValidateCheckpointName(const std::string& name);
/// A session name: [A-Za-z0-9._-], 1 to 64 characters, not starting with '.'.
void ValidateSessionName(const std::string& name);
/// A sampler snapshot name: the same rules as a session name.
void ValidateSnapshotName(const std::string& name);
/// The registry key (and trainer name) of session `session`'s snapshot `name`: '@' cannot
/// occur in a session name, so no session has it.
inline std::string SnapshotKey(const std::string& session, const std::string& name) { return session + "@" + name; }

}  // namespace streambp::server
