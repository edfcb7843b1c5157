#pragma once
// One engine step of an objective on a model, for tests that compare two ways of running the
// same step (offloaded inputs, kept attention outputs): the result and every gradient.
#include <string>
#include <vector>

#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/gradients.h"
#include "streambp/model.h"

namespace streambp::testing {

struct StepOutput {
  StepResult result;
  TensorMap grads;
};

/// ForwardBackward of `objective` (a built-in, default options) from zero gradients; the
/// gradients are collected and the model's cleared again.
StepOutput RunObjectiveStep(CausalLM& model, const Batch& batch, const std::string& objective,
                            const EngineOptions& options);

/// The tracking allocator's peak above what was live before an SFT step (from zero gradients,
/// cleared again after it); memory::InstallTrackingAllocator() must have run.
int64_t TrackedSftPeak(CausalLM& model, const Batch& batch, const EngineOptions& options);

/// The same for a built-in objective (default options) by name.
int64_t TrackedObjectivePeak(CausalLM& model, const Batch& batch, const std::string& objective,
                             const EngineOptions& options);

/// Four sequences (13, 9, 11, 6 tokens) shaped for `objective`: sft as they are, dpo as two
/// pairs with reference log-probabilities, grpo as one group with rewards.
std::vector<Sequence> ObjectiveSequences(const std::string& objective, int64_t vocab);

}  // namespace streambp::testing
