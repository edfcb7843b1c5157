#pragma once
// The edge between protobuf messages and core types: every field is validated here, with
// messages that name it ("batch.grpo.groups[1].completions[0].logprobs: 3 entries, ...").
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/v1/trainer.pb.h"

namespace streambp::server {

struct Limits {
  int64_t vocab_size = 0;
  int64_t max_sequence_length = 0;
  int64_t max_tokens_per_request = 0;
};

/// A step request in core terms.
struct StepInput {
  std::vector<Sequence> sequences;
  std::string objective;            ///< registered objective name
  nlohmann::json objective_options;  ///< JSON options of that objective
  EngineOptions engine;
  int64_t tokens = 0;
  std::vector<std::string> group_ids;  ///< grpo: the client's group ids (may be empty strings)
};

/// Converts and validates a batch with its objective, options and engine options.
/// Throws InvalidArgument naming the field; ResourceExhausted when over the token limit.
StepInput ConvertStep(const v1::Batch& batch, const std::string& objective, const v1::SftOptions* sft,
                      const v1::DpoOptions* dpo, const v1::GrpoOptions* grpo, const v1::EngineOptions& engine,
                      const EngineOptions& defaults, const Limits& limits);

/// Template helper for the three request types that carry a step.
template <typename Request>
StepInput ConvertStepRequest(const Request& r, const EngineOptions& defaults, const Limits& limits) {
  return ConvertStep(r.batch(), r.objective(), r.has_sft() ? &r.sft() : nullptr,
                     r.has_dpo() ? &r.dpo() : nullptr, r.has_grpo() ? &r.grpo() : nullptr, r.engine(), defaults,
                     limits);
}

/// Engine options of a request over the server's defaults (empty/0 fields keep defaults).
EngineOptions ConvertEngine(const v1::EngineOptions& e, const EngineOptions& defaults);

/// Sequences of ComputeLogprobs, validated.
std::vector<Sequence> ConvertSequences(const google::protobuf::RepeatedPtrField<v1::TokenSequence>& seqs,
                                       const Limits& limits);

/// A checkpoint name: [A-Za-z0-9._-]+, not "." or "..", at most 128 characters.
void ValidateCheckpointName(const std::string& name);

}  // namespace streambp::server
