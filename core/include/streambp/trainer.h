#pragma once
#ifdef STREAMBP_NO_TRAINER
#error "this layer must not use the Trainer (the gRPC edge goes through the TrainingHost)"
#endif
/// The Trainer: a model, its optimizer state, its learning-rate schedule and (optionally) a
/// frozen reference model, driven one step at a time (docs/architecture.md: Objectives, API semantics, Errors):
///   forward_backward(sequences, objective)   accumulate gradients (any number of calls)
///   optim_step()                             clip, schedule, update; policy version += 1
///   train_step(sequences, objective)         both
/// and saved / restored as a whole, bit-exactly (save_checkpoint / LoadCheckpoint).
///
/// Lifecycle and ownership: built only by Create() or LoadCheckpoint() (never half-built);
/// owns the model, the reference model and the optimizer state. Not thread-safe: one
/// thread (the device owner) calls it at a time.
///
/// Failure semantics: input is validated before anything runs, so bad input leaves
/// everything as it was. A forward_backward that fails after computing started (out of
/// memory, a bad side input found late) clears ALL pending gradients, including those of
/// earlier calls since the last optim_step, and rethrows: the caller starts the step over.
/// An optim_step that sees a non-finite loss (since the last step) or a non-finite gradient
/// norm changes no weight and no optimizer state, clears the gradients and reports the step
/// as skipped; skipped steps do not advance step() or policy_version().
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <nlohmann/json_fwd.hpp>

#include "streambp/batch.h"
#include "streambp/dist.h"
#include "streambp/engine.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/lora.h"
#include "streambp/optimizer.h"
#include "streambp/sampler.h"
#include "streambp/trainer_options.h"

namespace streambp {

/// The newest complete trainer checkpoint directly inside `dir`, by folder name, or "" when
/// there is none. Complete: manifest.json is present (it is written last) and
/// trainer_state.json parses. Newest: the highest step; on equal steps the most recently
/// written manifest; then the greater name. Hidden folders (".staging") are never candidates.
std::string FindNewestCheckpoint(const std::string& dir);

/// Removes what interrupted saves left in `dir` (its hidden ".staging" folder).
void CleanStaging(const std::string& dir);

/// SHA-256 over a model's weights (HF names, dtypes, shapes and bytes, in order): the
/// identity of the base an adapter was trained on.
std::string BaseIdentity(const CausalLMImpl& model);

/// A step checked and split once (docs/architecture.md: One walk per step): the sequences
/// validated (ValidateSequences, against the vocabulary and options.max_sequence_length)
/// and split into micro-batches (SplitMicroBatches, options.layout and
/// options.micro_batch_tokens). forward_backward makes one when it is given none; a caller
/// that needs the split as well (the server's admission and progress) makes it once with
/// PlanStep and hands it on, and the step neither validates nor splits again.
struct StepPlan {
  std::vector<std::vector<size_t>> micro_batches;  ///< indices into the step's sequences, in order
  size_t sequences = 0;                            ///< how many sequences it was made for
  int64_t tokens = 0;
  int64_t longest = 0;
  int64_t top_k = 0;  ///< the most candidates of a 2-D (top-k) target row, 0 without any
};

/// InvalidArgument for sequences a step with `options` on a model of `vocab_size` refuses.
StepPlan PlanStep(const std::vector<Sequence>& sequences, int64_t vocab_size, const TrainerOptions& options);

class Trainer {
 public:
  /// Takes the model (its parameters become the trained weights). Validates `options`
  /// (InvalidArgument), makes the reference model (a frozen copy of the model, or loaded
  /// from options.reference.dir) and the optimizer state.
  ///
  /// With an `adapter` (LoRA, made for this model) the base is frozen and only the adapter
  /// trains: its tensors get the gradients and the optimizer state; the base never changes.
  /// The reference model is then the base with the adapter off (no second copy), unless
  /// options.reference.dir names one. Several Trainers may share one base model, each with
  /// its own adapter: every call attaches this Trainer's adapter first (activate()).
  static std::unique_ptr<Trainer> Create(CausalLM model, const TrainerOptions& options,
                                         std::shared_ptr<LoraAdapter> adapter = nullptr);

  /// Restores a checkpoint written by save_checkpoint(). The manifest is verified first (a
  /// missing file, or a size or SHA-256 mismatch, is InvalidArgument naming the file), then
  /// everything is read; nothing outside the new Trainer is changed. `override` replaces the
  /// saved options (e.g. another lr or schedule); the weights, optimizer state, step, policy
  /// version and random generator are always the saved ones.
  ///
  /// A checkpoint of an adapter run holds the adapter (PEFT files), its optimizer state and
  /// the identity of its base (config + BaseIdentity), not the base weights: it is loaded
  /// onto `base`, which must be that very model (InvalidArgument "... a different base ..."
  /// otherwise, nothing changed); `base` is required for it. A full checkpoint takes only
  /// its device from `base` (the CPU when it is null).
  static std::unique_ptr<Trainer> LoadCheckpoint(const std::string& dir,
                                                 const TrainerOptions* override = nullptr,
                                                 CausalLM base = nullptr);

  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Validates `sequences` (token ids, mask lengths, max length), fills reference log-probs
  /// when the objective needs them (reference model, chunk by chunk), then runs
  /// objective.prepare(sequences) and every micro-batch through the engine, adding to the
  /// pending gradients. Returns the summed loss, token counts and the objective's metrics
  /// (with data or context parallel, finish_merged's: the whole step's on every rank). Throws InvalidArgument for bad input (nothing changed), and InvalidArgument
  /// "... needs reference log-probs ..." when the objective needs reference log-probs that
  /// neither the input nor a reference model gives.
  /// `engine` overrides options().engine for this call (null: the trainer's). `plan`: the
  /// PlanStep of exactly these sequences with these options (null: made here).
  StepResult forward_backward(const std::vector<Sequence>& sequences, Objective& objective,
                              const EngineOptions* engine = nullptr, const StepPlan* plan = nullptr);

  /// Applies the pending gradients: norm, non-finite check, clipping, schedule, update;
  /// then clears the gradients and advances step() and policy_version() (unless skipped).
  /// Throws FailedPrecondition when there are no pending gradients.
  /// With `adam`, this step uses its learning rate, betas, eps, weight decay and clipping
  /// norm instead of the configured ones (and no schedule); the configuration is unchanged
  /// for later steps. Bad `adam` (InvalidArgument), or an optimizer that is not adamw
  /// (FailedPrecondition), is refused before anything changes: the gradients stay pending.
  OptimResult optim_step(const AdamStepParams* adam = nullptr);

  /// forward_backward then optim_step. In a data-parallel run with
  /// options().overlap_grad_reduce, the gradient buckets of each layer are launched from
  /// the engine's on_grads_ready hook during the backward of the last micro-batch, and
  /// optim_step waits for them: the same sums as the non-overlapped path. All ranks must
  /// make the same kind of call (train_step, or forward_backward + optim_step) for a step.
  TrainResult train_step(const std::vector<Sequence>& sequences, Objective& objective,
                         const EngineOptions* engine = nullptr, const StepPlan* plan = nullptr);
  /// The first half of train_step, for callers that time or budget the two halves apart
  /// (the server): forward_backward of the step's last call, starting the overlapped
  /// gradient sum in a data-parallel run. The next call must be optim_step (which waits
  /// for the sum); all ranks make the same call.
  StepResult forward_backward_last(const std::vector<Sequence>& sequences, Objective& objective,
                                   const EngineOptions* engine = nullptr, const StepPlan* plan = nullptr);

  /// Drops the pending gradients (and the non-finite loss flag).
  void zero_gradients();
  bool has_pending_gradients() const { return pending_; }

  /// Writes the whole state to `dir` (replacing it atomically if it exists):
  ///   config.json, model.safetensors   a Hugging Face model folder (LoadModel reads it);
  ///                                    with an adapter instead: adapter_config.json,
  ///                                    adapter_model.safetensors (PEFT), base_config.json
  ///   optimizer.safetensors            Optimizer::state() + "rng_state" (uint8)
  ///   reference.safetensors            the reference weights, when there is a reference
  ///   trainer_state.json               step, policy version, dtype, options
  ///   tokenizer.json, ...              the side files given to set_side_files() (the model
  ///                                    folder's tokenizer, generation config, chat template)
  ///   manifest.json                    every other file with its size and SHA-256
  /// Written to "<parent>/.staging/<name>.tmp-<pid>", each file and the folder fsynced,
  /// then renamed to dir. Disk full is ResourceExhausted ("no space left"), and the old
  /// checkpoint of that name, if any, stays. Pending gradients are not saved.
  void save_checkpoint(const std::string& dir, bool with_side_files = true) const;
  /// Files written as they are into every checkpoint (ReadModelSideFiles of the model folder),
  /// so that a checkpoint folder is a model folder transformers / vLLM load with its tokenizer.
  void set_side_files(std::vector<std::pair<std::string, std::string>> files) { side_files_ = std::move(files); }

  /// Data parallelism (docs/architecture.md: Layers dist). With a communicator of N ranks every rank holds
  /// the whole model and is given the whole step by every call (the same sequences on
  /// every rank); each computes the groups of its shard, normalized as the whole step, and
  /// the gradients are summed once per step in optim_step (buckets, one all-reduce —
  /// independent of the number of chunks and micro-batches). ZeRO stage 1: each rank keeps
  /// the optimizer state of its share of the parameters and updates only those, then every
  /// parameter is broadcast from its owner; stage 2: gradients are reduced to their owner
  /// only. N ranks give the update of one process on the whole batch. Every call of
  /// forward_backward, optim_step and save_checkpoint is then a collective: all ranks make
  /// it in the same order. Set once, before the first step.
  void set_communicator(std::shared_ptr<Communicator> communicator);
  Communicator* communicator() const { return comm_.get(); }
  /// Context parallel (docs/architecture.md: Context parallel): from now on every
  /// forward-backward splits its batches' positions over the ranks of `group` (every rank
  /// runs the same steps with the same sequences), and optim_step first sums the ranks'
  /// gradients over it, so every rank applies the one-process update. The stream engine
  /// only. With data parallel too (set_communicator; SplitParallelGroups makes the two
  /// groups of a job), each data-parallel rank's shard is split over its context group, and
  /// optim_step sums over both. Null: off.
  void set_context_parallel(std::shared_ptr<Communicator> group);
  Communicator* context_parallel() const { return cp_.get(); }
  /// Bytes of optimizer state this rank holds (1/N of the total with ZeRO).
  int64_t optimizer_state_bytes() const;
  /// How the last optim_step summed the gradients (all zeros without a communicator).
  const GradReduceInfo& last_grad_reduce() const { return last_reduce_; }

  CausalLM& model() { return model_; }
  const CausalLM& model() const { return model_; }
  /// The adapter this Trainer trains, or null (full fine-tuning).
  const std::shared_ptr<LoraAdapter>& adapter() const { return adapter_; }
  /// Attaches this Trainer's adapter (or none) to the model: done by every call; for
  /// callers that use model() directly on a base shared with other Trainers.
  void activate();
  /// The tensors this Trainer trains, by name: the adapter's, or every model parameter.
  std::vector<std::pair<std::string, torch::Tensor>> trainable() const;
  /// The frozen reference model; null when there is none, or when it is the base with the
  /// adapter off (an adapter run without reference.dir: see token_logprobs()).
  const CausalLM& reference_model() const { return reference_; }
  /// Whether reference log-probs are available (a reference model, or the adapter's base).
  bool has_reference() const { return reference_ || reference_from_base_; }
  /// Per-token log-probs (TokenLogprobs) under the policy (its adapter attached) or the
  /// reference (the reference model, or the base with the adapter off). FailedPrecondition
  /// for a reference that does not exist.
  torch::Tensor token_logprobs(const Batch& batch, bool reference, int64_t logits_chunk, double temperature);
  /// Completions from the policy (its adapter attached).
  std::vector<SampledCompletion> sample(const std::vector<std::vector<int64_t>>& prompts, const SampleOptions& options);
  /// SHA-256 over the base weights (names, dtypes, shapes, bytes): computed once.
  const std::string& base_identity() const;
  int64_t step() const { return step_; }                      ///< updates applied
  int64_t policy_version() const { return policy_version_; }  ///< bumped by every update
  const TrainerOptions& options() const { return options_; }
  double current_lr() const;  ///< the learning rate the next optim_step() will use
  const Optimizer& optimizer() const { return *optimizer_; }
  /// The trainer's random generator (seeded by options().seed, saved in checkpoints).
  at::Generator& generator() { return generator_; }

 private:
  Trainer(CausalLM model, CausalLM reference, const TrainerOptions& options, std::shared_ptr<LoraAdapter> adapter);
  std::vector<Sequence> with_reference_logprobs(const std::vector<Sequence>& sequences,
                                                const std::vector<std::vector<size_t>>& micro_batches,
                                                int64_t logits_chunk, double temperature);

  CausalLM model_;
  CausalLM reference_;
  std::shared_ptr<LoraAdapter> adapter_;
  bool reference_from_base_ = false;  // the reference is the base with the adapter off
  mutable std::string base_identity_;
  std::vector<std::pair<std::string, std::string>> side_files_;
  TrainerOptions options_;
  std::unique_ptr<Optimizer> optimizer_;
  at::Generator generator_;
  int64_t step_ = 0;
  int64_t policy_version_ = 0;
  bool pending_ = false;         // gradients accumulated since the last optim_step
  bool nonfinite_loss_ = false;  // a non-finite loss was seen since the last optim_step
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<Communicator> cp_;  // context parallel
  std::map<std::string, int> owner_;  // ZeRO: the rank that owns each parameter
  std::unique_ptr<BucketedSum> overlapped_;  // the gradient sum started by the backward
  std::vector<bool> overlapped_groups_;      // per layer, + the embedding, + the head: added yet
  int64_t overlapped_in_backward_ = 0;       // its buckets launched before the backward ended
  GradReduceInfo last_reduce_;
  /// The indices of the sequences data-parallel rank `rank` computes.
  std::vector<size_t> local_shard(const std::vector<Sequence>& sequences, int rank) const;
  void check_context_shards(const std::vector<Sequence>& sequences) const;
  StepResult run_step(const std::vector<Sequence>& sequences, Objective& objective, const EngineOptions* engine,
                      const StepPlan* plan, bool overlap);
  void reduce_gradients();
  /// Adds the gradients of decoder layer `layer` (-1: every parameter not yet added, then
  /// launches the partly filled buckets) to the overlapped sum.
  void add_to_overlapped(int64_t layer);
};

}  // namespace streambp
