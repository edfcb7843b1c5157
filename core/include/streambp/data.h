#pragma once
/// JSONL data files, one example per line (DESIGN §3, used by every tool):
///   {"tokens":[...], "loss_mask":[0|1,...]}   loss_mask optional (default all ones)
///   {"prompt":[...], "completion":[...]}      loss on the completion tokens only
/// Blank lines are skipped. A line that does not parse or has a bad field throws
/// InvalidArgument naming the file, the line number and the field.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/batch.h"

namespace streambp {

/// One SFT example from a parsed JSON line; `where` prefixes error messages ("f.jsonl:3").
Sequence ParseSftExample(const nlohmann::json& j, const std::string& where);

std::vector<Sequence> ReadSftJsonl(const std::string& path);

/// Reads a JSONL file into parsed JSON objects, with line numbers (1-based).
struct JsonLine {
  int64_t line = 0;
  nlohmann::json value;
};
std::vector<JsonLine> ReadJsonl(const std::string& path);

}  // namespace streambp
