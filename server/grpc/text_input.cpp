#include "text_input.h"

#include <algorithm>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "streambp/chat.h"
#include "streambp/error.h"

namespace streambp::server {
namespace {

using google::protobuf::RepeatedField;
using google::protobuf::RepeatedPtrField;

std::string Index(const std::string& base, int i) { return base + "[" + std::to_string(i) + "]"; }

bool Given(const v1::Text& t) { return !t.text().empty() || !t.messages().empty(); }

// The text of one request, bounded before anything is tokenized.
class TextInput {
 public:
  explicit TextInput(const InputLimits& limits) : limits_(limits) {}

  const TextCodec& codec() const {
    if (!limits_.text) throw FailedPrecondition("text input needs the model's tokenizer, but " + limits_.text_unavailable);
    return *limits_.text;
  }

  std::vector<int64_t> Encode(const std::string& text, bool add_special_tokens, const std::string& field) {
    Charge(text.size(), field);
    return codec().encode(text, add_special_tokens, field);
  }

  // A plain-text training target: ends with the tokenizer's end-of-sequence token, as TRL's
  // SFT appends it.
  std::vector<int64_t> EncodeWithEos(const std::string& text, bool add_special_tokens, const std::string& field) {
    auto ids = Encode(text, add_special_tokens, field);
    const int64_t eos = codec().eos_token_id();
    if (eos >= 0 && (ids.empty() || ids.back() != eos)) ids.push_back(eos);
    return ids;
  }

  std::vector<ChatMessage> Messages(const RepeatedPtrField<v1::ChatMessage>& in, const std::string& field,
                                    std::optional<bool> train = std::nullopt) {
    std::vector<ChatMessage> out;
    for (int i = 0; i < in.size(); ++i) {
      const auto& m = in[i];
      Charge(m.role().size() + m.content().size() + m.reasoning_content().size(), Index(field, i));
      ChatMessage c;
      c.role = m.role();
      c.content = m.content();
      if (m.has_reasoning_content()) c.reasoning_content = m.reasoning_content();
      if (train) {
        c.train = train;
      } else if (m.has_train()) {
        c.train = m.train();
      }
      out.push_back(std::move(c));
    }
    return out;
  }

  RenderedIds Render(const std::vector<ChatMessage>& messages, bool generation_prompt, bool thinking,
                     const std::string& field) {
    return codec().render(messages, generation_prompt, thinking, field);
  }

  // A prompt for sampling: a string (with the tokenizer's special tokens, e.g. Llama's BOS), or
  // messages rendered with the generation prompt.
  std::vector<int64_t> Prompt(const v1::Text& t, const std::string& field) {
    OneForm(t, field);
    if (!t.text().empty()) return Encode(t.text(), true, field + ".text");
    return Render(Messages(t.messages(), field + ".messages"), true, !t.has_enable_thinking() || t.enable_thinking(),
                  field + ".messages")
        .ids;
  }

  static void OneForm(const v1::Text& t, const std::string& field) {
    if (!t.text().empty() && !t.messages().empty()) throw InvalidArgument(field + ": give text or messages, not both");
    if (!Given(t)) throw InvalidArgument(field + " is empty: give text or messages");
  }

 private:
  void Charge(size_t bytes, const std::string& field) {
    bytes_ += static_cast<int64_t>(bytes);
    if (bytes_ > limits_.max_text_bytes) {
      throw ResourceExhausted(field + ": the request carries more than " + std::to_string(limits_.max_text_bytes) +
                              " bytes of text (limits.max_text_bytes); split it into several calls");
    }
  }

  const InputLimits& limits_;
  int64_t bytes_ = 0;
};

template <class Ids>
void SetIds(const std::vector<int64_t>& ids, Ids* out) {
  out->Clear();
  out->Reserve(static_cast<int>(ids.size()));
  for (int64_t id : ids) out->Add(static_cast<int32_t>(id));
}

void ResolveSft(v1::SftExample* e, TextInput& in, const std::string& f) {
  const bool ids = !e->tokens().empty() || !e->prompt().empty() || !e->completion().empty();
  const bool pair = e->has_prompt_text() || e->has_completion_text();
  const int forms = int(ids) + int(!e->text().empty()) + int(!e->messages().empty()) + int(pair);
  if (forms == 0) return;  // nothing given: the ids path names the missing field
  if (forms > 1) {
    throw InvalidArgument(f + ": give one of tokens, prompt + completion, text, messages, prompt_text + "
                              "completion_text");
  }
  if (!e->text().empty()) {
    SetIds(in.EncodeWithEos(e->text(), true, f + ".text"), e->mutable_tokens());
    e->clear_text();
  } else if (!e->messages().empty()) {
    auto r = in.Render(in.Messages(e->messages(), f + ".messages"), false, true, f + ".messages");
    if (std::find(r.loss_mask.begin(), r.loss_mask.end(), 1) == r.loss_mask.end()) {
      throw InvalidArgument(f + ".messages: no assistant message to train on (or every one has train = false)");
    }
    SetIds(r.ids, e->mutable_tokens());
    SetIds(std::vector<int64_t>(r.loss_mask.begin(), r.loss_mask.end()), e->mutable_loss_mask());
    e->clear_messages();
  } else if (pair) {
    if (!e->has_prompt_text() || !Given(e->prompt_text())) throw InvalidArgument(f + ".prompt_text is empty");
    if (!e->has_completion_text() || !Given(e->completion_text())) throw InvalidArgument(f + ".completion_text is empty");
    const auto& p = e->prompt_text();
    const auto& c = e->completion_text();
    TextInput::OneForm(p, f + ".prompt_text");
    TextInput::OneForm(c, f + ".completion_text");
    if (!p.text().empty() && !c.text().empty()) {
      SetIds(in.Encode(p.text(), true, f + ".prompt_text.text"), e->mutable_prompt());
      SetIds(in.EncodeWithEos(c.text(), false, f + ".completion_text.text"), e->mutable_completion());
    } else if (!p.messages().empty() && !c.messages().empty()) {
      // One conversation: the prompt's turns are context, the completion's assistant turns
      // are trained (a completion message's own train flag still applies).
      auto messages = in.Messages(p.messages(), f + ".prompt_text.messages", false);
      for (auto& m : in.Messages(c.messages(), f + ".completion_text.messages")) messages.push_back(std::move(m));
      auto r = in.Render(messages, false, true, f + ".completion_text.messages");
      if (std::find(r.loss_mask.begin(), r.loss_mask.end(), 1) == r.loss_mask.end()) {
        throw InvalidArgument(f + ".completion_text.messages: no assistant message to train on");
      }
      SetIds(r.ids, e->mutable_tokens());
      SetIds(std::vector<int64_t>(r.loss_mask.begin(), r.loss_mask.end()), e->mutable_loss_mask());
    } else {
      throw InvalidArgument(f + ": prompt_text and completion_text must both be text or both be messages");
    }
    e->clear_prompt_text();
    e->clear_completion_text();
  }
}

// A DPO completion in conversation form: the ids the full conversation adds after the
// prompt's generation prompt (the prompt's rendering must be a prefix of it).
std::vector<int64_t> Continuation(TextInput& in, const v1::Text& prompt, const v1::Text& completion,
                                  const std::vector<int64_t>& prompt_ids, const std::string& field) {
  auto messages = in.Messages(prompt.messages(), field);
  for (auto& m : in.Messages(completion.messages(), field + ".messages")) messages.push_back(std::move(m));
  auto full = in.Render(messages, false, !prompt.has_enable_thinking() || prompt.enable_thinking(), field + ".messages");
  if (full.ids.size() <= prompt_ids.size() || !std::equal(prompt_ids.begin(), prompt_ids.end(), full.ids.begin())) {
    throw InvalidArgument(field + ": the chat format renders the prompt differently inside the whole conversation "
                                  "(or the completion adds nothing); send ids instead");
  }
  return {full.ids.begin() + static_cast<std::ptrdiff_t>(prompt_ids.size()), full.ids.end()};
}

void ResolveDpo(v1::DpoPair* p, TextInput& in, const std::string& f) {
  const bool text = p->has_prompt_text() || p->has_chosen_text() || p->has_rejected_text();
  if (!text) return;
  if (!p->prompt().empty() || !p->chosen().empty() || !p->rejected().empty()) {
    throw InvalidArgument(f + ": give ids (prompt, chosen, rejected) or text (prompt_text, chosen_text, "
                              "rejected_text), not both");
  }
  for (const auto& [name, t] : {std::pair<const char*, const v1::Text*>{"prompt_text", &p->prompt_text()},
                                {"chosen_text", &p->chosen_text()}, {"rejected_text", &p->rejected_text()}}) {
    TextInput::OneForm(*t, f + "." + name);
  }
  const bool strings = !p->prompt_text().text().empty();
  if (!strings == p->chosen_text().messages().empty() || !strings == p->rejected_text().messages().empty()) {
    throw InvalidArgument(f + ": prompt_text, chosen_text and rejected_text must all be text or all be messages");
  }
  const auto prompt = in.Prompt(p->prompt_text(), f + ".prompt_text");
  SetIds(prompt, p->mutable_prompt());
  if (strings) {
    SetIds(in.EncodeWithEos(p->chosen_text().text(), false, f + ".chosen_text.text"), p->mutable_chosen());
    SetIds(in.EncodeWithEos(p->rejected_text().text(), false, f + ".rejected_text.text"), p->mutable_rejected());
  } else {
    SetIds(Continuation(in, p->prompt_text(), p->chosen_text(), prompt, f + ".chosen_text"), p->mutable_chosen());
    SetIds(Continuation(in, p->prompt_text(), p->rejected_text(), prompt, f + ".rejected_text"), p->mutable_rejected());
  }
  p->clear_prompt_text();
  p->clear_chosen_text();
  p->clear_rejected_text();
}

template <class Group>
void ResolveGroup(Group* g, TextInput& in, const std::string& f) {
  if (g->has_prompt_text()) {
    if (!g->prompt().empty()) throw InvalidArgument(f + ": give prompt or prompt_text, not both");
    SetIds(in.Prompt(g->prompt_text(), f + ".prompt_text"), g->mutable_prompt());
    g->clear_prompt_text();
  }
  for (int k = 0; k < g->completions_size(); ++k) {
    auto* c = g->mutable_completions(k);
    if (c->text().empty()) continue;
    const std::string fc = Index(f + ".completions", k);
    if (!c->tokens().empty()) throw InvalidArgument(fc + ": give tokens or text, not both");
    SetIds(in.Encode(c->text(), false, fc + ".text"), c->mutable_tokens());
    c->clear_text();
  }
}

// A string field that holds text to tokenize or render.
bool IsTextField(const google::protobuf::FieldDescriptor* f) {
  const std::string& n = f->name();
  return n == "text" || n == "content" || n == "role" || n == "reasoning_content" || n == "text_prompts";
}

void CountText(const google::protobuf::Message& m, int64_t& charge, int64_t limit) {
  using google::protobuf::FieldDescriptor;
  if (m.GetDescriptor() == v1::ChatMessage::descriptor()) charge += kMessageCharge;
  const auto* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (charge > limit) return;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        CountText(r->GetMessage(m, f), charge, limit);
        continue;
      }
      const int n = r->FieldSize(m, f);
      for (int i = 0; i < n && charge <= limit; ++i) CountText(r->GetRepeatedMessage(m, f, i), charge, limit);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && IsTextField(f)) {
      if (!f->is_repeated()) {
        std::string scratch;
        charge += static_cast<int64_t>(r->GetStringReference(m, f, &scratch).size());
        continue;
      }
      const auto values = r->GetRepeatedFieldRef<std::string>(m, f);
      for (int i = 0; i < values.size(); ++i) charge += static_cast<int64_t>(values.Get(i).size());
    }
  }
}

}  // namespace

int64_t ChargeText(const google::protobuf::Message& request, const InputLimits& limits) {
  int64_t charge = 0;
  CountText(request, charge, limits.max_text_bytes);
  if (charge > limits.max_text_bytes) {
    throw ResourceExhausted("the request carries more than " + std::to_string(limits.max_text_bytes) +
                            " bytes of text (limits.max_text_bytes; each chat message counts " +
                            std::to_string(kMessageCharge) + " bytes beyond its text); split it into several calls");
  }
  return charge;
}

int64_t ChargeDetokenize(const v1::DetokenizeRequest& r, const InputLimits& limits) {
  TextInput in(limits);
  const auto& codec = in.codec();
  int64_t tokens = 0, bytes = 0;
  for (int i = 0; i < r.sequences_size(); ++i) {
    const auto& ids = r.sequences(i).tokens();
    tokens += ids.size();
    if (tokens > limits.max_tokens_per_request) {
      throw ResourceExhausted("the request has more than " + std::to_string(limits.max_tokens_per_request) +
                              " tokens (limits.max_tokens_per_request)");
    }
    for (int t = 0; t < ids.size(); ++t) {
      if (ids[t] < 0 || ids[t] >= limits.vocab_size) {
        throw InvalidArgument(Index("sequences", i) + ".tokens[" + std::to_string(t) + "] = " + std::to_string(ids[t]) +
                              " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
      }
      bytes += codec.token_bytes(ids[t]);
    }
    if (bytes > limits.max_text_bytes) {
      throw ResourceExhausted(Index("sequences", i) + ": the decoded text would be more than " +
                              std::to_string(limits.max_text_bytes) +
                              " bytes (limits.max_text_bytes); split the request into several calls");
    }
  }
  return bytes + 8 * tokens;
}

// A datum's text model input -> tokens (all but the last of its tokenization), target_tokens
// (the rest, unless given) and, for a conversation, loss_mask (its trained assistant turns, at
// the positions that predict them).
void ResolveDatum(v1::Datum* d, TextInput& in, const std::string& f) {
  auto* mi = d->mutable_model_input();
  if (!mi->has_text()) return;
  const std::string ft = f + ".model_input.text";
  if (!mi->tokens().empty()) throw InvalidArgument(f + ".model_input: give tokens or text, not both");
  const auto& t = mi->text();
  TextInput::OneForm(t, ft);
  std::vector<int64_t> ids, mask;
  if (!t.text().empty()) {
    ids = in.EncodeWithEos(t.text(), true, ft + ".text");
  } else {
    auto r = in.Render(in.Messages(t.messages(), ft + ".messages"), false,
                       !t.has_enable_thinking() || t.enable_thinking(), ft + ".messages");
    if (std::find(r.loss_mask.begin(), r.loss_mask.end(), 1) == r.loss_mask.end()) {
      throw InvalidArgument(ft + ".messages: no assistant message to train on (or every one has train = false)");
    }
    ids = std::move(r.ids);
    mask.assign(r.loss_mask.begin() + std::min<size_t>(1, r.loss_mask.size()), r.loss_mask.end());
  }
  if (ids.size() < 2) {
    throw InvalidArgument(ft + " tokenizes to " + std::to_string(ids.size()) +
                          " token(s); a datum needs at least 2 (the input and its last target)");
  }
  if (!mi->loss_mask().empty() && !mask.empty()) {
    throw InvalidArgument(f + ".model_input.loss_mask: a conversation sets its own (its trained assistant turns; "
                          "ChatMessage.train chooses them)");
  }
  SetIds(std::vector<int64_t>(ids.begin(), ids.end() - 1), mi->mutable_tokens());
  if (!mask.empty()) SetIds(mask, mi->mutable_loss_mask());
  mi->clear_text();
  auto& inputs = *d->mutable_loss_fn_inputs();
  if (!inputs.count("target_tokens")) {
    auto& targets = inputs["target_tokens"];
    for (size_t i = 1; i < ids.size(); ++i) targets.add_int_data(ids[i]);
    targets.add_shape(static_cast<int64_t>(ids.size()) - 1);
  }
}

bool HasText(const v1::Batch& batch) {
  for (const auto& d : batch.data().data()) {
    if (d.model_input().has_text()) return true;
  }
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

bool HasText(const v1::SampleRequest& r) { return !r.text_prompts().empty(); }

bool HasText(const v1::RolloutGroup& g) {
  if (g.has_prompt_text()) return true;
  for (const auto& c : g.completions()) {
    if (!c.text().empty()) return true;
  }
  return false;
}

void ResolveText(v1::Batch* batch, const InputLimits& limits) {
  TextInput in(limits);
  if (batch->has_sft()) {
    for (int i = 0; i < batch->sft().examples_size(); ++i) {
      ResolveSft(batch->mutable_sft()->mutable_examples(i), in, Index("batch.sft.examples", i));
    }
  } else if (batch->has_dpo()) {
    for (int i = 0; i < batch->dpo().pairs_size(); ++i) {
      ResolveDpo(batch->mutable_dpo()->mutable_pairs(i), in, Index("batch.dpo.pairs", i));
    }
  } else if (batch->has_grpo()) {
    for (int i = 0; i < batch->grpo().groups_size(); ++i) {
      ResolveGroup(batch->mutable_grpo()->mutable_groups(i), in, Index("batch.grpo.groups", i));
    }
  } else if (batch->has_data()) {
    for (int i = 0; i < batch->data().data_size(); ++i) {
      ResolveDatum(batch->mutable_data()->mutable_data(i), in, Index("batch.data.data", i));
    }
  }
}

void ResolveText(v1::SampleRequest* r, const InputLimits& limits) {
  if (r->text_prompts().empty()) return;
  if (!r->prompts().empty()) throw InvalidArgument("give prompts or text_prompts, not both");
  TextInput in(limits);
  for (int i = 0; i < r->text_prompts_size(); ++i) {
    SetIds(in.Prompt(r->text_prompts(i), Index("text_prompts", i)), r->add_prompts()->mutable_tokens());
  }
  r->clear_text_prompts();
}

void ResolveText(v1::RolloutGroup* g, const InputLimits& limits, const std::string& field) {
  TextInput in(limits);
  ResolveGroup(g, in, field);
}

v1::TokenizeResponse Tokenize(const v1::TokenizeRequest& r, const InputLimits& limits) {
  TextInput in(limits);
  in.codec();  // FailedPrecondition without a tokenizer, even for an empty request
  v1::TokenizeResponse out;
  for (int i = 0; i < r.inputs_size(); ++i) {
    const auto& t = r.inputs(i);
    const std::string f = Index("inputs", i);
    TextInput::OneForm(t, f);
    auto* o = out.add_outputs();
    if (!t.text().empty()) {
      SetIds(in.Encode(t.text(), r.add_special_tokens(), f + ".text"), o->mutable_ids());
    } else {
      auto rendered = in.Render(in.Messages(t.messages(), f + ".messages"), r.add_generation_prompt(),
                                !t.has_enable_thinking() || t.enable_thinking(), f + ".messages");
      SetIds(rendered.ids, o->mutable_ids());
      SetIds(std::vector<int64_t>(rendered.loss_mask.begin(), rendered.loss_mask.end()), o->mutable_loss_mask());
      o->set_text(std::move(rendered.text));
    }
  }
  if (r.has_batch()) {
    *out.mutable_batch() = r.batch();
    ResolveText(out.mutable_batch(), limits);
  }
  return out;
}

v1::DetokenizeResponse Detokenize(const v1::DetokenizeRequest& r, const InputLimits& limits) {
  TextInput in(limits);
  const auto& codec = in.codec();
  v1::DetokenizeResponse out;
  int64_t tokens = 0;
  for (int i = 0; i < r.sequences_size(); ++i) {
    const auto& ids = r.sequences(i).tokens();
    tokens += ids.size();
    if (tokens > limits.max_tokens_per_request) {
      throw ResourceExhausted("the request has more than " + std::to_string(limits.max_tokens_per_request) +
                              " tokens (limits.max_tokens_per_request)");
    }
    std::vector<int64_t> v(ids.begin(), ids.end());
    for (size_t t = 0; t < v.size(); ++t) {
      if (v[t] < 0 || v[t] >= limits.vocab_size) {
        throw InvalidArgument(Index("sequences", i) + ".tokens[" + std::to_string(t) + "] = " + std::to_string(v[t]) +
                              " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
      }
    }
    out.add_texts(codec.decode(v, r.skip_special_tokens()));
  }
  return out;
}

}  // namespace streambp::server
