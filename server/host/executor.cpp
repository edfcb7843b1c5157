#include "executor.h"

#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/objective.h"
#include "streambp/safetensors.h"

namespace streambp::server {
namespace {

class LocalExecutor final : public Executor {
 public:
  LocalExecutor(std::unique_ptr<Replica> replica, std::shared_ptr<Communicator> comm,
                std::function<void(const std::string&)> on_command)
      : replica_(std::move(replica)), comm_(std::move(comm)), on_command_(std::move(on_command)) {}

  CommandResult run(const Command& command, const ApplyHooks& hooks) override {
    if (on_command_ || world_size() > 1) {
      const auto bytes = EncodeCommand(command);
      if (on_command_) on_command_(bytes);
      if (world_size() > 1) comm_->broadcast_bytes(bytes, 0);  // the followers apply it too
    }
    return Apply(*replica_, command, hooks);
  }
  Replica& replica() override { return *replica_; }
  int world_size() const override { return comm_ ? comm_->world_size() : 1; }

 private:
  std::unique_ptr<Replica> replica_;
  std::shared_ptr<Communicator> comm_;
  std::function<void(const std::string&)> on_command_;
};

}  // namespace

std::unique_ptr<Executor> MakeExecutor(std::unique_ptr<Replica> replica, std::shared_ptr<Communicator> comm,
                                       std::function<void(const std::string&)> on_command) {
  return std::make_unique<LocalExecutor>(std::move(replica), std::move(comm), std::move(on_command));
}

void CheckParallelLayout(const ServerConfig& config, const DistOptions& dist) {
  const int64_t P = config.parallel.context_parallel;
  if (P <= 1) return;
  const std::string what = "parallel.context_parallel " + std::to_string(P);
  if (dist.world_size % P != 0) {
    throw InvalidArgument(what + " needs a multiple of " + std::to_string(P) +
                          " ranks (WORLD_SIZE = data parallel x context parallel, with RANK, MASTER_ADDR and "
                          "MASTER_PORT), got WORLD_SIZE=" + std::to_string(dist.world_size));
  }
  if (dist.zero_stage != 0 && dist.world_size == P) {
    throw InvalidArgument(what + ": with context parallel alone every rank holds the whole optimizer state; set "
                          "STREAMBP_ZERO_STAGE=0 (got " + std::to_string(dist.zero_stage) +
                          "), or add data-parallel ranks (WORLD_SIZE a multiple of P) for ZeRO to shard it over");
  }
  if (config.trainer.engine.kind != EngineKind::kStream) {
    throw InvalidArgument(what + " runs the stream engine only; the configured engine is " +
                          EngineName(config.trainer.engine.kind) + " (trainer.engine.kind, --engine)");
  }
  if (config.trainer.engine.recompute_kv_per_chunk) {
    throw InvalidArgument(what + ": trainer.engine.recompute_kv_per_chunk (the ablation) does not run context parallel");
  }
  if (config.trainer.engine.keep_attention) {
    throw InvalidArgument(what + ": trainer.engine.keep_attention (--keep-attention) does not run context parallel; "
                          "turn one of them off");
  }
}

void CheckParallelAgreement(const ServerConfig& config, Communicator& comm) {
  if (comm.world_size() <= 1) return;
  // Collective: every rank learns the smallest and largest P, so all refuse alike.
  const double mine = static_cast<double>(config.parallel.context_parallel);
  const double largest = comm.all_reduce_scalar(mine, /*max=*/true);
  const double smallest = -comm.all_reduce_scalar(-mine, /*max=*/true);
  if (largest != smallest) {
    throw InvalidArgument("the ranks disagree on parallel.context_parallel (from " + std::to_string(static_cast<int64_t>(smallest)) +
                          " to " + std::to_string(static_cast<int64_t>(largest)) +
                          "): start every rank with the same config and flags");
  }
}

int RunFollower(const ServerConfig& config, const DistOptions& dist) {
  CheckParallelLayout(config, dist);
  RegisterBuiltinObjectives();
  DistOptions options = dist;
  const auto device = RankDevice(config.model.device, dist);
  if (options.backend.empty()) options.backend = device.is_cuda() ? "nccl" : "gloo";
  auto comm = Communicator::Create(options);
  CheckParallelAgreement(config, *comm);
  auto replica = Replica::Create(config, device, comm);
  spdlog::info("rank {} of {} joined ({}); following rank 0", dist.rank, dist.world_size,
               config.parallel.context_parallel > 1 ? "context parallel" : "data parallel");
  // What this rank holds, for comparing the ranks: the model (replica-R.safetensors), or a
  // session's trainable state when rank 0 writes it out (at eviction and shutdown:
  // replica-R-SESSION.safetensors, the adapter under PEFT's names or a full session's model;
  // removed when the session is deleted).
  auto replica_file = [&](const std::string& session) {
    return std::filesystem::path(config.checkpoint_dir) /
           ("replica-" + std::to_string(dist.rank) + (session.empty() ? "" : "-" + session) + ".safetensors");
  };
  auto write_replica = [&](const std::string& session) {
    if (config.checkpoint_dir.empty()) return;
    std::filesystem::create_directories(config.checkpoint_dir);
    auto& trainer = replica->trainer(session);
    WriteSafetensors(replica_file(session).string(),
                     trainer.adapter() ? trainer.adapter()->peft_tensors() : trainer.model()->hf_tensors(),
                     {{"format", "pt"}});
  };
  int rc = 0;
  for (;;) {
    Command command;
    try {
      command = DecodeCommand(comm->broadcast_bytes("", 0));
    } catch (const Error& e) {
      spdlog::error("rank {}: lost rank 0: {}", dist.rank, e.what());
      rc = 1;
      break;
    }
    if (std::holds_alternative<StopCommand>(command)) break;
    if (const auto* drop = std::get_if<DropSessionCommand>(&command)) {
      const auto resident = replica->resident_sessions();
      try {
        if (drop->deleted) {  // a deleted session leaves no copy behind (written at an earlier eviction)
          std::error_code ec;
          if (!config.checkpoint_dir.empty()) std::filesystem::remove(replica_file(drop->session), ec);
        } else if (std::find(resident.begin(), resident.end(), drop->session) != resident.end()) {
          write_replica(drop->session);
        }
      } catch (const std::exception& e) {  // a copy for comparison only: the command still runs
        spdlog::warn("rank {}: could not write session {}'s replica file: {}", dist.rank, drop->session, e.what());
      }
    }
    try {
      Apply(*replica, command);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kUnavailable) {
        spdlog::error("rank {}: the process group broke: {}", dist.rank, e.what());
        rc = 1;
        break;
      }
      // Rank 0 applied the same command to the same input and got the same error.
      spdlog::info("rank {}: {} refused: {}", dist.rank, CommandName(command), e.what());
    } catch (const std::exception& e) {
      spdlog::warn("rank {}: {} failed: {}", dist.rank, CommandName(command), e.what());
    }
  }
  if (rc == 0) {
    for (const auto& session : replica->resident_sessions()) write_replica(session);
  }
  spdlog::info("rank {}: {}", dist.rank, rc == 0 ? "stopped by rank 0" : "exiting: the group is broken");
  return rc;
}

}  // namespace streambp::server
