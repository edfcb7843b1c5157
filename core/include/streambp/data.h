#pragma once
/// JSONL data files, one example per line (docs/architecture.md: Models, used by every tool):
///   {"tokens":[...], "loss_mask":[0|1,...]}   loss_mask optional (default all ones)
///   {"prompt":[...], "completion":[...]}      loss on the completion tokens only
/// Blank lines are skipped. A line that does not parse or has a bad field throws
/// InvalidArgument naming the file, the line number and the field.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/batch.h"

namespace streambp {

/// One SFT example from a parsed JSON line; `where` prefixes error messages ("f.jsonl:3").
Sequence ParseSftExample(const nlohmann::json& j, const std::string& where);

std::vector<Sequence> ReadSftJsonl(const std::string& path);

/// One DPO pair {"prompt","chosen","rejected","ref_chosen_logp"?,"ref_rejected_logp"?}:
/// two sequences (prompt+chosen, prompt+rejected; loss on the completion), with group
/// `group`, roles 0 (chosen) and 1 (rejected), and ref_logp when given (both or neither).
std::vector<Sequence> ParseDpoExample(const nlohmann::json& j, const std::string& where, int64_t group);

/// One GRPO group {"prompt", "completions":[{"tokens","reward","logprobs"?,"advantages"?}]}:
/// one sequence per completion (prompt+completion; loss on the completion), group
/// `group`, the reward, and the per-token sampler log-probs / advantages of the
/// completion tokens (one value per completion token) when given.
std::vector<Sequence> ParseGrpoExample(const nlohmann::json& j, const std::string& where, int64_t group);

/// One weighted_logprobs sequence {"tokens":[...], "weights":[...]}: weights[i] multiplies
/// log p(tokens[i+1] | tokens[..i]) (one fewer than the tokens, as ComputeLogprobs aligns).
Sequence ParseWeightedExample(const nlohmann::json& j, const std::string& where);

/// One sequence of Tinker's policy losses (importance_sampling, ppo, cispo, dro)
/// {"tokens":[...], "logprobs":[...], "advantages":[...], "loss_mask"?:[...]}: logprobs[i] (the
/// sampler's) and advantages[i] belong to tokens[i+1], one fewer than the tokens; loss_mask
/// (one per token, as sft's) selects the targets, all tokens after the first by default.
Sequence ParsePolicyExample(const nlohmann::json& j, const std::string& where);

/// True for the objectives whose data is ParsePolicyExample's.
bool IsPolicyLoss(const std::string& objective);

/// Reads a JSONL file in the format of `objective` (sft | dpo | grpo | weighted_logprobs and
/// cross_entropy | importance_sampling, ppo, cispo and dro).
std::vector<Sequence> ReadExamples(const std::string& path, const std::string& objective);

/// Reads a JSONL file into parsed JSON objects, with line numbers (1-based).
struct JsonLine {
  int64_t line = 0;
  nlohmann::json value;
};
std::vector<JsonLine> ReadJsonl(const std::string& path);

}  // namespace streambp
