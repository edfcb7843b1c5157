#include "weights_snapshot.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/digest.h"
#include "streambp/safetensors.h"

namespace streambp::server {

WeightsSnapshot MakeWeightsSnapshot(const CausalLM& model, int64_t policy_version, bool merged) {
  WeightsSnapshot s;
  s.bytes = SerializeSafetensors(merged ? model->merged_hf_tensors() : model->hf_tensors(), {{"format", "pt"}});
  s.sha256 = Sha256Hex(s.bytes);
  auto config = model->config();
  config.torch_dtype = DtypeName(model->named_hf_parameters().front().second.scalar_type());
  s.config_json = config.ToJson().dump(2);
  s.policy_version = policy_version;
  return s;
}

WeightsSnapshot MakeAdapterSnapshot(const LoraAdapter& adapter, int64_t policy_version) {
  WeightsSnapshot s;
  s.format = "peft_adapter";
  s.bytes = SerializeSafetensors(adapter.peft_tensors(), {{"format", "pt"}});
  s.sha256 = Sha256Hex(s.bytes);
  s.config_json = adapter.config().ToPeftJson().dump(2);
  s.policy_version = policy_version;
  return s;
}

}  // namespace streambp::server
