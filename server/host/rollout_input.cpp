#include "rollout_input.h"

#include <cmath>

#include "streambp/error.h"

namespace streambp::server {
namespace {

void CheckTokens(const std::vector<int64_t>& tokens, const InputLimits& limits, const std::string& field) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= limits.vocab_size) {
      throw InvalidArgument(field + "[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                            " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
    }
  }
}

std::vector<double> Aligned(const std::vector<double>& values, size_t prompt_len, size_t completion_len,
                            const std::string& field, bool logprobs) {
  if (values.empty()) return {};
  if (values.size() != completion_len) {
    throw InvalidArgument(field + " has " + std::to_string(values.size()) + " entries but the completion has " +
                          std::to_string(completion_len) + " tokens");
  }
  std::vector<double> out(prompt_len, 0.0);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) throw InvalidArgument(field + "[" + std::to_string(i) + "] is not finite");
    if (logprobs && values[i] > 0) {
      throw InvalidArgument(field + "[" + std::to_string(i) + "] = " + std::to_string(values[i]) +
                            " is positive: a log-probability is <= 0");
    }
    out.push_back(values[i]);
  }
  return out;
}

}  // namespace

std::vector<Sequence> RolloutSequences(const RolloutGroup& group, int64_t group_index, const InputLimits& limits,
                                       const std::string& field) {
  if (group.prompt.empty()) throw InvalidArgument(field + ".prompt is empty");
  if (group.completions.empty()) throw InvalidArgument(field + ".completions is empty");
  CheckTokens(group.prompt, limits, field + ".prompt");
  std::vector<Sequence> out;
  int64_t tokens = 0;
  for (size_t k = 0; k < group.completions.size(); ++k) {
    const auto& c = group.completions[k];
    const std::string fc = field + ".completions[" + std::to_string(k) + "]";
    if (c.tokens.empty()) throw InvalidArgument(fc + ".tokens is empty");
    CheckTokens(c.tokens, limits, fc + ".tokens");
    if (!std::isfinite(c.reward)) throw InvalidArgument(fc + ".reward is not finite");
    Sequence s;
    s.tokens = group.prompt;
    s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n > limits.max_sequence_length) {
      throw InvalidArgument(fc + ": prompt + completion = " + std::to_string(n) +
                            " tokens exceed the maximum sequence length " + std::to_string(limits.max_sequence_length));
    }
    tokens += n;
    if (tokens > limits.max_tokens_per_request) {
      throw ResourceExhausted(field + " has more than " + std::to_string(limits.max_tokens_per_request) +
                              " tokens (limits.max_tokens_per_request)");
    }
    s.loss_mask.assign(group.prompt.size(), 0);
    s.loss_mask.resize(s.tokens.size(), 1);
    s.group = group_index;
    s.reward = c.reward;
    s.sampler_logprobs = Aligned(c.logprobs, group.prompt.size(), c.tokens.size(), fc + ".logprobs", true);
    s.advantages = Aligned(c.advantages, group.prompt.size(), c.tokens.size(), fc + ".advantages", false);
    if (!c.routed_experts.empty()) {
      CheckRoutedExperts(c.routed_experts, s.tokens.size(), limits, fc + ".routed_experts");
      s.routed_experts = c.routed_experts;
    }
    out.push_back(std::move(s));
  }
  return out;
}

void CheckRoutedExperts(const std::vector<int32_t>& ids, size_t tokens, const InputLimits& limits,
                        const std::string& field) {
  if (limits.sparse_layers == 0) {
    throw InvalidArgument(field + " is given, but this model has no mixture-of-experts layers to route");
  }
  const size_t k = static_cast<size_t>(limits.experts_per_token), per_token = limits.sparse_layers * k;
  if (ids.size() != tokens * per_token) {
    throw InvalidArgument(field + " has " + std::to_string(ids.size()) + " ids; the sequence's " +
                          std::to_string(tokens) + " tokens (prompt + completion) x " +
                          std::to_string(limits.sparse_layers) + " sparse layers x " + std::to_string(k) +
                          " experts per token need " + std::to_string(tokens * per_token));
  }
  for (size_t at = 0; at < ids.size(); at += k) {
    const std::string where = field + " (token " + std::to_string(at / per_token) + ", sparse layer " +
                              std::to_string(at % per_token / k) + ")";
    int given = 0;
    for (size_t i = at; i < at + k; ++i) {
      if (ids[i] < -1 || ids[i] >= limits.num_experts) {
        throw InvalidArgument(where + ": expert id " + std::to_string(ids[i]) + " is outside [0, " +
                              std::to_string(limits.num_experts) + ")");
      }
      given += ids[i] >= 0 ? 1 : 0;
      for (size_t j = at; j < i; ++j) {
        if (ids[i] >= 0 && ids[j] == ids[i]) {
          throw InvalidArgument(where + ": expert " + std::to_string(ids[i]) + " is named twice in one top-" +
                                std::to_string(k));
        }
      }
    }
    if (given != 0 && given != static_cast<int>(k)) {
      throw InvalidArgument(where + ": the " + std::to_string(k) +
                            " ids are either all given or all -1 (the router's choice)");
    }
  }
}

}  // namespace streambp::server
