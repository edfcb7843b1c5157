#pragma once
/// Loss plugins. An objective turns chunks of logits into loss terms whose sum over all
/// chunks of a step is the loss of the step; the engines only ever hand it one chunk of
/// positions at a time, so it never sees all logits at once (except the `full` engine,
/// which hands it one chunk covering everything). Normalizers are computed in begin() from
/// the masks, before any chunk, so every term is already normalized.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/types.h>

#include "streambp/batch.h"

namespace streambp {

using Metrics = std::map<std::string, double>;

/// The logits of positions [start, end) of every row, with what the objective needs to
/// score them. logits are at least float32 and require grad in the gradient pass.
struct LogitsChunk {
  torch::Tensor logits;        ///< [B, c, V]
  int64_t start = 0;
  int64_t end = 0;
  torch::Tensor targets;       ///< [B, c] int64
  torch::Tensor target_mask;   ///< [B, c] bool
  torch::Tensor sequence_ids;  ///< [B, c] int64, -1 = padding
};

/// Contract: for one step the engine calls begin(batch); if needs_sequence_pass(), then
/// observe(chunk) for every chunk with no graph and end_sequence_pass(); then
/// chunk_loss(chunk) for every chunk, backpropagating each returned scalar at once; then
/// finish(). An instance is used by one thread at a time and may be reused across steps.
class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;

  /// Validates the objective's side inputs against the batch and computes normalizers.
  /// Throws InvalidArgument on bad input (nothing has run yet).
  virtual void begin(const Batch& batch) = 0;

  /// True when a sequence-level quantity is needed before any gradient (DPO's sequence
  /// log-probabilities): the engine then runs a no-grad pass over all chunks first.
  virtual bool needs_sequence_pass() const { return false; }
  virtual void observe(const LogitsChunk& chunk) {}
  virtual void end_sequence_pass() {}

  /// The loss term of one chunk (a 0-dim tensor on the graph of chunk.logits).
  virtual torch::Tensor chunk_loss(const LogitsChunk& chunk) = 0;

  /// Called after the last chunk: the step's metrics (loss excluded; the engine sums it).
  virtual Metrics finish() { return {}; }
};

/// Token cross-entropy on the selected targets, divided by `normalizer` when it is > 0
/// (so that micro-batches of one step add up to the whole step), else by the number of
/// selected targets of the batch.
struct SftOptions {
  double normalizer = 0.0;  ///< tokens of the whole step; 0 = this batch's selected tokens
};
std::unique_ptr<Objective> MakeSftObjective(const SftOptions& options);

/// Registry of objectives by name. Factories take the objective's JSON options (an
/// unknown key is InvalidArgument).
using ObjectiveFactory = std::unique_ptr<Objective> (*)(const nlohmann::json& options);
void RegisterObjective(const std::string& name, ObjectiveFactory factory);
/// Registers sft (and, as they land, dpo and grpo). Idempotent.
void RegisterBuiltinObjectives();
/// Creates a registered objective; NotFound-style InvalidArgument for an unknown name
/// (listing the known ones).
std::unique_ptr<Objective> CreateObjective(const std::string& name, const nlohmann::json& options);
std::vector<std::string> ObjectiveNames();

}  // namespace streambp
