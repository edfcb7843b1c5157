#include "convert.h"
#include "converter.h"

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



// A GRPO group of a TrainStep batch and a pushed rollout group are the same thing on the
// wire (GrpoGroup, RolloutGroup: prompt and GrpoCompletions): both become a RolloutGroup
// here and training sequences in RolloutSequences (server/host/rollout_input.h), the one
// place that checks and aligns them. InvalidArgument for routing replay that does not decode.
template <class Group>
RolloutGroup ToRolloutGroup(const Group& g, const InputLimits& limits, const std::string& field) {
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
      rc.routed_experts = DecodeRoutedExperts(c.routed_experts(), limits, Index(field + ".completions", k) +
                                                                             ".routed_experts");
    }
    group.completions.push_back(std::move(rc));
  }
  return group;
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
      const std::string f = Index("batch.grpo.groups", g);
      auto sequences = RolloutSequences(ToRolloutGroup(groups[g], limits, f), g, limits, f);
      for (size_t k = 0; k < sequences.size(); ++k) {
        c.Count(sequences[k], Index(f + ".completions", static_cast<int>(k)));
        in.sequences.push_back(std::move(sequences[k]));
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
  try {  // the rest of the checks come with the group's (RolloutSequences)
    group = ToRolloutGroup(g, limits, field);
  } catch (const InvalidArgument& e) {  // answered as this group's invalid ack
    item.error = e.what();
    return item;
  }
  item.group = std::move(group);
  return item;
}

}  // namespace streambp::server
