#pragma once
// Fixtures for Trainer tests: exact-accumulation checks that any objective can reuse.
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "streambp/batch.h"
#include "streambp/objective.h"
#include "streambp/safetensors.h"
#include "streambp/trainer.h"

namespace streambp::testing {

/// Splits `sequences` into `parts` consecutive parts of about equal size, never splitting
/// a group (consecutive sequences with the same group id >= 0 stay together).
std::vector<std::vector<Sequence>> SplitIntoParts(const std::vector<Sequence>& sequences, size_t parts);

/// The gradients after one forward_backward per part (starting from no pending gradients),
/// each with a fresh objective from `make_objective`; the pending gradients are cleared
/// again afterwards. `loss`, when given, receives the summed loss.
TensorMap AccumulatedGradients(Trainer& trainer, const std::vector<std::vector<Sequence>>& parts,
                               const std::function<std::unique_ptr<Objective>()>& make_objective,
                               double* loss = nullptr);

/// Trainer options for exactness tests: float64-friendly engine chunks that do not divide
/// the lengths, SGD lr 1, no clipping, no reference model.
TrainerOptions ExactTrainerOptions();

}  // namespace streambp::testing
