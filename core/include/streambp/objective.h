#pragma once
/// Loss plugins. An objective turns chunks of logits into loss terms whose sum over all
/// chunks of a step is the loss of the step; the engines only ever hand it one chunk of
/// positions at a time, so it never sees all logits at once (except the `full` engine,
/// which hands it one chunk covering everything). Normalizers are computed in begin() from
/// the masks, before any chunk, so every term is already normalized.
#include <functional>
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

/// A step's metrics before they are divided out, so that the ranks of a data- or
/// context-parallel step can add theirs up: `means` are (sum, count) pairs read as
/// sum / count (0 when the count is 0), `totals` plain sums, `maxima` maxima.
struct MetricParts {
  std::map<std::string, std::pair<double, double>> means;
  std::map<std::string, double> totals;
  std::map<std::string, double> maxima;
};
/// Combines one rank's parts with the other ranks' in place (every rank gets the group's).
using MetricMerge = std::function<void(MetricParts&)>;

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
  /// side inputs (nothing has run yet). Reference log-probs the Trainer computes with its
  /// reference model are not filled in yet here (in a data-parallel run each rank computes
  /// them for its own shard only): they arrive with the micro-batches in begin().
  virtual void prepare(const std::vector<Sequence>& step) = 0;

  /// Validates the micro-batch and sets it up (calls prepare(batch.sequences) first if
  /// the step was not prepared).
  virtual void begin(const Batch& batch) = 0;

  /// True when a sequence-level quantity is needed before any gradient (DPO's sequence
  /// log-probabilities): the engine then runs a no-grad pass over all chunks first.
  virtual bool needs_sequence_pass() const { return false; }
  virtual void observe(const LogitsChunk& chunk) {}
  virtual void end_sequence_pass() {}
  /// Context parallel (docs/architecture.md: Context parallel): the tensors observe() added
  /// to that end_sequence_pass() reads (per-sequence sums, on the chunks' device). A step
  /// whose positions are split over ranks observes each rank's chunks there and sums these
  /// over the ranks, in place, before end_sequence_pass(). Every rank returns the same
  /// shapes, defined even when it observed nothing. Empty without a sequence pass.
  virtual std::vector<torch::Tensor> sequence_pass_sums() { return {}; }
  /// The part of batch_loss() that end_sequence_pass() computed from those sums: the same
  /// on every rank of a context-parallel step, so only one of them counts it.
  virtual double sequence_pass_loss() const { return 0.0; }

  /// The loss term of one chunk (a 0-dim tensor on the graph of chunk.logits).
  virtual torch::Tensor chunk_loss(const LogitsChunk& chunk) = 0;

  /// The true loss of the micro-batch when chunk terms are a surrogate; nullopt when the
  /// sum of the chunk terms is the loss.
  virtual std::optional<double> batch_loss() const { return std::nullopt; }

  /// True when the objective needs reference log-probs that the sequences do not carry
  /// (the trainer then computes them with its reference model into ref_logprobs).
  virtual bool needs_reference(const std::vector<Sequence>& step) const { return false; }
  /// The temperature the reference log-probs are wanted at (GRPO's KL compares the policy
  /// at its sampling temperature with the reference at the same one, as TRL does).
  virtual double reference_temperature() const { return 1.0; }

  /// Metrics of the step (loss excluded) and the end of the step.
  virtual Metrics finish() = 0;
  /// finish() for a step whose sequences (data parallel) or positions (context parallel)
  /// are split over ranks: every rank calls it, and `merge` combines the ranks' parts, so
  /// each reports the metrics of the whole step. The built-in objectives override it; the
  /// default reports this rank's finish().
  virtual Metrics finish_merged(const MetricMerge& merge) { return finish(); }
};

/// Token cross-entropy on the selected targets, divided by `normalizer` when it is > 0
/// (so that micro-batches of one step add up to the whole step), else by the number of
/// selected targets of the batch.
struct SftOptions {
  double normalizer = 0.0;  ///< tokens of the whole step; 0 = this batch's selected tokens
};
std::unique_ptr<Objective> MakeSftObjective(const SftOptions& options);

/// dpo: pairs of sequences (group = pair, role 0 chosen / 1 rejected; loss on the
/// completion). With S = summed log-prob of the completion under the policy and R under
/// the reference (ref_logp, or the sum of ref_logprobs), z = (S_c - S_r) - (R_c - R_r):
///   sigmoid: -(1-ls) log s(beta z) - ls log s(-beta z)        (ls = label_smoothing)
///   ipo:     (z - 1/(2 beta))^2 with S and R divided by the completion length (as TRL)
///   hinge:   relu(1 - beta z)
///   robust:  (-(1-ls) log s(beta z) + ls log s(-beta z)) / (1 - 2 ls)
/// averaged over the pairs of the step (or divided by `normalizer`). Two passes: a no-grad
/// pass for S, then the gradient pass with per-sequence weights dL/dS.
struct DpoOptions {
  double beta = 0.1;                  ///< inverse temperature of the implicit reward
  std::string loss_type = "sigmoid";  ///< sigmoid | ipo | hinge | robust
  double label_smoothing = 0.0;       ///< sigmoid and robust: assumed label noise, in [0, 0.5)
  double normalizer = 0.0;            ///< pairs of the whole step; 0 = pairs given to prepare()
};
std::unique_ptr<Objective> MakeDpoObjective(const DpoOptions& options);

/// grpo: groups of completions of one prompt (group id per sequence; loss on the
/// completion). Per completion token t of sequence i, with logp under logits/temperature:
///   A      advantage: given per token, or (r_i - mean_g) / (std + 1e-4) with the group's
///          unbiased std (scale_rewards=group), the step's (batch), or r_i - mean_g (none)
///   ratio  exp(logp - old); old = the sampler's log-probs (old_logprobs=sampler) or the
///          detached current ones (current); importance_sampling_level=sequence uses the
///          completion's mean log-ratio for all its tokens (GSPO)
///   l_t  = -min(ratio A, clip(ratio, 1-epsilon_low, 1+epsilon_high) A)
///          x min(exp(logp_detached - sampler), tis_cap)  when sampler log-probs are given,
///            old_logprobs=current and tis_cap > 0 (truncated importance sampling)
///          + beta (exp(ref - logp) - (ref - logp) - 1)      (k3 KL to the reference)
/// aggregated by loss_type: grpo (mean over each completion's tokens, then over
/// completions), bnpo / dapo (sum over the step's completion tokens / their number),
/// dr_grpo (sum / (completions x max_completion_length)). `normalizer` > 0 replaces the
/// denominator (completions for grpo, tokens for bnpo/dapo, completions x length for dr_grpo).
struct GrpoOptions {
  double beta = 0.0;              ///< weight of the k3 KL to the reference (0: no reference needed)
  double epsilon_low = 0.2;       ///< lower clip of the ratio: 1 - epsilon_low
  double epsilon_high = 0.28;     ///< upper clip of the ratio: 1 + epsilon_high
  std::string loss_type = "dapo";  ///< grpo | bnpo | dr_grpo | dapo
  std::string scale_rewards = "group";  ///< group | batch | none
  std::string importance_sampling_level = "token";  ///< token | sequence (GSPO)
  double temperature = 1.0;       ///< logits are divided by it (use the sampler's)
  std::string old_logprobs = "current";  ///< current | sampler
  double tis_cap = 2.0;           ///< cap of the trainer/sampler importance weight; 0 = off
  double max_completion_length = 0.0;  ///< dr_grpo; 0 = the longest completion of the step
  double normalizer = 0.0;        ///< see above; 0 = computed from the step
  bool entropy = true;            ///< report the mean token entropy (costs one softmax per chunk)
};
std::unique_ptr<Objective> MakeGrpoObjective(const GrpoOptions& options);

/// weighted_logprobs: a loss linear in the per-token log-probs of the targets,
///   L = sum over target tokens t of w_t log p(token_t)   (log p of logits / temperature)
/// with w = Sequence::token_weights, given by the client: a client loss f(logp) is trained
/// exactly by sending w = df/dlogp computed at the current weights (one extra forward, as
/// Tinker's forward_backward_custom). No normalization: the weights carry it.
struct WeightedLogprobsOptions {
  double temperature = 1.0;  ///< logits are divided by it
};
std::unique_ptr<Objective> MakeWeightedLogprobsObjective(const WeightedLogprobsOptions& options);

/// The built-in losses of Tinker's forward_backward (docs/architecture.md: Objectives), summed
/// over the target tokens of the step with no normalizer (the caller's advantages and weights
/// carry it). Per target token, lp = log p(token) under the policy, q the sampler's log-prob
/// (Sequence::sampler_logprobs), A the advantage (Sequence::advantages), r = exp(lp - q):
///   importance_sampling  -sum r A
///   ppo                  -sum min(r A, clip(r, clip_low_threshold, clip_high_threshold) A)
///   cispo                -sum sg(clip(r, clip_low_threshold, clip_high_threshold)) A lp
///   dro                  -sum (lp A - beta/2 (lp - q)^2)
///   cross_entropy        -sum w lp   (w = Sequence::token_weights; no sampler needed), or
///                        with 2-D targets -sum_t sum_j w_tj log p(candidate_tj) over the top-k
///                        candidates of each target token (Sequence::top_k_targets / weights)
/// Metrics, over the target tokens: the train/sampler mismatch (k3 estimate of KL(q || p),
/// the ratio's mean and maximum) and, for ppo and cispo, the share of tokens whose ratio lies
/// outside the clip.
struct PolicyLossOptions {
  std::string loss;                  ///< importance_sampling | ppo | cispo | dro | cross_entropy
  double clip_low_threshold = 0.0;   ///< ppo, cispo
  double clip_high_threshold = 0.0;  ///< ppo, cispo
  double beta = 0.0;                 ///< dro
};
std::unique_ptr<Objective> MakePolicyLossObjective(const PolicyLossOptions& options);

/// One option of an objective: the schema that the JSON reader, the server's protobuf
/// converter (a field of the same name in streambp.v1.<Kind>Options) and the command-line
/// tools share, so the three cannot drift apart (a test checks the proto against it).
struct ObjectiveOption {
  enum class Type { kNumber, kBool, kChoice };
  std::string key;
  Type type = Type::kNumber;
  std::vector<std::string> choices;  ///< kChoice: the allowed values
  std::string default_value;         ///< the default, as text
  std::string help;                  ///< one line
};

/// One named per-token input of an objective, as a datum carries it (Tinker's Datum:
/// `loss_fn_inputs`, docs/api.md: Data and loss functions): a float tensor with one value
/// per position of the model input (the value of the token that position predicts), which
/// lands in the Sequence field `target` names, aligned as that field is (entry t = token t,
/// entry 0 unused). `target` kNamed keeps it by its own name in Sequence::inputs /
/// Batch::inputs, so a loss can take an input nothing else knows.
struct ObjectiveInput {
  enum class Target { kNamed, kTokenWeights, kSamplerLogprobs, kAdvantages, kRefLogprobs };
  std::string name;
  Target target = Target::kNamed;
  bool required = true;
  std::string help;  ///< one line
  /// A kTokenWeights input that may also come as [N, K] with 2-D target_tokens [N, K] (a
  /// teacher's top-k, for distillation): then it is the weight of each candidate and lands in
  /// Sequence::top_k_weights (cross_entropy).
  bool top_k = false;
};

/// Registry of objectives by name. Factories take the objective's JSON options (an
/// unknown key is InvalidArgument).
using ObjectiveFactory = std::unique_ptr<Objective> (*)(const nlohmann::json& options);
/// `batch_kind`: the kind of batch the objective trains on (sft | dpo | grpo | ...; empty =
/// `name`): a request with another kind of batch is refused. `inputs`: the per-token inputs
/// a datum gives it (besides the target tokens every datum has); an objective with none
/// declared takes no data batch.
void RegisterObjective(const std::string& name, ObjectiveFactory factory,
                       std::vector<ObjectiveOption> schema = {}, const std::string& batch_kind = "",
                       std::vector<ObjectiveInput> inputs = {});
/// The per-token inputs a registered objective takes from a datum (InvalidArgument for an
/// unknown name; empty: it takes no data batch).
std::vector<ObjectiveInput> ObjectiveInputs(const std::string& name);
/// The kind of batch a registered objective trains on (InvalidArgument for an unknown name).
std::string ObjectiveBatchKind(const std::string& name);
/// The options a registered objective accepts (InvalidArgument for an unknown name).
std::vector<ObjectiveOption> ObjectiveOptionSchema(const std::string& name);
/// Registers sft (and, as they land, dpo and grpo). Idempotent.
void RegisterBuiltinObjectives();
/// Creates a registered objective; NotFound-style InvalidArgument for an unknown name
/// (listing the known ones).
std::unique_ptr<Objective> CreateObjective(const std::string& name, const nlohmann::json& options);
std::vector<std::string> ObjectiveNames();

}  // namespace streambp
