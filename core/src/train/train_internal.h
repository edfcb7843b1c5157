#pragma once
// Pieces of the Trainer shared by its step and its checkpoints (internal to streambp_core).
#include <string>

#include <torch/types.h>

#include "streambp/model.h"
#include "streambp/trainer.h"

namespace streambp::train {

/// The dtype of the model's parameters.
torch::Dtype ModelDtype(const CausalLMImpl& model);

/// No gradients ever: requires_grad off, .grad dropped.
void Freeze(CausalLMImpl& model);

/// A model of `config` in `dtype` on `device` holding `tensors` (HF names, validated).
CausalLM ModelFromTensors(const ModelConfig& config, const TensorMap& tensors, torch::Dtype dtype,
                          const torch::Device& device);

/// The frozen reference: a copy of `model`'s weights, or the model in options.dir.
CausalLM MakeReference(const CausalLMImpl& model, const ReferenceOptions& options);

}  // namespace streambp::train
