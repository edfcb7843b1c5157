#pragma once
/// JSONL data files -> streambp.v1 batches, with no LibTorch. One example per line, blank
/// lines skipped. Ids, or text that the server tokenizes (TRL's dataset formats):
///   sft   {"tokens":[...], "loss_mask":[0|1,...]?}  or  {"prompt":[ids], "completion":[ids]}
///         {"input_ids":[...], "labels":[... -100 = no loss ...]?}      (Hugging Face)
///         {"text":"..."}                                              (TRL language modeling)
///         {"messages":[{"role":..., "content":...}, ...]}             (loss on assistant turns)
///         {"prompt":"...", "completion":"..."}  or both as message lists (loss on the completion)
///   dpo   {"prompt":..., "chosen":..., "rejected":..., "ref_chosen_logp":x?, "ref_rejected_logp":y?}
///         prompt/chosen/rejected all ids, all strings or all message lists (both ref values or neither)
///   grpo  {"prompt": ids | "..." | [messages], "completions":[{"tokens":[...] | "text":"...",
///          "reward":r, "logprobs":[...]?, "advantages":[...]?}, ...]}  (reward optional with advantages)
///   weighted  {"tokens":[...], "weights":[...]}   weights[i] multiplies log p(tokens[i+1])
/// An example is one SFT sequence, one DPO pair or one GRPO group; splitting into steps
/// keeps examples whole.
///
/// Errors throw ClientError: NOT_FOUND for a file that cannot be opened, INVALID_ARGUMENT
/// naming the file, line and field ("data.jsonl:3: completions[1]: field 'reward' ...").
/// All functions are reentrant.
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "streambp/v1/trainer.pb.h"

namespace streambp::client {

/// "sft", "dpo", "grpo" or "weighted"; anything else is INVALID_ARGUMENT.
void CheckObjectiveKind(const std::string& kind);

/// Every example of a JSONL stream in the format of `kind`, in one Batch (its oneof set
/// to `kind`). `name` prefixes error messages (usually the file name). An input with no
/// example is INVALID_ARGUMENT.
v1::Batch ParseBatchJsonl(std::istream& in, const std::string& name, const std::string& kind);
v1::Batch ReadBatchJsonl(const std::string& path, const std::string& kind);

/// The kind of a batch ("sft", "dpo", "grpo", "weighted"; "" when unset).
std::string BatchKind(const v1::Batch& batch);
/// Whether any example is text (the server tokenizes it; Client::Tokenize with the batch
/// gives the ids it will train on, which token counts and splitting need).
bool BatchHasText(const v1::Batch& batch);
/// Examples in the batch (SFT examples, DPO pairs, GRPO groups).
int64_t BatchExamples(const v1::Batch& batch);
/// Tokens the server processes for the batch: every sequence in full (a DPO pair is
/// prompt+chosen and prompt+rejected; a GRPO group is prompt+completion per completion).
/// Text is not counted: resolve it to ids first (BatchHasText).
int64_t BatchTokens(const v1::Batch& batch);
/// The same for example `i` of the batch.
int64_t ExampleTokens(const v1::Batch& batch, int64_t i);

/// Consecutive examples, packed greedily: a batch takes the next example while its tokens
/// stay <= max_tokens; an example longer than max_tokens forms a batch of its own.
std::vector<v1::Batch> SplitByTokens(const v1::Batch& batch, int64_t max_tokens);
/// Consecutive examples, `examples` per batch (the last batch may hold fewer).
std::vector<v1::Batch> SplitByExamples(const v1::Batch& batch, int64_t examples);

/// The whole token sequence of an SFT example (tokens, or prompt + completion) and its
/// target mask (loss_mask, all ones when absent, or 0 on the prompt and 1 on the completion).
std::vector<int32_t> SequenceTokens(const v1::SftExample& example);
std::vector<int32_t> SequenceTargets(const v1::SftExample& example);

/// The typed options of an objective, parsed from a JSON object whose keys are the
/// fields of SftOptions / DpoOptions / GrpoOptions in the proto (e.g. {"beta":0.1,
/// "loss_type":"ipo"}). An unknown key, a value of the wrong type or bad JSON is
/// INVALID_ARGUMENT naming the key and listing the known ones.
struct ObjectiveOptions {
  std::string kind;  ///< sft | dpo | grpo | weighted (objective weighted_logprobs)
  v1::SftOptions sft;
  v1::DpoOptions dpo;
  v1::GrpoOptions grpo;
  v1::WeightedOptions weighted;

  /// Sets the request's options oneof (and objective name) to these options.
  void ApplyTo(v1::TrainStepRequest* request) const;
  void ApplyTo(v1::ForwardBackwardRequest* request) const;
};
ObjectiveOptions ParseObjectiveOptions(const std::string& kind, const std::string& json);

}  // namespace streambp::client
