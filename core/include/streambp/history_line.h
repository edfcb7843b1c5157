#pragma once
// One line of a session's metrics.jsonl (docs/operations.md: Training history), the parts the
// server's writer and `streambp history --jsonl` share: numbers that are not finite are null,
// and an objective metric whose name is a record field's (or already starts "objective/") is
// written "objective/<name>". Header-only: the CLI uses it without linking the core.
#include <array>
#include <cmath>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace streambp {

/// The record's own fields, in the order of the proto's HistoryRecord.
inline constexpr std::array<std::string_view, 16> kHistoryFields = {
    "index",   "step",          "policy_version", "source",    "time",          "loss",
    "tokens",  "forward_backwards", "tokens_per_second", "seconds", "peak_memory_bytes", "grad_norm",
    "learning_rate", "skipped", "skip_reason", "groups_consumed"};

inline nlohmann::json HistoryNumber(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

/// The key an objective metric has in a line.
inline std::string HistoryMetricKey(const std::string& name) {
  bool field = name.rfind("objective/", 0) == 0;
  for (auto f : kHistoryFields) field = field || name == f;
  return field ? "objective/" + name : name;
}

}  // namespace streambp
