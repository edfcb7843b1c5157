#include "streambp/client/data.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "streambp/client/result.h"

namespace streambp::client {
namespace {

using nlohmann::json;
using google::protobuf::RepeatedField;

[[noreturn]] void Bad(const std::string& message) { throw ClientError(grpc::StatusCode::INVALID_ARGUMENT, message); }

void CheckKeys(const json& j, const std::string& where, std::initializer_list<const char*> known) {
  for (const auto& [key, v] : j.items()) {
    bool ok = false;
    std::string list;
    for (const char* k : known) {
      ok = ok || key == k;
      list += std::string(list.empty() ? "" : ", ") + k;
    }
    if (!ok) Bad(where + ": unknown field '" + key + "' (known: " + list + ")");
  }
}

void TokenList(const json& j, const char* field, const std::string& where, RepeatedField<int32_t>* out) {
  auto it = j.find(field);
  if (it == j.end()) Bad(where + ": missing field '" + field + "'");
  if (!it->is_array()) Bad(where + ": field '" + field + "' must be a list of token ids");
  out->Reserve(static_cast<int>(it->size()));
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    const std::string name = std::string(field) + "[" + std::to_string(i) + "]";
    if (!v.is_number_integer()) Bad(where + ": " + name + " must be an integer token id, got " + v.dump());
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())) {
      Bad(where + ": " + name + " = " + v.dump() + " is not a token id (must be in [0, 2^31))");
    }
    out->Add(static_cast<int32_t>(v.get<int64_t>()));
  }
}

std::optional<double> OptionalNumber(const json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) Bad(where + ": field '" + field + "' must be a number, got " + it->dump());
  const double v = it->get<double>();
  if (!std::isfinite(v)) Bad(where + ": field '" + field + "' is not finite");
  return v;
}

// A list of finite numbers, empty when absent.
void NumberList(const json& j, const char* field, const std::string& where, RepeatedField<float>* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_array()) Bad(where + ": field '" + field + "' must be a list of numbers");
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    const std::string name = std::string(field) + "[" + std::to_string(i) + "]";
    if (!v.is_number()) Bad(where + ": " + name + " must be a number, got " + v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::abs(d) > std::numeric_limits<float>::max()) {
      Bad(where + ": " + name + " is not finite");
    }
    out->Add(static_cast<float>(d));
  }
}

void ParseSft(const json& j, const std::string& where, v1::SftExample* e) {
  if (!j.is_object()) Bad(where + ": expected a JSON object");
  if (j.contains("tokens")) {
    for (const auto& [key, v] : j.items()) {
      if (key != "tokens" && key != "loss_mask") {
        Bad(where + ": unknown field '" + key + "' (with 'tokens' only 'loss_mask' is allowed)");
      }
    }
    TokenList(j, "tokens", where, e->mutable_tokens());
    if (e->tokens().empty()) Bad(where + ": field 'tokens' is empty");
    if (j.contains("loss_mask")) {
      const auto& m = j.at("loss_mask");
      if (!m.is_array()) Bad(where + ": field 'loss_mask' must be a list of 0/1");
      if (static_cast<int>(m.size()) != e->tokens_size()) {
        Bad(where + ": loss_mask has " + std::to_string(m.size()) + " entries but tokens has " +
            std::to_string(e->tokens_size()));
      }
      for (size_t i = 0; i < m.size(); ++i) {
        const auto& v = m[i];
        const bool is_bit = v.is_boolean() || (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1));
        if (!is_bit) Bad(where + ": loss_mask[" + std::to_string(i) + "] must be 0 or 1, got " + v.dump());
        e->add_loss_mask(v.is_boolean() ? int32_t(v.get<bool>()) : static_cast<int32_t>(v.get<int64_t>()));
      }
    }
  } else if (j.contains("prompt") || j.contains("completion")) {
    for (const auto& [key, v] : j.items()) {
      if (key != "prompt" && key != "completion") {
        Bad(where + ": unknown field '" + key + "' (with 'prompt' only 'completion' is allowed)");
      }
    }
    TokenList(j, "prompt", where, e->mutable_prompt());
    TokenList(j, "completion", where, e->mutable_completion());
    if (e->completion().empty()) Bad(where + ": field 'completion' is empty");
  } else {
    Bad(where + ": expected a field 'tokens' or the fields 'prompt' and 'completion'");
  }
}

void ParseDpo(const json& j, const std::string& where, v1::DpoPair* p) {
  if (!j.is_object()) Bad(where + ": expected a JSON object");
  CheckKeys(j, where, {"prompt", "chosen", "rejected", "ref_chosen_logp", "ref_rejected_logp"});
  TokenList(j, "prompt", where, p->mutable_prompt());
  TokenList(j, "chosen", where, p->mutable_chosen());
  TokenList(j, "rejected", where, p->mutable_rejected());
  if (p->prompt().empty()) Bad(where + ": field 'prompt' is empty (a completion needs a token before it)");
  if (p->chosen().empty()) Bad(where + ": field 'chosen' is empty");
  if (p->rejected().empty()) Bad(where + ": field 'rejected' is empty");
  const auto ref_c = OptionalNumber(j, "ref_chosen_logp", where);
  const auto ref_r = OptionalNumber(j, "ref_rejected_logp", where);
  if (ref_c.has_value() != ref_r.has_value()) Bad(where + ": give both ref_chosen_logp and ref_rejected_logp, or neither");
  if (ref_c) {
    p->set_ref_chosen_logp(*ref_c);
    p->set_ref_rejected_logp(*ref_r);
  }
}

void ParseGrpo(const json& j, const std::string& where, v1::GrpoGroup* g) {
  if (!j.is_object()) Bad(where + ": expected a JSON object");
  CheckKeys(j, where, {"prompt", "completions"});
  TokenList(j, "prompt", where, g->mutable_prompt());
  if (g->prompt().empty()) Bad(where + ": field 'prompt' is empty (a completion needs a token before it)");
  auto it = j.find("completions");
  if (it == j.end() || !it->is_array()) Bad(where + ": missing field 'completions' (a list)");
  if (it->empty()) Bad(where + ": field 'completions' is empty");
  for (size_t c = 0; c < it->size(); ++c) {
    const std::string w = where + ": completions[" + std::to_string(c) + "]";
    const auto& cj = (*it)[c];
    if (!cj.is_object()) Bad(w + ": expected a JSON object");
    CheckKeys(cj, w, {"tokens", "reward", "logprobs", "advantages"});
    auto* completion = g->add_completions();
    TokenList(cj, "tokens", w, completion->mutable_tokens());
    if (completion->tokens().empty()) Bad(w + ": field 'tokens' is empty");
    NumberList(cj, "logprobs", w, completion->mutable_logprobs());
    NumberList(cj, "advantages", w, completion->mutable_advantages());
    const auto reward = OptionalNumber(cj, "reward", w);
    if (!reward && completion->advantages().empty()) Bad(w + ": missing field 'reward'");
    completion->set_reward(reward.value_or(0.0));
    for (const auto& [name, n] : {std::pair{"logprobs", completion->logprobs_size()},
                                  std::pair{"advantages", completion->advantages_size()}}) {
      if (n != 0 && n != completion->tokens_size()) {
        Bad(w + ": " + name + " has " + std::to_string(n) + " entries but the completion has " +
            std::to_string(completion->tokens_size()) + " tokens");
      }
    }
  }
}

// Appends examples [begin, end) of `from` to `to` (same kind).
void CopyExamples(const v1::Batch& from, int64_t begin, int64_t end, v1::Batch* to) {
  for (int64_t i = begin; i < end; ++i) {
    const int k = static_cast<int>(i);
    switch (from.kind_case()) {
      case v1::Batch::kSft: *to->mutable_sft()->add_examples() = from.sft().examples(k); break;
      case v1::Batch::kDpo: *to->mutable_dpo()->add_pairs() = from.dpo().pairs(k); break;
      case v1::Batch::kGrpo: *to->mutable_grpo()->add_groups() = from.grpo().groups(k); break;
      default: break;
    }
  }
}

v1::Batch EmptyLike(const v1::Batch& batch) {
  v1::Batch out;
  switch (batch.kind_case()) {
    case v1::Batch::kSft: out.mutable_sft(); break;
    case v1::Batch::kDpo: out.mutable_dpo(); break;
    case v1::Batch::kGrpo: out.mutable_grpo(); break;
    default: break;
  }
  return out;
}

}  // namespace

void CheckObjectiveKind(const std::string& kind) {
  if (kind != "sft" && kind != "dpo" && kind != "grpo") {
    Bad("no data format for objective '" + kind + "' (known: sft, dpo, grpo)");
  }
}

v1::Batch ParseBatchJsonl(std::istream& in, const std::string& name, const std::string& kind) {
  CheckObjectiveKind(kind);
  v1::Batch batch;
  std::string line;
  int64_t n = 0;
  int64_t examples = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = name + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // parse errors, and numbers out of range (1e999)
      Bad(where + ": not valid JSON (" + e.what() + ")");
    }
    if (kind == "sft") ParseSft(j, where, batch.mutable_sft()->add_examples());
    if (kind == "dpo") ParseDpo(j, where, batch.mutable_dpo()->add_pairs());
    if (kind == "grpo") ParseGrpo(j, where, batch.mutable_grpo()->add_groups());
    ++examples;
  }
  if (in.bad()) throw ClientError(grpc::StatusCode::DATA_LOSS, name + ": read error");
  if (examples == 0) Bad(name + ": no examples (the file is empty)");
  return batch;
}

v1::Batch ReadBatchJsonl(const std::string& path, const std::string& kind) {
  CheckObjectiveKind(kind);
  std::ifstream in(path);
  if (!in) throw ClientError(grpc::StatusCode::NOT_FOUND, "cannot open data file " + path);
  return ParseBatchJsonl(in, path, kind);
}

std::string BatchKind(const v1::Batch& batch) {
  switch (batch.kind_case()) {
    case v1::Batch::kSft: return "sft";
    case v1::Batch::kDpo: return "dpo";
    case v1::Batch::kGrpo: return "grpo";
    default: return "";
  }
}

int64_t BatchExamples(const v1::Batch& batch) {
  switch (batch.kind_case()) {
    case v1::Batch::kSft: return batch.sft().examples_size();
    case v1::Batch::kDpo: return batch.dpo().pairs_size();
    case v1::Batch::kGrpo: return batch.grpo().groups_size();
    default: return 0;
  }
}

int64_t ExampleTokens(const v1::Batch& batch, int64_t i) {
  const int k = static_cast<int>(i);
  switch (batch.kind_case()) {
    case v1::Batch::kSft: {
      const auto& e = batch.sft().examples(k);
      return e.tokens_size() + e.prompt_size() + e.completion_size();
    }
    case v1::Batch::kDpo: {
      const auto& p = batch.dpo().pairs(k);
      return 2 * int64_t(p.prompt_size()) + p.chosen_size() + p.rejected_size();
    }
    case v1::Batch::kGrpo: {
      const auto& g = batch.grpo().groups(k);
      int64_t n = 0;
      for (const auto& c : g.completions()) n += g.prompt_size() + c.tokens_size();
      return n;
    }
    default: return 0;
  }
}

int64_t BatchTokens(const v1::Batch& batch) {
  int64_t n = 0;
  for (int64_t i = 0; i < BatchExamples(batch); ++i) n += ExampleTokens(batch, i);
  return n;
}

std::vector<v1::Batch> SplitByTokens(const v1::Batch& batch, int64_t max_tokens) {
  if (max_tokens <= 0) Bad("tokens per batch must be > 0, got " + std::to_string(max_tokens));
  std::vector<v1::Batch> out;
  const int64_t n = BatchExamples(batch);
  int64_t begin = 0;
  while (begin < n) {
    int64_t end = begin + 1;
    int64_t tokens = ExampleTokens(batch, begin);
    while (end < n && tokens + ExampleTokens(batch, end) <= max_tokens) tokens += ExampleTokens(batch, end++);
    out.push_back(EmptyLike(batch));
    CopyExamples(batch, begin, end, &out.back());
    begin = end;
  }
  return out;
}

std::vector<v1::Batch> SplitByExamples(const v1::Batch& batch, int64_t examples) {
  if (examples <= 0) Bad("examples per batch must be > 0, got " + std::to_string(examples));
  std::vector<v1::Batch> out;
  const int64_t n = BatchExamples(batch);
  for (int64_t begin = 0; begin < n; begin += examples) {
    out.push_back(EmptyLike(batch));
    CopyExamples(batch, begin, std::min(n, begin + examples), &out.back());
  }
  return out;
}

std::vector<int32_t> SequenceTokens(const v1::SftExample& e) {
  std::vector<int32_t> out(e.tokens().begin(), e.tokens().end());
  out.insert(out.end(), e.prompt().begin(), e.prompt().end());
  out.insert(out.end(), e.completion().begin(), e.completion().end());
  return out;
}

std::vector<int32_t> SequenceTargets(const v1::SftExample& e) {
  if (e.tokens_size() > 0) {
    if (e.loss_mask_size() == 0) return std::vector<int32_t>(e.tokens_size(), 1);
    return {e.loss_mask().begin(), e.loss_mask().end()};
  }
  std::vector<int32_t> out(e.prompt_size(), 0);
  out.resize(out.size() + e.completion_size(), 1);
  return out;
}

}  // namespace streambp::client
