// Trainer options: validation and JSON (every key optional, unknown keys refused).
#include <cmath>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "streambp/error.h"
#include "streambp/trainer.h"

namespace streambp {
namespace {

using nlohmann::json;

std::string Key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// Calls the handler of each key of `j`; a key without a handler is an error naming it.
void ForEachKey(const json& j, const std::string& prefix,
                const std::map<std::string, std::function<void(const json&, const std::string&)>>& handlers) {
  if (j.is_null()) return;
  if (!j.is_object()) {
    throw InvalidArgument(
        "trainer options: " + (prefix.empty() ? std::string("options") : "'" + prefix + "'") +
        " must be a JSON object");
  }
  for (const auto& [key, value] : j.items()) {
    auto it = handlers.find(key);
    if (it == handlers.end()) {
      std::string known;
      for (const auto& [k, h] : handlers) known += (known.empty() ? "" : ", ") + k;
      throw InvalidArgument("trainer options: unknown key '" + Key(prefix, key) + "' (known: " + known + ")");
    }
    it->second(value, Key(prefix, key));
  }
}

double Number(const json& v, const std::string& key) {
  if (!v.is_number()) throw InvalidArgument("trainer options: '" + key + "' must be a number");
  return v.get<double>();
}

int64_t Integer(const json& v, const std::string& key) {
  if (!v.is_number_integer()) throw InvalidArgument("trainer options: '" + key + "' must be an integer");
  return v.get<int64_t>();
}

bool Bool(const json& v, const std::string& key) {
  if (!v.is_boolean()) throw InvalidArgument("trainer options: '" + key + "' must be true or false");
  return v.get<bool>();
}

std::string String(const json& v, const std::string& key) {
  if (!v.is_string()) throw InvalidArgument("trainer options: '" + key + "' must be a string");
  return v.get<std::string>();
}

OptimizerOptions ReadOptimizer(const json& j, const std::string& prefix) {
  OptimizerOptions o;
  ForEachKey(j, prefix,
             {{"name", [&](const json& v, const std::string& k) { o.name = String(v, k); }},
              {"lr", [&](const json& v, const std::string& k) { o.lr = Number(v, k); }},
              {"betas",
               [&](const json& v, const std::string& k) {
                 if (!v.is_array() || v.size() != 2) {
                   throw InvalidArgument("trainer options: '" + k + "' must be an array of two numbers");
                 }
                 o.betas = {Number(v[0], k + "[0]"), Number(v[1], k + "[1]")};
               }},
              {"eps", [&](const json& v, const std::string& k) { o.eps = Number(v, k); }},
              {"weight_decay", [&](const json& v, const std::string& k) { o.weight_decay = Number(v, k); }},
              {"momentum", [&](const json& v, const std::string& k) { o.momentum = Number(v, k); }}});
  return o;
}

ScheduleOptions ReadSchedule(const json& j, const std::string& prefix) {
  ScheduleOptions o;
  ForEachKey(j, prefix,
             {{"type", [&](const json& v, const std::string& k) { o.type = String(v, k); }},
              {"warmup_steps", [&](const json& v, const std::string& k) { o.warmup_steps = Integer(v, k); }},
              {"total_steps", [&](const json& v, const std::string& k) { o.total_steps = Integer(v, k); }},
              {"min_lr_ratio", [&](const json& v, const std::string& k) { o.min_lr_ratio = Number(v, k); }}});
  return o;
}

ReferenceOptions ReadReference(const json& j, const std::string& prefix) {
  ReferenceOptions o;
  ForEachKey(j, prefix,
             {{"use_reference_model",
               [&](const json& v, const std::string& k) { o.use_reference_model = Bool(v, k); }},
              {"dir", [&](const json& v, const std::string& k) { o.dir = String(v, k); }}});
  return o;
}

EngineOptions ReadEngine(const json& j, const std::string& prefix) {
  EngineOptions o;
  ForEachKey(j, prefix,
             {{"kind", [&](const json& v, const std::string& k) { o.kind = ParseEngine(String(v, k)); }},
              {"chunk", [&](const json& v, const std::string& k) { o.chunk = Integer(v, k); }},
              {"logits_chunk", [&](const json& v, const std::string& k) { o.logits_chunk = Integer(v, k); }},
              {"key_chunk", [&](const json& v, const std::string& k) { o.key_chunk = Integer(v, k); }},
              {"recompute_kv_per_chunk",
               [&](const json& v, const std::string& k) { o.recompute_kv_per_chunk = Bool(v, k); }},
              {"tiled_attention", [&](const json& v, const std::string& k) { o.tiled_attention = Bool(v, k); }},
              {"offload_layer_inputs",
               [&](const json& v, const std::string& k) { o.offload_layer_inputs = Bool(v, k); }},
              {"scratch_dir", [&](const json& v, const std::string& k) { o.scratch_dir = String(v, k); }},
              {"keep_attention", [&](const json& v, const std::string& k) { o.keep_attention = Bool(v, k); }},
              {"router_aux_loss_coef",
               [&](const json& v, const std::string& k) { o.router_aux_loss_coef = Number(v, k); }}});
  return o;
}

}  // namespace

json AdamStepParams::ToJson() const {
  return {{"learning_rate", lr}, {"beta1", beta1},          {"beta2", beta2},
          {"eps", eps},          {"weight_decay", weight_decay}, {"grad_clip_norm", grad_clip_norm}};
}

AdamStepParams AdamStepParams::FromJson(const json& j) {
  if (!j.is_object()) throw InvalidArgument("adam_params must be a JSON object");
  AdamStepParams p;
  for (const auto& [key, value] : j.items()) {
    double* field = key == "learning_rate"    ? &p.lr
                    : key == "beta1"          ? &p.beta1
                    : key == "beta2"          ? &p.beta2
                    : key == "eps"            ? &p.eps
                    : key == "weight_decay"   ? &p.weight_decay
                    : key == "grad_clip_norm" ? &p.grad_clip_norm
                                              : nullptr;
    if (!field) throw InvalidArgument("adam_params: unknown field '" + key + "'");
    if (!value.is_number()) throw InvalidArgument("adam_params." + key + " must be a number");
    *field = value.get<double>();
  }
  p.Validate();
  return p;
}

OptimizerOptions OptimizerOptions::FromJson(const json& j) { return ReadOptimizer(j, "optimizer"); }

json OptimizerOptions::ToJson() const {
  return {{"name", name},
          {"lr", lr},
          {"betas", {betas[0], betas[1]}},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"momentum", momentum}};
}

ScheduleOptions ScheduleOptions::FromJson(const json& j) { return ReadSchedule(j, "schedule"); }

json ScheduleOptions::ToJson() const {
  return {{"type", type},
          {"warmup_steps", warmup_steps},
          {"total_steps", total_steps},
          {"min_lr_ratio", min_lr_ratio}};
}

ReferenceOptions ReferenceOptions::FromJson(const json& j) { return ReadReference(j, "reference"); }

json ReferenceOptions::ToJson() const { return {{"use_reference_model", use_reference_model}, {"dir", dir}}; }

EngineOptions EngineOptionsFromJson(const json& j) { return ReadEngine(j, "engine"); }

json EngineOptionsToJson(const EngineOptions& o) {
  return {{"kind", EngineName(o.kind)},
          {"chunk", o.chunk},
          {"logits_chunk", o.logits_chunk},
          {"key_chunk", o.key_chunk},
          {"recompute_kv_per_chunk", o.recompute_kv_per_chunk},
          {"tiled_attention", o.tiled_attention},
          {"offload_layer_inputs", o.offload_layer_inputs},
          {"scratch_dir", o.scratch_dir},
          {"keep_attention", o.keep_attention},
          {"router_aux_loss_coef", o.router_aux_loss_coef}};
}

void TrainerOptions::Validate() const {
  optimizer.Validate();
  schedule.Validate();
  if (!(std::isfinite(max_grad_norm) && max_grad_norm >= 0)) {
    throw InvalidArgument("max_grad_norm must be a finite number >= 0 (0 = no clipping)");
  }
  if (engine.chunk < 0) throw InvalidArgument("engine.chunk must be >= 0 (0 = default)");
  if (engine.logits_chunk < -1) throw InvalidArgument("engine.logits_chunk must be >= -1 (-1 = default)");
  if (engine.key_chunk < 0) throw InvalidArgument("engine.key_chunk must be >= 0 (0 = default)");
  if (!(engine.router_aux_loss_coef == -1 ||
        (std::isfinite(engine.router_aux_loss_coef) && engine.router_aux_loss_coef >= 0))) {
    throw InvalidArgument("engine.router_aux_loss_coef must be -1 (the model's) or a finite number >= 0");
  }
  if (engine.offload_layer_inputs && engine.kind != EngineKind::kStream) {
    throw InvalidArgument("engine.offload_layer_inputs needs engine.kind stream");
  }
  if (engine.keep_attention && engine.kind != EngineKind::kStream) {
    throw InvalidArgument("engine.keep_attention needs engine.kind stream");
  }
  if (engine.keep_attention && engine.offload_layer_inputs) {
    throw InvalidArgument(
        "engine.keep_attention and engine.offload_layer_inputs do not run together: keep_attention keeps every "
        "layer's attention output on the device; choose one");
  }
  if (micro_batch_tokens < 0) throw InvalidArgument("micro_batch_tokens must be >= 0 (0 = whole batch)");
  if (max_sequence_length < 0) throw InvalidArgument("max_sequence_length must be >= 0 (0 = no limit)");
  if (grad_bucket_bytes < 0) throw InvalidArgument("grad_bucket_bytes must be >= 0 (0 = default)");
}

TrainerOptions TrainerOptions::FromJson(const json& j) {
  TrainerOptions o;
  ForEachKey(j, "",
             {{"optimizer", [&](const json& v, const std::string& k) { o.optimizer = ReadOptimizer(v, k); }},
              {"schedule", [&](const json& v, const std::string& k) { o.schedule = ReadSchedule(v, k); }},
              {"max_grad_norm", [&](const json& v, const std::string& k) { o.max_grad_norm = Number(v, k); }},
              {"engine", [&](const json& v, const std::string& k) { o.engine = ReadEngine(v, k); }},
              {"layout", [&](const json& v, const std::string& k) { o.layout = ParseLayout(String(v, k)); }},
              {"micro_batch_tokens",
               [&](const json& v, const std::string& k) { o.micro_batch_tokens = Integer(v, k); }},
              {"max_sequence_length",
               [&](const json& v, const std::string& k) { o.max_sequence_length = Integer(v, k); }},
              {"reference", [&](const json& v, const std::string& k) { o.reference = ReadReference(v, k); }},
              {"overlap_grad_reduce",
               [&](const json& v, const std::string& k) { o.overlap_grad_reduce = Bool(v, k); }},
              {"grad_bucket_bytes", [&](const json& v, const std::string& k) { o.grad_bucket_bytes = Integer(v, k); }},
              {"seed", [&](const json& v, const std::string& k) {
                 if (!v.is_number_unsigned())
                   throw InvalidArgument("trainer options: '" + k + "' must be an integer >= 0");
                 o.seed = v.get<uint64_t>();
               }}});
  return o;
}

json TrainerOptions::ToJson() const {
  return {{"optimizer", optimizer.ToJson()},
          {"schedule", schedule.ToJson()},
          {"max_grad_norm", max_grad_norm},
          {"engine", EngineOptionsToJson(engine)},
          {"layout", LayoutName(layout)},
          {"micro_batch_tokens", micro_batch_tokens},
          {"max_sequence_length", max_sequence_length},
          {"reference", reference.ToJson()},
          {"overlap_grad_reduce", overlap_grad_reduce},
          {"grad_bucket_bytes", grad_bucket_bytes},
          {"seed", seed}};
}

}  // namespace streambp
