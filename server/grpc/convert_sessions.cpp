// Sessions on the wire: CreateSessionRequest -> SessionRequest (the server's defaults filled in,
// the adapter's PEFT files checked), SessionReport -> SessionInfo.
#include <cmath>

#include "convert.h"
#include "streambp/error.h"

namespace streambp::server {

SessionRequest ConvertCreateSession(const v1::CreateSessionRequest& r, const ServerConfig& defaults) {
  SessionRequest out;
  auto& spec = out.spec;
  spec.name = r.name();
  switch (r.kind_case()) {
    case v1::CreateSessionRequest::kLora: {
      const auto& l = r.lora();
      if (l.r() < 1) throw InvalidArgument("lora.r must be >= 1");
      spec.lora.r = l.r();
      spec.lora.alpha = l.has_alpha() ? l.alpha() : 2.0 * l.r();
      if (!l.target_modules().empty()) spec.lora.target_modules.assign(l.target_modules().begin(), l.target_modules().end());
      spec.lora.modules_to_save.assign(l.modules_to_save().begin(), l.modules_to_save().end());
      spec.lora.use_rslora = l.use_rslora();
      spec.lora.seed = l.seed();
      break;
    }
    case v1::CreateSessionRequest::kAdapter:
      if (r.adapter().adapter_config_json().empty() || r.adapter().adapter_model_safetensors().empty()) {
        throw InvalidArgument("adapter: give adapter_config_json and adapter_model_safetensors");
      }
      try {
        const auto parsed = nlohmann::json::parse(r.adapter().adapter_config_json());
        if (!parsed.is_object()) throw InvalidArgument("adapter.adapter_config_json must be a JSON object");
      } catch (const nlohmann::json::exception& e) {
        throw InvalidArgument(std::string("adapter.adapter_config_json is not valid JSON: ") + e.what());
      }
      out.adapter_config_json = r.adapter().adapter_config_json();
      out.adapter_safetensors = r.adapter().adapter_model_safetensors();
      break;
    case v1::CreateSessionRequest::kFull:
      if (!r.full()) throw InvalidArgument("full must be true when set");
      spec.full = true;
      break;
    default:
      throw InvalidArgument("give lora (a new adapter), adapter (an uploaded PEFT adapter) or full");
  }
  auto& t = spec.trainer;
  t = defaults.trainer;
  const auto& tc = r.training();
  const auto& o = tc.optimizer();
  if (!o.name().empty()) t.optimizer.name = o.name();
  if (o.has_lr()) t.optimizer.lr = o.lr();
  if (o.has_beta1()) t.optimizer.betas[0] = o.beta1();
  if (o.has_beta2()) t.optimizer.betas[1] = o.beta2();
  if (o.has_eps()) t.optimizer.eps = o.eps();
  if (o.has_weight_decay()) t.optimizer.weight_decay = o.weight_decay();
  if (o.has_momentum()) t.optimizer.momentum = o.momentum();
  const auto& sc = tc.schedule();
  if (!sc.type().empty()) t.schedule.type = sc.type();
  if (sc.warmup_steps() != 0) t.schedule.warmup_steps = sc.warmup_steps();
  if (sc.total_steps() != 0) t.schedule.total_steps = sc.total_steps();
  if (sc.has_min_lr_ratio()) t.schedule.min_lr_ratio = sc.min_lr_ratio();
  if (tc.has_max_grad_norm()) t.max_grad_norm = tc.max_grad_norm();
  if (tc.seed() != 0) t.seed = tc.seed();
  try {
    t.Validate();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("training: ") + e.what());
  }
  const auto& rc = r.rollouts();
  spec.groups_per_step = rc.has_groups_per_step() ? rc.groups_per_step() : defaults.rollouts.groups_per_step;
  spec.max_staleness = rc.has_max_staleness() ? rc.max_staleness() : defaults.rollouts.max_staleness;
  spec.grpo = defaults.rollouts.grpo;
  const auto grpo = OptionsToJson(rc.grpo());
  for (auto it = grpo.begin(); it != grpo.end(); ++it) spec.grpo[it.key()] = it.value();
  return out;
}

void ToProto(const SessionReport& s, v1::SessionInfo* out) {
  out->set_name(s.spec.name);
  out->set_kind(s.spec.full ? "full" : "lora");
  if (!s.spec.full) {
    auto* l = out->mutable_lora();
    l->set_r(static_cast<int32_t>(s.spec.lora.r));
    l->set_alpha(s.spec.lora.alpha);
    for (const auto& m : s.spec.lora.target_modules) l->add_target_modules(m);
    for (const auto& m : s.spec.lora.modules_to_save) l->add_modules_to_save(m);
    l->set_use_rslora(s.spec.lora.use_rslora);
    l->set_seed(s.spec.lora.seed);
  }
  out->set_step(s.step);
  out->set_policy_version(s.policy_version);
  out->set_resident(s.resident);
  out->set_trainable_parameters(s.trainable_parameters);
  out->set_device_bytes(s.device_bytes);
  out->set_idle_seconds(s.idle_seconds);
  out->set_pending_micro_batches(s.pending_micro_batches);
  out->set_optimizer(s.spec.trainer.optimizer.name);
  out->set_learning_rate(s.spec.trainer.optimizer.lr);
  out->set_groups_per_step(s.spec.groups_per_step);
  out->set_max_staleness(s.spec.max_staleness);
}

void ToProto(const SnapshotReport& s, v1::SnapshotInfo* out) {
  out->set_session(s.session);
  out->set_name(s.name);
  out->set_step(s.step);
  out->set_policy_version(s.policy_version);
  out->set_bytes(s.bytes);
  out->set_created_unix(s.created_unix);
  out->set_expires_unix(s.expires_unix);
  out->set_resident(s.resident);
}

}  // namespace streambp::server
