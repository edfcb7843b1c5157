#pragma once
// One serialized version of the weights for ExportWeights.
#include "streambp/lora.h"
#include "streambp/model.h"
#include "types.h"

namespace streambp::server {

/// The model's weights as one safetensors file (HF names), its SHA-256 and config.json
/// (torch_dtype = the weights' dtype). `merged`: the attached adapter folded in.
WeightsSnapshot MakeWeightsSnapshot(const CausalLM& model, int64_t policy_version, bool merged = false);

/// A PEFT adapter as adapter_model.safetensors + adapter_config.json.
WeightsSnapshot MakeAdapterSnapshot(const LoraAdapter& adapter, int64_t policy_version);

}  // namespace streambp::server
