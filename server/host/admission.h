#pragma once
// Admission (docs/architecture.md: Errors, admission and durability): every request's cost is bounded before it is queued. Chunk sizes
// have floors; a step's, a Sample's and a ComputeLogprobs' peak memory is estimated with
// the same analytic model (streambp/estimate.h) and refused when it does not fit the
// budget; Sample is bounded in rows, sampled tokens and K/V-cache bytes. Refusals name the
// limit and say what to change. Stateless after construction; thread-safe.
#include <cstdint>
#include <string>

#include <torch/types.h>

#include "config.h"
#include "streambp/trainer.h"
#include "types.h"

namespace streambp::server {

class Admission {
 public:
  Admission(const ServerConfig& config, const ModelConfig& model, torch::Dtype dtype);

  /// The engine options of a request over the server's defaults. InvalidArgument for an
  /// unknown engine, a negative size, or a size below the configured floor.
  EngineOptions resolve_engine(const EngineRequest& request) const;

  /// The step's plan (the sequences validated and split into micro-batches, once: the step
  /// runs with it), automatic chunks (when configured and the request set none:
  /// `chunks_given` false) and the budget check of a training step of `sequences` with
  /// `engine` (resolved). InvalidArgument for bad sequences; ResourceExhausted (nothing
  /// runs) when the estimate exceeds the budget.
  /// `lora`: the session's adapter (the base frozen), or null; `resident_bytes`: what the
  /// other resident sessions hold (their adapters and optimizer states), counted too, as is
  /// a reference model's copy of the weights (every budget check counts it).
  StepPlan admit_step(const std::vector<Sequence>& sequences, bool chunks_given, EngineOptions* engine,
                      const LoraConfig* lora = nullptr, int64_t resident_bytes = 0) const;
  /// Rows, sampled tokens, K/V-cache bytes and the budget of a Sample.
  void admit_sample(const SampleRequest& request, int64_t resident_bytes = 0) const;
  /// The budget of a ComputeLogprobs.
  void admit_logprobs(const LogprobsRequest& request, int64_t resident_bytes = 0) const;
  /// The budget of a forward pass over `sequences` packed (a ComputeLogprobs, or the pass
  /// that gives a ForwardBackward's return_logprobs before its step): ResourceExhausted
  /// naming `what` when it does not fit.
  void admit_forward(const std::vector<Sequence>& sequences, const std::string& what, const std::string& advice,
                     int64_t resident_bytes = 0) const;
  /// The base model's weights (what one copy of them takes on the device).
  int64_t weights_bytes() const { return weights_bytes_; }
  /// EstimateMemory: InvalidArgument for lengths or rows the server would refuse anyway.
  EstimateReply estimate(int64_t rows, int64_t seq_len, const EngineRequest& engine,
                         const LoraConfig* lora = nullptr, int64_t resident_bytes = 0) const;

  /// Called when a refusal happens (metrics): reason "estimate".
  std::function<void(const std::string& reason)> on_refusal;

 private:
  int64_t rows_of(int64_t longest, int64_t tokens) const;
  void check_budget(const MemoryEstimate& estimate, int64_t resident_bytes, const std::string& what,
                    const std::string& advice) const;

  const ServerConfig& config_;
  TrainerOptions plan_options_;  // what the replica's trainers split and validate with
  ModelConfig model_;
  torch::Dtype dtype_;
  /// The frozen reference model's weights when the trainer holds a copy (a server without
  /// sessions and trainer.reference.use_reference_model): resident for every request.
  int64_t reference_bytes_ = 0;
  int64_t weights_bytes_ = 0;
};

}  // namespace streambp::server
