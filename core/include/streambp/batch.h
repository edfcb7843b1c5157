#pragma once
/// A batch of token sequences laid out in rows, with the attention structure that follows
/// the tokens into every chunk: position ids restart per sequence, and `sequence_ids`
/// says which sequence each slot holds (-1 for padding). Query i may attend to key j of
/// the same row iff sequence_ids[i] == sequence_ids[j] and j <= i (padding slots attend
/// only to padding, so their rows stay finite and never influence a real token).
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

namespace streambp {

/// One training sequence. loss_mask[i] = 1 makes token i a target, predicted from the
/// tokens before it (the HF `labels` convention: loss_mask[0] has no effect). Empty
/// loss_mask means all ones.
struct Sequence {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> loss_mask;
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
  int64_t num_sequences = 0;
  std::vector<int64_t> lengths;  ///< tokens of each input sequence

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

/// Attention mask [B, q_end - q_start, k_end] (true = allowed) for queries
/// [q_start, q_end) over keys [0, k_end), with an optional sliding window (0 = none).
torch::Tensor AttentionMask(const Batch& batch, int64_t q_start, int64_t q_end, int64_t k_end,
                            int64_t sliding_window = 0);

}  // namespace streambp
