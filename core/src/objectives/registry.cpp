#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "streambp/error.h"
#include "streambp/objective.h"

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
  SftOptions o;
  if (!options.is_null() && !options.is_object()) {
    throw InvalidArgument("sft options must be a JSON object");
  }
  for (const auto& [key, value] : options.items()) {
    if (key == "normalizer") {
      if (!value.is_number() || value.get<double>() < 0) {
        throw InvalidArgument("sft option 'normalizer' must be a number >= 0");
      }
      o.normalizer = value.get<double>();
    } else {
      throw InvalidArgument("sft: unknown option '" + key + "' (known: normalizer)");
    }
  }
  return MakeSftObjective(o);
}

}  // namespace

void RegisterObjective(const std::string& name, ObjectiveFactory factory) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[name] = factory;
}

void RegisterBuiltinObjectives() {
  RegisterObjective("sft", &CreateSft);
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
