#pragma once
// Everything that changes a model is a typed Command (docs/architecture.md: Layers): rank 0 runs it through
// its Executor, which first sends it to the other ranks (encoded here, in one place), and
// every rank applies it with the same function, Apply(). Replication therefore cannot
// drift from what rank 0 runs.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "replica.h"
#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/optimizer.h"
#include "streambp/trainer.h"

namespace streambp::server {

enum class StepKind {
  kForwardBackward,      ///< accumulate gradients
  kForwardBackwardLast,  ///< the step's last forward-backward: starts the gradient sum over the ranks
  kTrainStep,            ///< forward-backward and the optimizer step
};

struct StepCommand {
  std::string session;
  StepKind kind = StepKind::kForwardBackward;
  std::vector<Sequence> sequences;
  std::string objective;
  nlohmann::json options = nlohmann::json::object();
  EngineOptions engine;  ///< its hooks are not sent (they are rank 0's own)
  std::optional<AdamStepParams> adam;  ///< kTrainStep: this step's Adam parameters
  // Rank 0's own, never sent (docs/architecture.md: One walk per step): the objective built
  // when the request was admitted, and the plan admission made (the sequences validated and
  // split). The other ranks build and plan from what they receive.
  std::shared_ptr<Objective> built;
  std::shared_ptr<const StepPlan> plan;
};
struct OptimStepCommand {
  std::string session;
  std::optional<AdamStepParams> adam;  ///< this step's Adam parameters (OptimStep's adam_params)
};
struct ZeroGradientsCommand {
  std::string session;
};
struct SaveCommand {
  std::string session;
  std::string dir;
  /// The model folder's tokenizer etc. go in too (not in session state folders). Only rank 0
  /// writes, so this is not encoded for the other ranks.
  bool side_files = true;
};
struct LoadCommand {
  std::string session;
  std::string dir;
};
/// A new session (its trainer on every rank).
struct CreateSessionCommand {
  SessionRequest request;
};
/// A session back from its state folder.
struct RestoreSessionCommand {
  SessionSpec spec;
  std::string dir;
};
/// A session's trainer forgotten (after its state was saved, or when it is deleted).
struct DropSessionCommand {
  std::string session;
  bool deleted = false;  ///< the session is gone for good (not only written to disk)
};
struct PingCommand {};
struct StopCommand {};

using Command = std::variant<StepCommand, OptimStepCommand, ZeroGradientsCommand, SaveCommand, LoadCommand,
                             CreateSessionCommand, RestoreSessionCommand, DropSessionCommand, PingCommand,
                             StopCommand>;

std::string CommandName(const Command& command);
/// Bytes for the other ranks (CBOR).
std::string EncodeCommand(const Command& command);
/// InvalidArgument for bytes that are not an encoded command.
Command DecodeCommand(const std::string& bytes);

struct CommandResult {
  StepResult step;    ///< StepCommand
  OptimResult optim;  ///< OptimStepCommand, StepCommand kTrainStep
};

/// What rank 0 adds to a command it applies (never sent).
struct ApplyHooks {
  std::function<void(const EngineProgress&)> on_progress;
  /// kTrainStep: called between the forward-backward and the optimizer step.
  std::function<void(const StepResult&)> after_forward_backward;
};

/// The one place where a command meets the model, on every rank. Ping and Stop do nothing.
CommandResult Apply(Replica& replica, const Command& command, const ApplyHooks& hooks = {});

}  // namespace streambp::server
