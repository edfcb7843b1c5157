#include <fstream>

#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/error.h"

namespace streambp {
namespace {

using nlohmann::json;

std::vector<int64_t> TokenList(const json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end()) throw InvalidArgument(where + ": missing field '" + field + "'");
  if (!it->is_array()) throw InvalidArgument(where + ": field '" + field + "' must be a list of token ids");
  std::vector<int64_t> out;
  out.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    if (!v.is_number_integer()) {
      throw InvalidArgument(where + ": " + field + "[" + std::to_string(i) +
                            "] must be an integer token id, got " + v.dump());
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

Sequence ParseSftExample(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  Sequence s;
  if (j.contains("tokens")) {
    for (const auto& [key, v] : j.items()) {
      if (key != "tokens" && key != "loss_mask") {
        throw InvalidArgument(where + ": unknown field '" + key + "' (with 'tokens' only 'loss_mask' is allowed)");
      }
    }
    s.tokens = TokenList(j, "tokens", where);
    if (j.contains("loss_mask")) {
      const auto& m = j.at("loss_mask");
      if (!m.is_array()) throw InvalidArgument(where + ": field 'loss_mask' must be a list of 0/1");
      if (m.size() != s.tokens.size()) {
        throw InvalidArgument(where + ": loss_mask has " + std::to_string(m.size()) +
                              " entries but tokens has " + std::to_string(s.tokens.size()));
      }
      for (size_t i = 0; i < m.size(); ++i) {
        const auto& v = m[i];
        if (!(v.is_number_integer() || v.is_boolean()) ||
            (v.is_number_integer() && v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
          throw InvalidArgument(where + ": loss_mask[" + std::to_string(i) + "] must be 0 or 1, got " + v.dump());
        }
        s.loss_mask.push_back(v.is_boolean() ? v.get<bool>() : static_cast<uint8_t>(v.get<int64_t>()));
      }
    }
  } else if (j.contains("prompt") || j.contains("completion")) {
    for (const auto& [key, v] : j.items()) {
      if (key != "prompt" && key != "completion") {
        throw InvalidArgument(where + ": unknown field '" + key + "' (with 'prompt' only 'completion' is allowed)");
      }
    }
    auto prompt = TokenList(j, "prompt", where);
    auto completion = TokenList(j, "completion", where);
    if (completion.empty()) throw InvalidArgument(where + ": field 'completion' is empty");
    s.tokens = prompt;
    s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
    s.loss_mask.assign(prompt.size(), 0);
    s.loss_mask.resize(s.tokens.size(), 1);
  } else {
    throw InvalidArgument(where + ": expected a field 'tokens' or the fields 'prompt' and 'completion'");
  }
  if (s.tokens.empty()) throw InvalidArgument(where + ": field 'tokens' is empty");
  return s;
}

std::vector<JsonLine> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw NotFound("cannot open data file " + path);
  std::vector<JsonLine> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back({n, json::parse(line)});
    } catch (const json::parse_error& e) {
      throw InvalidArgument(path + ":" + std::to_string(n) + ": not valid JSON (" + e.what() + ")");
    }
  }
  if (out.empty()) throw InvalidArgument(path + ": no examples (the file is empty)");
  return out;
}

std::vector<Sequence> ReadSftJsonl(const std::string& path) {
  std::vector<Sequence> out;
  for (const auto& l : ReadJsonl(path)) {
    out.push_back(ParseSftExample(l.value, path + ":" + std::to_string(l.line)));
  }
  return out;
}

}  // namespace streambp
