#pragma once
// Configuration of `streambp-server serve`: nested structs with defaults, one line of
// comment per field, parsed once from JSON (an unknown key is an error naming it) and
// overridden by command-line flags for the common fields. The host reads the model,
// trainer, limits and rollout sections; the gRPC edge the listen, TLS, auth and keepalive ones.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/model.h"
#include "streambp/trainer_options.h"

namespace streambp::server {

struct ModelSection {
  std::string dir;               ///< HF model folder; empty = the embedded preset
  std::string preset = "tiny";   ///< embedded preset when dir is empty: tiny | small
  std::string family = "qwen3";  ///< the preset's architecture: llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3
  uint64_t seed = 0;             ///< seed of the embedded preset
  std::string dtype = "float32";  ///< float32 | float64 | bfloat16 (float16 on cuda only)
  std::string device = "cpu";    ///< cpu | cuda | cuda:N
  /// The chat format of messages: qwen3 | llama3 | llama3.1 | llama3.2 | gemma | chatml; "" = the one
  /// the tokenizer's chat_template is recognized as.
  std::string chat_format;
};

struct LimitsSection {
  int64_t max_tokens_per_request = 1 << 20;  ///< tokens in one request's batch (prompts too)
  int64_t max_sequence_length = 32768;       ///< tokens in one sequence
  int64_t max_message_bytes = 64 << 20;      ///< largest gRPC message accepted
  int64_t max_text_bytes = 16 << 20;         ///< text (strings, message contents) in one request
  int64_t text_workers = 2;                  ///< threads that turn requests' text into ids (off the gRPC threads)
  int64_t text_queue = 64;                   ///< requests whose text waits for them; more -> RESOURCE_EXHAUSTED
  int64_t text_memory_bytes = 1 << 30;       ///< memory the text work running at once may hold (estimated before it starts)
  int64_t queue_depth = 64;                  ///< jobs waiting for the device; more -> RESOURCE_EXHAUSTED
  int64_t memory_budget_bytes = 0;           ///< refuse requests estimated above this; 0 = no budget
  int64_t request_id_cache = 4096;           ///< answers remembered for retried request ids
  int64_t request_id_cache_bytes = 64 << 20;  ///< ... and their bytes at most (oldest forgotten first)
  int64_t max_request_id_bytes = 128;        ///< longer request ids are refused
  bool auto_chunks = false;                  ///< stream steps that do not set chunk sizes get the largest
                                             ///< ones whose estimate fits memory_budget_bytes
  int64_t min_chunk = 16;                    ///< smallest engine.chunk a request may ask for
  int64_t min_key_chunk = 16;                ///< smallest engine.key_chunk a request may ask for
  int64_t min_logits_chunk = 16;             ///< smallest engine.logits_chunk a request may ask for
  int64_t max_sampled_tokens = 1 << 18;      ///< Sample: prompts x n x max_tokens at most
  int64_t max_sample_rows = 1024;            ///< Sample: prompts x n (rows of the K/V cache) at most
  int64_t max_kv_cache_bytes = 1LL << 30;    ///< Sample: estimated K/V cache + logits bytes at most
  int64_t max_concurrent_exports = 4;        ///< ExportWeights streams at once (they share a snapshot)
  int64_t min_export_chunk_bytes = 64 << 10;  ///< smallest ExportWeights max_chunk_bytes accepted
  int64_t max_streams = 64;                  ///< WatchPolicy + PushRolloutsStream streams at once
};

/// A token limited to some sessions (a tenant): it sees, samples from, trains, exports and
/// deletes only sessions whose name matches one of `sessions` ("alice" or a prefix
/// pattern "alice-*"); other sessions do not exist for it (NOT_FOUND).
struct ScopedToken {
  std::string token;
  std::vector<std::string> sessions;  ///< names or "prefix*" patterns
  std::string access = "write";       ///< write | read (read: no training, no deletes)
  bool create = false;                ///< may create sessions whose names match
};

struct AuthSection {
  std::vector<std::string> tokens;            ///< bearer tokens with full access (admins); empty = no auth
  std::vector<std::string> read_only_tokens;  ///< may call GetInfo, ComputeLogprobs, ExportWeights, EstimateMemory
  std::vector<ScopedToken> scoped_tokens;     ///< tokens limited to some sessions
  /// Server reflection without a token when auth is on (it lists the service and its
  /// messages); off by default then. Without auth it is always on.
  bool reflection_without_token = false;
};
constexpr size_t kMinTokenLength = 16;  ///< bearer tokens shorter than this are refused at load

struct TlsSection {
  std::string cert;       ///< PEM certificate chain of the server; empty = plaintext
  std::string key;        ///< PEM private key of the server
  std::string client_ca;  ///< PEM roots for client certificates; set = mutual TLS required
};

struct ShutdownSection {
  double grace_seconds = 30;        ///< time to finish the running step after SIGTERM/SIGINT
  bool checkpoint_on_exit = false;  ///< save "shutdown-<step>" into checkpoint_dir on exit
};

struct LogSection {
  std::string format = "text";  ///< text | json (one JSON object per line)
  std::string level = "info";   ///< trace | debug | info | warn | error | off; SIGHUP re-reads it from --config
};

struct KeepaliveSection {
  int64_t time_ms = 60000;     ///< ping an idle connection after this long
  int64_t timeout_ms = 20000;  ///< close it when the ping is not answered within this
};

struct MetricsSection {
  std::string listen;  ///< host:port of the Prometheus /metrics HTTP endpoint; port 0 picks one; "" = off
  std::string dashboard = "auto";  ///< the training dashboard beside it: auto (on without auth) | on | off
};

/// The training history of every session (docs/operations.md: Training history).
struct HistorySection {
  int64_t max_records = 4096;  ///< records each session keeps in memory for GetHistory
  bool file = true;            ///< append them to <checkpoint_dir>[/<session>]/metrics.jsonl
  bool tensorboard = false;    ///< and write TensorBoard event files beside it (tensorboard/)
};

struct SessionsSection {
  bool enabled = false;               ///< host sessions (adapters on a frozen, shared base); off = one default session
  int64_t max_sessions = 64;          ///< sessions in all (resident or written to disk)
  int64_t max_resident_sessions = 8;  ///< sessions held in device memory; the least recently used idle one is written out
  double idle_seconds = 600;          ///< a session unused this long is written to disk (0 = never by time)
  bool allow_full_finetuning = false;  ///< sessions may train a whole copy of the base
  int64_t max_lora_rank = 256;        ///< largest adapter rank a session may ask for
  int64_t queue_depth = 16;           ///< jobs one session may have waiting (RESOURCE_EXHAUSTED names it)
  std::string state_dir;              ///< where sessions live on disk; "" = <checkpoint_dir>/.sessions
  bool metrics_label = false;         ///< label request metrics with the session (cardinality!)
  int64_t max_snapshots = 8;          ///< sampler snapshots per session (SaveWeightsForSampler)
  int64_t max_snapshot_bytes = int64_t{4} << 30;  ///< their bytes on disk per session, together
  double snapshot_ttl_seconds = 0;    ///< default TTL of a snapshot; 0 = kept until deleted
};

struct RolloutSection {
  int64_t groups_per_step = 8;    ///< queued GRPO groups that trigger a server-side step
  int64_t max_staleness = 4;      ///< drop groups sampled by a version older than current - this
  int64_t max_queue = 4096;       ///< queued groups at most (pushes beyond are refused)
  std::string log;                ///< rollout log file; acknowledged groups survive a restart
  nlohmann::json grpo = nlohmann::json::object();  ///< grpo objective options of server-side steps
  int64_t checkpoint_every = 0;   ///< save "policy-v<version>" into checkpoint_dir every N versions
  /// JSON lines: {"run","resumed"} at start and {"run","version","ids"} after every applied
  /// rollout step (fsynced): which groups made which version, across restarts. "" = none.
  std::string audit_log;
};

/// How the ranks of a distributed server (RANK, WORLD_SIZE, ...) share the work
/// (docs/architecture.md: Context parallel).
struct ParallelSection {
  /// 1: the ranks are data parallel (each trains on its share of the batch's sequences).
  /// P > 1: every sequence's positions are split over P ranks (context parallel); P must
  /// equal WORLD_SIZE (data parallel x context parallel is not supported yet).
  int64_t context_parallel = 1;
};

struct ServerConfig {
  ModelSection model;
  TrainerOptions trainer;        ///< optimizer, schedule, clipping, engine, micro-batches, reference
  std::string listen = "127.0.0.1:50051";  ///< host:port; port 0 picks a free one (logged)
  int threads = 0;               ///< LibTorch threads; 0 = number of cores
  LimitsSection limits;
  AuthSection auth;
  TlsSection tls;
  std::string checkpoint_dir;    ///< where Save/LoadCheckpoint names live; empty = refuse them
  ShutdownSection shutdown;
  LogSection log;
  KeepaliveSection keepalive;
  RolloutSection rollouts;
  SessionsSection sessions;
  bool resume = false;           ///< at start, load the newest complete checkpoint in checkpoint_dir
  MetricsSection metrics;
  HistorySection history;
  ParallelSection parallel;

  /// Throws InvalidArgument naming the first unknown key or bad value ("config: ...").
  /// `validate` false: only keys and types are checked, not how the fields fit together
  /// (a caller that overlays command-line flags validates the result itself).
  static ServerConfig FromJson(const nlohmann::json& j, bool validate = true);
  static ServerConfig FromFile(const std::string& path, bool validate = true);
  /// Every field. `mask_secrets`: bearer tokens are written as "***" (for --check-config).
  nlohmann::json ToJson(bool mask_secrets = false) const;
  void Validate() const;
  /// The model as a ModelSource (the device as configured).
  ModelSource model_source() const;
  /// Where sessions live on disk (sessions.state_dir or <checkpoint_dir>/.sessions).
  std::string sessions_dir() const;
};

}  // namespace streambp::server
