#include <algorithm>
#include <cmath>

#include "common.h"

namespace streambp::objectives {

OptionReader::OptionReader(const std::string& objective, const nlohmann::json& options)
    : objective_(objective), options_(options.is_null() ? nlohmann::json::object() : options) {
  if (!options_.is_object()) throw InvalidArgument(objective + " options must be a JSON object");
}

double OptionReader::number(const char* key, double fallback) {
  known_.push_back(key);
  auto it = options_.find(key);
  if (it == options_.end() || it->is_null()) return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    throw InvalidArgument(objective_ + ": option '" + key + "' must be a finite number, got " + it->dump());
  }
  return it->get<double>();
}

bool OptionReader::boolean(const char* key, bool fallback) {
  known_.push_back(key);
  auto it = options_.find(key);
  if (it == options_.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw InvalidArgument(objective_ + ": option '" + key + "' must be true or false");
  return it->get<bool>();
}

std::string OptionReader::choice(const char* key, const std::string& fallback,
                                 const std::vector<std::string>& allowed) {
  known_.push_back(key);
  auto it = options_.find(key);
  if (it == options_.end() || it->is_null()) return fallback;
  std::string list;
  for (const auto& a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
  if (!it->is_string()) throw InvalidArgument(objective_ + ": option '" + key + "' must be one of " + list);
  const auto value = it->get<std::string>();
  for (const auto& a : allowed) {
    if (value == a) return value;
  }
  throw InvalidArgument(objective_ + ": unknown " + key + " '" + value + "' (known: " + list + ")");
}

void OptionReader::done() const {
  for (const auto& [key, v] : options_.items()) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
      std::string list;
      for (const auto& k : known_) list += (list.empty() ? "" : ", ") + k;
      throw InvalidArgument(objective_ + ": unknown option '" + key + "' (known: " + list + ")");
    }
  }
}

}  // namespace streambp::objectives
