#pragma once
// Internal to the gRPC edge's conversions (convert.cpp, convert_data.cpp): the per-request
// converter that validates ids and counts a request's tokens against its limits, and the
// conversion of a data batch (Tinker's Datums).
#include <cstdint>
#include <string>
#include <vector>

#include "streambp/batch.h"
#include "streambp/error.h"
#include "streambp/v1/trainer.pb.h"
#include "config.h"
#include "types.h"

namespace streambp::server {

inline std::string Index(const std::string& base, int i) { return base + "[" + std::to_string(i) + "]"; }

class Converter {
 public:
  explicit Converter(const InputLimits& limits) : limits_(limits) {}

  std::vector<int64_t> Tokens(const google::protobuf::RepeatedField<int32_t>& ids, const std::string& field) {
    std::vector<int64_t> out(ids.begin(), ids.end());
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] < 0 || out[i] >= limits_.vocab_size) {
        throw InvalidArgument(field + "[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
                              " is outside the vocabulary [0, " + std::to_string(limits_.vocab_size) + ")");
      }
    }
    return out;
  }

  void Count(const Sequence& s, const std::string& field) {
    const int64_t n = s.tokens.size();
    if (n == 0) throw InvalidArgument(field + ": the sequence is empty");
    if (n > limits_.max_sequence_length) {
      throw InvalidArgument(field + ": " + std::to_string(n) + " tokens exceed the maximum sequence length " +
                            std::to_string(limits_.max_sequence_length));
    }
    tokens_ += n;
    if (tokens_ + candidates_ > limits_.max_tokens_per_request) {
      throw ResourceExhausted("the request has more than " + std::to_string(limits_.max_tokens_per_request) +
                              " tokens (limits.max_tokens_per_request); split it into several calls (steps: with a "
                              "step-wide normalizer)");
    }
  }

  static Sequence PromptCompletion(std::vector<int64_t> prompt, const std::vector<int64_t>& completion) {
    Sequence s;
    s.loss_mask.assign(prompt.size(), 0);
    s.tokens = std::move(prompt);
    s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
    s.loss_mask.resize(s.tokens.size(), 1);
    return s;
  }

  int64_t tokens() const { return tokens_; }
  /// Charges `entries` more against limits.max_tokens_per_request (2-D targets' candidates).
  void Charge(int64_t entries, const std::string& field) {
    candidates_ += entries;
    if (tokens_ + candidates_ > limits_.max_tokens_per_request) {
      throw ResourceExhausted(field + ": the request has more than " + std::to_string(limits_.max_tokens_per_request) +
                              " tokens and top-k candidates (limits.max_tokens_per_request); split it into several "
                              "calls or give fewer candidates");
    }
  }
  int64_t vocab_size() const { return limits_.vocab_size; }

 private:
  const InputLimits& limits_;
  int64_t tokens_ = 0;
  int64_t candidates_ = 0;  // 2-D targets' candidates, charged as tokens
};

/// A data batch (docs/api.md: Datum): every datum checked against the inputs `objective`
/// declares and appended to in->sequences (text already resolved to ids).
void ConvertData(const v1::DatumBatch& batch, const std::string& objective, Converter& c, StepRequest* in);

}  // namespace streambp::server
