#pragma once
// What every rank of a server holds: the model and the trainer that owns its optimizer
// state, built the same way on every rank from the config. Commands (command.h) are the
// only way the model changes, so rank 0 and its followers cannot drift apart.
// Not thread-safe: the device thread (rank 0) or the follower loop uses it.
#include <memory>
#include <string>

#include "config.h"
#include "streambp/dist.h"
#include "streambp/trainer.h"

namespace streambp::server {

class Replica {
 public:
  /// Builds the model (LoadOrInitModel on this rank's device) and its trainer. `comm`:
  /// the process group (null: one process); the trainer then sums gradients over it.
  static std::unique_ptr<Replica> Create(const ServerConfig& config, const torch::Device& device,
                                         std::shared_ptr<Communicator> comm);

  /// The trainer of `session` ("" = the default session, the full model). NotFound for
  /// another name.
  Trainer& trainer(const std::string& session = "");
  /// Replaces the default session's trainer by the one in checkpoint folder `dir`: the
  /// checkpoint must hold a model of the same shape (FailedPrecondition otherwise).
  void load(const std::string& session, const std::string& dir);

  const ModelConfig& model_config() const { return model_config_; }
  const TrainerOptions& trainer_options() const { return trainer_options_; }
  torch::Dtype dtype() const { return dtype_; }
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }

 private:
  Replica() = default;
  ModelConfig model_config_;
  TrainerOptions trainer_options_;
  torch::Dtype dtype_ = torch::kFloat32;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace streambp::server
