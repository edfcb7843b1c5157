#pragma once
/// streambp::client::Client: a typed C++ client of the streambp.v1.Trainer service.
///
/// Usage:
///   streambp::client::ClientOptions options;
///   options.target = "127.0.0.1:50051";
///   options.token = "secret";                      // sent as "authorization: Bearer secret"
///   auto client = streambp::client::Client::Create(options);   // throws ClientError on bad options
///   auto info = client->GetInfo();                 // Result<GetInfoResponse>
///   if (!info.ok()) { ... info.status() ... }
///   streambp::v1::TrainStepRequest req;
///   *req.mutable_batch() = batch;                  // see data.h for JSONL -> Batch
///   auto step = client->TrainStep(std::move(req)); // request_id filled in, reused on retries
///
/// Errors: see result.h. An RPC never throws for a gRPC error; it returns Result<T> with
/// the final status (an UNAVAILABLE one ends in "(retried up to N attempts)" when the client
/// made its channel, and so its retry policy).
///
/// Lifetime and threads: a Client owns one gRPC channel (connections are made lazily and
/// re-made after failures). It is immutable after Create and safe to use from several
/// threads at once; calls from different threads run concurrently on the channel (the
/// server still runs steps one at a time, in arrival order). Destroying the Client while
/// a call is in flight on another thread is not allowed.
///
/// Deadlines: every call has one, from CallOptions::timeout or else the ClientOptions
/// default of its kind (step_timeout for steps, log-probs, checkpoints and weights;
/// info_timeout for GetInfo and EstimateMemory). The deadline covers the whole logical
/// call, retries and waits included.
///
/// Retries: UNAVAILABLE only, by gRPC itself: the channel's service config carries
/// RetryPolicy as the retryPolicy of every Trainer method, so a retry re-sends the same
/// request bytes. Mutating calls (ForwardBackward, OptimStep, TrainStep, SaveCheckpoint,
/// LoadCheckpoint, CreateSession, DeleteSession, SaveWeightsForSampler, DeleteSnapshot) get a
/// random 128-bit request_id when the caller left it empty, so the server applies the request
/// at most once however often it arrives. gRPC retries a call only until its first response message; a stream that
/// breaks later (ExportWeights, TrainStepWithProgress) ends UNAVAILABLE, and calling again
/// with the same request is safe (ExportWeights starts over).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/channel.h>

#include "streambp/client/result.h"
#include "streambp/client/retry.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "streambp/v1/trainer.pb.h"

namespace streambp::client {

using Seconds = std::chrono::duration<double>;

namespace detail {
struct WeightsSink;  // where ExportWeights writes (memory or file)
}  // namespace detail

/// TLS of the channel. Without `enabled` the channel is plaintext (loopback, tests).
struct TlsOptions {
  bool enabled = false;              ///< use TLS
  std::string root_ca_file;          ///< PEM roots that sign the server's certificate; empty = system roots
  std::string cert_file;             ///< PEM client certificate chain, for mTLS (with key_file)
  std::string key_file;              ///< PEM private key of cert_file
  std::string server_name_override;  ///< name checked against the server's certificate (ssl_target_name_override)
};

/// How to reach the server and how calls behave. Validated by Client::Create.
struct ClientOptions {
  std::string target = "127.0.0.1:50051";  ///< "host:port" (or any gRPC target URI)
  std::string token;                      ///< bearer token; empty = no authorization metadata
  TlsOptions tls;                         ///< transport security
  Seconds step_timeout{600.0};            ///< default deadline of steps, log-probs, checkpoints, weights
  Seconds info_timeout{30.0};             ///< default deadline of GetInfo and EstimateMemory
  int64_t max_message_bytes = 64 << 20;   ///< largest message sent or received
  RetryPolicy retry;                      ///< retries of UNAVAILABLE
  bool wait_for_ready = false;            ///< wait for the channel to connect (up to the deadline) instead of failing fast
  /// The session every call names when its request leaves `session` empty ("" = the
  /// server's default session, on servers without sessions).
  std::string session;
};

/// Per-call overrides.
struct CallOptions {
  std::optional<Seconds> timeout;  ///< deadline of this call (retries included); unset = the default of its kind
};

/// The whole safetensors file of ExportWeights, verified (contiguous offsets, total size,
/// SHA-256 of the bytes equal to the server's).
struct ExportedWeights {
  int64_t policy_version = 0;
  std::string data;         ///< the file's bytes (empty when written to a file)
  int64_t total_bytes = 0;
  std::string sha256;       ///< lowercase hex
  std::string config_json;  ///< config.json of the model (adapter_config.json for an adapter)
  std::string format = "model";  ///< "model" (model.safetensors) | "peft_adapter" (adapter_model.safetensors)
  /// with_files: the model folder's other files (tokenizer.json, ...) by name, each verified.
  std::map<std::string, std::string> files;
};

/// A new random request id: 128 bits as 32 lowercase hex digits. Thread-safe.
std::string NewRequestId();

class Client {
 public:
  /// Connects lazily to options.target. Throws ClientError(INVALID_ARGUMENT) for bad
  /// options (empty target, max_message_bytes <= 0, non-positive timeouts, bad retry
  /// policy, cert without key) and ClientError(NOT_FOUND) for an unreadable PEM file.
  static std::unique_ptr<Client> Create(const ClientOptions& options);

  /// The same on an existing channel (e.g. grpc::Server::InProcessChannel in tests); the
  /// target, TLS, message-size and retry options are then ignored: retries are whatever the
  /// channel was made with (ServiceConfigJson(policy) in retry.h makes its service config).
  static std::unique_ptr<Client> Create(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  /// Model, dtype, device, engine, chunk sizes, policy version, step, limits.
  Result<v1::GetInfoResponse> GetInfo(const CallOptions& call = {}) const;

  /// Forward and backward of a batch; gradients accumulate until OptimStep. Mutating.
  Result<v1::ForwardBackwardResponse> ForwardBackward(v1::ForwardBackwardRequest request,
                                                      const CallOptions& call = {}) const;
  /// Applies the accumulated gradients. Mutating.
  Result<v1::OptimStepResponse> OptimStep(v1::OptimStepRequest request = {}, const CallOptions& call = {}) const;
  /// ForwardBackward + OptimStep. Mutating.
  Result<v1::TrainStepResponse> TrainStep(v1::TrainStepRequest request, const CallOptions& call = {}) const;
  /// TrainStep with its progress (TrainStepProgress): `on_progress` sees each message before
  /// "done" (queued, started, forward / backward layer by layer, head, optimizer); the result
  /// is the step's answer. Against a server without that RPC (UNIMPLEMENTED) it runs
  /// TrainStep with the same request id and reports nothing. Mutating (one request id).
  Result<v1::TrainStepResponse> TrainStepWithProgress(v1::TrainStepRequest request,
                                                      const std::function<void(const v1::StepProgress&)>& on_progress,
                                                      const CallOptions& call = {}) const;

  /// Text: ids of texts / conversations with the model's tokenizer and chat format, and a
  /// batch's text forms resolved exactly as a step would (request.batch).
  Result<v1::TokenizeResponse> Tokenize(const v1::TokenizeRequest& request, const CallOptions& call = {}) const;
  Result<v1::DetokenizeResponse> Detokenize(const v1::DetokenizeRequest& request, const CallOptions& call = {}) const;

  /// Completions of prompts (ids or text) from the current policy.
  Result<v1::SampleResponse> Sample(const v1::SampleRequest& request, const CallOptions& call = {}) const;

  /// Per-token log-probs of sequences under the policy or the reference model.
  Result<v1::ComputeLogprobsResponse> ComputeLogprobs(const v1::ComputeLogprobsRequest& request,
                                                      const CallOptions& call = {}) const;

  /// Full resumable state under a name in the server's checkpoint directory. Mutating.
  Result<v1::SaveCheckpointResponse> SaveCheckpoint(v1::SaveCheckpointRequest request = {},
                                                    const CallOptions& call = {}) const;
  /// Restores a checkpoint (empty name = the newest). Mutating.
  Result<v1::LoadCheckpointResponse> LoadCheckpoint(v1::LoadCheckpointRequest request = {},
                                                    const CallOptions& call = {}) const;

  /// The current weights, reassembled and verified; DATA_LOSS when the stream is
  /// inconsistent (gap in offsets, wrong total, SHA-256 mismatch, no last message).
  Result<ExportedWeights> ExportWeights(const v1::ExportWeightsRequest& request = {},
                                        const CallOptions& call = {}) const;
  /// The same, written to `path` (through `path`.tmp, renamed once verified, so `path` is
  /// never a partial file); the returned data is empty. `progress(received, total)` is
  /// called after each chunk when given. INTERNAL when the file cannot be written.
  Result<ExportedWeights> ExportWeightsToFile(const std::string& path, const v1::ExportWeightsRequest& request = {},
                                              const CallOptions& call = {},
                                              const std::function<void(int64_t, int64_t)>& progress = {}) const;

  /// The session's training history (a record per optimizer step), oldest first, from
  /// request.after_index on (one page: up to request.max_records, at most 10000).
  Result<v1::GetHistoryResponse> GetHistory(v1::GetHistoryRequest request = {}, const CallOptions& call = {}) const;

  /// Predicted peak memory of a step and whether it fits.
  Result<v1::EstimateMemoryResponse> EstimateMemory(const v1::EstimateMemoryRequest& request,
                                                    const CallOptions& call = {}) const;

  /// Sessions (servers with sessions): create (mutating, with a request id), inspect, list
  /// (those the token may see) and delete.
  Result<v1::SessionInfo> CreateSession(v1::CreateSessionRequest request, const CallOptions& call = {}) const;
  Result<v1::SessionInfo> GetSession(const std::string& name, const CallOptions& call = {}) const;
  Result<v1::ListSessionsResponse> ListSessions(const CallOptions& call = {}) const;
  Result<v1::DeleteSessionResponse> DeleteSession(const std::string& name, const CallOptions& call = {}) const;

  /// Sampler snapshots of the client's session (or request.session): SaveWeightsForSampler
  /// freezes its weights under a name (mutating, with a request id) that Sample,
  /// ComputeLogprobs and ExportWeights target through their `snapshot` field.
  Result<v1::SnapshotInfo> SaveWeightsForSampler(v1::SaveWeightsForSamplerRequest request,
                                                 const CallOptions& call = {}) const;
  Result<v1::ListSnapshotsResponse> ListSnapshots(const CallOptions& call = {}) const;
  Result<v1::DeleteSnapshotResponse> DeleteSnapshot(const std::string& name, const CallOptions& call = {}) const;

 private:
  /// `own_retries`: the channel was made here with options.retry as its service config, so
  /// a failed retryable call can say how often it was tried.
  Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options, bool own_retries);

  Result<ExportedWeights> Export(const v1::ExportWeightsRequest& request, const CallOptions& call,
                                 detail::WeightsSink& sink,
                                 const std::function<void(int64_t, int64_t)>& progress) const;

  ClientOptions options_;
  ClientOptions call_options_;  // options_, with retry.max_attempts 1 when the channel's retries are unknown
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Trainer::Stub> stub_;
};

}  // namespace streambp::client
