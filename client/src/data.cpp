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

// What a JSON value holding a prompt / completion is: ids, a string, or a conversation.
enum class Form { kIds, kText, kMessages };

Form FormOf(const json& v, const std::string& where, const char* field) {
  if (v.is_string()) return Form::kText;
  if (v.is_array() && !v.empty() && v[0].is_object()) return Form::kMessages;
  if (v.is_array()) return Form::kIds;
  Bad(where + ": field '" + field + "' must be token ids, a string or a list of messages, got " + v.dump());
}

void Messages(const json& v, const std::string& where, const char* field,
              google::protobuf::RepeatedPtrField<v1::ChatMessage>* out) {
  if (!v.is_array() || v.empty()) Bad(where + ": field '" + field + "' must be a non-empty list of messages");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + ": " + field + "[" + std::to_string(i) + "]";
    const auto& m = v[i];
    if (!m.is_object()) Bad(w + ": expected a message {\"role\": ..., \"content\": ...}");
    CheckKeys(m, w, {"role", "content", "reasoning_content", "train"});
    auto* c = out->Add();
    if (!m.contains("role") || !m["role"].is_string()) Bad(w + ": field 'role' must be a string");
    c->set_role(m["role"].get<std::string>());
    if (!m.contains("content") || !(m["content"].is_string() || m["content"].is_null())) {
      Bad(w + ": field 'content' must be a string");
    }
    if (m["content"].is_string()) c->set_content(m["content"].get<std::string>());
    if (m.contains("reasoning_content")) {
      if (!m["reasoning_content"].is_string()) Bad(w + ": field 'reasoning_content' must be a string");
      c->set_reasoning_content(m["reasoning_content"].get<std::string>());
    }
    if (m.contains("train")) {
      if (!m["train"].is_boolean()) Bad(w + ": field 'train' must be true or false");
      c->set_train(m["train"].get<bool>());
    }
  }
}

void TextOrMessages(const json& j, const char* field, const std::string& where, v1::Text* out) {
  const auto& v = j.at(field);
  if (FormOf(v, where, field) == Form::kText) {
    if (v.get<std::string>().empty()) Bad(where + ": field '" + field + "' is empty");
    out->set_text(v.get<std::string>());
  } else {
    Messages(v, where, field, out->mutable_messages());
  }
}

// HF's input_ids + labels: labels[i] = -100 leaves token i out of the loss; any other label
// must be the token itself (the model shifts: token i is predicted from the tokens before it).
void ParseInputIds(const json& j, const std::string& where, v1::SftExample* e) {
  CheckKeys(j, where, {"input_ids", "labels", "attention_mask"});
  TokenList(j, "input_ids", where, e->mutable_tokens());
  if (e->tokens().empty()) Bad(where + ": field 'input_ids' is empty");
  if (j.contains("attention_mask")) {
    const auto& m = j["attention_mask"];
    if (!m.is_array() || static_cast<int>(m.size()) != e->tokens_size()) {
      Bad(where + ": attention_mask must have one entry per input id");
    }
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] != 1) Bad(where + ": attention_mask[" + std::to_string(i) + "] is not 1: strip padding from examples");
    }
  }
  if (!j.contains("labels")) return;
  const auto& labels = j["labels"];
  if (!labels.is_array() || static_cast<int>(labels.size()) != e->tokens_size()) {
    Bad(where + ": labels must have one entry per input id");
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto& l = labels[i];
    if (!l.is_number_integer()) Bad(where + ": labels[" + std::to_string(i) + "] must be an integer");
    const int64_t v = l.get<int64_t>();
    if (v != -100 && v != e->tokens(static_cast<int>(i))) {
      Bad(where + ": labels[" + std::to_string(i) + "] = " + std::to_string(v) +
          " is neither -100 nor input_ids[" + std::to_string(i) + "]");
    }
    e->add_loss_mask(v == -100 ? 0 : 1);
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
  } else if (j.contains("input_ids")) {
    ParseInputIds(j, where, e);
  } else if (j.contains("text")) {
    CheckKeys(j, where, {"text"});
    if (!j["text"].is_string() || j["text"].get<std::string>().empty()) Bad(where + ": field 'text' must be a non-empty string");
    e->set_text(j["text"].get<std::string>());
  } else if (j.contains("messages")) {
    CheckKeys(j, where, {"messages"});
    Messages(j["messages"], where, "messages", e->mutable_messages());
  } else if (j.contains("prompt") || j.contains("completion")) {
    CheckKeys(j, where, {"prompt", "completion"});
    if (!j.contains("prompt")) Bad(where + ": missing field 'prompt'");
    if (!j.contains("completion")) Bad(where + ": missing field 'completion'");
    const Form p = FormOf(j["prompt"], where, "prompt"), c = FormOf(j["completion"], where, "completion");
    if (p != c) Bad(where + ": 'prompt' and 'completion' must have the same form (ids, strings or messages)");
    if (p == Form::kIds) {
      TokenList(j, "prompt", where, e->mutable_prompt());
      TokenList(j, "completion", where, e->mutable_completion());
      if (e->completion().empty()) Bad(where + ": field 'completion' is empty");
    } else {
      TextOrMessages(j, "prompt", where, e->mutable_prompt_text());
      TextOrMessages(j, "completion", where, e->mutable_completion_text());
    }
  } else {
    Bad(where + ": expected one of the fields 'tokens', 'input_ids', 'text', 'messages', or 'prompt' and "
                "'completion'");
  }
}

void ParseDpo(const json& j, const std::string& where, v1::DpoPair* p) {
  if (!j.is_object()) Bad(where + ": expected a JSON object");
  CheckKeys(j, where, {"prompt", "chosen", "rejected", "ref_chosen_logp", "ref_rejected_logp"});
  for (const char* f : {"prompt", "chosen", "rejected"}) {
    if (!j.contains(f)) Bad(where + ": missing field '" + std::string(f) + "'");
  }
  const Form form = FormOf(j["prompt"], where, "prompt");
  for (const char* f : {"chosen", "rejected"}) {
    if (FormOf(j[f], where, f) != form) {
      Bad(where + ": 'prompt', 'chosen' and 'rejected' must have the same form (ids, strings or messages)");
    }
  }
  if (form == Form::kIds) {
    TokenList(j, "prompt", where, p->mutable_prompt());
    TokenList(j, "chosen", where, p->mutable_chosen());
    TokenList(j, "rejected", where, p->mutable_rejected());
    if (p->prompt().empty()) Bad(where + ": field 'prompt' is empty (a completion needs a token before it)");
    if (p->chosen().empty()) Bad(where + ": field 'chosen' is empty");
    if (p->rejected().empty()) Bad(where + ": field 'rejected' is empty");
  } else {
    TextOrMessages(j, "prompt", where, p->mutable_prompt_text());
    TextOrMessages(j, "chosen", where, p->mutable_chosen_text());
    TextOrMessages(j, "rejected", where, p->mutable_rejected_text());
  }
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
  if (!j.contains("prompt")) Bad(where + ": missing field 'prompt'");
  if (FormOf(j["prompt"], where, "prompt") == Form::kIds) {
    TokenList(j, "prompt", where, g->mutable_prompt());
    if (g->prompt().empty()) Bad(where + ": field 'prompt' is empty (a completion needs a token before it)");
  } else {
    TextOrMessages(j, "prompt", where, g->mutable_prompt_text());
  }
  auto it = j.find("completions");
  if (it == j.end() || !it->is_array()) Bad(where + ": missing field 'completions' (a list)");
  if (it->empty()) Bad(where + ": field 'completions' is empty");
  for (size_t c = 0; c < it->size(); ++c) {
    const std::string w = where + ": completions[" + std::to_string(c) + "]";
    const auto& cj = (*it)[c];
    if (!cj.is_object()) Bad(w + ": expected a JSON object");
    CheckKeys(cj, w, {"tokens", "text", "reward", "logprobs", "advantages"});
    auto* completion = g->add_completions();
    if (cj.contains("text")) {
      if (cj.contains("tokens")) Bad(w + ": give 'tokens' or 'text', not both");
      if (!cj["text"].is_string() || cj["text"].get<std::string>().empty()) Bad(w + ": field 'text' must be a non-empty string");
      completion->set_text(cj["text"].get<std::string>());
    } else {
      TokenList(cj, "tokens", w, completion->mutable_tokens());
      if (completion->tokens().empty()) Bad(w + ": field 'tokens' is empty");
    }
    NumberList(cj, "logprobs", w, completion->mutable_logprobs());
    NumberList(cj, "advantages", w, completion->mutable_advantages());
    const auto reward = OptionalNumber(cj, "reward", w);
    if (!reward && completion->advantages().empty()) Bad(w + ": missing field 'reward'");
    completion->set_reward(reward.value_or(0.0));
    if (!completion->text().empty()) continue;  // lengths are checked once the server has tokenized it
    for (const auto& [name, n] : {std::pair{"logprobs", completion->logprobs_size()},
                                  std::pair{"advantages", completion->advantages_size()}}) {
      if (n != 0 && n != completion->tokens_size()) {
        Bad(w + ": " + name + " has " + std::to_string(n) + " entries but the completion has " +
            std::to_string(completion->tokens_size()) + " tokens");
      }
    }
  }
}

// {"tokens": [...], "weights": [...]}: weights[i] multiplies log p(tokens[i+1]).
void ParseWeighted(const json& j, const std::string& where, v1::WeightedSequence* s) {
  if (!j.is_object()) Bad(where + ": expected a JSON object");
  CheckKeys(j, where, {"tokens", "weights"});
  TokenList(j, "tokens", where, s->mutable_tokens());
  if (s->tokens_size() < 2) Bad(where + ": field 'tokens' needs at least 2 tokens");
  auto it = j.find("weights");
  if (it == j.end() || !it->is_array()) Bad(where + ": missing field 'weights' (a list of numbers)");
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      Bad(where + ": weights[" + std::to_string(i) + "] must be a finite number, got " + v.dump());
    }
    s->add_weights(v.get<double>());
  }
  if (s->weights_size() + 1 != s->tokens_size()) {
    Bad(where + ": weights has " + std::to_string(s->weights_size()) + " entries; it needs " +
        std::to_string(s->tokens_size() - 1) + " (one per token after the first)");
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
      case v1::Batch::kWeighted: *to->mutable_weighted()->add_sequences() = from.weighted().sequences(k); break;
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
    case v1::Batch::kWeighted:
      out.mutable_weighted();
      if (batch.weighted().has_policy_version()) out.mutable_weighted()->set_policy_version(batch.weighted().policy_version());
      break;
    default: break;
  }
  return out;
}

}  // namespace

void CheckObjectiveKind(const std::string& kind) {
  if (kind != "sft" && kind != "dpo" && kind != "grpo" && kind != "weighted") {
    Bad("no data format for objective '" + kind + "' (known: sft, dpo, grpo, weighted)");
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
    if (kind == "weighted") ParseWeighted(j, where, batch.mutable_weighted()->add_sequences());
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
    case v1::Batch::kWeighted: return "weighted";
    default: return "";
  }
}

bool BatchHasText(const v1::Batch& batch) {
  for (const auto& e : batch.sft().examples()) {
    if (!e.text().empty() || !e.messages().empty() || e.has_prompt_text() || e.has_completion_text()) return true;
  }
  for (const auto& p : batch.dpo().pairs()) {
    if (p.has_prompt_text() || p.has_chosen_text() || p.has_rejected_text()) return true;
  }
  for (const auto& g : batch.grpo().groups()) {
    if (g.has_prompt_text()) return true;
    for (const auto& c : g.completions()) {
      if (!c.text().empty()) return true;
    }
  }
  return false;
}

int64_t BatchExamples(const v1::Batch& batch) {
  switch (batch.kind_case()) {
    case v1::Batch::kSft: return batch.sft().examples_size();
    case v1::Batch::kDpo: return batch.dpo().pairs_size();
    case v1::Batch::kGrpo: return batch.grpo().groups_size();
    case v1::Batch::kWeighted: return batch.weighted().sequences_size();
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
    case v1::Batch::kWeighted: return batch.weighted().sequences(k).tokens_size();
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
