#pragma once
/// Loss plugins. An objective turns chunks of logits into loss terms whose sum over all
/// chunks of a step is the loss of the step; the engines only ever hand it one chunk of
/// positions at a time, so it never sees all logits at once (except the `full` engine,
/// which hands it one chunk covering everything). Normalizers are computed in begin() from
/// the masks, before any chunk, so every term is already normalized.
#include <map>
#include <memory>
#include <optional>
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

/// Contract. A step may be split into micro-batches (to bound memory, or by the client
/// across calls); the objective then sees:
///   prepare(all sequences of the step)     step-wide normalizers, advantages; resets metrics
///   for each micro-batch:
///     begin(batch)                         validates; per-batch setup
///     [observe(chunk)... end_sequence_pass()]   no-grad pass, if needs_sequence_pass()
///     chunk_loss(chunk)...                 one term per chunk; the engine backprops each
///     batch_loss()                         the loss of this micro-batch, when the chunk
///                                          terms are a surrogate (same gradient, other value)
///   finish()                               metrics over the whole step
/// If begin() is called without prepare() since the last finish(), the batch is the whole
/// step (begin prepares from batch.sequences). The sum over micro-batches of the loss is
/// the loss of the step, and so is the sum of the gradients. An instance is used by one
/// thread at a time and may be reused across steps.
class Objective {
 public:
  virtual ~Objective() = default;
  virtual std::string name() const = 0;

  /// Step-wide quantities from every sequence of the step. Throws InvalidArgument on bad
  /// side inputs (nothing has run yet).
  virtual void prepare(const std::vector<Sequence>& step) = 0;

  /// Validates the micro-batch and sets it up (calls prepare(batch.sequences) first if
  /// the step was not prepared).
  virtual void begin(const Batch& batch) = 0;

  /// True when a sequence-level quantity is needed before any gradient (DPO's sequence
  /// log-probabilities): the engine then runs a no-grad pass over all chunks first.
  virtual bool needs_sequence_pass() const { return false; }
  virtual void observe(const LogitsChunk& chunk) {}
  virtual void end_sequence_pass() {}

  /// The loss term of one chunk (a 0-dim tensor on the graph of chunk.logits).
  virtual torch::Tensor chunk_loss(const LogitsChunk& chunk) = 0;

  /// The true loss of the micro-batch when chunk terms are a surrogate; nullopt when the
  /// sum of the chunk terms is the loss.
  virtual std::optional<double> batch_loss() const { return std::nullopt; }

  /// True when the objective needs reference log-probs that the sequences do not carry
  /// (the trainer then computes them with its reference model into ref_logprobs).
  virtual bool needs_reference(const std::vector<Sequence>& step) const { return false; }

  /// Metrics of the step (loss excluded) and the end of the step.
  virtual Metrics finish() = 0;
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
