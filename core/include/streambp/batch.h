#pragma once
/// A batch of token sequences laid out in rows, with the attention structure that follows
/// the tokens into every chunk: position ids restart per sequence, and `sequence_ids`
/// says which sequence each slot holds (-1 for padding). Query i may attend to key j of
/// the same row iff sequence_ids[i] == sequence_ids[j] and j <= i (padding slots attend
/// only to padding, so their rows stay finite and never influence a real token).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

namespace streambp {

/// One training sequence. loss_mask[i] = 1 makes token i a target, predicted from the
/// tokens before it (the HF `labels` convention: loss_mask[0] has no effect). Empty
/// loss_mask means all ones.
///
/// The remaining fields are side inputs of the objectives; each is empty/unset when the
/// objective does not use it. Per-token vectors are aligned with `tokens` (entry i belongs
/// to token i; entries of tokens that are not targets are ignored).
struct Sequence {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> loss_mask;

  /// Sequences with the same group id belong together: a DPO pair (role 0 = chosen,
  /// 1 = rejected) or a GRPO group (completions of one prompt). Micro-batching never
  /// splits a group. -1 = no group.
  int64_t group = -1;
  int role = 0;
  double reward = 0.0;                   ///< grpo: scalar reward of this completion
  std::optional<double> ref_logp;        ///< dpo: reference log-prob, summed over targets
  std::vector<double> sampler_logprobs;  ///< grpo: log-probs of the sampler, per token
  std::vector<double> advantages;        ///< grpo: advantages given per token
  std::vector<double> ref_logprobs;      ///< reference log-probs per token (grpo KL)
  std::vector<double> token_weights;     ///< weighted_logprobs: w of each token (entry 0 unused)
  /// Mixture of experts, routing replay: the experts token t goes to in sparse layer j (the
  /// j-th sparse layer), entries (t * sparse_layers + j) * k + i for i < k (k =
  /// num_experts_per_tok); all k entries of a (token, layer) -1: the router routes it there.
  /// Empty: the router routes every token (docs/architecture.md: Models).
  std::vector<int32_t> routed_experts;
  /// Per-token inputs by name that a registered objective declared for itself (a datum's
  /// loss_fn_inputs with ObjectiveInput::Target::kNamed), aligned as sampler_logprobs.
  std::map<std::string, std::vector<double>> inputs;
  /// cross_entropy with 2-D targets (distillation from a teacher's top-k): `top_k` candidate
  /// tokens for each target token and their weights, entries t * top_k + j for token t (the
  /// candidates in place of token t, scored at the position that predicts it; token 0's
  /// unused). 0 = none: the target is the next token itself.
  int64_t top_k = 0;
  std::vector<int64_t> top_k_targets;
  std::vector<double> top_k_weights;

  /// Tokens that are training targets (loss_mask[i] = 1 for i >= 1).
  int64_t num_targets() const;
};

enum class Layout {
  kRightPad,  ///< one sequence per row, padding after it
  kLeftPad,   ///< one sequence per row, padding before it
  kPacked,    ///< several sequences per row (first fit, in order), each attending only to itself
};
Layout ParseLayout(const std::string& name);  ///< right | left | packed
std::string LayoutName(Layout layout);

struct Batch {
  torch::Tensor input_ids;     ///< [B, T] int64
  torch::Tensor position_ids;  ///< [B, T] int64, 0 at the first token of each sequence
  torch::Tensor sequence_ids;  ///< [B, T] int64, index into the input sequences, -1 = padding
  torch::Tensor targets;       ///< [B, T] int64: the token at position t+1 (0 where none)
  torch::Tensor target_mask;   ///< [B, T] bool: position t predicts a selected target token
  /// Per-token side inputs on the predicting positions (value of token t+1 at position
  /// t), float64 [B, T]; undefined when no sequence of the batch has them.
  torch::Tensor sampler_logprobs;
  torch::Tensor advantages;
  torch::Tensor ref_logprobs;
  torch::Tensor token_weights;
  /// Sequence::inputs by name, float64 [B, T] on the predicting positions as the side inputs
  /// above (0 where a sequence has none); a name is present when any sequence has it.
  std::map<std::string, torch::Tensor> inputs;
  /// Sequence::top_k_targets / top_k_weights on the predicting positions: [B, T, K] (int64,
  /// float64; K the largest top_k of the batch, weight 0 where a sequence has fewer or none);
  /// undefined when no sequence of the batch has them.
  torch::Tensor top_k_targets;
  torch::Tensor top_k_weights;
  /// Routing replay at each token's own position: [B, T, W] int64, W = sparse layers x k
  /// (Sequence::routed_experts), -1 where the router routes (padding, sequences without);
  /// undefined when no sequence carries routing.
  torch::Tensor routed_experts;
  int64_t num_sequences = 0;
  /// Every row holds one sequence from position 0, padding only after it (MakeBatch knows it
  /// from its layout; false where unknown). Fused attention needs it: known on the host, no
  /// device read per chunk.
  bool whole_rows = false;
  /// Where each run of slots holding one sequence (or padding) starts in each row, then the
  /// row's end: {0, ..., T} (a packed row: its sequences' starts, the padding's, T). Known
  /// from the layout (MakeBatch), so a kernel that attends per sequence (docs/gpu.md:
  /// Attention on CUDA) never reads the device for it; null where unknown (built by hand).
  std::shared_ptr<const std::vector<std::vector<int64_t>>> runs;
  std::vector<int64_t> lengths;     ///< tokens of each input sequence
  std::vector<Sequence> sequences;  ///< the input sequences, with their side inputs

  int64_t rows() const { return input_ids.size(0); }
  int64_t length() const { return input_ids.size(1); }
  int64_t num_targets() const;  ///< number of true entries of target_mask
  Batch to(const torch::Device& device) const;
};

/// Checks sequences before anything runs: non-empty batch, non-empty sequences, token ids
/// in [0, vocab_size), loss_mask length equal to tokens, lengths <= max_length (0 = no
/// limit). Throws InvalidArgument naming the sequence index and field.
void ValidateSequences(const std::vector<Sequence>& sequences, int64_t vocab_size,
                       int64_t max_length = 0);

/// Lays sequences out in rows. For kPacked, rows are `pack_length` long (0: the longest
/// sequence); a sequence longer than pack_length is an error.
Batch MakeBatch(const std::vector<Sequence>& sequences, Layout layout, int64_t pack_length = 0);

/// Runs of consecutive sequences with the same group id (>= 0), and single sequences:
/// the units that micro-batching and data-parallel sharding never split.
std::vector<std::vector<size_t>> GroupUnits(const std::vector<Sequence>& sequences);

/// Splits sequences into micro-batches whose padded size (rows x length after MakeBatch
/// with `layout`) stays within `max_tokens`, never splitting a group; a group that alone
/// exceeds the budget becomes a micro-batch of its own. Returns index lists into
/// `sequences`, in order. max_tokens <= 0: one micro-batch.
std::vector<std::vector<size_t>> SplitMicroBatches(const std::vector<Sequence>& sequences, Layout layout,
                                                   int64_t max_tokens);

/// Attention mask [B, q_end - q_start, k_end] (true = allowed) for queries
/// [q_start, q_end) over keys [0, k_end), with an optional sliding window (0 = none).
torch::Tensor AttentionMask(const Batch& batch, int64_t q_start, int64_t q_end, int64_t k_end,
                            int64_t sliding_window = 0);

/// Which keys each query may attend to, for attention that visits the keys tile by tile:
/// block() builds the mask of one block of queries and keys when it is needed, so no
/// [B, C, L] mask has to exist (at T = 32768 that would be 1 GiB of bools). Either
/// AttentionMask's rule over a batch's sequence ids (Causal), or a given mask tensor.
/// Query indices of block() and key_limit() are relative to the first query row.
struct AttentionPattern {
  AttentionPattern() = default;
  /// A given mask [B, C, L], true where attention is allowed (implicit on purpose: every
  /// caller with a mask tensor keeps passing it as is).
  AttentionPattern(torch::Tensor mask);  // NOLINT(google-explicit-constructor)
  /// AttentionMask(batch, q_start, q_end, k_end, sliding_window), block by block.
  static AttentionPattern Causal(const Batch& batch, int64_t q_start, int64_t q_end, int64_t k_end,
                                 int64_t sliding_window = 0);

  int64_t queries() const { return q_end - q_start; }
  int64_t keys() const { return k_end; }
  /// The mask of query rows [q0, q1) over keys [k0, k1): [B, q1 - q0, k1 - k0] bool.
  torch::Tensor block(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const;
  torch::Tensor dense() const { return block(0, queries(), 0, keys()); }  ///< [B, C, L]
  /// Keys at or past this index are masked for every query row of [q0, q1) (causality).
  int64_t key_limit(int64_t q0, int64_t q1) const;
  /// Keys before this index are masked for every query row of [q0, q1): those older than
  /// the first query's window, and (runs known) those before the run that holds the first
  /// query in each row. At most key_limit(q0, q1).
  int64_t key_start(int64_t q0, int64_t q1) const;

  torch::Tensor mask;          ///< the given mask, or undefined (Causal)
  torch::Tensor sequence_ids;  ///< Causal: the batch's sequence ids [B, T]
  int64_t q_start = 0, q_end = 0, k_end = 0;
  int64_t window = 0;          ///< Causal: sliding window (0 = none)
  bool whole_rows = false;     ///< Causal: the batch's Batch::whole_rows
  /// Causal: the batch's Batch::runs (null where unknown).
  std::shared_ptr<const std::vector<std::vector<int64_t>>> runs;
};

}  // namespace streambp
