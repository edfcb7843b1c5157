#pragma once
// 2-D targets for cross_entropy (a teacher's top-k, distillation) on test sequences.
#include <cmath>
#include <vector>

#include "streambp/batch.h"

namespace streambp::testing {

/// Gives every other sequence (starting with the first) k candidates per token after the
/// first, distinct ids spread over the vocabulary (the next token itself among them at some
/// positions), with weights of both signs; the others keep whatever 1-D inputs they have.
inline void AddTopK(std::vector<Sequence>& sequences, int64_t vocab, int64_t k) {
  for (size_t i = 0; i < sequences.size(); i += 2) {
    auto& s = sequences[i];
    const size_t n = s.tokens.size();
    s.top_k = k;
    s.top_k_targets.assign(n * k, 0);
    s.top_k_weights.assign(n * k, 0.0);
    s.token_weights.clear();
    for (size_t t = 1; t < n; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t e = t * k + j;
        s.top_k_targets[e] = j == 0 && t % 2 == 0 ? s.tokens[t] : (s.tokens[t] + 7 * (j + 1) + 3 * i) % vocab;
        s.top_k_weights[e] = 0.6 * std::sin(1.3 * static_cast<double>(e) + static_cast<double>(i)) + (j == 0 ? 0.5 : 0.0);
      }
    }
  }
}

}  // namespace streambp::testing
