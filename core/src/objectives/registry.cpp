// The objective registry, and each built-in objective's options as one table (key, type,
// default, help, and the struct member it sets): the JSON reader below, the server's proto
// converter and the tools all read options through it.
#include <functional>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "streambp/error.h"
#include "streambp/objective.h"
#include "common.h"

namespace streambp {
namespace {

using Type = ObjectiveOption::Type;

struct Registered {
  ObjectiveFactory factory = nullptr;
  std::vector<ObjectiveOption> schema;
  std::string batch_kind;
  std::vector<ObjectiveInput> inputs;
};

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Registered>& Registry() {
  static std::map<std::string, Registered> r;
  return r;
}

std::string Text(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

// One option of an options struct O: its schema, how it is read into O, and its default.
template <class O>
struct Field {
  ObjectiveOption spec;
  std::function<void(objectives::OptionReader&, O&)> read;
  std::function<std::string(const O&)> text;
};

template <class O>
Field<O> Number(const char* key, double O::*m, const char* help) {
  return {ObjectiveOption{key, Type::kNumber, {}, "", help},
          [key, m](objectives::OptionReader& r, O& o) { o.*m = r.number(key, o.*m); },
          [m](const O& o) { return Text(o.*m); }};
}

template <class O>
Field<O> Bool(const char* key, bool O::*m, const char* help) {
  return {ObjectiveOption{key, Type::kBool, {}, "", help},
          [key, m](objectives::OptionReader& r, O& o) { o.*m = r.boolean(key, o.*m); },
          [m](const O& o) { return std::string(o.*m ? "true" : "false"); }};
}

template <class O>
Field<O> Choice(const char* key, std::string O::*m, std::vector<std::string> choices, const char* help) {
  return {ObjectiveOption{key, Type::kChoice, choices, "", help},
          [key, m, choices](objectives::OptionReader& r, O& o) { o.*m = r.choice(key, o.*m, choices); },
          [m](const O& o) { return o.*m; }};
}

template <class O>
std::vector<ObjectiveOption> Schema(const std::vector<Field<O>>& fields) {
  const O defaults{};
  std::vector<ObjectiveOption> out;
  for (const auto& f : fields) {
    out.push_back(f.spec);
    out.back().default_value = f.text(defaults);
  }
  return out;
}

template <class O>
O Read(const std::string& objective, const nlohmann::json& options, const std::vector<Field<O>>& fields) {
  objectives::OptionReader r(objective, options);
  O o;
  for (const auto& f : fields) f.read(r, o);
  r.done();
  return o;
}

const std::vector<Field<SftOptions>>& SftFields() {
  static const std::vector<Field<SftOptions>> f = {
      Number("normalizer", &SftOptions::normalizer,
             "selected target tokens of the whole step when it spans several calls; 0 = this call's"),
  };
  return f;
}

const std::vector<Field<DpoOptions>>& DpoFields() {
  static const std::vector<Field<DpoOptions>> f = {
      Number("beta", &DpoOptions::beta, "inverse temperature of the implicit reward"),
      Choice("loss_type", &DpoOptions::loss_type, {"sigmoid", "ipo", "hinge", "robust"}, "the DPO loss"),
      Number("label_smoothing", &DpoOptions::label_smoothing, "sigmoid and robust: assumed label noise in [0, 0.5)"),
      Number("normalizer", &DpoOptions::normalizer, "pairs of the whole step; 0 = this call's pairs"),
  };
  return f;
}

const std::vector<Field<GrpoOptions>>& GrpoFields() {
  static const std::vector<Field<GrpoOptions>> f = {
      Number("beta", &GrpoOptions::beta, "weight of the k3 KL to the reference (0: no reference needed)"),
      Number("epsilon_low", &GrpoOptions::epsilon_low, "lower clip of the ratio: 1 - epsilon_low"),
      Number("epsilon_high", &GrpoOptions::epsilon_high, "upper clip of the ratio: 1 + epsilon_high"),
      Choice("loss_type", &GrpoOptions::loss_type, {"grpo", "bnpo", "dr_grpo", "dapo"},
             "aggregation of the token losses"),
      Choice("scale_rewards", &GrpoOptions::scale_rewards, {"group", "batch", "none"}, "std used to scale advantages"),
      Choice("importance_sampling_level", &GrpoOptions::importance_sampling_level, {"token", "sequence"},
             "ratio per token, or per sequence (GSPO)"),
      Number("temperature", &GrpoOptions::temperature, "logits are divided by it (use the sampler's)"),
      Choice("old_logprobs", &GrpoOptions::old_logprobs, {"current", "sampler"}, "the denominator of the ratio"),
      Number("tis_cap", &GrpoOptions::tis_cap, "cap of the trainer/sampler importance weight; 0 = off"),
      Number("max_completion_length", &GrpoOptions::max_completion_length,
             "dr_grpo's fixed length; 0 = the longest completion of the step"),
      Number("normalizer", &GrpoOptions::normalizer, "replaces the denominator of the aggregation; 0 = computed"),
      Bool("entropy", &GrpoOptions::entropy, "report the mean token entropy (one softmax per chunk)"),
  };
  return f;
}

const std::vector<Field<WeightedLogprobsOptions>>& WeightedFields() {
  static const std::vector<Field<WeightedLogprobsOptions>> f = {
      Number("temperature", &WeightedLogprobsOptions::temperature, "log-probs of logits / temperature"),
  };
  return f;
}

// Tinker's losses (policy_losses.cpp): each its own defaults, Tinker's.
struct ClipOptions {
  double clip_low_threshold, clip_high_threshold;
};
struct PpoOptions : ClipOptions {
  PpoOptions() : ClipOptions{0.8, 1.2} {}
};
struct CispoOptions : ClipOptions {
  CispoOptions() : ClipOptions{0.0, 4.0} {}
};
struct DroOptions {
  double beta = 0.05;
};
struct NoOptions {};

template <class O>
std::vector<Field<O>> ClipFields() {
  return {Number("clip_low_threshold", static_cast<double O::*>(&ClipOptions::clip_low_threshold),
                 "lower bound of the clipped ratio exp(logp - sampler logp)"),
          Number("clip_high_threshold", static_cast<double O::*>(&ClipOptions::clip_high_threshold),
                 "upper bound of the clipped ratio")};
}
const std::vector<Field<PpoOptions>>& PpoFields() {
  static const auto f = ClipFields<PpoOptions>();
  return f;
}
const std::vector<Field<CispoOptions>>& CispoFields() {
  static const auto f = ClipFields<CispoOptions>();
  return f;
}
const std::vector<Field<DroOptions>>& DroFields() {
  static const std::vector<Field<DroOptions>> f = {
      Number("beta", &DroOptions::beta, "weight of the quadratic penalty on logp - sampler logp"),
  };
  return f;
}
const std::vector<Field<NoOptions>>& NoFields() {
  static const std::vector<Field<NoOptions>> f;
  return f;
}

template <const char* kName>
std::unique_ptr<Objective> CreatePolicyLoss(const nlohmann::json& options) {
  PolicyLossOptions o;
  o.loss = kName;
  const std::string name = kName;
  if (name == "ppo") {
    const auto read = Read(name, options, PpoFields());
    o.clip_low_threshold = read.clip_low_threshold;
    o.clip_high_threshold = read.clip_high_threshold;
  } else if (name == "cispo") {
    const auto read = Read(name, options, CispoFields());
    o.clip_low_threshold = read.clip_low_threshold;
    o.clip_high_threshold = read.clip_high_threshold;
  } else if (name == "dro") {
    o.beta = Read(name, options, DroFields()).beta;
  } else {
    Read(name, options, NoFields());
  }
  return MakePolicyLossObjective(o);
}
constexpr char kImportanceSampling[] = "importance_sampling", kPpo[] = "ppo", kCispo[] = "cispo", kDro[] = "dro",
               kCrossEntropy[] = "cross_entropy";

std::unique_ptr<Objective> CreateWeighted(const nlohmann::json& options) {
  return MakeWeightedLogprobsObjective(Read("weighted_logprobs", options, WeightedFields()));
}

std::unique_ptr<Objective> CreateSft(const nlohmann::json& options) {
  auto o = Read("sft", options, SftFields());
  if (o.normalizer < 0) throw InvalidArgument("sft: normalizer must be >= 0");
  return MakeSftObjective(o);
}

std::unique_ptr<Objective> CreateDpo(const nlohmann::json& options) {
  return MakeDpoObjective(Read("dpo", options, DpoFields()));
}

std::unique_ptr<Objective> CreateGrpo(const nlohmann::json& options) {
  return MakeGrpoObjective(Read("grpo", options, GrpoFields()));
}

}  // namespace

void RegisterObjective(const std::string& name, ObjectiveFactory factory, std::vector<ObjectiveOption> schema,
                       const std::string& batch_kind, std::vector<ObjectiveInput> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    if (in.name.empty() || in.name == "target_tokens") {
      throw InvalidArgument("objective '" + name + "': input " + std::to_string(i) + " needs a name other than "
                            "target_tokens (every datum has target tokens)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (inputs[j].name == in.name) throw InvalidArgument("objective '" + name + "': input '" + in.name + "' twice");
    }
  }
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[name] = Registered{factory, std::move(schema), batch_kind.empty() ? name : batch_kind, std::move(inputs)};
}

void RegisterBuiltinObjectives() {
  RegisterObjective("sft", &CreateSft, Schema(SftFields()));
  RegisterObjective("dpo", &CreateDpo, Schema(DpoFields()));
  RegisterObjective("grpo", &CreateGrpo, Schema(GrpoFields()));
  // Tinker's losses take data batches (Datum: target_tokens plus the inputs declared here)
  // under Tinker's names, and the typed batches that carry the same inputs: a GRPO batch's
  // completions (sampler log-probs and advantages), a weighted batch's weights (cross_entropy).
  using Target = ObjectiveInput::Target;
  const ObjectiveInput weights{"weights", Target::kTokenWeights, true, "w of each target token"};
  const std::vector<ObjectiveInput> policy = {
      {"logprobs", Target::kSamplerLogprobs, true, "the sampler's log-prob of each target token (<= 0)"},
      {"advantages", Target::kAdvantages, true, "the advantage of each target token"}};
  RegisterObjective("weighted_logprobs", &CreateWeighted, Schema(WeightedFields()), "weighted", {weights});
  RegisterObjective(kImportanceSampling, &CreatePolicyLoss<kImportanceSampling>, Schema(NoFields()), "grpo", policy);
  RegisterObjective(kPpo, &CreatePolicyLoss<kPpo>, Schema(PpoFields()), "grpo", policy);
  RegisterObjective(kCispo, &CreatePolicyLoss<kCispo>, Schema(CispoFields()), "grpo", policy);
  RegisterObjective(kDro, &CreatePolicyLoss<kDro>, Schema(DroFields()), "grpo", policy);
  ObjectiveInput candidate_weights{"weights", Target::kTokenWeights, false,
                                   "w of each target token (left out: 1); [N, K] with 2-D target_tokens (a teacher's "
                                   "top-k)"};
  candidate_weights.top_k = true;
  RegisterObjective(kCrossEntropy, &CreatePolicyLoss<kCrossEntropy>, Schema(NoFields()), "weighted",
                    {candidate_weights});
}

std::vector<std::string> ObjectiveNames() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  for (const auto& [name, r] : Registry()) names.push_back(name);
  return names;
}

namespace {
std::string KnownNames() {
  std::string known;
  for (const auto& n : ObjectiveNames()) known += (known.empty() ? "" : ", ") + n;
  return known;
}
}  // namespace

std::vector<ObjectiveOption> ObjectiveOptionSchema(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) return it->second.schema;
  }
  throw InvalidArgument("unknown objective '" + name + "' (known: " + KnownNames() + ")");
}

std::vector<ObjectiveInput> ObjectiveInputs(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) return it->second.inputs;
  }
  throw InvalidArgument("unknown objective '" + name + "' (known: " + KnownNames() + ")");
}

std::string ObjectiveBatchKind(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) return it->second.batch_kind;
  }
  throw InvalidArgument("unknown objective '" + name + "' (known: " + KnownNames() + ")");
}

std::unique_ptr<Objective> CreateObjective(const std::string& name, const nlohmann::json& options) {
  ObjectiveFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(name);
    if (it != Registry().end()) factory = it->second.factory;
  }
  if (factory == nullptr) throw InvalidArgument("unknown objective '" + name + "' (known: " + KnownNames() + ")");
  return factory(options);
}

}  // namespace streambp
