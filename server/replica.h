#pragma once
// Data-parallel serving (DESIGN §1 dist): rank 0 serves gRPC and, before every call that
// touches the model, broadcasts the command to the other ranks, which run the same
// Trainer call (the collectives inside it then line up). Ranks > 0 serve health only.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"
#include "streambp/batch.h"
#include "streambp/dist.h"

namespace streambp::server {

nlohmann::json SequencesToJson(const std::vector<Sequence>& sequences);
std::vector<Sequence> SequencesFromJson(const nlohmann::json& j);

/// Rank 0: sends `command` to every other rank (a collective; no-op with one rank).
void SendCommand(Communicator* comm, const nlohmann::json& command);

/// Ranks > 0: builds the same model and trainer, joins the process group, serves health
/// on config.listen and runs rank 0's commands until it says stop (returns 0) or the group
/// breaks (returns 1 with the reason logged). On stop, with a checkpoint_dir, the replica's
/// weights are written to "<checkpoint_dir>/replica-<rank>.safetensors" (for verification).
int RunFollower(const ServerConfig& config, const DistOptions& dist);

}  // namespace streambp::server
