#pragma once
// What every rank of a server holds: the base model and the trainers of the resident
// sessions, built the same way on every rank. Commands (command.h) are the only way they
// change, so rank 0 and its followers cannot drift apart.
//
// Without sessions there is one session, "" (the default): a Trainer of the whole model.
// With sessions the base is frozen and shared; each session is a Trainer of its own LoRA
// adapter on it (or, where allowed, of its own copy of the base). Sessions not resident
// live on disk (the host writes and reads them with Save/Restore commands).
// Not thread-safe: the device thread (rank 0) or the follower loop uses it.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "streambp/dist.h"
#include "streambp/trainer.h"
#include "types.h"

namespace streambp::server {

class Replica {
 public:
  /// Builds the base model (LoadOrInitModel on this rank's device) and, without sessions,
  /// the default session's trainer. `comm`: the process group (null: one process).
  static std::unique_ptr<Replica> Create(const ServerConfig& config, const torch::Device& device,
                                         std::shared_ptr<Communicator> comm);

  /// The trainer of a resident session ("" = the default). NotFound otherwise.
  Trainer& trainer(const std::string& session = "");
  bool resident(const std::string& session) const { return trainers_.count(session) > 0; }
  std::vector<std::string> resident_sessions() const;

  /// A new session from its spec (InvalidArgument for a bad spec or adapter files).
  void create_session(const SessionRequest& request);
  /// A session from its state folder (a trainer checkpoint written by save_checkpoint).
  void restore_session(const SessionSpec& spec, const std::string& dir);
  /// Forgets a resident session (its state must have been saved first if it is to live on).
  void drop_session(const std::string& name);
  /// Replaces the session's trainer by the checkpoint in `dir`: it must hold a model of the
  /// same shape (and for an adapter session, an adapter of the same configuration on this
  /// base): FailedPrecondition otherwise, nothing changed. With several ranks, every rank
  /// reads `dir` from its own storage and they agree before any changes: a rank that cannot
  /// read it makes every rank fail with its error (FailedPrecondition naming the rank), the
  /// group intact. restore_session agrees the same way.
  void load(const std::string& session, const std::string& dir);

  /// Device bytes a resident session holds (its adapter or model copy, gradients, optimizer).
  int64_t session_bytes(const std::string& session);

  CausalLM& base() { return base_; }
  const ModelConfig& model_config() const { return model_config_; }
  const TrainerOptions& trainer_options() const { return trainer_options_; }
  torch::Dtype dtype() const { return dtype_; }
  bool sessions() const { return sessions_; }
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }

 private:
  /// Every trainer this replica makes: the communicator, and the model folder's side files.
  void adopt(Trainer& trainer) const;
  Replica() = default;
  TrainerOptions options_of(const SessionSpec& spec) const;
  torch::Dtype adapter_dtype() const { return dtype_ == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32; }
  CausalLM base_copy() const;
  /// load()'s trainer from `dir`, checked against the session's (nothing changes here).
  std::unique_ptr<Trainer> read_checkpoint(const std::string& session, const std::string& dir);

  ModelConfig model_config_;
  TrainerOptions trainer_options_;
  torch::Dtype dtype_ = torch::kFloat32;
  torch::Device device_ = torch::kCPU;
  bool sessions_ = false;
  std::shared_ptr<Communicator> comm_;  // every rank (agreement on reads)
  ParallelGroups groups_;               // comm_'s data- and context-parallel groups
  std::vector<std::pair<std::string, std::string>> side_files_;  // the model folder's tokenizer etc.
  CausalLM base_{nullptr};
  std::map<std::string, std::unique_ptr<Trainer>> trainers_;
};

}  // namespace streambp::server
