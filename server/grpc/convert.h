#pragma once
// The edge between protobuf messages and the host's core types. Every field is validated
// while converting, with messages that name it ("batch.grpo.groups[1].completions[0].logprobs:
// 3 entries, ..."); the host never sees a wire type.
#include <string>
#include <type_traits>

#include <google/protobuf/message.h>
#include <nlohmann/json.hpp>

#include "streambp/v1/trainer.pb.h"
#include "config.h"
#include "types.h"

namespace streambp::server {

/// A batch with its objective, options and engine options. InvalidArgument naming the field
/// (an objective whose batch kind is not the batch's, options of another kind, bad token
/// ids, lengths, masks, non-finite side inputs); ResourceExhausted over the token limit.
StepRequest ConvertStep(const v1::Batch& batch, const std::string& objective, const google::protobuf::Message* options,
                        const v1::EngineOptions& engine, const InputLimits& limits,
                        const google::protobuf::Map<std::string, v1::ConfigValue>* loss_fn_config = nullptr);

/// loss_fn_config as the objective's JSON options (the registry's option reader checks the
/// keys and their types, naming the known ones).
nlohmann::json ConfigToJson(const google::protobuf::Map<std::string, v1::ConfigValue>& config);

/// AdamParams in core terms: each unset field keeps Tinker's default (AdamStepParams' own).
/// The values are checked by the host (InvalidArgument naming the field).
AdamStepParams ConvertAdam(const v1::AdamParams& a);

/// The three request types that carry a step (TrainStep's with its adam_params).
template <typename Request>
StepRequest ConvertStepRequest(const Request& r, const InputLimits& limits) {
  const google::protobuf::Message* options = nullptr;
  if (r.has_sft()) options = &r.sft();
  if (r.has_dpo()) options = &r.dpo();
  if (r.has_grpo()) options = &r.grpo();
  if (r.has_weighted()) options = &r.weighted();
  StepRequest step = ConvertStep(r.batch(), r.objective(), options, r.engine(), limits, &r.loss_fn_config());
  if constexpr (std::is_same_v<Request, v1::TrainStepRequest>) {
    if (r.has_adam_params()) step.adam = ConvertAdam(r.adam_params());
  } else {
    step.return_logprobs = r.return_logprobs();
  }
  return step;
}

/// An objective's options message as JSON: every field that is set, under its own name
/// (the core's option schema names them the same; a test keeps the two in step).
nlohmann::json OptionsToJson(const google::protobuf::Message& options);

EngineRequest ConvertEngine(const v1::EngineOptions& e);
LogprobsRequest ConvertLogprobs(const v1::ComputeLogprobsRequest& r, const InputLimits& limits);
SampleRequest ConvertSample(const v1::SampleRequest& r, const InputLimits& limits);
/// A pushed group in core terms (validated by the host, which names its fields) for
/// `session` (the group's own session field when set). Text forms are resolved to ids here;
/// a text error becomes the item's error (its ack: invalid), named by `field`.
PushItem ConvertRolloutGroup(const v1::RolloutGroup& g, int index, const std::string& session,
                             const InputLimits& limits, const std::string& field);

/// CreateSession over the server's defaults (its trainer and rollouts config): unset fields
/// keep them. InvalidArgument naming a bad field.
SessionRequest ConvertCreateSession(const v1::CreateSessionRequest& r, const ServerConfig& defaults);
void ToProto(const SessionReport& s, v1::SessionInfo* out);
void ToProto(const SnapshotReport& s, v1::SnapshotInfo* out);  // convert_sessions.cpp

void ToProto(const StepStats& s, v1::StepStats* out);
void ToProto(const StepStats& s, v1::ForwardBackwardResponse* out);
void ToProto(const OptimStats& o, v1::OptimStepResponse* out);
void ToProto(const HostInfo& i, v1::GetInfoResponse* out);
void ToProto(const EstimateReply& e, v1::EstimateMemoryResponse* out);
void ToProto(const LogprobsReply& r, v1::ComputeLogprobsResponse* out);
void ToProto(const SampleReply& r, v1::SampleResponse* out);
void ToProto(const RolloutAck& a, v1::RolloutAck* out);
void ToProto(const RolloutStats& s, v1::RolloutStats* out);
void ToProto(const HistoryRecord& r, v1::HistoryRecord* out);  // convert_history.cpp
void ToProto(const HistoryReply& h, v1::GetHistoryResponse* out);
void ToProto(const PolicyUpdate& u, v1::PolicyUpdate* out);

}  // namespace streambp::server
