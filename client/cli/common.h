#pragma once
// Shared pieces of the `streambp` commands: connection flags, the client, output helpers.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "streambp/client/client.h"

namespace streambp::cli {

/// Flags of every command: where the server is and how to talk to it.
struct ConnectionFlags {
  std::string server = "127.0.0.1:50051";  ///< --server, env STREAMBP_SERVER
  std::string token;                      ///< --token, env STREAMBP_TOKEN
  bool tls = false;                       ///< --tls (implied by --ca/--cert/--key/--server-name)
  std::string ca, cert, key, server_name;
  double timeout = 0;                     ///< --timeout seconds per call; 0 = the library defaults
  std::string session;                    ///< --session, env STREAMBP_SESSION: the session every call names
  double wait = 0;                        ///< --wait seconds, env STREAMBP_WAIT: for a server still starting
};

/// Engine flags shared by train and estimate.
struct EngineFlags {
  std::string engine;        ///< full | checkpoint | stream; empty = server default
  int64_t chunk = 0;         ///< 0 = server default
  int64_t logits_chunk = 0;  ///< 0 = server default
  int64_t key_chunk = 0;     ///< 0 = server default
};

void AddConnectionFlags(CLI::App* cmd, ConnectionFlags& flags);
void AddEngineFlags(CLI::App* cmd, EngineFlags& flags);
v1::EngineOptions ToProto(const EngineFlags& flags);

/// The client for the flags; throws ClientError for bad TLS files and the like.
std::unique_ptr<client::Client> Connect(const ConnectionFlags& flags);

/// The response, or throws ClientError with the call's status (main prints it).
template <class T>
T Check(client::Result<T> result) {
  return std::move(result).value();
}

/// 1234567 -> "1.18 MiB".
std::string Bytes(int64_t bytes);
/// Whether an UNAVAILABLE status means nothing answered at the address.
bool IsConnectionFailure(const std::string& message);
/// Whether the channel of the last Connect() is not connected (connecting, or failing to):
/// a call that then ended UNAVAILABLE or DEADLINE_EXCEEDED found no server (gRPC's retries
/// can outlast a short --timeout while the channel waits to reconnect).
bool LastChannelDown();
/// 3725 s -> "1h02m05s".
std::string Duration(double seconds);

// The commands; each returns the process exit status.
int Info(const ConnectionFlags& conn);
struct LogprobsArgs {
  std::string data;
  bool reference = false;
  double temperature = 0;  ///< 0 = unset (server default 1)
  std::string out;         ///< empty = stdout
  int64_t batch_tokens = 16384;
};
int Logprobs(const ConnectionFlags& conn, const LogprobsArgs& args);
int Save(const ConnectionFlags& conn, const std::string& name);
int Load(const ConnectionFlags& conn, const std::string& name);
/// A model (model.safetensors + config.json) or, for an adapter session, its PEFT adapter
/// (adapter_model.safetensors + adapter_config.json); `merged`: the base with it folded in.
/// `snapshot`: a sampler snapshot of the session instead of its current weights.
int ExportWeights(const ConnectionFlags& conn, const std::string& out_dir, bool merged,
                  const std::string& snapshot = "");
struct EstimateArgs {
  int64_t seq_len = 0;
  int64_t batch = 1;
  EngineFlags engine;
};
int Estimate(const ConnectionFlags& conn, const EstimateArgs& args);
struct HistoryArgs {
  int64_t after = 0;   ///< records with a larger index
  bool jsonl = false;  ///< one JSON object per line (metrics.jsonl's format) instead of a table
};
int History(const ConnectionFlags& conn, const HistoryArgs& args);
struct TrainArgs {
  std::string objective = "sft";
  std::string data;
  int64_t batch_tokens = 4096;
  int64_t batch_size = 0;  ///< > 0: examples per step instead of batch_tokens
  int64_t steps = 0;       ///< 0 = one pass over the data
  std::string objective_options = "{}";
  EngineFlags engine;
  int64_t weights_version = -1;  ///< weighted: the policy version of the weights (-1 = not checked)
};
int Train(const ConnectionFlags& conn, const TrainArgs& args);

struct SessionArgs {
  std::string name;
  bool exist_ok = false;  ///< a session of that name already there is used as it is
  int64_t lora_rank = 16;
  double lora_alpha = 0;  ///< 0 = 2 x rank
  std::vector<std::string> lora_targets;
  std::vector<std::string> lora_modules_to_save;  ///< "gate": train the mixture-of-experts router too
  bool use_rslora = false;
  uint64_t seed = 0;
  std::string adapter;    ///< start from this PEFT adapter folder
  bool full = false;      ///< full fine-tuning (where the server allows it)
  std::string optimizer;  ///< "" = the server's
  double lr = 0;          ///< 0 = the server's
  double weight_decay = -1;
  int64_t groups_per_step = 0;
};
/// What a server message that speaks of its API (RPC names, request fields) means on this
/// command line: "lora.r must be >= 1" -> "--lora-rank"; "" when nothing applies.
std::string CommandLineHint(const std::string& server_message);

/// The session name of `session create|get|delete`: positional or --name, the same for all three.
void AddSessionName(CLI::App* cmd, std::string& name);
int SessionCreate(const ConnectionFlags& conn, const SessionArgs& args);
int SessionList(const ConnectionFlags& conn);
int SessionGet(const ConnectionFlags& conn, const std::string& name);
int SessionDelete(const ConnectionFlags& conn, const std::string& name);

/// streambp sample: completions of a text prompt (or a user message) from the policy.
struct SampleArgs {
  std::string prompt;        ///< plain text
  std::vector<int32_t> prompt_ids;  ///< or token ids (a model without a tokenizer)
  std::string user;          ///< a user message (rendered with the chat format)
  std::string system;        ///< an optional system message before it
  int32_t n = 1;
  int32_t max_tokens = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t seed = -1;         ///< -1 = random
  bool ignore_eos = false;
  bool no_thinking = false;  ///< qwen3: the non-thinking generation prompt
  bool json = false;         ///< one JSON object per completion
  std::string snapshot;      ///< a sampler snapshot of the session instead of its current weights
};
int Sample(const ConnectionFlags& conn, const SampleArgs& args);

// streambp snapshot save|list|delete (snapshots.cpp): sampler snapshots of --session.
struct SnapshotArgs {
  std::string name;
  double ttl_seconds = 0;  ///< 0 = the server's sessions.snapshot_ttl_seconds
  bool replace_oldest = false;
};
int SnapshotSave(const ConnectionFlags& conn, const SnapshotArgs& args);
int SnapshotList(const ConnectionFlags& conn);
int SnapshotDelete(const ConnectionFlags& conn, const std::string& name);

}  // namespace streambp::cli
