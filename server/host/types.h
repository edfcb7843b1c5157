#pragma once
// What the TrainingHost takes and gives, in core types: the gRPC edge converts protobuf to
// these and back, and nothing in server/host/ knows the wire format.
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/estimate.h"
#include "streambp/lora.h"
#include "streambp/objective.h"
#include "streambp/sampler.h"
#include "streambp/trainer_options.h"
#include "history.h"
#include "text_codec.h"

namespace streambp::server {

using Clock = std::chrono::steady_clock;

/// Where a step is, for callers that follow it (the progress RPCs):
///   queued (queue_position: jobs that run first; again whenever it changes), started,
///   forward / backward (layer of num_layers, micro_batch of micro_batches), head, optimizer.
/// "done" is the answer itself.
struct StepProgressEvent {
  std::string state;
  int64_t queue_position = 0;
  int64_t layer = 0, num_layers = 0;
  int64_t micro_batch = 0, micro_batches = 0;
};

/// Who calls and until when: what every host method gets besides its input.
struct CallContext {
  std::string method;      ///< for logs and metrics ("TrainStep")
  std::string session;     ///< the session the call is for ("" = the default session)
  std::string request_id;  ///< mutating calls: a repeated id returns the first answer
  std::string digest;      ///< of the request body without its id: a reused id with another body is refused
  /// Set by the host itself when it has already begun the request id in its cache under a
  /// key of the call's own (CreateSession, DeleteSession: keyed by name, since the session
  /// does not exist yet or no longer does); the common path then completes that key.
  std::string cache_key;
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::function<bool()> cancelled;  ///< true once the caller has gone (may be empty)
  Clock::time_point received = Clock::now();
  /// Told where the call's work is (may be empty). Called from the device thread (and under
  /// the device worker's lock for "queued"): must not block.
  std::function<void(const StepProgressEvent&)> progress;
};

/// The answer of an asynchronous host call: a value, or the error (a core exception the
/// edge turns into a status with ToStatus).
template <class T>
struct Outcome {
  std::shared_ptr<const T> value;
  std::exception_ptr error;
  bool ok() const { return error == nullptr; }
};
template <class T>
using Done = std::function<void(const Outcome<T>&)>;

/// The bounds the edge validates input against while converting it.
struct InputLimits {
  int64_t vocab_size = 0;
  int64_t max_sequence_length = 0;
  int64_t max_tokens_per_request = 0;
  /// Bytes of text (strings and message contents) one request may carry, checked before
  /// anything is tokenized.
  int64_t max_text_bytes = 0;
  /// The model's tokenizer and chat format; null when there is none (text is then refused
  /// with FailedPrecondition(text_unavailable)).
  std::shared_ptr<const TextCodec> text;
  std::string text_unavailable;
  /// Mixture of experts (routing replay's checks): experts, sparse layers and experts per
  /// token of the model; 0 for a dense model.
  int64_t num_experts = 0;
  int64_t sparse_layers = 0;
  int64_t experts_per_token = 0;
};

/// Engine options as a request gives them: empty / 0 = the server's default.
struct EngineRequest {
  std::string engine;
  int64_t chunk = 0;
  int64_t logits_chunk = 0;
  int64_t key_chunk = 0;
  /// The load-balancing coefficient (EngineOptions::router_aux_loss_coef); unset = the server's.
  std::optional<double> router_aux_loss_coef;
  bool any_chunk() const { return chunk != 0 || logits_chunk != 0 || key_chunk != 0; }
};

/// A training step's input (ForwardBackward, TrainStep), validated field by field.
struct StepRequest {
  std::vector<Sequence> sequences;
  std::string objective;  ///< registered objective name
  nlohmann::json objective_options = nlohmann::json::object();
  EngineRequest engine;
  int64_t tokens = 0;
  /// weighted_logprobs: the policy version the client's weights were computed at; the step
  /// is refused (FailedPrecondition) when the session has moved on. Unset = not checked.
  std::optional<int64_t> weights_policy_version;
  /// TrainStep: this step's Adam parameters (OptimStep's adam_params); unset: the configuration.
  std::optional<AdamStepParams> adam;
  /// ForwardBackward: also each sequence's log-probs (StepStats::logprobs).
  bool return_logprobs = false;
};

/// What a forward-backward did (StepStats on the wire).
struct StepStats {
  StepResult result;
  int64_t sequences = 0;
  int64_t micro_batches = 0;
  EngineKind engine = EngineKind::kStream;
  ResolvedChunks chunks{0, 0, 0};
  int64_t peak_memory_bytes = 0;
  double seconds = 0;        ///< on the device
  double queue_seconds = 0;  ///< waiting for the device
  int64_t policy_version = 0;  ///< of the weights the gradients were computed on
  /// return_logprobs: per sequence of the step, log p(tokens[t+1] | tokens[..t]) at those weights.
  std::vector<std::vector<double>> logprobs;
};

struct OptimStats {
  OptimResult optim;
  int64_t policy_version = 0;  ///< after the step
  int64_t step = 0;
};

struct TrainStats {
  StepStats forward;
  OptimStats optim;
};

struct LogprobsRequest {
  std::vector<Sequence> sequences;
  bool reference = false;
  double temperature = 1.0;
  bool fp64 = false;  ///< the answer carries double precision too
  int64_t top_k = 0;  ///< also the k most likely next tokens at every position (0 = none)
};

struct LogprobsReply {
  std::vector<std::vector<double>> logprobs;  ///< per sequence, one fewer than its tokens
  int64_t policy_version = 0;
  bool fp64 = false;
  /// top_k > 0: per sequence, k ids and log-probs per position (one fewer than its tokens),
  /// most likely first.
  int64_t top_k = 0;
  std::vector<std::vector<int32_t>> top_ids;
  std::vector<std::vector<double>> top_logprobs;
};

struct SampleRequest {
  std::vector<std::vector<int64_t>> prompts;
  SampleOptions options;
  /// Completions end at the model's end-of-sequence ids too (HostInfo::eos_token_ids) unless set.
  bool ignore_eos = false;
  /// Decode the completions into text (with the model's tokenizer, special tokens skipped).
  bool decode_text = false;
};

struct SampleReply {
  std::vector<SampledCompletion> completions;
  std::vector<std::string> texts;  ///< decode_text: one per completion
  int64_t policy_version = 0;
  int64_t num_experts = 0;  ///< routed experts' id range (how they are packed on the wire)
  int64_t sparse_layers = 0;
  int64_t experts_per_token = 0;
};

struct CheckpointReply {
  std::string name;
  int64_t step = 0;
  int64_t policy_version = 0;
  int64_t bytes = 0;
};

/// One serialized version of the weights, shared by every export of that version.
struct WeightsSnapshot {
  std::string format = "model";  ///< "model" (model.safetensors + config.json) | "peft_adapter"
  std::string bytes;             ///< the safetensors file (HF names, or PEFT's)
  std::string sha256;
  std::string config_json;       ///< config.json, or adapter_config.json
  int64_t policy_version = 0;
};

/// Files of the model folder that travel with exported weights (tokenizer etc.), by name.
using SideFiles = std::vector<std::pair<std::string, std::string>>;

struct ExportReply {
  std::shared_ptr<const WeightsSnapshot> snapshot;
  std::string note;  ///< set when the version asked for is not the one served
  std::shared_ptr<const SideFiles> files;  ///< the model folder's tokenizer files etc.
};

struct EstimateReply {
  MemoryEstimate estimate;
  EngineKind engine = EngineKind::kStream;
  int64_t budget_bytes = 0;
  bool fits = true;
};

// --- Sessions ----------------------------------------------------------------------------

/// What a session is and how it trains (persisted as spec.json in its state folder).
struct SessionSpec {
  std::string name;
  bool full = false;        ///< full fine-tuning of a copy of the base; else a LoRA adapter
  LoraConfig lora;          ///< the adapter (when !full)
  TrainerOptions trainer;   ///< optimizer, schedule, clipping (engine and limits: the server's)
  int64_t groups_per_step = 8;
  int64_t max_staleness = 4;
  nlohmann::json grpo = nlohmann::json::object();  ///< GRPO options of its rollout steps

  nlohmann::json ToJson() const;
  static SessionSpec FromJson(const nlohmann::json& j);
};

/// CreateSession in core terms: the spec, and optionally an uploaded PEFT adapter to start from.
struct SessionRequest {
  SessionSpec spec;
  std::string adapter_config_json;  ///< with adapter_safetensors: start from this adapter
  std::string adapter_safetensors;
};

/// What GetSession / ListSessions report.
struct SessionReport {
  SessionSpec spec;
  int64_t step = 0;
  int64_t policy_version = 0;
  bool resident = false;
  int64_t trainable_parameters = 0;
  int64_t device_bytes = 0;
  double idle_seconds = 0;
  int64_t pending_micro_batches = 0;
};

/// A sampler snapshot: a session's weights frozen under a name (SaveWeightsForSampler).
struct SnapshotReport {
  std::string session, name;
  int64_t step = 0, policy_version = 0;
  int64_t bytes = 0;  ///< on disk
  double created_unix = 0, expires_unix = 0;  ///< expires 0: kept until deleted
  bool resident = false;
};

// --- The RL loop ---------------------------------------------------------------------

struct RolloutCompletion {
  std::vector<int64_t> tokens;
  double reward = 0.0;
  std::vector<double> logprobs;    ///< the sampler's, per completion token (may be empty)
  std::vector<double> advantages;  ///< per completion token (may be empty)
  /// Routing replay: the experts of every token of prompt + completion (Sequence's layout;
  /// empty = the router's choice everywhere).
  std::vector<int32_t> routed_experts;
};

struct RolloutGroup {
  std::vector<int64_t> prompt;
  std::vector<RolloutCompletion> completions;
  int64_t policy_version = 0;  ///< the version that sampled it (0 = unknown)
  std::string group_id;        ///< the client's id, or "" (the server makes one)
};

/// A pushed group as the edge converted it: the group, or why it could not be converted.
struct PushItem {
  int index = 0;
  std::string session;  ///< the session the group trains
  std::optional<RolloutGroup> group;
  std::string error;  ///< set when group is empty: the conversion's message (field named)
};

enum class RolloutStatus {
  kAccepted,   ///< durably queued: it will be trained exactly once
  kDuplicate,  ///< its group_id was accepted before; not trained twice
  kStale,      ///< sampled by a version older than current - max_staleness; dropped
  kInvalid,    ///< bad input; the message names the field
  kRetry,      ///< not queued now (queue full, rollout log not writable): push it again later
};
const char* RolloutStatusName(RolloutStatus status);  ///< accepted | duplicate | stale | invalid | retry

struct RolloutAck {
  int index = 0;
  std::string group_id;
  RolloutStatus status = RolloutStatus::kInvalid;
  std::string message;
  int64_t queue_depth = 0;
  int64_t policy_version = 0;
};

struct RolloutStats {
  int64_t queue_depth = 0, accepted = 0, consumed = 0, dropped_stale = 0, duplicates = 0, invalid = 0;
  int64_t steps_run = 0, groups_per_step = 0, max_staleness = 0, policy_version = 0;
  int64_t in_step = 0;  ///< taken by the running step, neither consumed nor queued yet
  double last_step_seconds = 0;
};

/// A new policy version, as WatchPolicy streams it.
struct PolicyUpdate {
  int64_t policy_version = 0;
  int64_t step = 0;
  std::string source;  ///< start | rollouts | train | load
  double loss = 0, reward_mean = 0, kl = 0, clip_fraction = 0;
  int64_t tokens = 0;
  int64_t groups_consumed = 0;
  int64_t groups_dropped = 0;
  Metrics metrics;
};

/// What GetHistory answers.
struct HistoryReply {
  std::vector<HistoryRecord> records;
  int64_t first_index = 0;  ///< the oldest record kept (0: none)
  int64_t last_index = 0;   ///< the newest
  std::string file;         ///< metrics.jsonl's path, "" when the history is not written
};

/// What GetInfo reports.
struct HostInfo {
  bool sessions = false;  ///< the server hosts sessions
  ModelConfig model;
  int64_t num_parameters = 0;
  std::string dtype, device;
  EngineOptions engine;  ///< the defaults
  int world_size = 1;
  int context_parallel = 1;  ///< ranks each sequence is split over (1: data parallel, if any)
  std::string optimizer;
  double learning_rate = 0;
  int64_t max_sequence_length = 0, max_tokens_per_request = 0;
  bool reference_model = false;
  int64_t policy_version = 0, step = 0, pending_micro_batches = 0;
  /// What ends a completion: config.json's and generation_config.json's eos_token_id(s).
  std::vector<int64_t> eos_token_ids;
  TokenizerReport tokenizer;
};

}  // namespace streambp::server
