#pragma once
/// Sampling completions from a causal LM with a KV cache (the RL loop's rollouts;
/// docs/architecture.md: API semantics). Prompts are prefilled once (left-padded, batched)
/// and their caches repeated for the n completions of each; each new token is one batched
/// decode step. A sliding-window layer sees only its window, in the prefill and in every
/// step, and caches only that.
#include <cstdint>
#include <string>
#include <vector>

#include "streambp/model.h"

namespace streambp {

struct SampleOptions {
  int64_t n = 1;                     ///< completions per prompt
  double temperature = 1.0;          ///< logits / temperature; 0 = greedy
  double top_p = 1.0;                ///< nucleus: smallest set of tokens with mass >= top_p
  int64_t max_tokens = 16;           ///< new tokens per completion
  std::vector<int64_t> stop_tokens;  ///< a completion ends after producing one of these
  uint64_t seed = 0;                 ///< the same seed, model and prompts give the same samples
  /// Mixture of experts: record the experts the routers chose for every token the sampler
  /// fed through the model (SampledCompletion::routed_experts), for routing replay.
  bool record_routing = false;
};

struct SampledCompletion {
  int64_t prompt_index = 0;
  std::vector<int64_t> tokens;
  /// log p(token) under log_softmax(logits / temperature) (before top-p truncation;
  /// temperature 1 when greedy): what TokenLogprobs gives at that temperature.
  std::vector<double> logprobs;
  std::string finish_reason;  ///< "stop" | "length"
  /// With SampleOptions::record_routing on a mixture-of-experts model: the experts each token
  /// of prompt + completion was routed to, in Sequence::routed_experts' layout (token major,
  /// then sparse layer, then the k slots), as the prefill and the decode steps chose them. The
  /// last completion token is never fed to the model: its entries are -1 (the router's choice).
  std::vector<int32_t> routed_experts;
};

/// Throws InvalidArgument for an empty prompt list, an empty prompt, a token outside the
/// vocabulary, n < 1, max_tokens < 1, temperature < 0 or top_p outside (0, 1].
std::vector<SampledCompletion> SampleCompletions(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                                 const SampleOptions& options);

/// The same generation in slices, so that a server can give the device to other work
/// between them: step() runs the prefill on its first call and then up to `decode_steps`
/// tokens per call. The model must be in the same state (weights, attached adapter) at
/// every call. The result equals SampleCompletions' for the same arguments.
class SampleRun {
 public:
  /// Validates as SampleCompletions does (InvalidArgument); computes nothing yet.
  SampleRun(CausalLM model, std::vector<std::vector<int64_t>> prompts, SampleOptions options);
  ~SampleRun();
  SampleRun(const SampleRun&) = delete;
  SampleRun& operator=(const SampleRun&) = delete;
  /// Advances; true once every completion has finished.
  bool step(int64_t decode_steps);
  bool done() const;
  /// The completions (prompt by prompt, n each); call once done().
  std::vector<SampledCompletion> take();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace streambp
