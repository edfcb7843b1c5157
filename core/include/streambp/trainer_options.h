#pragma once
/// The Trainer's configuration and the plain results of its calls: what a caller needs to
/// configure a Trainer or read its answers without the Trainer class itself (the server's
/// gRPC edge includes this, never trainer.h).
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/optimizer.h"

namespace streambp {

/// Where reference log-probs come from when an objective needs them and the sequences do
/// not carry them.
struct ReferenceOptions {
  bool use_reference_model = true;  ///< keep a frozen reference model (costs one model's memory)
  std::string dir;                  ///< HF folder of the reference; empty = the initial weights

  static ReferenceOptions FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

struct TrainerOptions {
  OptimizerOptions optimizer;       ///< adamw | sgd and its hyper-parameters
  ScheduleOptions schedule;         ///< learning-rate multiplier per step
  double max_grad_norm = 1.0;       ///< clip the total L2 norm of the gradients to this; 0 = off
  EngineOptions engine;             ///< backward engine and its chunk sizes
  Layout layout = Layout::kPacked;  ///< how sequences are laid out in rows
  int64_t micro_batch_tokens = 0;   ///< padded tokens per micro-batch; 0 = whole batch at once
  int64_t max_sequence_length = 0;  ///< longer sequences are refused; 0 = no limit
  ReferenceOptions reference;       ///< the frozen reference model
  uint64_t seed = 0;                ///< seed of the trainer's random generator
  /// Data parallel, train_step: start the sum of each layer's gradients over the ranks as
  /// soon as the backward of the step's last micro-batch has finished them, so that it runs
  /// while the earlier layers are backpropagated (false: everything in optim_step).
  bool overlap_grad_reduce = true;
  int64_t grad_bucket_bytes = 0;  ///< overlapped sum: bytes per bucket (0 = kDefaultGradBucketBytes)

  /// Throws InvalidArgument naming the bad field.
  void Validate() const;
  /// Every field is optional; an unknown key (at any level) is InvalidArgument naming it,
  /// e.g. "trainer options: unknown key 'optimizer.betass'".
  static TrainerOptions FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

constexpr int64_t kDefaultGradBucketBytes = 25 << 20;  // PyTorch DDP's bucket_cap_mb


/// JSON of engine options: {"kind": "stream", "chunk": 0, "logits_chunk": -1,
/// "recompute_kv_per_chunk": false}; unknown keys are InvalidArgument.
EngineOptions EngineOptionsFromJson(const nlohmann::json& j);
nlohmann::json EngineOptionsToJson(const EngineOptions& options);

struct OptimResult {
  double lr = 0.0;         ///< learning rate of this step (the one it would have used, if skipped)
  double grad_norm = 0.0;  ///< total L2 norm of the gradients before clipping (float64)
  bool skipped = false;    ///< true when nothing was applied
  std::string reason;      ///< why it was skipped: "non-finite loss" | "non-finite gradient norm"
  int64_t step = 0;        ///< step() after this call
};

/// How the gradients of the last optimizer step were summed over the ranks.
struct GradReduceInfo {
  bool overlapped = false;           ///< started during the backward (train_step, overlap on)
  int64_t buckets = 0;               ///< gradient collectives (all-reduce, or reduce with ZeRO-2)
  int64_t buckets_in_backward = 0;   ///< of those, launched before the backward had finished
  int64_t bytes = 0;                 ///< their payload (the flattened gradient buckets)
  double wait_seconds = 0;           ///< time optim_step waited for them
};

struct TrainResult {
  StepResult forward;  ///< loss, token counts and the objective's metrics
  OptimResult optim;
};

}  // namespace streambp
