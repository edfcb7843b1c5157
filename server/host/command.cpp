#include "command.h"

#include "streambp/error.h"
#include "streambp/objective.h"
#include "streambp/trainer.h"

namespace streambp::server {
namespace {

using nlohmann::json;

json SequencesToJson(const std::vector<Sequence>& sequences) {
  json out = json::array();
  for (const auto& s : sequences) {
    json j{{"tokens", s.tokens}, {"loss_mask", s.loss_mask}, {"group", s.group}, {"role", s.role}, {"reward", s.reward}};
    if (s.ref_logp) j["ref_logp"] = *s.ref_logp;
    if (!s.sampler_logprobs.empty()) j["sampler_logprobs"] = s.sampler_logprobs;
    if (!s.advantages.empty()) j["advantages"] = s.advantages;
    if (!s.ref_logprobs.empty()) j["ref_logprobs"] = s.ref_logprobs;
    if (!s.token_weights.empty()) j["token_weights"] = s.token_weights;
    if (!s.routed_experts.empty()) j["routed_experts"] = s.routed_experts;
    if (!s.inputs.empty()) j["inputs"] = s.inputs;
    if (s.top_k > 0) j["top_k"] = {{"k", s.top_k}, {"targets", s.top_k_targets}, {"weights", s.top_k_weights}};
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<Sequence> SequencesFromJson(const json& j) {
  std::vector<Sequence> out;
  for (const auto& e : j) {
    Sequence s;
    s.tokens = e.at("tokens").get<std::vector<int64_t>>();
    s.loss_mask = e.at("loss_mask").get<std::vector<uint8_t>>();
    s.group = e.at("group").get<int64_t>();
    s.role = e.at("role").get<int>();
    s.reward = e.at("reward").get<double>();
    if (e.contains("ref_logp")) s.ref_logp = e["ref_logp"].get<double>();
    if (e.contains("sampler_logprobs")) s.sampler_logprobs = e["sampler_logprobs"].get<std::vector<double>>();
    if (e.contains("advantages")) s.advantages = e["advantages"].get<std::vector<double>>();
    if (e.contains("ref_logprobs")) s.ref_logprobs = e["ref_logprobs"].get<std::vector<double>>();
    if (e.contains("token_weights")) s.token_weights = e["token_weights"].get<std::vector<double>>();
    if (e.contains("routed_experts")) s.routed_experts = e["routed_experts"].get<std::vector<int32_t>>();
    if (e.contains("inputs")) s.inputs = e["inputs"].get<std::map<std::string, std::vector<double>>>();
    if (e.contains("top_k")) {
      const auto& k = e["top_k"];
      s.top_k = k.at("k").get<int64_t>();
      s.top_k_targets = k.at("targets").get<std::vector<int64_t>>();
      s.top_k_weights = k.at("weights").get<std::vector<double>>();
    }
    out.push_back(std::move(s));
  }
  return out;
}

const char* StepKindName(StepKind k) {
  switch (k) {
    case StepKind::kForwardBackward: return "forward_backward";
    case StepKind::kForwardBackwardLast: return "forward_backward_last";
    case StepKind::kTrainStep: return "train_step";
  }
  return "?";
}

StepKind ParseStepKind(const std::string& name) {
  for (auto k : {StepKind::kForwardBackward, StepKind::kForwardBackwardLast, StepKind::kTrainStep}) {
    if (name == StepKindName(k)) return k;
  }
  throw InvalidArgument("unknown step kind '" + name + "'");
}

}  // namespace

std::string CommandName(const Command& command) {
  return std::visit(
      [](const auto& c) -> std::string {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, StepCommand>) return StepKindName(c.kind);
        if constexpr (std::is_same_v<T, OptimStepCommand>) return "optim_step";
        if constexpr (std::is_same_v<T, ZeroGradientsCommand>) return "zero_gradients";
        if constexpr (std::is_same_v<T, SaveCommand>) return "save";
        if constexpr (std::is_same_v<T, LoadCommand>) return "load";
        if constexpr (std::is_same_v<T, CreateSessionCommand>) return "create_session";
        if constexpr (std::is_same_v<T, RestoreSessionCommand>) return "restore_session";
        if constexpr (std::is_same_v<T, DropSessionCommand>) return "drop_session";
        if constexpr (std::is_same_v<T, PingCommand>) return "ping";
        return "stop";
      },
      command);
}

std::string EncodeCommand(const Command& command) {
  json j = std::visit(
      [](const auto& c) -> json {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, StepCommand>) {
          json j = {{"session", c.session},
                    {"sequences", SequencesToJson(c.sequences)},
                    {"objective", c.objective},
                    {"options", c.options},
                    {"engine", EngineOptionsToJson(c.engine)}};
          if (c.adam) j["adam"] = c.adam->ToJson();
          return j;
        } else if constexpr (std::is_same_v<T, SaveCommand> || std::is_same_v<T, LoadCommand>) {
          return {{"session", c.session}, {"dir", c.dir}};
        } else if constexpr (std::is_same_v<T, OptimStepCommand>) {
          json j = {{"session", c.session}};
          if (c.adam) j["adam"] = c.adam->ToJson();
          return j;
        } else if constexpr (std::is_same_v<T, ZeroGradientsCommand>) {
          return {{"session", c.session}};
        } else if constexpr (std::is_same_v<T, DropSessionCommand>) {
          return {{"session", c.session}, {"deleted", c.deleted}};
        } else if constexpr (std::is_same_v<T, CreateSessionCommand>) {
          return {{"spec", c.request.spec.ToJson()},
                  {"adapter_config_json", c.request.adapter_config_json},
                  {"adapter_safetensors", json::binary(std::vector<uint8_t>(c.request.adapter_safetensors.begin(),
                                                                            c.request.adapter_safetensors.end()))}};
        } else if constexpr (std::is_same_v<T, RestoreSessionCommand>) {
          return {{"spec", c.spec.ToJson()}, {"dir", c.dir}};
        } else {
          return json::object();
        }
      },
      command);
  j["op"] = CommandName(command);
  const auto bytes = json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

Command DecodeCommand(const std::string& bytes) {
  try {
    const json j = json::from_cbor(bytes);
    const std::string op = j.at("op").get<std::string>();
    if (op == "forward_backward" || op == "forward_backward_last" || op == "train_step") {
      StepCommand c;
      c.session = j.at("session").get<std::string>();
      c.kind = ParseStepKind(op);
      c.sequences = SequencesFromJson(j.at("sequences"));
      c.objective = j.at("objective").get<std::string>();
      c.options = j.at("options");
      c.engine = EngineOptionsFromJson(j.at("engine"));
      if (j.contains("adam")) c.adam = AdamStepParams::FromJson(j.at("adam"));
      return c;
    }
    if (op == "optim_step") {
      OptimStepCommand c{j.at("session").get<std::string>(), std::nullopt};
      if (j.contains("adam")) c.adam = AdamStepParams::FromJson(j.at("adam"));
      return c;
    }
    if (op == "zero_gradients") return ZeroGradientsCommand{j.at("session").get<std::string>()};
    if (op == "save") return SaveCommand{j.at("session").get<std::string>(), j.at("dir").get<std::string>()};
    if (op == "load") return LoadCommand{j.at("session").get<std::string>(), j.at("dir").get<std::string>()};
    if (op == "create_session") {
      CreateSessionCommand c;
      c.request.spec = SessionSpec::FromJson(j.at("spec"));
      c.request.adapter_config_json = j.at("adapter_config_json").get<std::string>();
      const auto& bin = j.at("adapter_safetensors").get_binary();
      c.request.adapter_safetensors.assign(bin.begin(), bin.end());
      return c;
    }
    if (op == "restore_session") {
      return RestoreSessionCommand{SessionSpec::FromJson(j.at("spec")), j.at("dir").get<std::string>()};
    }
    if (op == "drop_session") {
      return DropSessionCommand{j.at("session").get<std::string>(), j.value("deleted", false)};
    }
    if (op == "ping") return PingCommand{};
    if (op == "stop") return StopCommand{};
    throw InvalidArgument("unknown command '" + op + "'");
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("not an encoded command: ") + e.what());
  }
}

CommandResult Apply(Replica& replica, const Command& command, const ApplyHooks& hooks) {
  CommandResult r;
  std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, StepCommand>) {
          auto& trainer = replica.trainer(c.session);
          const auto objective = c.built ? c.built : std::shared_ptr<Objective>(CreateObjective(c.objective, c.options));
          EngineOptions engine = c.engine;
          engine.on_progress = hooks.on_progress;
          const StepPlan* plan = c.plan.get();
          if (c.kind == StepKind::kForwardBackward) {
            r.step = trainer.forward_backward(c.sequences, *objective, &engine, plan);
          } else {
            // kTrainStep is one command on the wire: the step's last forward-backward (its
            // backward starts the gradient sum over the ranks), then the optimizer step.
            r.step = trainer.forward_backward_last(c.sequences, *objective, &engine, plan);
            if (c.kind == StepKind::kTrainStep) {
              if (hooks.after_forward_backward) hooks.after_forward_backward(r.step);
              r.optim = trainer.optim_step(c.adam ? &*c.adam : nullptr);
            }
          }
        } else if constexpr (std::is_same_v<T, OptimStepCommand>) {
          r.optim = replica.trainer(c.session).optim_step(c.adam ? &*c.adam : nullptr);
        } else if constexpr (std::is_same_v<T, ZeroGradientsCommand>) {
          replica.trainer(c.session).zero_gradients();
        } else if constexpr (std::is_same_v<T, SaveCommand>) {
          replica.trainer(c.session).save_checkpoint(c.dir, c.side_files);
        } else if constexpr (std::is_same_v<T, LoadCommand>) {
          replica.load(c.session, c.dir);
        } else if constexpr (std::is_same_v<T, CreateSessionCommand>) {
          replica.create_session(c.request);
        } else if constexpr (std::is_same_v<T, RestoreSessionCommand>) {
          replica.restore_session(c.spec, c.dir);
        } else if constexpr (std::is_same_v<T, DropSessionCommand>) {
          replica.drop_session(c.session);
        }
      },
      command);
  return r;
}

}  // namespace streambp::server
