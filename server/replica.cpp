#include "replica.h"

#include <filesystem>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/safetensors.h"
#include "streambp/trainer.h"

namespace streambp::server {

using nlohmann::json;

json SequencesToJson(const std::vector<Sequence>& sequences) {
  json out = json::array();
  for (const auto& s : sequences) {
    json j{{"tokens", s.tokens}, {"loss_mask", s.loss_mask}, {"group", s.group}, {"role", s.role}, {"reward", s.reward}};
    if (s.ref_logp) j["ref_logp"] = *s.ref_logp;
    if (!s.sampler_logprobs.empty()) j["sampler_logprobs"] = s.sampler_logprobs;
    if (!s.advantages.empty()) j["advantages"] = s.advantages;
    if (!s.ref_logprobs.empty()) j["ref_logprobs"] = s.ref_logprobs;
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
    out.push_back(std::move(s));
  }
  return out;
}

void SendCommand(Communicator* comm, const json& command) {
  if (comm == nullptr || comm->world_size() == 1) return;
  const auto bytes = json::to_cbor(command);
  comm->broadcast_bytes(std::string(bytes.begin(), bytes.end()), 0);
}

int RunFollower(const ServerConfig& config, const DistOptions& dist) {
  RegisterBuiltinObjectives();
  const auto dtype = ParseDtype(config.model.dtype);
  CausalLM model = config.model.dir.empty() ? InitModel(PresetConfig(config.model.preset), config.model.seed, dtype)
                                            : LoadModel(config.model.dir, dtype, RankDevice(config.model.device, dist));
  model->to(RankDevice(config.model.device, dist));
  TrainerOptions topts = config.trainer;
  topts.max_sequence_length = config.limits.max_sequence_length;
  auto trainer = Trainer::Create(model, topts);
  DistOptions options = dist;
  if (options.backend.empty()) options.backend = RankDevice(config.model.device, dist).is_cuda() ? "nccl" : "gloo";
  auto comm = Communicator::Create(options);
  trainer->set_communicator(comm);

  // Health only, so that orchestration sees this rank is alive.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &port);
  auto health_server = builder.BuildAndStart();
  if (health_server) health_server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("rank {} of {} joined; following rank 0 (health on port {})", dist.rank, dist.world_size, port);

  int rc = 0;
  for (;;) {
    json cmd;
    try {
      const auto bytes = comm->broadcast_bytes("", 0);
      cmd = json::from_cbor(bytes);
    } catch (const std::exception& e) {
      spdlog::error("rank {}: lost rank 0: {}", dist.rank, e.what());
      rc = 1;
      break;
    }
    const std::string op = cmd.value("op", "");
    if (op == "ping") continue;
    if (op == "stop") break;
    try {
      if (op == "forward_backward" || op == "forward_backward_last" || op == "train_step") {
        const auto seqs = SequencesFromJson(cmd.at("sequences"));
        auto objective = CreateObjective(cmd.at("objective").get<std::string>(), cmd.at("options"));
        auto engine = EngineOptionsFromJson(cmd.at("engine"));
        if (op == "forward_backward") {
          trainer->forward_backward(seqs, *objective, &engine);
        } else if (op == "forward_backward_last") {
          trainer->forward_backward_last(seqs, *objective, &engine);
        } else {
          trainer->train_step(seqs, *objective, &engine);
        }
      } else if (op == "optim_step") {
        trainer->optim_step();
      } else if (op == "save") {
        trainer->save_checkpoint(cmd.at("dir").get<std::string>());
      } else if (op == "load") {
        trainer = Trainer::LoadCheckpoint(cmd.at("dir").get<std::string>(), &topts);
        trainer->set_communicator(comm);
      } else if (op == "zero_gradients") {
        trainer->zero_gradients();
      } else {
        spdlog::warn("rank {}: unknown command '{}'", dist.rank, op);
      }
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kUnavailable) {
        spdlog::error("rank {}: the process group broke: {}", dist.rank, e.what());
        rc = 1;
        break;
      }
      // Rank 0 ran the same call on the same input and got the same error (and answered it).
      spdlog::info("rank {}: {} refused: {}", dist.rank, op, e.what());
    } catch (const std::exception& e) {
      spdlog::warn("rank {}: {} failed: {}", dist.rank, op, e.what());
    }
  }
  if (rc == 0 && !config.checkpoint_dir.empty()) {
    std::filesystem::create_directories(config.checkpoint_dir);
    WriteSafetensors((std::filesystem::path(config.checkpoint_dir) / ("replica-" + std::to_string(dist.rank) + ".safetensors")).string(),
                     trainer->model()->hf_tensors(), {{"format", "pt"}});
  }
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  spdlog::info("rank {}: {}", dist.rank, rc == 0 ? "stopped by rank 0" : "exiting: the group is broken");
  return rc;
}

}  // namespace streambp::server
