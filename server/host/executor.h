#pragma once
// The seam between the host and the ranks (vLLM's collective_rpc is the model): the host
// runs every model-changing Command through an Executor. Locally (one process) that is
// Apply(); on rank 0 of a data-parallel server it is "send the command to every other
// rank, then Apply()", and the other ranks run RunFollower(), which decodes the same
// Command type and applies it with the same function. One process or many is a choice
// made here, nowhere else.
#include <functional>
#include <memory>
#include <string>

#include "command.h"
#include "config.h"
#include "replica.h"
#include "streambp/dist.h"

namespace streambp::server {

class Executor {
 public:
  virtual ~Executor() = default;
  /// Runs `command` on every rank and returns this rank's result; throws what Apply()
  /// throws (the other ranks throw the same for the same input), and Unavailable when a
  /// rank is gone. Called by one thread at a time (the device thread).
  virtual CommandResult run(const Command& command, const ApplyHooks& hooks = {}) = 0;
  virtual Replica& replica() = 0;
  virtual int world_size() const = 0;
};

/// `comm` null or of one rank: the local executor; else rank 0's. `on_command` (optional)
/// sees every command's encoding before it runs (tests record sessions with it).
std::unique_ptr<Executor> MakeExecutor(std::unique_ptr<Replica> replica, std::shared_ptr<Communicator> comm,
                                       std::function<void(const std::string&)> on_command = nullptr);

/// The ranks' layout against the config (parallel.context_parallel), on every rank before it
/// joins the group, so that a bad layout fails at start on each rank with the same message:
/// context parallel needs WORLD_SIZE = P, ZeRO stage 0 and the stream engine.
void CheckParallelLayout(const ServerConfig& config, const DistOptions& dist);

/// Right after the group forms, on every rank (collective): InvalidArgument on every rank
/// when they were started with different parallel.context_parallel.
void CheckParallelAgreement(const ServerConfig& config, Communicator& comm);

/// Ranks > 0: builds the same replica, joins the process group and applies rank 0's
/// commands until it says stop (returns 0) or the group breaks (returns 1, the reason
/// logged). (`serve` answers gRPC health for the rank meanwhile.) On stop, with a checkpoint_dir, the replica's
/// weights are written to "<checkpoint_dir>/replica-<rank>.safetensors" (for verification).
int RunFollower(const ServerConfig& config, const DistOptions& dist);

}  // namespace streambp::server
