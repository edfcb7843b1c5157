#pragma once
// A pushed rollout group as training sequences, validated field by field (the messages name
// the field, e.g. "groups[3].completions[1].reward is not finite").
#include <string>
#include <vector>

#include "streambp/batch.h"
#include "types.h"

namespace streambp::server {

/// One sequence per completion (prompt + completion, loss on the completion), group id
/// `group`, reward and per-token sampler log-probs / advantages aligned with the tokens.
/// InvalidArgument naming `field` for: an empty prompt or completion list, a token outside
/// the vocabulary, a sequence over the maximum length, a non-finite reward, log-probs or
/// advantages of the wrong length, non-finite, or (log-probs) positive.
std::vector<Sequence> RolloutSequences(const RolloutGroup& group, int64_t group_index, const InputLimits& limits,
                                       const std::string& field);

/// Routing replay given for a sequence of `tokens` tokens (Sequence::routed_experts' layout):
/// InvalidArgument naming `field` unless the model has mixture-of-experts layers, there are
/// tokens x sparse layers x k ids, each in [-1, num_experts), a (token, layer)'s k ids all
/// given or all -1, and none repeated within them.
void CheckRoutedExperts(const std::vector<int32_t>& ids, size_t tokens, const InputLimits& limits,
                        const std::string& field);

}  // namespace streambp::server
