#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "streambp/error.h"
#include "streambp/objective.h"
#include "common.h"

namespace streambp {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, ObjectiveFactory>& Registry() {
  static std::map<std::string, ObjectiveFactory> r;
  return r;
}

std::unique_ptr<Objective> CreateSft(const nlohmann::json& options) {
  objectives::OptionReader r("sft", options);
  SftOptions o;
  o.normalizer = r.number("normalizer", o.normalizer);
  r.done();
  if (o.normalizer < 0) throw InvalidArgument("sft: normalizer must be >= 0");
  return MakeSftObjective(o);
}

std::unique_ptr<Objective> CreateDpo(const nlohmann::json& options) {
  objectives::OptionReader r("dpo", options);
  DpoOptions o;
  o.beta = r.number("beta", o.beta);
  o.loss_type = r.choice("loss_type", o.loss_type, {"sigmoid", "ipo", "hinge", "robust"});
  o.label_smoothing = r.number("label_smoothing", o.label_smoothing);
  o.normalizer = r.number("normalizer", o.normalizer);
  r.done();
  return MakeDpoObjective(o);
}

std::unique_ptr<Objective> CreateGrpo(const nlohmann::json& options) {
  objectives::OptionReader r("grpo", options);
  GrpoOptions o;
  o.beta = r.number("beta", o.beta);
  o.epsilon_low = r.number("epsilon_low", o.epsilon_low);
  o.epsilon_high = r.number("epsilon_high", o.epsilon_high);
  o.loss_type = r.choice("loss_type", o.loss_type, {"grpo", "bnpo", "dr_grpo", "dapo"});
  o.scale_rewards = r.choice("scale_rewards", o.scale_rewards, {"group", "batch", "none"});
  o.importance_sampling_level =
      r.choice("importance_sampling_level", o.importance_sampling_level, {"token", "sequence"});
  o.temperature = r.number("temperature", o.temperature);
  o.old_logprobs = r.choice("old_logprobs", o.old_logprobs, {"current", "sampler"});
  o.tis_cap = r.number("tis_cap", o.tis_cap);
  o.max_completion_length = r.number("max_completion_length", o.max_completion_length);
  o.normalizer = r.number("normalizer", o.normalizer);
  o.entropy = r.boolean("entropy", o.entropy);
  r.done();
  return MakeGrpoObjective(o);
}

}  // namespace

void RegisterObjective(const std::string& name, ObjectiveFactory factory) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[name] = factory;
}

void RegisterBuiltinObjectives() {
  RegisterObjective("sft", &CreateSft);
  RegisterObjective("dpo", &CreateDpo);
  RegisterObjective("grpo", &CreateGrpo);
}

std::vector<std::string> ObjectiveNames() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  for (const auto& [name, f] : Registry()) names.push_back(name);
  return names;
}

std::unique_ptr<Objective> CreateObjective(const std::string& name, const nlohmann::json& options) {
  ObjectiveFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) factory = it->second;
  }
  if (factory == nullptr) {
    std::string known;
    for (const auto& n : ObjectiveNames()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("unknown objective '" + name + "' (known: " + known + ")");
  }
  return factory(options);
}

}  // namespace streambp
