#pragma once
// Text at the edge (docs/architecture.md: Models "Text"): the text forms of a request (strings, chat messages)
// become ids with the model's tokenizer and chat format before the ids are validated as
// always. One function per request type; Tokenize(batch) shows a client exactly what a step
// would train on, because it is the same function.
#include <cstdint>
#include <string>

#include <google/protobuf/message.h>

#include "streambp/v1/trainer.pb.h"
#include "types.h"

namespace streambp::server {

/// What one chat message costs beyond its bytes when a request's text is counted.
constexpr int64_t kMessageCharge = 64;
/// Memory the text work of a request may hold at its peak per unit of its charge (the ids
/// and offsets of its tokens, the merge state of its longest word, its rendering).
constexpr int64_t kTextWorkBytesPerCharge = 48;

/// The text a request carries, counted over the whole request before any of it is processed:
/// the bytes of its strings (text, message roles and contents) plus kMessageCharge per chat
/// message, so that many tiny messages cost what their rendering costs. ResourceExhausted over
/// limits.max_text_bytes (counting stops there). 0: the request has no text.
int64_t ChargeText(const google::protobuf::Message& request, const InputLimits& limits);
/// Detokenize's charge: the bytes the decoded texts can have at most (every token's bytes),
/// counted before anything is decoded. ResourceExhausted over limits.max_text_bytes;
/// InvalidArgument for an id outside the vocabulary; FailedPrecondition without a tokenizer.
int64_t ChargeDetokenize(const v1::DetokenizeRequest& r, const InputLimits& limits);

/// Whether a batch / request carries any text form.
bool HasText(const v1::Batch& batch);
bool HasText(const v1::SampleRequest& r);
bool HasText(const v1::RolloutGroup& g);

/// Replaces every text form by ids (and loss masks), in place:
///   SFT   text -> tokens (+ eos), loss on all; messages -> tokens + loss_mask (assistant turns);
///         prompt_text + completion_text -> prompt + completion (strings: + eos), or tokens +
///         loss_mask (conversations: the completion's assistant turns)
///   DPO   prompt_text / chosen_text / rejected_text -> prompt / chosen / rejected
///   GRPO  prompt_text -> prompt; completions[].text -> tokens
///   data  model_input.text -> tokens (all but the tokenization's last), target_tokens (the
///         rest, unless given), loss_mask (a conversation's trained assistant turns)
/// InvalidArgument naming the field (two forms at once, invalid UTF-8, a bad role, empty
/// messages, no assistant turn to train on); ResourceExhausted over limits.max_text_bytes;
/// FailedPrecondition when the model has no tokenizer.
void ResolveText(v1::Batch* batch, const InputLimits& limits);
/// text_prompts -> prompts (messages end with the generation prompt).
void ResolveText(v1::SampleRequest* r, const InputLimits& limits);
/// prompt_text -> prompt, completions[].text -> tokens; `field` names the group.
void ResolveText(v1::RolloutGroup* g, const InputLimits& limits, const std::string& field);

v1::TokenizeResponse Tokenize(const v1::TokenizeRequest& r, const InputLimits& limits);
v1::DetokenizeResponse Detokenize(const v1::DetokenizeRequest& r, const InputLimits& limits);

}  // namespace streambp::server
