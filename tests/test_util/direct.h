#pragma once
// Direct computations for checking objectives: the whole model forward with autograd on
// fully materialized logits, and the loss written out by the test itself (no engine, no
// chunking, no objective code).
#include <functional>

#include <torch/torch.h>

#include "streambp/batch.h"
#include "streambp/model.h"
#include "streambp/safetensors.h"

namespace streambp::testing {

struct DirectResult {
  double loss = 0;
  TensorMap grads;  // by HF name
};

/// Runs the model over the batch with a graph, hands the logits [B, T, V] (upcast to at
/// least float32) to `loss_fn`, backprops its scalar, and returns loss and gradients.
/// The model's gradients are cleared before and after.
DirectResult DirectLossAndGrads(CausalLM& model, const Batch& batch,
                                const std::function<torch::Tensor(const torch::Tensor& logits)>& loss_fn);

/// log p(target) at every position [B, T] from full logits (log_softmax + gather).
torch::Tensor DirectTokenLogprobs(const torch::Tensor& logits, const Batch& batch, double temperature = 1.0);

/// Mask [B, T] (float) of the target positions of sequence i.
torch::Tensor SequenceTargetMask(const Batch& batch, int64_t i);

}  // namespace streambp::testing
