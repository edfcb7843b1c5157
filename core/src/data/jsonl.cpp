#include <cmath>
#include <fstream>
#include <optional>

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

void CheckKeys(const json& j, const std::string& where, std::initializer_list<const char*> known) {
  for (const auto& [key, v] : j.items()) {
    bool ok = false;
    std::string list;
    for (const char* k : known) {
      ok = ok || key == k;
      list += std::string(list.empty() ? "" : ", ") + k;
    }
    if (!ok) throw InvalidArgument(where + ": unknown field '" + key + "' (known: " + list + ")");
  }
}

std::optional<double> OptionalNumber(const json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw InvalidArgument(where + ": field '" + field + "' must be a number");
  return it->get<double>();
}

std::vector<double> NumberList(const json& j, const char* field, const std::string& where) {
  std::vector<double> out;
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) throw InvalidArgument(where + ": field '" + field + "' must be a list of numbers");
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_number()) {
      throw InvalidArgument(where + ": " + field + "[" + std::to_string(i) + "] must be a number, got " +
                            (*it)[i].dump());
    }
    out.push_back((*it)[i].get<double>());
  }
  return out;
}

Sequence PromptCompletion(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion) {
  Sequence s;
  s.tokens = prompt;
  s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
  s.loss_mask.assign(prompt.size(), 0);
  s.loss_mask.resize(s.tokens.size(), 1);
  return s;
}

// Per-completion-token values placed at the completion's positions of the sequence.
std::vector<double> AlignToSequence(const std::vector<double>& values, size_t prompt_len) {
  std::vector<double> out(prompt_len, 0.0);
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

}  // namespace

std::vector<Sequence> ParseDpoExample(const json& j, const std::string& where, int64_t group) {
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  CheckKeys(j, where, {"prompt", "chosen", "rejected", "ref_chosen_logp", "ref_rejected_logp"});
  auto prompt = TokenList(j, "prompt", where);
  auto chosen = TokenList(j, "chosen", where);
  auto rejected = TokenList(j, "rejected", where);
  if (chosen.empty()) throw InvalidArgument(where + ": field 'chosen' is empty");
  if (rejected.empty()) throw InvalidArgument(where + ": field 'rejected' is empty");
  if (prompt.empty()) throw InvalidArgument(where + ": field 'prompt' is empty (a completion needs a token before it)");
  auto ref_c = OptionalNumber(j, "ref_chosen_logp", where);
  auto ref_r = OptionalNumber(j, "ref_rejected_logp", where);
  if (ref_c.has_value() != ref_r.has_value()) {
    throw InvalidArgument(where + ": give both ref_chosen_logp and ref_rejected_logp, or neither");
  }
  std::vector<Sequence> out{PromptCompletion(prompt, chosen), PromptCompletion(prompt, rejected)};
  for (int role = 0; role < 2; ++role) {
    out[role].group = group;
    out[role].role = role;
    if (ref_c) out[role].ref_logp = role == 0 ? *ref_c : *ref_r;
  }
  return out;
}

std::vector<Sequence> ParseGrpoExample(const json& j, const std::string& where, int64_t group) {
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  CheckKeys(j, where, {"prompt", "completions"});
  auto prompt = TokenList(j, "prompt", where);
  if (prompt.empty()) throw InvalidArgument(where + ": field 'prompt' is empty (a completion needs a token before it)");
  auto it = j.find("completions");
  if (it == j.end() || !it->is_array()) throw InvalidArgument(where + ": missing field 'completions' (a list)");
  if (it->empty()) throw InvalidArgument(where + ": field 'completions' is empty");
  std::vector<Sequence> out;
  for (size_t c = 0; c < it->size(); ++c) {
    const std::string w = where + ": completions[" + std::to_string(c) + "]";
    const auto& cj = (*it)[c];
    if (!cj.is_object()) throw InvalidArgument(w + ": expected a JSON object");
    CheckKeys(cj, w, {"tokens", "reward", "logprobs", "advantages"});
    auto tokens = TokenList(cj, "tokens", w);
    if (tokens.empty()) throw InvalidArgument(w + ": field 'tokens' is empty");
    auto reward = OptionalNumber(cj, "reward", w);
    auto logprobs = NumberList(cj, "logprobs", w);
    auto advantages = NumberList(cj, "advantages", w);
    if (!reward && advantages.empty()) throw InvalidArgument(w + ": missing field 'reward'");
    if (reward && !std::isfinite(*reward)) throw InvalidArgument(w + ": reward is not finite");
    for (const auto& [name, values] : {std::pair<const char*, const std::vector<double>*>{"logprobs", &logprobs},
                                       {"advantages", &advantages}}) {
      if (!values->empty() && values->size() != tokens.size()) {
        throw InvalidArgument(w + ": " + name + " has " + std::to_string(values->size()) +
                              " entries but the completion has " + std::to_string(tokens.size()) + " tokens");
      }
      for (size_t i = 0; i < values->size(); ++i) {
        if (!std::isfinite((*values)[i])) {
          throw InvalidArgument(w + ": " + name + "[" + std::to_string(i) + "] is not finite");
        }
      }
    }
    Sequence s = PromptCompletion(prompt, tokens);
    s.group = group;
    s.reward = reward.value_or(0.0);
    if (!logprobs.empty()) s.sampler_logprobs = AlignToSequence(logprobs, prompt.size());
    if (!advantages.empty()) s.advantages = AlignToSequence(advantages, prompt.size());
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

// 2-D targets (cross_entropy distillation): 'target_tokens' and 'weights' are one row of K
// candidates / weights per token after the first (row i in place of tokens[i + 1]).
Sequence WithTopK(const json& j, Sequence s, const std::string& where) {
  const size_t rows = s.tokens.size() - 1;
  auto table = [&](const char* field, auto&& read) {
    const auto& v = j.at(field);
    if (!v.is_array() || v.size() != rows) {
      throw InvalidArgument(where + ": with 2-D targets, '" + field + "' needs " + std::to_string(rows) +
                            " rows (one per token after the first) of K entries each");
    }
    for (size_t i = 0; i < rows; ++i) {
      const auto& row = v[i];
      if (!row.is_array() || row.empty() || (s.top_k > 0 && static_cast<int64_t>(row.size()) != s.top_k)) {
        throw InvalidArgument(where + ": " + field + "[" + std::to_string(i) + "] must be a list of " +
                              (s.top_k > 0 ? std::to_string(s.top_k) : std::string("K >= 1")) +
                              " entries (every row of target_tokens and weights has the same K)");
      }
      if (s.top_k == 0) s.top_k = row.size();
      for (size_t c = 0; c < row.size(); ++c) {
        std::string at = field;
        at += '[';  // appended piece by piece: GCC 12 warns on "literal" + to_string() at -O3
        at += std::to_string(i) + "][" + std::to_string(c) + "]";
        read(row[c], at);
      }
    }
  };
  if (!j.contains("weights")) throw InvalidArgument(where + ": missing field 'weights' (a row of K per token after the first)");
  table("target_tokens", [&](const json& v, const std::string& at) {
    if (!v.is_number_integer()) throw InvalidArgument(where + ": " + at + " must be an integer token id, got " + v.dump());
    s.top_k_targets.push_back(v.get<int64_t>());
  });
  table("weights", [&](const json& v, const std::string& at) {
    if (!v.is_number()) throw InvalidArgument(where + ": " + at + " must be a number, got " + v.dump());
    s.top_k_weights.push_back(v.get<double>());
  });
  // Token 0's entries: unused.
  s.top_k_targets.insert(s.top_k_targets.begin(), s.top_k, 0);
  s.top_k_weights.insert(s.top_k_weights.begin(), s.top_k, 0.0);
  return s;
}

}  // namespace

Sequence ParseWeightedExample(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  CheckKeys(j, where, {"tokens", "weights", "target_tokens"});
  Sequence s;
  s.tokens = TokenList(j, "tokens", where);
  if (s.tokens.size() < 2) throw InvalidArgument(where + ": field 'tokens' needs at least 2 tokens");
  if (j.contains("target_tokens")) return WithTopK(j, std::move(s), where);
  const auto weights = NumberList(j, "weights", where);
  if (weights.size() + 1 != s.tokens.size()) {
    throw InvalidArgument(where + ": weights has " + std::to_string(weights.size()) + " entries; it needs " +
                          std::to_string(s.tokens.size() - 1) + " (one per token after the first)");
  }
  s.token_weights.push_back(0.0);
  s.token_weights.insert(s.token_weights.end(), weights.begin(), weights.end());
  return s;
}

namespace {

// A row's 'tokens' and optional 'loss_mask' (0/1 or booleans, one per token).
Sequence TokensAndMask(const json& j, const std::string& where) {
  Sequence s;
  s.tokens = TokenList(j, "tokens", where);
  if (j.contains("loss_mask")) {
    const auto& m = j.at("loss_mask");
    if (!m.is_array()) throw InvalidArgument(where + ": field 'loss_mask' must be a list of 0/1");
    if (m.size() != s.tokens.size()) {
      throw InvalidArgument(where + ": loss_mask has " + std::to_string(m.size()) + " entries but tokens has " +
                            std::to_string(s.tokens.size()));
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
  return s;
}

}  // namespace

bool IsPolicyLoss(const std::string& objective) {
  return objective == "importance_sampling" || objective == "ppo" || objective == "cispo" || objective == "dro";
}

Sequence ParsePolicyExample(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  CheckKeys(j, where, {"tokens", "logprobs", "advantages", "loss_mask"});
  if (!j.contains("tokens")) throw InvalidArgument(where + ": missing field 'tokens'");
  Sequence s = TokensAndMask(j, where);  // checked as sft's
  if (s.tokens.empty()) throw InvalidArgument(where + ": field 'tokens' is empty");
  if (s.tokens.size() < 2) throw InvalidArgument(where + ": field 'tokens' needs at least 2 tokens");
  for (auto [field, out] : {std::pair{"logprobs", &s.sampler_logprobs}, std::pair{"advantages", &s.advantages}}) {
    if (!j.contains(field)) {
      throw InvalidArgument(where + ": missing field '" + field + "' (one per token after the first)");
    }
    const auto values = NumberList(j, field, where);
    if (values.size() + 1 != s.tokens.size()) {
      throw InvalidArgument(where + ": " + field + " has " + std::to_string(values.size()) + " entries; it needs " +
                            std::to_string(s.tokens.size() - 1) + " (one per token after the first)");
    }
    out->push_back(0.0);
    out->insert(out->end(), values.begin(), values.end());
  }
  return s;
}

std::vector<Sequence> ReadExamples(const std::string& path, const std::string& objective) {
  if (objective == "sft") return ReadSftJsonl(path);
  if (IsPolicyLoss(objective)) {
    std::vector<Sequence> out;
    for (const auto& l : ReadJsonl(path)) out.push_back(ParsePolicyExample(l.value, path + ":" + std::to_string(l.line)));
    return out;
  }
  if (objective == "weighted" || objective == "weighted_logprobs" || objective == "cross_entropy") {
    std::vector<Sequence> out;
    for (const auto& l : ReadJsonl(path)) out.push_back(ParseWeightedExample(l.value, path + ":" + std::to_string(l.line)));
    if (out.empty()) throw InvalidArgument(path + ": no examples (the file is empty)");
    return out;
  }
  if (objective != "dpo" && objective != "grpo") {
    throw InvalidArgument("no data format for objective '" + objective +
                          "' (known: sft, dpo, grpo, weighted_logprobs, cross_entropy, importance_sampling, ppo, "
                          "cispo, dro)");
  }
  std::vector<Sequence> out;
  int64_t group = 0;
  for (const auto& l : ReadJsonl(path)) {
    const std::string where = path + ":" + std::to_string(l.line);
    auto seqs = objective == "dpo" ? ParseDpoExample(l.value, where, group) : ParseGrpoExample(l.value, where, group);
    ++group;
    for (auto& s : seqs) out.push_back(std::move(s));
  }
  return out;
}

Sequence ParseSftExample(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  Sequence s;
  if (j.contains("tokens")) {
    for (const auto& [key, v] : j.items()) {
      if (key != "tokens" && key != "loss_mask") {
        throw InvalidArgument(where + ": unknown field '" + key + "' (with 'tokens' only 'loss_mask' is allowed)");
      }
    }
    s = TokensAndMask(j, where);
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
    } catch (const json::exception& e) {  // parse errors, and numbers out of range (1e999)
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
