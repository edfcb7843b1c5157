#include "convert.h"

#include <cmath>

#include "streambp/error.h"

namespace streambp::server {
namespace {

std::string Index(const std::string& base, int i) { return base + "[" + std::to_string(i) + "]"; }

class Converter {
 public:
  explicit Converter(const Limits& limits) : limits_(limits) {}

  std::vector<int64_t> Tokens(const google::protobuf::RepeatedField<int32_t>& ids, const std::string& field) {
    std::vector<int64_t> out(ids.begin(), ids.end());
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] < 0 || out[i] >= limits_.vocab_size) {
        throw InvalidArgument(field + "[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
                              " is outside the vocabulary [0, " + std::to_string(limits_.vocab_size) + ")");
      }
    }
    return out;
  }

  void Count(const Sequence& s, const std::string& field) {
    const int64_t n = s.tokens.size();
    if (n == 0) throw InvalidArgument(field + ": the sequence is empty");
    if (n > limits_.max_sequence_length) {
      throw InvalidArgument(field + ": " + std::to_string(n) + " tokens exceed the maximum sequence length " +
                            std::to_string(limits_.max_sequence_length));
    }
    tokens_ += n;
    if (tokens_ > limits_.max_tokens_per_request) {
      throw ResourceExhausted("the batch has more than " + std::to_string(limits_.max_tokens_per_request) +
                              " tokens (limits.max_tokens_per_request); split it into several ForwardBackward "
                              "calls with a step-wide normalizer");
    }
  }

  static Sequence PromptCompletion(std::vector<int64_t> prompt, const std::vector<int64_t>& completion) {
    Sequence s;
    s.loss_mask.assign(prompt.size(), 0);
    s.tokens = std::move(prompt);
    s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
    s.loss_mask.resize(s.tokens.size(), 1);
    return s;
  }

  int64_t tokens() const { return tokens_; }

 private:
  const Limits& limits_;
  int64_t tokens_ = 0;
};

std::vector<double> Values(const google::protobuf::RepeatedField<float>& v, size_t prompt_len, size_t expected,
                           const std::string& field) {
  if (v.empty()) return {};
  if (static_cast<size_t>(v.size()) != expected) {
    throw InvalidArgument(field + " has " + std::to_string(v.size()) + " entries but the completion has " +
                          std::to_string(expected) + " tokens");
  }
  std::vector<double> out(prompt_len, 0.0);
  for (int i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) throw InvalidArgument(field + "[" + std::to_string(i) + "] is not finite");
    out.push_back(v[i]);
  }
  return out;
}

std::string KindName(v1::Batch::KindCase kind) {
  switch (kind) {
    case v1::Batch::kSft: return "sft";
    case v1::Batch::kDpo: return "dpo";
    case v1::Batch::kGrpo: return "grpo";
    default: return "";
  }
}

}  // namespace

EngineOptions ConvertEngine(const v1::EngineOptions& e, const EngineOptions& defaults) {
  EngineOptions o = defaults;
  if (!e.engine().empty()) o.kind = ParseEngine(e.engine());
  if (e.chunk() < 0) throw InvalidArgument("engine.chunk must be >= 0");
  if (e.logits_chunk() < 0) throw InvalidArgument("engine.logits_chunk must be >= 0 (0 = the server's default)");
  if (e.key_chunk() < 0) throw InvalidArgument("engine.key_chunk must be >= 0 (0 = the server's default)");
  if (e.chunk() > 0) o.chunk = e.chunk();
  if (e.key_chunk() > 0) o.key_chunk = e.key_chunk();
  if (e.logits_chunk() > 0) o.logits_chunk = e.logits_chunk();
  return o;
}

StepInput ConvertStep(const v1::Batch& batch, const std::string& objective, const v1::SftOptions* sft,
                      const v1::DpoOptions* dpo, const v1::GrpoOptions* grpo, const v1::EngineOptions& engine,
                      const EngineOptions& defaults, const Limits& limits) {
  StepInput in;
  Converter c(limits);
  const std::string kind = KindName(batch.kind_case());
  if (kind.empty()) throw InvalidArgument("batch is empty: set batch.sft, batch.dpo or batch.grpo");
  in.objective = objective.empty() ? kind : objective;
  // Options must match the batch kind.
  in.objective_options = nlohmann::json::object();
  if ((sft && kind != "sft") || (dpo && kind != "dpo") || (grpo && kind != "grpo")) {
    throw InvalidArgument(std::string("options.") + (sft ? "sft" : dpo ? "dpo" : "grpo") + " given for a " + kind +
                          " batch");
  }
  auto& o = in.objective_options;
  if (sft && sft->normalizer() != 0) o["normalizer"] = sft->normalizer();
  if (dpo) {
    if (dpo->has_beta()) o["beta"] = dpo->beta();
    if (!dpo->loss_type().empty()) o["loss_type"] = dpo->loss_type();
    if (dpo->has_label_smoothing()) o["label_smoothing"] = dpo->label_smoothing();
    if (dpo->normalizer() != 0) o["normalizer"] = dpo->normalizer();
  }
  if (grpo) {
    if (grpo->has_beta()) o["beta"] = grpo->beta();
    if (grpo->has_epsilon_low()) o["epsilon_low"] = grpo->epsilon_low();
    if (grpo->has_epsilon_high()) o["epsilon_high"] = grpo->epsilon_high();
    if (!grpo->loss_type().empty()) o["loss_type"] = grpo->loss_type();
    if (!grpo->scale_rewards().empty()) o["scale_rewards"] = grpo->scale_rewards();
    if (!grpo->importance_sampling_level().empty()) o["importance_sampling_level"] = grpo->importance_sampling_level();
    if (grpo->has_temperature()) o["temperature"] = grpo->temperature();
    if (!grpo->old_logprobs().empty()) o["old_logprobs"] = grpo->old_logprobs();
    if (grpo->has_tis_cap()) o["tis_cap"] = grpo->tis_cap();
    if (grpo->max_completion_length() != 0) o["max_completion_length"] = grpo->max_completion_length();
    if (grpo->normalizer() != 0) o["normalizer"] = grpo->normalizer();
  }
  in.engine = ConvertEngine(engine, defaults);

  if (kind == "sft") {
    const auto& examples = batch.sft().examples();
    if (examples.empty()) throw InvalidArgument("batch.sft.examples is empty");
    for (int i = 0; i < examples.size(); ++i) {
      const auto& e = examples[i];
      const std::string f = Index("batch.sft.examples", i);
      Sequence s;
      if (!e.tokens().empty()) {
        if (!e.prompt().empty() || !e.completion().empty()) {
          throw InvalidArgument(f + ": give tokens, or prompt and completion, not both");
        }
        s.tokens = c.Tokens(e.tokens(), f + ".tokens");
        if (!e.loss_mask().empty()) {
          if (e.loss_mask_size() != e.tokens_size()) {
            throw InvalidArgument(f + ".loss_mask has " + std::to_string(e.loss_mask_size()) +
                                  " entries but tokens has " + std::to_string(e.tokens_size()));
          }
          for (int t = 0; t < e.loss_mask_size(); ++t) {
            if (e.loss_mask(t) != 0 && e.loss_mask(t) != 1) {
              throw InvalidArgument(f + ".loss_mask[" + std::to_string(t) + "] must be 0 or 1");
            }
            s.loss_mask.push_back(static_cast<uint8_t>(e.loss_mask(t)));
          }
        }
      } else {
        if (e.completion().empty()) throw InvalidArgument(f + ": tokens (or prompt and completion) is empty");
        s = Converter::PromptCompletion(c.Tokens(e.prompt(), f + ".prompt"), c.Tokens(e.completion(), f + ".completion"));
      }
      c.Count(s, f);
      in.sequences.push_back(std::move(s));
    }
  } else if (kind == "dpo") {
    const auto& pairs = batch.dpo().pairs();
    if (pairs.empty()) throw InvalidArgument("batch.dpo.pairs is empty");
    for (int i = 0; i < pairs.size(); ++i) {
      const auto& p = pairs[i];
      const std::string f = Index("batch.dpo.pairs", i);
      if (p.prompt().empty()) throw InvalidArgument(f + ".prompt is empty");
      if (p.chosen().empty()) throw InvalidArgument(f + ".chosen is empty");
      if (p.rejected().empty()) throw InvalidArgument(f + ".rejected is empty");
      if (p.has_ref_chosen_logp() != p.has_ref_rejected_logp()) {
        throw InvalidArgument(f + ": give both ref_chosen_logp and ref_rejected_logp, or neither");
      }
      auto prompt = c.Tokens(p.prompt(), f + ".prompt");
      const std::vector<int64_t> completions[2] = {c.Tokens(p.chosen(), f + ".chosen"),
                                                   c.Tokens(p.rejected(), f + ".rejected")};
      for (int role = 0; role < 2; ++role) {
        Sequence s = Converter::PromptCompletion(prompt, completions[role]);
        s.group = i;
        s.role = role;
        if (p.has_ref_chosen_logp()) {
          const double ref = role == 0 ? p.ref_chosen_logp() : p.ref_rejected_logp();
          if (!std::isfinite(ref)) throw InvalidArgument(f + (role == 0 ? ".ref_chosen_logp" : ".ref_rejected_logp") + " is not finite");
          s.ref_logp = ref;
        }
        c.Count(s, f + (role == 0 ? ".chosen" : ".rejected"));
        in.sequences.push_back(std::move(s));
      }
    }
  } else {
    const auto& groups = batch.grpo().groups();
    if (groups.empty()) throw InvalidArgument("batch.grpo.groups is empty");
    for (int g = 0; g < groups.size(); ++g) {
      const auto& group = groups[g];
      const std::string f = Index("batch.grpo.groups", g);
      if (group.prompt().empty()) throw InvalidArgument(f + ".prompt is empty");
      if (group.completions().empty()) throw InvalidArgument(f + ".completions is empty");
      auto prompt = c.Tokens(group.prompt(), f + ".prompt");
      for (int k = 0; k < group.completions_size(); ++k) {
        const auto& comp = group.completions(k);
        const std::string fc = Index(f + ".completions", k);
        if (comp.tokens().empty()) throw InvalidArgument(fc + ".tokens is empty");
        if (!std::isfinite(comp.reward())) throw InvalidArgument(fc + ".reward is not finite");
        Sequence s = Converter::PromptCompletion(prompt, c.Tokens(comp.tokens(), fc + ".tokens"));
        s.group = g;
        s.reward = comp.reward();
        s.sampler_logprobs = Values(comp.logprobs(), prompt.size(), comp.tokens_size(), fc + ".logprobs");
        s.advantages = Values(comp.advantages(), prompt.size(), comp.tokens_size(), fc + ".advantages");
        c.Count(s, fc);
        in.sequences.push_back(std::move(s));
      }
      in.group_ids.push_back(group.group_id());
    }
  }
  in.tokens = c.tokens();
  return in;
}

std::vector<Sequence> ConvertSequences(const google::protobuf::RepeatedPtrField<v1::TokenSequence>& seqs,
                                       const Limits& limits) {
  if (seqs.empty()) throw InvalidArgument("sequences is empty");
  Converter c(limits);
  std::vector<Sequence> out;
  for (int i = 0; i < seqs.size(); ++i) {
    Sequence s;
    s.tokens = c.Tokens(seqs[i].tokens(), Index("sequences", i) + ".tokens");
    c.Count(s, Index("sequences", i));
    out.push_back(std::move(s));
  }
  return out;
}

void ValidateCheckpointName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 128 && name != "." && name != "..";
  for (char ch : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-');
  }
  if (!ok) {
    throw InvalidArgument("checkpoint name '" + name.substr(0, 200) +
                          "' is not allowed: use letters, digits, '.', '_' and '-' (a name inside the server's "
                          "checkpoint directory, never a path)");
  }
}

}  // namespace streambp::server
