#include "types.h"

#include "streambp/error.h"

namespace streambp::server {

nlohmann::json SessionSpec::ToJson() const {
  return {{"name", name},           {"full", full},
          {"lora", lora.ToJson()},  {"trainer", trainer.ToJson()},
          {"groups_per_step", groups_per_step}, {"max_staleness", max_staleness},
          {"grpo", grpo}};
}

SessionSpec SessionSpec::FromJson(const nlohmann::json& j) {
  SessionSpec s;
  try {
    s.name = j.at("name").get<std::string>();
    s.full = j.at("full").get<bool>();
    s.lora = LoraConfig::FromJson(j.at("lora"));
    s.trainer = TrainerOptions::FromJson(j.at("trainer"));
    s.groups_per_step = j.at("groups_per_step").get<int64_t>();
    s.max_staleness = j.at("max_staleness").get<int64_t>();
    s.grpo = j.at("grpo");
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("session spec: ") + e.what());
  }
  return s;
}

}  // namespace streambp::server
