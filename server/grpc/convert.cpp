#include "convert.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "streambp/error.h"
#include "streambp/objective.h"
#include "rollout_input.h"
#include "streambp/runtime.h"
#include "text_input.h"

namespace streambp::server {
namespace {

using google::protobuf::FieldDescriptor;

std::string Index(const std::string& base, int i) { return base + "[" + std::to_string(i) + "]"; }

class Converter {
 public:
  explicit Converter(const InputLimits& limits) : limits_(limits) {}

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
    if (tokens_ + candidates_ > limits_.max_tokens_per_request) {
      throw ResourceExhausted("the request has more than " + std::to_string(limits_.max_tokens_per_request) +
                              " tokens (limits.max_tokens_per_request); split it into several calls (steps: with a "
                              "step-wide normalizer)");
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
  /// Charges `entries` more against limits.max_tokens_per_request (2-D targets' candidates).
  void Charge(int64_t entries, const std::string& field) {
    candidates_ += entries;
    if (tokens_ + candidates_ > limits_.max_tokens_per_request) {
      throw ResourceExhausted(field + ": the request has more than " + std::to_string(limits_.max_tokens_per_request) +
                              " tokens and top-k candidates (limits.max_tokens_per_request); split it into several "
                              "calls or give fewer candidates");
    }
  }
  int64_t vocab_size() const { return limits_.vocab_size; }

 private:
  const InputLimits& limits_;
  int64_t tokens_ = 0;
  int64_t candidates_ = 0;  // 2-D targets' candidates, charged as tokens
};

std::vector<double> Values(const google::protobuf::RepeatedField<float>& v, size_t prompt_len, size_t expected,
                           const std::string& field, bool logprobs) {
  if (v.empty()) return {};
  if (static_cast<size_t>(v.size()) != expected) {
    throw InvalidArgument(field + " has " + std::to_string(v.size()) + " entries but the completion has " +
                          std::to_string(expected) + " tokens");
  }
  std::vector<double> out(prompt_len, 0.0);
  for (int i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) throw InvalidArgument(field + "[" + std::to_string(i) + "] is not finite");
    if (logprobs && v[i] > 0) {
      throw InvalidArgument(field + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                            " is positive: a log-probability is <= 0");
    }
    out.push_back(v[i]);
  }
  return out;
}

std::string KindName(v1::Batch::KindCase kind) {
  switch (kind) {
    case v1::Batch::kSft: return "sft";
    case v1::Batch::kDpo: return "dpo";
    case v1::Batch::kGrpo: return "grpo";
    case v1::Batch::kWeighted: return "weighted";
    case v1::Batch::kData: return "data";
    default: return "";
  }
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// A per-token tensor of a datum: one dimension (or shape [N]) of N entries.
void CheckShape(const v1::TensorData& t, int64_t size, int64_t n, const std::string& field) {
  if (t.shape_size() > 1) {
    throw InvalidArgument(field + ".shape has " + std::to_string(t.shape_size()) +
                          " dimensions; this loss takes one value per input token (shape [" + std::to_string(n) +
                          "])");
  }
  if (t.shape_size() == 1 && t.shape(0) != size) {
    throw InvalidArgument(field + ".shape [" + std::to_string(t.shape(0)) + "] does not match its " +
                          std::to_string(size) + " values");
  }
  if (size != n) {
    throw InvalidArgument(field + " has " + std::to_string(size) + " values but model_input has " + std::to_string(n) +
                          " tokens (one per input token: entry t is about the token position t predicts; a text "
                          "model_input's tokens are what Tokenize with the batch shows)");
  }
}

// A datum with 2-D target_tokens [N, K]: K candidate tokens per position (a teacher's top-k,
// for distillation) with [N, K] weights, for a loss whose weights input declares top_k. The
// sequence is the input plus one more token (the last position's first candidate: it is read
// by no position that predicts), so that each of the N positions predicts.
void ConvertTopK(const v1::Datum& datum, const std::vector<ObjectiveInput>& declared, const std::string& objective,
                 const std::string& f, Converter& c, Sequence& s) {
  const std::string ft = f + ".loss_fn_inputs[target_tokens]";
  const auto& targets = datum.loss_fn_inputs().at("target_tokens");
  const int64_t n = s.tokens.size();
  const ObjectiveInput* weights = nullptr;
  for (const auto& d : declared) {
    if (d.top_k) weights = &d;
  }
  if (weights == nullptr) {
    throw InvalidArgument(ft + ".shape has 2 dimensions, but objective '" + objective + "' takes one target per "
                          "position (shape [" + std::to_string(n) + "]); 2-D targets (a teacher's top-k) are for "
                          "cross_entropy");
  }
  const int64_t rows = targets.shape(0), k = targets.shape(1);
  if (rows != n || k < 1) {
    throw InvalidArgument(ft + ".shape [" + std::to_string(rows) + ", " + std::to_string(k) + "] needs " +
                          std::to_string(n) + " rows (one per input token) of K >= 1 candidates");
  }
  if (k > c.vocab_size()) {
    throw InvalidArgument(ft + ".shape: K = " + std::to_string(k) + " candidates exceed the vocabulary of " +
                          std::to_string(c.vocab_size()));
  }
  if (targets.int_data_size() != n * k) {
    throw InvalidArgument(ft + " has " + std::to_string(targets.int_data_size()) + " values for shape [" +
                          std::to_string(n) + ", " + std::to_string(k) + "]");
  }
  // Every candidate is counted as a token against limits.max_tokens_per_request (it costs as
  // much to carry and to score).
  c.Charge(n * k, ft);
  for (const auto& d : declared) {
    if (&d != weights && d.required) {
      throw InvalidArgument(ft + " is 2-D, but objective '" + objective + "' also needs '" + d.name +
                            "', which has no 2-D form");
    }
  }
  const std::string fw = f + ".loss_fn_inputs[" + weights->name + "]";
  const auto it = datum.loss_fn_inputs().find(weights->name);
  if (it == datum.loss_fn_inputs().end()) {
    throw InvalidArgument(fw + " is missing (shape [" + std::to_string(n) + ", " + std::to_string(k) +
                          "], the weight of each candidate)");
  }
  const auto& w = it->second;
  if (w.int_data_size() > 0) throw InvalidArgument(fw + " holds numbers: give them as float_data");
  if (w.shape_size() != 2 || w.shape(0) != n || w.shape(1) != k || w.float_data_size() != n * k) {
    std::string shape;
    for (int d = 0; d < w.shape_size(); ++d) shape += (d ? ", " : "") + std::to_string(w.shape(d));
    throw InvalidArgument(fw + " has shape [" + shape + "] and " + std::to_string(w.float_data_size()) +
                          " values; with 2-D target_tokens it needs shape [" + std::to_string(n) + ", " +
                          std::to_string(k) + "] (the weight of each candidate)");
  }
  s.top_k = k;
  s.top_k_targets.assign(k, 0);  // token 0's: unused
  s.top_k_weights.assign(k, 0.0);
  for (int64_t e = 0; e < n * k; ++e) {
    std::string at = "[";  // built up: GCC 12 warns on "literal" + to_string() at -O3
    at += std::to_string(e / k) + "][" + std::to_string(e % k) + "]";
    const int64_t id = targets.int_data(e);
    if (id < 0 || id >= c.vocab_size()) {
      throw InvalidArgument(ft + at + " = " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size()) + ")");
    }
    const double v = w.float_data(e);
    if (!std::isfinite(v)) throw InvalidArgument(fw + at + " is not finite");
    s.top_k_targets.push_back(id);
    s.top_k_weights.push_back(v);
  }
  s.tokens.push_back(targets.int_data((n - 1) * k));
}

// A data batch (Tinker's Datum): the sequence is the input plus the last target, every
// per-token input lands in the Sequence field its objective declared, aligned as the typed
// batches align them (entry t + 1 = the value of target_tokens[t]; entry 0 unused).
void ConvertData(const v1::DatumBatch& batch, const std::string& objective, Converter& c, StepRequest* in) {
  const auto declared = ObjectiveInputs(objective);
  if (declared.empty()) {
    throw InvalidArgument("objective '" + objective + "' takes no data batch (it declares no loss_fn_inputs); use "
                          "batch." + ObjectiveBatchKind(objective));
  }
  std::vector<std::string> known{"target_tokens"};
  for (const auto& d : declared) known.push_back(d.name);
  if (batch.data().empty()) throw InvalidArgument("batch.data.data is empty");
  for (int i = 0; i < batch.data_size(); ++i) {
    const auto& datum = batch.data(i);
    const std::string f = Index("batch.data.data", i);
    const int64_t n = datum.model_input().tokens_size();
    if (n == 0) throw InvalidArgument(f + ".model_input.tokens is empty");
    for (const auto& [name, tensor] : datum.loss_fn_inputs()) {
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        throw InvalidArgument(f + ".loss_fn_inputs: unknown input '" + name + "' for objective '" + objective +
                              "' (it takes " + Join(known) + ")");
      }
    }
    const std::string ft = f + ".loss_fn_inputs[target_tokens]";
    const auto target_it = datum.loss_fn_inputs().find("target_tokens");
    if (target_it == datum.loss_fn_inputs().end()) throw InvalidArgument(ft + " is missing (int_data, one per token)");
    const auto& targets = target_it->second;
    if (targets.float_data_size() > 0) throw InvalidArgument(ft + " holds token ids: give them as int_data");
    Sequence s;
    s.tokens = c.Tokens(datum.model_input().tokens(), f + ".model_input.tokens");
    const auto& mask = datum.model_input().loss_mask();
    if (!mask.empty()) {
      // Sequence::loss_mask is per token of input + last target: entry t + 1 selects target t.
      if (mask.size() != n) {
        throw InvalidArgument(f + ".model_input.loss_mask has " + std::to_string(mask.size()) + " entries but "
                              "model_input has " + std::to_string(n) + " tokens (one per input token: entry t "
                              "selects the target position t predicts)");
      }
      s.loss_mask.assign(1, 0);
      for (int t = 0; t < mask.size(); ++t) {
        if (mask[t] != 0 && mask[t] != 1) {
          throw InvalidArgument(f + ".model_input.loss_mask[" + std::to_string(t) + "] = " + std::to_string(mask[t]) +
                                " must be 0 or 1");
        }
        s.loss_mask.push_back(static_cast<uint8_t>(mask[t]));
      }
    }
    if (targets.shape_size() == 2) {
      ConvertTopK(datum, declared, objective, f, c, s);
      c.Count(s, f);
      in->sequences.push_back(std::move(s));
      continue;
    }
    CheckShape(targets, targets.int_data_size(), n, ft);
    for (int64_t t = 0; t + 1 < n; ++t) {
      if (targets.int_data(t) != s.tokens[t + 1]) {
        throw InvalidArgument(ft + "[" + std::to_string(t) + "] = " + std::to_string(targets.int_data(t)) +
                              " is not the next input token " + std::to_string(s.tokens[t + 1]) +
                              ": the targets are the input shifted by one (target_tokens[t] = "
                              "model_input.tokens[t+1])");
      }
    }
    const int64_t last = targets.int_data(n - 1);
    if (last < 0 || last >= c.vocab_size()) {
      throw InvalidArgument(ft + "[" + std::to_string(n - 1) + "] = " + std::to_string(last) +
                            " is outside the vocabulary [0, " + std::to_string(c.vocab_size()) + ")");
    }
    s.tokens.push_back(last);
    for (const auto& d : declared) {
      const std::string fi = f + ".loss_fn_inputs[" + d.name + "]";
      const auto it = datum.loss_fn_inputs().find(d.name);
      if (it == datum.loss_fn_inputs().end()) {
        if (d.required) throw InvalidArgument(fi + " is missing (objective '" + objective + "' needs it)");
        // Optional weights left out: every target weighs 1 (the loss mask still selects).
        if (d.target == ObjectiveInput::Target::kTokenWeights) {
          s.token_weights.assign(n + 1, 1.0);
          s.token_weights[0] = 0.0;  // token 0: unused, as every per-token input's
        }
        continue;
      }
      const auto& tensor = it->second;
      if (tensor.int_data_size() > 0) throw InvalidArgument(fi + " holds numbers: give them as float_data");
      CheckShape(tensor, tensor.float_data_size(), n, fi);
      std::vector<double> values;
      values.reserve(n + 1);
      values.push_back(0.0);
      for (int64_t t = 0; t < n; ++t) {
        const double v = tensor.float_data(t);
        if (!std::isfinite(v)) throw InvalidArgument(fi + "[" + std::to_string(t) + "] is not finite");
        if (d.target == ObjectiveInput::Target::kSamplerLogprobs && v > 0) {
          throw InvalidArgument(fi + "[" + std::to_string(t) + "] = " + std::to_string(v) +
                                " is positive: a log-probability is <= 0");
        }
        values.push_back(v);
      }
      using Target = ObjectiveInput::Target;
      switch (d.target) {
        case Target::kTokenWeights: s.token_weights = std::move(values); break;
        case Target::kSamplerLogprobs: s.sampler_logprobs = std::move(values); break;
        case Target::kAdvantages: s.advantages = std::move(values); break;
        case Target::kRefLogprobs: s.ref_logprobs = std::move(values); break;
        case Target::kNamed: s.inputs[d.name] = std::move(values); break;
      }
    }
    c.Count(s, f);
    in->sequences.push_back(std::move(s));
  }
}

// The options message of each batch kind, and back.
std::string OptionsMessage(const std::string& kind) {
  if (kind == "sft") return "SftOptions";
  if (kind == "dpo") return "DpoOptions";
  if (kind == "grpo") return "GrpoOptions";
  return "WeightedOptions";
}
std::string OptionsKind(const std::string& message) {
  for (const char* kind : {"sft", "dpo", "grpo", "weighted"}) {
    if (OptionsMessage(kind) == message) return kind;
  }
  return message;
}

}  // namespace

nlohmann::json OptionsToJson(const google::protobuf::Message& options) {
  nlohmann::json out = nlohmann::json::object();
  const auto* d = options.GetDescriptor();
  const auto* r = options.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    if (f->is_repeated() || !r->HasField(options, f)) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_DOUBLE: out[f->name()] = r->GetDouble(options, f); break;
      case FieldDescriptor::CPPTYPE_FLOAT: out[f->name()] = r->GetFloat(options, f); break;
      case FieldDescriptor::CPPTYPE_BOOL: out[f->name()] = r->GetBool(options, f); break;
      case FieldDescriptor::CPPTYPE_STRING: out[f->name()] = r->GetString(options, f); break;
      case FieldDescriptor::CPPTYPE_INT32: out[f->name()] = r->GetInt32(options, f); break;
      case FieldDescriptor::CPPTYPE_INT64: out[f->name()] = r->GetInt64(options, f); break;
      default: throw InvalidArgument("options." + f->name() + " has a type the server cannot read");
    }
  }
  return out;
}

EngineRequest ConvertEngine(const v1::EngineOptions& e) {
  EngineRequest r{e.engine(), e.chunk(), e.logits_chunk(), e.key_chunk()};
  if (e.has_router_aux_loss_coef()) r.router_aux_loss_coef = e.router_aux_loss_coef();
  return r;
}

std::vector<int32_t> DecodeRoutedExperts(const v1::RoutedExperts& r, const InputLimits& limits,
                                         const std::string& field) {
  if (limits.sparse_layers == 0) {
    throw InvalidArgument(field + " is given, but this model has no mixture-of-experts layers to route");
  }
  if (r.sparse_layers() != limits.sparse_layers || r.experts_per_token() != limits.experts_per_token) {
    throw InvalidArgument(field + " is for " + std::to_string(r.sparse_layers()) + " sparse layers x " +
                          std::to_string(r.experts_per_token()) + " experts per token; this model routes " +
                          std::to_string(limits.sparse_layers) + " x " + std::to_string(limits.experts_per_token));
  }
  const int width = r.bytes_per_id();
  if (width != 1 && width != 2) {
    throw InvalidArgument(field + ".bytes_per_id must be 1 or 2, got " + std::to_string(width));
  }
  const std::string& bytes = r.ids();
  if (bytes.size() % static_cast<size_t>(width) != 0) {
    throw InvalidArgument(field + ".ids has " + std::to_string(bytes.size()) + " bytes, not a multiple of bytes_per_id " +
                          std::to_string(width));
  }
  std::vector<int32_t> out(bytes.size() / static_cast<size_t>(width));
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < out.size(); ++i) {  // little-endian, signed
    out[i] = width == 1 ? static_cast<int8_t>(b[i])
                        : static_cast<int16_t>(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
  }
  return out;
}

AdamStepParams ConvertAdam(const v1::AdamParams& a) {
  AdamStepParams p;
  if (a.has_learning_rate()) p.lr = a.learning_rate();
  if (a.has_beta1()) p.beta1 = a.beta1();
  if (a.has_beta2()) p.beta2 = a.beta2();
  if (a.has_eps()) p.eps = a.eps();
  if (a.has_weight_decay()) p.weight_decay = a.weight_decay();
  if (a.has_grad_clip_norm()) p.grad_clip_norm = a.grad_clip_norm();
  return p;
}

nlohmann::json ConfigToJson(const google::protobuf::Map<std::string, v1::ConfigValue>& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : config) {
    switch (value.value_case()) {
      case v1::ConfigValue::kNumber: out[key] = value.number(); break;
      case v1::ConfigValue::kText: out[key] = value.text(); break;
      case v1::ConfigValue::kFlag: out[key] = value.flag(); break;
      default: throw InvalidArgument("loss_fn_config[" + key + "] has no value (set number, text or flag)");
    }
  }
  return out;
}

StepRequest ConvertStep(const v1::Batch& given, const std::string& objective, const google::protobuf::Message* options,
                        const v1::EngineOptions& engine, const InputLimits& limits,
                        const google::protobuf::Map<std::string, v1::ConfigValue>* loss_fn_config) {
  std::optional<v1::Batch> resolved;  // text forms -> ids (a copy; only when there is text)
  if (HasText(given)) {
    resolved = given;
    ResolveText(&*resolved, limits);
  }
  const v1::Batch& batch = resolved ? *resolved : given;
  StepRequest in;
  Converter c(limits);
  const std::string kind = KindName(batch.kind_case());
  if (kind.empty()) {
    throw InvalidArgument("batch is empty: set batch.sft, batch.dpo, batch.grpo, batch.weighted or batch.data");
  }
  if (kind == "data" && objective.empty()) {
    throw InvalidArgument("objective is empty: a data batch needs the loss function by name (e.g. cross_entropy, ppo)");
  }
  in.objective = !objective.empty() ? objective : kind == "weighted" ? "weighted_logprobs" : kind;
  const std::string objective_kind = ObjectiveBatchKind(in.objective);  // unknown objective: refused
  if (kind != "data" && objective_kind != kind) {
    throw InvalidArgument("objective '" + in.objective + "' trains on " + objective_kind + " batches, but batch." +
                          kind + " was given");
  }
  if (loss_fn_config != nullptr && !loss_fn_config->empty()) {
    if (options != nullptr) {
      throw InvalidArgument("loss_fn_config and options." + OptionsKind(options->GetDescriptor()->name()) +
                            " are both given: give one");
    }
    in.objective_options = ConfigToJson(*loss_fn_config);
  }
  if (options != nullptr && kind == "data") {
    throw InvalidArgument("options." + OptionsKind(options->GetDescriptor()->name()) +
                          " given for a data batch: give its options as loss_fn_config");
  }
  if (options != nullptr) {
    const std::string options_message = options->GetDescriptor()->name();  // SftOptions, ...
    if (options_message != OptionsMessage(kind)) {
      throw InvalidArgument("options." + OptionsKind(options_message) + " given for a " + kind + " batch");
    }
    in.objective_options = OptionsToJson(*options);
  }
  in.engine = ConvertEngine(engine);

  if (kind == "data") {
    ConvertData(batch.data(), in.objective, c, &in);
  } else if (kind == "sft") {
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
          const std::string rf = f + (role == 0 ? ".ref_chosen_logp" : ".ref_rejected_logp");
          if (!std::isfinite(ref)) throw InvalidArgument(rf + " is not finite");
          if (ref > 0) throw InvalidArgument(rf + " is positive: a log-probability is <= 0");
          s.ref_logp = ref;
        }
        c.Count(s, f + (role == 0 ? ".chosen" : ".rejected"));
        in.sequences.push_back(std::move(s));
      }
    }
  } else if (kind == "weighted") {
    const auto& w = batch.weighted();
    if (w.sequences().empty()) throw InvalidArgument("batch.weighted.sequences is empty");
    if (w.has_policy_version()) {
      if (w.policy_version() < 0) throw InvalidArgument("batch.weighted.policy_version must be >= 0");
      in.weights_policy_version = w.policy_version();
    }
    for (int i = 0; i < w.sequences_size(); ++i) {
      const auto& ws = w.sequences(i);
      const std::string f = Index("batch.weighted.sequences", i);
      Sequence s;
      s.tokens = c.Tokens(ws.tokens(), f + ".tokens");
      if (s.tokens.size() < 2) throw InvalidArgument(f + ".tokens needs at least 2 tokens");
      if (static_cast<size_t>(ws.weights_size()) + 1 != s.tokens.size()) {
        throw InvalidArgument(f + ".weights has " + std::to_string(ws.weights_size()) + " entries; it needs " +
                              std::to_string(s.tokens.size() - 1) + " (one per token after the first, as "
                              "ComputeLogprobs returns log-probs)");
      }
      s.token_weights.reserve(s.tokens.size());
      s.token_weights.push_back(0.0);
      for (int t = 0; t < ws.weights_size(); ++t) {
        if (!std::isfinite(ws.weights(t))) {
          throw InvalidArgument(f + ".weights[" + std::to_string(t) + "] is not finite");
        }
        s.token_weights.push_back(ws.weights(t));
      }
      c.Count(s, f);
      in.sequences.push_back(std::move(s));
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
        s.sampler_logprobs = Values(comp.logprobs(), prompt.size(), comp.tokens_size(), fc + ".logprobs", true);
        s.advantages = Values(comp.advantages(), prompt.size(), comp.tokens_size(), fc + ".advantages", false);
        if (comp.has_routed_experts()) {
          s.routed_experts = DecodeRoutedExperts(comp.routed_experts(), limits, fc + ".routed_experts");
          CheckRoutedExperts(s.routed_experts, s.tokens.size(), limits, fc + ".routed_experts");
        }
        c.Count(s, fc);
        in.sequences.push_back(std::move(s));
      }
    }
  }
  in.tokens = c.tokens();
  return in;
}

LogprobsRequest ConvertLogprobs(const v1::ComputeLogprobsRequest& r, const InputLimits& limits) {
  if (r.sequences().empty()) throw InvalidArgument("sequences is empty");
  Converter c(limits);
  LogprobsRequest out;
  for (int i = 0; i < r.sequences_size(); ++i) {
    Sequence s;
    s.tokens = c.Tokens(r.sequences(i).tokens(), Index("sequences", i) + ".tokens");
    c.Count(s, Index("sequences", i));
    out.sequences.push_back(std::move(s));
  }
  out.reference = r.reference();
  out.temperature = r.has_temperature() ? r.temperature() : 1.0;
  out.fp64 = r.fp64();
  constexpr int64_t kMaxTopK = 20;
  const int64_t k = r.top_k();
  if (k < 0 || k > kMaxTopK || k > limits.vocab_size) {
    throw InvalidArgument("top_k = " + std::to_string(k) + " must be in [0, " +
                          std::to_string(std::min(kMaxTopK, limits.vocab_size)) + "]");
  }
  if (k > 0 && r.reference()) throw InvalidArgument("top_k is for the policy: give reference = false");
  if (k > 0 && c.tokens() * k > limits.max_tokens_per_request) {
    throw ResourceExhausted("tokens x top_k = " + std::to_string(c.tokens()) + " x " + std::to_string(k) +
                            " exceeds limits.max_tokens_per_request " +
                            std::to_string(limits.max_tokens_per_request) + "; ask for fewer tokens per call");
  }
  out.top_k = k;
  return out;
}

SampleRequest ConvertSample(const v1::SampleRequest& given, const InputLimits& limits) {
  std::optional<v1::SampleRequest> resolved;
  if (HasText(given)) {
    resolved = given;
    ResolveText(&*resolved, limits);
  }
  const v1::SampleRequest& r = resolved ? *resolved : given;
  if (r.prompts().empty()) throw InvalidArgument("prompts is empty: give prompts (ids) or text_prompts");
  Converter c(limits);
  SampleRequest out;
  for (int i = 0; i < r.prompts_size(); ++i) {
    Sequence s;
    s.tokens = c.Tokens(r.prompts(i).tokens(), Index("prompts", i) + ".tokens");
    c.Count(s, Index("prompts", i));
    out.prompts.push_back(std::move(s.tokens));
  }
  auto& o = out.options;
  o.n = r.n() > 0 ? r.n() : (r.n() == 0 ? 1 : r.n());
  o.temperature = r.has_temperature() ? r.temperature() : 1.0;
  o.top_p = r.has_top_p() ? r.top_p() : 1.0;
  o.max_tokens = r.max_tokens();
  o.stop_tokens.assign(r.stop_tokens().begin(), r.stop_tokens().end());
  o.seed = r.has_seed() ? r.seed() : std::random_device{}();
  out.ignore_eos = r.ignore_eos();
  o.record_routing = r.return_routed_experts();
  out.decode_text = limits.text != nullptr;
  return out;
}

PushItem ConvertRolloutGroup(const v1::RolloutGroup& given, int index, const std::string& session,
                             const InputLimits& limits, const std::string& field) {
  PushItem item;
  item.index = index;
  item.session = given.session().empty() ? session : given.session();
  std::optional<v1::RolloutGroup> resolved;
  if (HasText(given)) {
    try {
      ChargeText(given, limits);  // a stream's group is bounded like a request
      resolved = given;
      ResolveText(&*resolved, limits, field);
    } catch (const Cancelled&) {  // the call is gone or late: the whole call ends so
      throw;
    } catch (const DeadlineExceeded&) {
      throw;
    } catch (const Error& e) {  // answered as this group's invalid ack
      item.error = e.what();
      return item;
    }
  }
  const v1::RolloutGroup& g = resolved ? *resolved : given;
  RolloutGroup group;
  group.prompt.assign(g.prompt().begin(), g.prompt().end());
  group.policy_version = g.policy_version();
  group.group_id = g.group_id();
  for (int k = 0; k < g.completions_size(); ++k) {
    const auto& c = g.completions(k);
    RolloutCompletion rc;
    rc.tokens.assign(c.tokens().begin(), c.tokens().end());
    rc.reward = c.reward();
    rc.logprobs.assign(c.logprobs().begin(), c.logprobs().end());
    rc.advantages.assign(c.advantages().begin(), c.advantages().end());
    if (c.has_routed_experts()) {
      try {  // the rest of the checks come with the group's (RolloutSequences)
        rc.routed_experts = DecodeRoutedExperts(c.routed_experts(), limits,
                                                field + ".completions[" + std::to_string(k) + "].routed_experts");
      } catch (const InvalidArgument& e) {  // answered as this group's invalid ack
        item.error = e.what();
        return item;
      }
    }
    group.completions.push_back(std::move(rc));
  }
  item.group = std::move(group);
  return item;
}

}  // namespace streambp::server
