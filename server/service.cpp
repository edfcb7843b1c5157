// The streambp.v1.Trainer service (gRPC callback API) and the Server that hosts it.
// Handlers authorize, validate and convert on the gRPC thread, then hand the work to the
// device-owner thread; they never wait for training. Every answer is logged once.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <nlohmann/json.hpp>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "convert.h"
#include "metrics.h"
#include "replica.h"
#include "request_cache.h"
#include "rollouts.h"
#include "server.h"
#include "status.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/memory.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"
#include "streambp/safetensors.h"
#include "streambp/sampler.h"
#include "streambp/trainer.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "worker.h"

namespace streambp::server {

constexpr const char* kServiceName = "streambp.v1.Trainer";
constexpr const char* kServerVersion = "0.1.0";
constexpr int64_t kMaxWeightsChunk = 4 << 20;

namespace {

using Clock = std::chrono::steady_clock;

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : digest) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

std::string ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound(std::string("cannot read ") + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

enum class Access { kRead, kWrite };

}  // namespace

class PolicyWatcher;

// Policy versions for WatchPolicy: a short history (so a watcher that asks for versions
// since N gets the ones it missed) and the live watchers.
class PolicyHub {
 public:
  void publish(const v1::PolicyUpdate& update);
  /// Registers `w` and hands it the updates after `since` (at least the latest one).
  void subscribe(PolicyWatcher* w, int64_t since);
  void unsubscribe(PolicyWatcher* w);
  /// Ends every stream (shutdown).
  void close_all();

 private:
  std::mutex mutex_;
  std::deque<v1::PolicyUpdate> history_;
  std::set<PolicyWatcher*> watchers_;
  bool closed_ = false;
};

// One WatchPolicy stream: writes queued updates one at a time.
class PolicyWatcher final : public grpc::ServerWriteReactor<v1::PolicyUpdate> {
 public:
  explicit PolicyWatcher(PolicyHub* hub) : hub_(hub) {}
  void push(const v1::PolicyUpdate& u) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    pending_.push_back(u);
    if (!writing_) {
      writing_ = true;
      StartWrite(&pending_.front());
    }
  }
  void finish(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.pop_front();
    if (!ok || finished_) {
      writing_ = false;
      return;
    }
    if (!pending_.empty()) {
      StartWrite(&pending_.front());
    } else {
      writing_ = false;
    }
  }
  void OnCancel() override { finish(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (hub_) hub_->unsubscribe(this);
    delete this;
  }

 private:
  PolicyHub* hub_;
  std::mutex mutex_;
  std::deque<v1::PolicyUpdate> pending_;
  bool writing_ = false, finished_ = false;
};

void PolicyHub::publish(const v1::PolicyUpdate& update) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_.push_back(update);
  while (history_.size() > 256) history_.pop_front();
  for (auto* w : watchers_) w->push(update);
}

void PolicyHub::subscribe(PolicyWatcher* w, int64_t since) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) {
    w->finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    return;
  }
  watchers_.insert(w);
  bool sent = false;
  for (const auto& u : history_) {
    if (u.policy_version() > since) {
      w->push(u);
      sent = true;
    }
  }
  if (!sent && !history_.empty() && history_.back().policy_version() >= since) w->push(history_.back());
}

void PolicyHub::unsubscribe(PolicyWatcher* w) {
  std::lock_guard<std::mutex> lock(mutex_);
  watchers_.erase(w);
}

void PolicyHub::close_all() {
  std::set<PolicyWatcher*> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    all = watchers_;
  }
  for (auto* w : all) w->finish(grpc::Status::OK);
}

struct ServerState {
  ServerConfig config;
  torch::Dtype dtype = torch::kFloat32;
  std::unique_ptr<Trainer> trainer;  // touched only on the worker thread (and at shutdown)
  std::unique_ptr<DeviceWorker> worker;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<grpc::Service> service;
  RequestCache cache{4096};
  Limits limits;
  EngineOptions default_engine;
  v1::GetInfoResponse info;  // the parts that do not change
  std::atomic<int64_t> step{0}, version{0}, pending{0};
  std::atomic<bool> draining{false};
  std::mutex shutdown_mutex;
  std::condition_variable shutdown_cv;
  bool shut_down = false;
  std::string shutdown_checkpoint;
  std::string bound_address;
  std::unique_ptr<Metrics> metrics;  // null when config.metrics.listen is empty
  std::unique_ptr<RolloutQueue> rollouts;
  PolicyHub hub;
  std::shared_ptr<Communicator> comm;  // data parallel: rank 0's process group (null: one process)
  std::atomic<bool> broken{false};     // a rank is gone: every call answers UNAVAILABLE
  std::string broken_reason;
  std::thread heartbeat;
  std::mutex heartbeat_mutex;
  std::condition_variable heartbeat_cv;

  // Rank 0: the other ranks run the same Trainer call (see replica.h).
  void send(const nlohmann::json& command) { SendCommand(comm.get(), command); }
  nlohmann::json step_command(const char* op, const std::vector<Sequence>& seqs, const std::string& objective,
                              const nlohmann::json& options, const EngineOptions& engine) const {
    return {{"op", op}, {"sequences", SequencesToJson(seqs)}, {"objective", objective}, {"options", options},
            {"engine", EngineOptionsToJson(engine)}};
  }
  void mark_broken(const std::string& reason) {
    if (broken.exchange(true)) return;
    broken_reason = reason;
    spdlog::error("the process group is broken; answering UNAVAILABLE from now on: {}", reason);
    if (grpc_server) {
      if (auto* health = grpc_server->GetHealthCheckService()) health->SetServingStatus(false);
    }
  }
  std::atomic<bool> rollout_step_scheduled{false};
  std::atomic<int64_t> invalid_groups{0}, dropped_since_update{0};

  // A new policy version for the watchers (on the device thread).
  void announce(const std::string& source, const StepResult* forward, int64_t groups_consumed) {
    v1::PolicyUpdate u;
    u.set_policy_version(trainer->policy_version());
    u.set_step(trainer->step());
    u.set_source(source);
    if (forward) {
      u.set_loss(forward->loss);
      u.set_tokens(forward->tokens);
      auto get = [&](const char* k) { auto it = forward->metrics.find(k); return it == forward->metrics.end() ? 0.0 : it->second; };
      u.set_reward_mean(get("reward_mean"));
      u.set_kl(get("kl"));
      u.set_clip_fraction(get("clip_ratio/region_mean"));
      for (const auto& [k, v] : forward->metrics) (*u.mutable_metrics())[k] = v;
    }
    u.set_groups_consumed(groups_consumed);
    u.set_groups_dropped(dropped_since_update.exchange(0));
    hub.publish(u);
  }

  explicit ServerState(const ServerConfig& c) : config(c), cache(static_cast<size_t>(c.limits.request_id_cache)) {}

  void publish() {
    step = trainer->step();
    version = trainer->policy_version();
    pending = trainer->has_pending_gradients() ? 1 : 0;
  }

  void log_request(const std::string& method, const std::string& request_id, int64_t tokens, double seconds,
                   const grpc::Status& status) {
    if (metrics) metrics->ObserveRequest(method, CodeName(status.error_code()), seconds);
    const auto level = status.ok() ? spdlog::level::info : spdlog::level::warn;
    if (config.log.format == "json") {
      nlohmann::json j{{"event", "request"}, {"method", method}, {"request_id", request_id}, {"tokens", tokens},
                       {"ms", seconds * 1e3}, {"status", CodeName(status.error_code())}};
      if (!status.ok()) j["message"] = status.error_message();
      spdlog::log(level, "{}", j.dump());
    } else {
      spdlog::log(level, "{} id={} tokens={} {:.1f}ms {}{}", method, request_id.empty() ? "-" : request_id, tokens,
                  seconds * 1e3, CodeName(status.error_code()),
                  status.ok() ? "" : ": " + status.error_message());
    }
  }

  grpc::Status authorize(grpc::CallbackServerContext* ctx, Access access) const {
    const auto& auth = config.auth;
    if (auth.tokens.empty() && auth.read_only_tokens.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) {
      return {grpc::StatusCode::UNAUTHENTICATED, "missing credentials: send metadata 'authorization: Bearer <token>'"};
    }
    const std::string value(it->second.data(), it->second.size());
    const std::string prefix = "Bearer ";
    if (value.rfind(prefix, 0) != 0) {
      return {grpc::StatusCode::UNAUTHENTICATED, "the authorization metadata must be 'Bearer <token>'"};
    }
    const std::string token = value.substr(prefix.size());
    bool full = false, read_only = false;
    for (const auto& t : auth.tokens) full = full || ConstantTimeEqual(t, token);
    for (const auto& t : auth.read_only_tokens) read_only = read_only || ConstantTimeEqual(t, token);
    if (full) return grpc::Status::OK;
    if (read_only) {
      if (access == Access::kRead) return grpc::Status::OK;
      return {grpc::StatusCode::PERMISSION_DENIED, "this token is read-only: it cannot change the model"};
    }
    return {grpc::StatusCode::UNAUTHENTICATED, "invalid token"};
  }

  // Refuses a step whose estimated peak does not fit the memory budget.
  void check_budget(const StepInput& in) const {
    const int64_t budget = config.limits.memory_budget_bytes;
    if (budget <= 0) return;
    int64_t longest = 0;
    for (const auto& s : in.sequences) longest = std::max<int64_t>(longest, s.tokens.size());
    const int64_t mb = config.trainer.micro_batch_tokens > 0 ? config.trainer.micro_batch_tokens : in.tokens;
    const int64_t rows = std::max<int64_t>(1, (std::min(mb, in.tokens) + longest - 1) / longest);
    const auto est = EstimateStepMemory(trainer_config(), dtype, rows, longest, in.engine, config.trainer.optimizer.name);
    if (est.total() > budget) {
      if (metrics) metrics->CountOomRefusal("estimate");
      throw ResourceExhausted("the step is estimated at " + std::to_string(est.total()) + " bytes (activations " +
                              std::to_string(est.activation_bytes) + ") but the memory budget is " +
                              std::to_string(budget) + " bytes; use the stream engine, smaller chunks, smaller "
                              "micro-batches (trainer.micro_batch_tokens) or shorter sequences");
    }
  }

  const ModelConfig& trainer_config() const { return model_config; }
  ModelConfig model_config;
};

namespace {

// Streams the weights file, one message at a time (OnWriteDone drives the next write).
class WeightsWriter final : public grpc::ServerWriteReactor<v1::WeightsChunk> {
 public:
  WeightsWriter(ServerState* state, int64_t chunk_bytes, Clock::time_point start)
      : state_(state), chunk_bytes_(chunk_bytes), start_(start) {}

  // Called by the device thread once the file is serialized.
  void start(std::shared_ptr<const std::string> bytes, int64_t version, std::string sha, std::string config_json) {
    bytes_ = std::move(bytes);
    version_ = version;
    sha_ = std::move(sha);
    config_json_ = std::move(config_json);
    next();
  }
  void fail(const grpc::Status& status) { finish(status); }
  void set_note(std::string note) { note_ = std::move(note); }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away during the export"));
      return;
    }
    next();
  }
  void OnDone() override { delete this; }

 private:
  void next() {
    const int64_t total = bytes_->size();
    if (done_) {
      finish(grpc::Status::OK);
      return;
    }
    const int64_t n = std::min(chunk_bytes_, total - offset_);
    chunk_.Clear();
    chunk_.set_policy_version(version_);
    chunk_.set_total_bytes(total);
    chunk_.set_offset(offset_);
    chunk_.set_data(bytes_->data() + offset_, n);
    if (offset_ == 0) chunk_.set_note(note_);
    offset_ += n;
    if (offset_ >= total) {
      chunk_.set_sha256(sha_);
      chunk_.set_config_json(config_json_);
      chunk_.set_last(true);
      done_ = true;
    }
    StartWrite(&chunk_);
  }
  void finish(const grpc::Status& status) {
    state_->log_request("ExportWeights", "", 0, std::chrono::duration<double>(Clock::now() - start_).count(), status);
    Finish(status);
  }

  ServerState* state_;
  int64_t chunk_bytes_;
  Clock::time_point start_;
  std::shared_ptr<const std::string> bytes_;
  int64_t version_ = 0, offset_ = 0;
  bool done_ = false;
  std::string sha_, config_json_, note_;
  v1::WeightsChunk chunk_;
};

class TrainerService final : public v1::Trainer::CallbackService {
 public:
  explicit TrainerService(ServerState* state) : s_(state) {}

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const v1::GetInfoRequest*,
                                    v1::GetInfoResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    const auto start = Clock::now();
    auto status = s_->authorize(ctx, Access::kRead);
    if (status.ok()) {
      *resp = s_->info;
      resp->set_policy_version(s_->version);
      resp->set_step(s_->step);
      resp->set_pending_micro_batches(s_->pending);
    }
    s_->log_request("GetInfo", "", 0, Seconds(start), status);
    reactor->Finish(status);
    return reactor;
  }

  grpc::ServerUnaryReactor* EstimateMemory(grpc::CallbackServerContext* ctx, const v1::EstimateMemoryRequest* req,
                                           v1::EstimateMemoryResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    const auto start = Clock::now();
    auto status = s_->authorize(ctx, Access::kRead);
    if (status.ok()) {
      try {
        if (req->seq_len() <= 0) throw InvalidArgument("seq_len must be > 0");
        if (req->batch() < 0) throw InvalidArgument("batch must be >= 0 (0 = 1 row)");
        const auto engine = ConvertEngine(req->engine(), s_->default_engine);
        const auto est = EstimateStepMemory(s_->model_config, s_->dtype, std::max<int64_t>(1, req->batch()),
                                            req->seq_len(), engine, s_->config.trainer.optimizer.name);
        resp->set_weights_bytes(est.weights_bytes);
        resp->set_gradient_bytes(est.gradient_bytes);
        resp->set_optimizer_bytes(est.optimizer_bytes);
        resp->set_activation_bytes(est.activation_bytes);
        resp->set_total_bytes(est.total());
        resp->set_budget_bytes(s_->config.limits.memory_budget_bytes);
        resp->set_fits(s_->config.limits.memory_budget_bytes <= 0 || est.total() <= s_->config.limits.memory_budget_bytes);
        resp->set_engine(EngineName(engine.kind));
        resp->set_chunk(est.chunk);
        resp->set_logits_chunk(est.logits_chunk);
        resp->set_key_chunk(engine.kind == EngineKind::kStream ? est.key_chunk : 0);
      } catch (...) {
        status = ToStatus(std::current_exception());
      }
    }
    s_->log_request("EstimateMemory", "", 0, Seconds(start), status);
    reactor->Finish(status);
    return reactor;
  }

  grpc::ServerUnaryReactor* ForwardBackward(grpc::CallbackServerContext* ctx, const v1::ForwardBackwardRequest* req,
                                            v1::ForwardBackwardResponse* resp) override {
    return Dispatch<v1::ForwardBackwardResponse>(ctx, "ForwardBackward", Access::kWrite, req->request_id(), resp,
                                                 [this, req](int64_t& tokens) {
      auto step = PrepareStep(*req, tokens);
      return [this, step](v1::ForwardBackwardResponse* r) {
        r->set_policy_version(s_->trainer->policy_version());
        RunForwardBackward(*step, r->mutable_stats(), /*last=*/false);
      };
    });
  }

  grpc::ServerUnaryReactor* TrainStep(grpc::CallbackServerContext* ctx, const v1::TrainStepRequest* req,
                                      v1::TrainStepResponse* resp) override {
    return Dispatch<v1::TrainStepResponse>(ctx, "TrainStep", Access::kWrite, req->request_id(), resp,
                                           [this, req](int64_t& tokens) {
      auto step = PrepareStep(*req, tokens);
      return [this, step](v1::TrainStepResponse* r) {
        // The step's last forward/backward: with several ranks, the gradient sum starts
        // during its backward and the optimizer step waits for it.
        const auto forward = RunForwardBackward(*step, r->mutable_stats(), /*last=*/true);
        RunOptimStep(r->mutable_optim());
        if (!r->optim().skipped()) s_->announce("train", &forward, 0);
      };
    });
  }

  grpc::ServerUnaryReactor* OptimStep(grpc::CallbackServerContext* ctx, const v1::OptimStepRequest* req,
                                      v1::OptimStepResponse* resp) override {
    return Dispatch<v1::OptimStepResponse>(ctx, "OptimStep", Access::kWrite, req->request_id(), resp,
                                           [this](int64_t&) {
      return [this](v1::OptimStepResponse* r) {
        RunOptimStep(r);
        if (!r->skipped()) s_->announce("train", nullptr, 0);
      };
    });
  }

  grpc::ServerUnaryReactor* ComputeLogprobs(grpc::CallbackServerContext* ctx, const v1::ComputeLogprobsRequest* req,
                                            v1::ComputeLogprobsResponse* resp) override {
    return Dispatch<v1::ComputeLogprobsResponse>(ctx, "ComputeLogprobs", Access::kRead, "", resp,
                                                 [this, req](int64_t& tokens) {
      auto seqs = std::make_shared<std::vector<Sequence>>(ConvertSequences(req->sequences(), s_->limits));
      for (const auto& s : *seqs) tokens += s.tokens.size();
      const double temperature = req->has_temperature() ? req->temperature() : 1.0;
      if (!(temperature > 0)) throw InvalidArgument("temperature must be > 0");
      const bool reference = req->reference();
      if (reference && !s_->config.trainer.reference.use_reference_model) {
        throw FailedPrecondition("the server has no reference model (trainer.reference.use_reference_model is false)");
      }
      return [this, seqs, temperature, reference](v1::ComputeLogprobsResponse* r) {
        auto batch = MakeBatch(*seqs, Layout::kPacked);
        CausalLM model = reference ? s_->trainer->reference_model() : s_->trainer->model();
        auto logp = TokenLogprobs(model, batch, s_->default_engine.logits_chunk > 0 ? s_->default_engine.logits_chunk
                                                                                     : kDefaultLogitsChunk,
                                  temperature);
        auto ids = batch.sequence_ids;
        for (size_t i = 0; i < seqs->size(); ++i) {
          auto where = (ids == static_cast<int64_t>(i)).nonzero();
          const int64_t row = where[0][0].item<int64_t>(), start = where[0][1].item<int64_t>();
          auto values = logp[row].slice(0, start, start + (*seqs)[i].tokens.size() - 1).to(torch::kFloat32).contiguous();
          auto* out = r->add_sequences()->mutable_logprobs();
          out->Add(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
        }
        r->set_policy_version(s_->trainer->policy_version());
      };
    });
  }

  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* ctx, const v1::SaveCheckpointRequest* req,
                                           v1::SaveCheckpointResponse* resp) override {
    return Dispatch<v1::SaveCheckpointResponse>(ctx, "SaveCheckpoint", Access::kWrite, req->request_id(), resp,
                                                [this, req](int64_t&) {
      RequireCheckpointDir();
      std::string name = req->name();
      if (!name.empty()) ValidateCheckpointName(name);
      return [this, name](v1::SaveCheckpointResponse* r) {
        if (s_->trainer->has_pending_gradients()) {
          throw FailedPrecondition("gradients are pending: call OptimStep (or TrainStep) before saving a checkpoint");
        }
        const std::string n = name.empty() ? "step-" + std::to_string(s_->trainer->step()) : name;
        const auto dir = std::filesystem::path(s_->config.checkpoint_dir) / n;
        s_->send({{"op", "save"}, {"dir", dir.string()}});
        s_->trainer->save_checkpoint(dir.string());
        int64_t bytes = 0;
        for (const auto& f : std::filesystem::directory_iterator(dir)) {
          if (f.is_regular_file()) bytes += f.file_size();
        }
        r->set_name(n);
        r->set_step(s_->trainer->step());
        r->set_policy_version(s_->trainer->policy_version());
        r->set_bytes(bytes);
      };
    });
  }

  grpc::ServerUnaryReactor* LoadCheckpoint(grpc::CallbackServerContext* ctx, const v1::LoadCheckpointRequest* req,
                                           v1::LoadCheckpointResponse* resp) override {
    return Dispatch<v1::LoadCheckpointResponse>(ctx, "LoadCheckpoint", Access::kWrite, req->request_id(), resp,
                                                [this, req](int64_t&) {
      RequireCheckpointDir();
      std::string name = req->name();
      if (!name.empty()) ValidateCheckpointName(name);
      return [this, name](v1::LoadCheckpointResponse* r) {
        const std::string n = name.empty() ? NewestCheckpoint() : name;
        const auto dir = (std::filesystem::path(s_->config.checkpoint_dir) / n).string();
        if (!std::filesystem::is_directory(dir)) throw NotFound("no checkpoint named '" + n + "'");
        auto loaded = Trainer::LoadCheckpoint(dir, &s_->config.trainer);
        auto shape = [](const ModelConfig& c) {
          auto j = c.ToJson();
          j.erase("torch_dtype");
          return j;
        };
        if (shape(loaded->model()->config()) != shape(s_->model_config)) {
          throw FailedPrecondition("checkpoint '" + n + "' holds a different model (" +
                                   loaded->model()->config().architecture + ", other sizes) than this server serves");
        }
        s_->send({{"op", "load"}, {"dir", dir}});
        if (s_->comm) loaded->set_communicator(s_->comm);
        s_->trainer = std::move(loaded);
        s_->announce("load", nullptr, 0);
        r->set_name(n);
        r->set_step(s_->trainer->step());
        r->set_policy_version(s_->trainer->policy_version());
      };
    });
  }

  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* ctx, const v1::SampleRequest* req,
                                   v1::SampleResponse* resp) override {
    return Dispatch<v1::SampleResponse>(ctx, "Sample", Access::kRead, "", resp, [this, req](int64_t& tokens) {
      if (req->prompts().empty()) throw InvalidArgument("prompts is empty");
      if (req->max_tokens() <= 0) throw InvalidArgument("max_tokens must be > 0");
      if (req->n() < 0 || req->n() > 256) throw InvalidArgument("n must be in [1, 256] (0 = 1)");
      auto prompts = std::make_shared<std::vector<std::vector<int64_t>>>();
      auto seqs = ConvertSequences(req->prompts(), s_->limits);
      for (size_t i = 0; i < seqs.size(); ++i) {
        if (static_cast<int64_t>(seqs[i].tokens.size()) + req->max_tokens() > s_->limits.max_sequence_length) {
          throw InvalidArgument("prompts[" + std::to_string(i) + "]: prompt + max_tokens exceed the maximum sequence length " +
                                std::to_string(s_->limits.max_sequence_length));
        }
        tokens += static_cast<int64_t>(seqs[i].tokens.size());
        prompts->push_back(std::move(seqs[i].tokens));
      }
      SampleOptions o;
      o.n = req->n() > 0 ? req->n() : 1;
      o.temperature = req->has_temperature() ? req->temperature() : 1.0;
      o.top_p = req->has_top_p() ? req->top_p() : 1.0;
      o.max_tokens = req->max_tokens();
      o.stop_tokens.assign(req->stop_tokens().begin(), req->stop_tokens().end());
      for (int64_t t : o.stop_tokens) {
        if (t < 0 || t >= s_->limits.vocab_size) throw InvalidArgument("stop token " + std::to_string(t) + " is outside the vocabulary");
      }
      if (!(o.temperature >= 0)) throw InvalidArgument("temperature must be >= 0");
      if (!(o.top_p > 0 && o.top_p <= 1)) throw InvalidArgument("top_p must be in (0, 1]");
      o.seed = req->has_seed() ? req->seed() : std::random_device{}();
      return [this, prompts, o](v1::SampleResponse* r) {
        for (const auto& c : SampleCompletions(s_->trainer->model(), *prompts, o)) {
          auto* out = r->add_completions();
          out->set_prompt_index(static_cast<int32_t>(c.prompt_index));
          out->mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
          for (double lp : c.logprobs) out->add_logprobs(static_cast<float>(lp));
          out->set_finish_reason(c.finish_reason);
        }
        r->set_policy_version(s_->trainer->policy_version());
      };
    });
  }

  grpc::ServerUnaryReactor* PushRollouts(grpc::CallbackServerContext* ctx, const v1::PushRolloutsRequest* req,
                                         v1::PushRolloutsResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    const auto start = Clock::now();
    auto status = s_->authorize(ctx, Access::kWrite);
    if (status.ok() && s_->draining) status = Unavailable();
    int64_t tokens = 0;
    if (status.ok()) {
      if (req->groups().empty()) {
        status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "groups is empty");
      } else {
        for (int i = 0; i < req->groups_size(); ++i) {
          *resp->add_acks() = PushOne(req->groups(i), i);
          for (const auto& c : req->groups(i).completions()) tokens += req->groups(i).prompt_size() + c.tokens_size();
        }
        ScheduleRolloutStep();
      }
    }
    s_->log_request("PushRollouts", "", tokens, Seconds(start), status);
    reactor->Finish(status);
    return reactor;
  }

  grpc::ServerBidiReactor<v1::RolloutGroup, v1::RolloutAck>* PushRolloutsStream(
      grpc::CallbackServerContext* ctx) override {
    auto status = s_->authorize(ctx, Access::kWrite);
    if (status.ok() && s_->draining) status = Unavailable();
    return new PushStream(this, status);
  }

  grpc::ServerWriteReactor<v1::PolicyUpdate>* WatchPolicy(grpc::CallbackServerContext* ctx,
                                                         const v1::WatchPolicyRequest* req) override {
    auto* watcher = new PolicyWatcher(&s_->hub);
    auto status = s_->authorize(ctx, Access::kRead);
    if (status.ok() && s_->draining) status = Unavailable();
    if (!status.ok()) {
      watcher->finish(status);
      return watcher;
    }
    s_->hub.subscribe(watcher, req->since_version());
    return watcher;
  }

  grpc::ServerUnaryReactor* GetRolloutStats(grpc::CallbackServerContext* ctx, const v1::GetRolloutStatsRequest*,
                                            v1::RolloutStats* resp) override {
    auto* reactor = ctx->DefaultReactor();
    auto status = s_->authorize(ctx, Access::kRead);
    if (status.ok()) {
      *resp = s_->rollouts->stats();
      resp->set_invalid(s_->invalid_groups);
      resp->set_policy_version(s_->version);
    }
    reactor->Finish(status);
    return reactor;
  }

  // Validates one pushed group and queues it; the ack says what happened to it.
  v1::RolloutAck PushOne(const v1::RolloutGroup& group, int index) {
    v1::RolloutAck ack;
    ack.set_index(index);
    ack.set_group_id(group.group_id());
    const int64_t current = s_->version;
    try {
      if (group.policy_version() > current) {
        throw InvalidArgument("policy_version " + std::to_string(group.policy_version()) +
                              " is from the future (the current version is " + std::to_string(current) + ")");
      }
      v1::Batch batch;
      auto* g = batch.mutable_grpo()->add_groups();
      *g->mutable_prompt() = group.prompt();
      *g->mutable_completions() = group.completions();
      auto input = ConvertStep(batch, "grpo", nullptr, nullptr, nullptr, v1::EngineOptions(), s_->default_engine, s_->limits);
      CreateObjective("grpo", s_->config.rollouts.grpo)->prepare(input.sequences);  // e.g. a group of one
      std::string id;
      const auto outcome = s_->rollouts->push(group, current, &id);
      ack.set_group_id(id);
      ack.set_status(outcome == "full" ? "invalid" : outcome);
      if (outcome == "stale") {
        s_->dropped_since_update++;
        ack.set_message("sampled by version " + std::to_string(group.policy_version()) + ", older than current " +
                        std::to_string(current) + " - max_staleness " + std::to_string(s_->config.rollouts.max_staleness));
      } else if (outcome == "duplicate") {
        ack.set_message("group_id '" + id + "' was pushed before; it is not trained twice");
      } else if (outcome == "full") {
        ack.set_message("the rollout queue is full (rollouts.max_queue); push again later");
      }
    } catch (const std::exception& e) {
      s_->invalid_groups++;
      ack.set_status("invalid");
      ack.set_message(ToStatus(std::current_exception()).error_message());
    }
    ack.set_queue_depth(s_->rollouts->stats().queue_depth());
    ack.set_policy_version(current);
    return ack;
  }

  // One server-side GRPO step on the device thread whenever enough groups are queued.
  void ScheduleRolloutStep() {
    if (!s_->rollouts->ready()) return;
    bool expected = false;
    if (!s_->rollout_step_scheduled.compare_exchange_strong(expected, true)) return;
    DeviceWorker::Job job;
    job.method = "RolloutStep";
    job.run = [this] {
      try {
        RunRolloutStep();
      } catch (const std::exception& e) {
        spdlog::error("rollout step failed: {}", e.what());
      }
      s_->publish();
      s_->rollout_step_scheduled = false;
      ScheduleRolloutStep();
    };
    job.drop = [this](const grpc::Status&) { s_->rollout_step_scheduled = false; };
    if (!s_->worker->submit(std::move(job))) s_->rollout_step_scheduled = false;  // retried on the next push
  }

  void RunRolloutStep() {
    const auto start = Clock::now();
    int64_t dropped = 0;
    auto groups = s_->rollouts->take(s_->trainer->policy_version(), &dropped);
    s_->dropped_since_update += dropped;
    if (groups.empty()) return;
    v1::Batch batch;
    int64_t tokens = 0;
    for (const auto& q : groups) {
      auto* g = batch.mutable_grpo()->add_groups();
      *g->mutable_prompt() = q.group.prompt();
      *g->mutable_completions() = q.group.completions();
      g->set_group_id(q.id);
      for (const auto& c : q.group.completions()) tokens += q.group.prompt_size() + c.tokens_size();
    }
    grpc::Status status;
    try {
      auto input = ConvertStep(batch, "grpo", nullptr, nullptr, nullptr, v1::EngineOptions(), s_->default_engine, s_->limits);
      auto objective = CreateObjective("grpo", s_->config.rollouts.grpo);
      s_->send(s_->step_command("train_step", input.sequences, "grpo", s_->config.rollouts.grpo, s_->default_engine));
      const auto result = s_->trainer->train_step(input.sequences, *objective, &s_->default_engine);
      if (s_->metrics) s_->metrics->ObserveTrainStep(result.forward.tokens, Seconds(start), result.optim.skipped);
      s_->rollouts->consumed(groups, s_->trainer->policy_version());
      if (!result.optim.skipped) {
        s_->announce("rollouts", &result.forward, static_cast<int64_t>(groups.size()));
        const int64_t every = s_->config.rollouts.checkpoint_every;
        if (every > 0 && s_->trainer->policy_version() % every == 0) {
          const auto dir = (std::filesystem::path(s_->config.checkpoint_dir) /
                            ("policy-v" + std::to_string(s_->trainer->policy_version()))).string();
          s_->send({{"op", "save"}, {"dir", dir}});
          s_->trainer->save_checkpoint(dir);
        }
      } else {
        spdlog::warn("rollout step skipped: {}", result.optim.reason);
      }
    } catch (...) {
      status = ToStatus(std::current_exception());
      // Groups that cannot be trained are dropped (counted), never retried forever.
      s_->invalid_groups += static_cast<int64_t>(groups.size());
      s_->rollouts->consumed(groups, s_->trainer->policy_version());
    }
    s_->rollouts->set_last_step_seconds(Seconds(start));
    s_->log_request("RolloutStep", "", tokens, Seconds(start), status);
  }

  // PushRolloutsStream: one ack per group read, written in order, one write at a time.
  class PushStream final : public grpc::ServerBidiReactor<v1::RolloutGroup, v1::RolloutAck> {
   public:
    PushStream(TrainerService* service, const grpc::Status& status) : service_(service) {
      if (!status.ok()) {
        finished_ = true;
        Finish(status);
        return;
      }
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        std::lock_guard<std::mutex> lock(mutex_);
        reads_done_ = true;
        maybe_finish();
        return;
      }
      auto ack = service_->PushOne(in_, index_++);
      service_->ScheduleRolloutStep();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        acks_.push_back(std::move(ack));
        if (!writing_) {
          writing_ = true;
          StartWrite(&acks_.front());
        }
      }
      StartRead(&in_);
    }
    void OnWriteDone(bool ok) override {
      std::lock_guard<std::mutex> lock(mutex_);
      acks_.pop_front();
      if (!ok) {
        writing_ = false;
        if (!finished_) {
          finished_ = true;
          Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
        }
        return;
      }
      if (!acks_.empty()) {
        StartWrite(&acks_.front());
      } else {
        writing_ = false;
        maybe_finish();
      }
    }
    void OnDone() override { delete this; }

   private:
    void maybe_finish() {
      if (reads_done_ && !writing_ && !finished_) {
        finished_ = true;
        Finish(grpc::Status::OK);
      }
    }
    TrainerService* service_;
    v1::RolloutGroup in_;
    int index_ = 0;
    std::mutex mutex_;
    std::deque<v1::RolloutAck> acks_;
    bool writing_ = false, reads_done_ = false, finished_ = false;
  };

  grpc::ServerWriteReactor<v1::WeightsChunk>* ExportWeights(grpc::CallbackServerContext* ctx,
                                                            const v1::ExportWeightsRequest* req) override {
    const auto start = Clock::now();
    int64_t chunk = req->max_chunk_bytes() > 0 ? std::min<int64_t>(req->max_chunk_bytes(), kMaxWeightsChunk)
                                               : kMaxWeightsChunk;
    auto* writer = new WeightsWriter(s_, chunk, start);
    auto status = s_->authorize(ctx, Access::kRead);
    if (status.ok() && s_->draining) status = Unavailable();
    if (!status.ok()) {
      writer->fail(status);
      return writer;
    }
    DeviceWorker::Job job;
    job.method = "ExportWeights";
    job.deadline = ctx->deadline();
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    const int64_t wanted = req->version();
    job.run = [this, writer, wanted] {
      try {
        if (wanted != 0 && wanted != s_->trainer->policy_version()) {
          writer->set_note("version " + std::to_string(wanted) + " is not available; serving the current version " +
                           std::to_string(s_->trainer->policy_version()));
        }
        auto model = s_->trainer->model();
        auto bytes = std::make_shared<std::string>(SerializeSafetensors(model->hf_tensors(), {{"format", "pt"}}));
        auto config = model->config();
        config.torch_dtype = DtypeName(s_->dtype);
        writer->start(bytes, s_->trainer->policy_version(), Sha256Hex(*bytes), config.ToJson().dump(2));
      } catch (...) {
        writer->fail(ToStatus(std::current_exception()));
      }
    };
    job.drop = [writer](const grpc::Status& st) { writer->fail(st); };
    if (!s_->worker->submit(std::move(job))) writer->fail(QueueFull());
    return writer;
  }

 private:
  static double Seconds(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
  static grpc::Status Unavailable() {
    return {grpc::StatusCode::UNAVAILABLE, "the server is shutting down; retry against its replacement"};
  }
  grpc::Status QueueFull() const {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "the request queue is full (" + std::to_string(s_->worker->capacity()) +
                " waiting, limits.queue_depth); retry with backoff"};
  }

  // The common path of every call that runs on the device: auth, draining, validation
  // (`prepare`, on this thread, returns the work), request-id replay, the queue.
  template <typename Resp, typename Prepare>
  grpc::ServerUnaryReactor* Dispatch(grpc::CallbackServerContext* ctx, const std::string& method, Access access,
                                     const std::string& request_id, Resp* resp, Prepare prepare) {
    auto* reactor = ctx->DefaultReactor();
    const auto start = Clock::now();
    auto tokens = std::make_shared<int64_t>(0);
    auto finish = [this, reactor, method, request_id, start, tokens](const grpc::Status& st) {
      s_->log_request(method, request_id, *tokens, Seconds(start), st);
      reactor->Finish(st);
    };
    auto status = s_->authorize(ctx, access);
    if (status.ok() && s_->draining) status = Unavailable();
    if (status.ok() && s_->broken) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "a rank of this server is gone: " + s_->broken_reason);
    }
    if (!status.ok()) {
      finish(status);
      return reactor;
    }
    std::function<void(Resp*)> work;
    try {
      work = prepare(*tokens);
    } catch (...) {
      finish(ToStatus(std::current_exception()));
      return reactor;
    }
    const std::string key = request_id.empty() ? "" : method + "/" + request_id;
    if (!key.empty()) {
      const bool fresh = s_->cache.begin(key, [resp, finish](const grpc::Status& st, const std::string& bytes) {
        if (st.ok()) resp->ParseFromString(bytes);
        finish(st);
      });
      if (!fresh) return reactor;
    }
    DeviceWorker::Job job;
    job.method = method;
    job.deadline = ctx->deadline();
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    job.run = [this, work, resp, key, finish] {
      grpc::Status st;
      try {
        work(resp);
      } catch (...) {
        st = ToStatus(std::current_exception());
        if (st.error_code() == grpc::StatusCode::UNAVAILABLE && s_->comm) s_->mark_broken(st.error_message());
      }
      s_->publish();
      if (!key.empty()) s_->cache.complete(key, st, st.ok() ? resp->SerializeAsString() : "", true);
      finish(st);
    };
    job.drop = [this, key, finish](const grpc::Status& st) {
      if (!key.empty()) s_->cache.complete(key, st, "", false);
      finish(st);
    };
    if (!s_->worker->submit(std::move(job))) {
      const auto st = QueueFull();
      if (!key.empty()) s_->cache.complete(key, st, "", false);
      finish(st);
    }
    return reactor;
  }

  struct PreparedStep {
    StepInput input;
    std::shared_ptr<Objective> objective;
  };

  template <typename Request>
  std::shared_ptr<PreparedStep> PrepareStep(const Request& req, int64_t& tokens) {
    auto step = std::make_shared<PreparedStep>();
    step->input = ConvertStepRequest(req, s_->default_engine, s_->limits);
    tokens = step->input.tokens;
    step->objective = CreateObjective(step->input.objective, step->input.objective_options);
    if (s_->config.limits.auto_chunks && step->input.engine.kind == EngineKind::kStream &&
        req.engine().chunk() == 0 && req.engine().logits_chunk() == 0 && req.engine().key_chunk() == 0) {
      // `auto`: the largest chunks whose estimated peak fits the memory budget.
      int64_t longest = 0;
      for (const auto& seq : step->input.sequences) longest = std::max<int64_t>(longest, seq.tokens.size());
      const int64_t mb = s_->config.trainer.micro_batch_tokens > 0 ? s_->config.trainer.micro_batch_tokens : tokens;
      const int64_t rows = std::max<int64_t>(1, (std::min(mb, tokens) + longest - 1) / longest);
      step->input.engine = ChooseChunks(s_->model_config, s_->dtype, rows, longest, s_->config.limits.memory_budget_bytes,
                                        s_->config.trainer.optimizer.name);
    }
    s_->check_budget(step->input);
    return step;
  }

  StepResult RunForwardBackward(const PreparedStep& step, v1::StepStats* stats, bool last) {
    const auto start = Clock::now();
    memory::ResetPeak();
    const int64_t live_before = memory::LiveBytes();
    StepResult result;
    {
      memory::ScopedBudget budget(s_->config.limits.memory_budget_bytes);
      try {
        s_->send(s_->step_command(last ? "forward_backward_last" : "forward_backward", step.input.sequences,
                                  step.input.objective, step.input.objective_options, step.input.engine));
        result = last ? s_->trainer->forward_backward_last(step.input.sequences, *step.objective, &step.input.engine)
                      : s_->trainer->forward_backward(step.input.sequences, *step.objective, &step.input.engine);
      } catch (const c10::OutOfMemoryError&) {
        if (s_->metrics) s_->metrics->CountOomRefusal("out_of_memory");
        throw;
      }
    }
    int64_t longest = 0;
    for (const auto& s : step.input.sequences) longest = std::max<int64_t>(longest, s.tokens.size());
    const auto chunks = ResolveChunks(step.input.engine, longest);
    stats->set_loss(result.loss);
    for (const auto& [k, v] : result.metrics) (*stats->mutable_metrics())[k] = v;
    stats->set_tokens(result.tokens);
    stats->set_targets(result.targets);
    stats->set_sequences(static_cast<int64_t>(step.input.sequences.size()));
    stats->set_micro_batches(static_cast<int64_t>(
        SplitMicroBatches(step.input.sequences, s_->config.trainer.layout, s_->config.trainer.micro_batch_tokens).size()));
    stats->set_engine(EngineName(step.input.engine.kind));
    stats->set_chunk(chunks.chunk);
    stats->set_logits_chunk(chunks.logits_chunk);
    stats->set_key_chunk(step.input.engine.kind == EngineKind::kStream ? chunks.key_chunk : 0);
    stats->set_peak_memory_bytes(memory::PeakBytes() - live_before);
    stats->set_seconds(Seconds(start));
    if (s_->metrics) s_->metrics->ObserveForwardBackward(result.tokens, stats->seconds(), stats->peak_memory_bytes());
    return result;
  }

  void RunOptimStep(v1::OptimStepResponse* r) {
    const auto start = Clock::now();
    s_->send({{"op", "optim_step"}});
    const auto o = s_->trainer->optim_step();
    if (s_->metrics) s_->metrics->ObserveOptimStep(o.skipped, Seconds(start));
    r->set_policy_version(s_->trainer->policy_version());
    r->set_step(s_->trainer->step());
    r->set_learning_rate(o.lr);
    r->set_grad_norm(o.grad_norm);
    r->set_skipped(o.skipped);
    r->set_skip_reason(o.reason);
  }

  void RequireCheckpointDir() const {
    if (s_->config.checkpoint_dir.empty()) {
      throw FailedPrecondition("no checkpoint directory is configured (checkpoint_dir in the server config)");
    }
  }

  // The complete checkpoint (it has a manifest) with the highest step; newest on ties.
  std::string NewestCheckpoint() const {
    namespace fs = std::filesystem;
    std::string best;
    int64_t best_step = -1;
    fs::file_time_type best_time;
    if (!fs::is_directory(s_->config.checkpoint_dir)) throw NotFound("the checkpoint directory does not exist yet");
    for (const auto& entry : fs::directory_iterator(s_->config.checkpoint_dir)) {
      const auto manifest = entry.path() / "manifest.json";
      if (!entry.is_directory() || !fs::exists(manifest)) continue;
      int64_t step = 0;
      try {
        auto state = nlohmann::json::parse(ReadFile((entry.path() / "trainer_state.json").string(), "state"));
        step = state.value("step", int64_t{0});
      } catch (...) {
        continue;
      }
      const auto time = fs::last_write_time(manifest);
      if (step > best_step || (step == best_step && time > best_time)) {
        best = entry.path().filename().string();
        best_step = step;
        best_time = time;
      }
    }
    if (best.empty()) throw NotFound("no complete checkpoint in " + s_->config.checkpoint_dir);
    return best;
  }

  ServerState* s_;
};

// The Prometheus endpoint (config.metrics); its gauges read the state at scrape time.
void StartMetrics(ServerState* s) {
  s->metrics = Metrics::Create(s->config.metrics.listen);
  auto& m = *s->metrics;
  m.AddGaugeCallback("streambp_queue_depth", "Jobs waiting for the device (the running one not counted)",
                     [s] { return static_cast<double>(s->worker->depth()); });
  m.AddGaugeCallback("streambp_queue_capacity", "Jobs that may wait (limits.queue_depth)",
                     [s] { return static_cast<double>(s->worker->capacity()); });
  m.AddGaugeCallback("streambp_policy_version", "Version of the policy (+1 per applied optimizer step)",
                     [s] { return static_cast<double>(s->version.load()); });
  m.AddGaugeCallback("streambp_optimizer_step", "The trainer's optimizer step (restored by LoadCheckpoint)",
                     [s] { return static_cast<double>(s->step.load()); });
  auto rollouts = [s](int64_t (v1::RolloutStats::*field)() const) {
    return [s, field] { return s->rollouts ? static_cast<double>((s->rollouts->stats().*field)()) : 0.0; };
  };
  m.AddCounterCallback("streambp_rollouts_accepted_total", "Rollout groups pushed and queued",
                       rollouts(&v1::RolloutStats::accepted));
  m.AddCounterCallback("streambp_rollouts_consumed_total", "Rollout groups taken into a training step",
                       rollouts(&v1::RolloutStats::consumed));
  m.AddCounterCallback("streambp_rollouts_dropped_total",
                       "Rollout groups dropped as stale (older than current version - rollouts.max_staleness)",
                       rollouts(&v1::RolloutStats::dropped_stale));
  m.AddCounterCallback("streambp_rollouts_duplicates_total", "Rollout groups pushed again under a known group_id",
                       rollouts(&v1::RolloutStats::duplicates));
  m.AddCounterCallback("streambp_rollouts_invalid_total", "Rollout groups refused or dropped as untrainable",
                       [s] { return static_cast<double>(s->invalid_groups.load()); });
  m.AddGaugeCallback("streambp_rollout_queue_depth", "Rollout groups waiting for a step",
                     rollouts(&v1::RolloutStats::queue_depth));
  m.AddGaugeCallback("streambp_tracked_memory_bytes", "Tracked tensor memory alive now (weights, optimizer, gradients)",
                     [] { return static_cast<double>(memory::LiveBytes()); });
  const auto rt = GetRuntimeInfo();
  m.SetBuildInfo({{"version", kServerVersion}, {"libtorch", rt.torch_version}, {"blas", rt.blas},
                  {"cuda", rt.cuda ? "true" : "false"}});
  spdlog::info("metrics on http://{}:{}/metrics", s->config.metrics.listen.substr(0, s->config.metrics.listen.rfind(':')),
               m.port());
}

}  // namespace

std::unique_ptr<Server> Server::Create(const ServerConfig& config) {
  config.Validate();
  RegisterBuiltinObjectives();
  memory::InstallTrackingAllocator();
  auto state = std::make_shared<ServerState>(config);
  auto& c = state->config;
  state->dtype = ParseDtype(c.model.dtype);
  const torch::Device device = RankDevice(c.model.device, DistOptions::FromEnv());
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw InvalidArgument("config: model.device is " + c.model.device +
                          " but no CUDA device is available (this build: " +
                          (GetRuntimeInfo().cuda ? "CUDA" : "CPU only") + ")");
  }
  CausalLM model = c.model.dir.empty() ? InitModel(PresetConfig(c.model.preset), c.model.seed, state->dtype)
                                       : LoadModel(c.model.dir, state->dtype, device);
  model->to(device);
  state->model_config = model->config();
  TrainerOptions topts = c.trainer;
  topts.max_sequence_length = c.limits.max_sequence_length;
  state->trainer = Trainer::Create(model, topts);
  auto dist = DistOptions::FromEnv();
  if (dist.enabled()) {
    if (dist.backend.empty()) dist.backend = device.is_cuda() ? "nccl" : "gloo";
    state->comm = Communicator::Create(dist);  // the other ranks run RunFollower (replica.h)
    state->trainer->set_communicator(state->comm);
    spdlog::info("rank 0 of {}: data parallel over {}, ZeRO stage {}", dist.world_size, dist.backend,
                 dist.zero_stage);
  }
  if (c.resume) {
    // The newest complete checkpoint, if any (a fresh directory starts from the model).
    std::string best;
    int64_t best_step = -1;
    if (std::filesystem::is_directory(c.checkpoint_dir)) {
      for (const auto& entry : std::filesystem::directory_iterator(c.checkpoint_dir)) {
        if (!entry.is_directory() || !std::filesystem::exists(entry.path() / "manifest.json")) continue;
        try {
          auto st = nlohmann::json::parse(ReadFile((entry.path() / "trainer_state.json").string(), "state"));
          if (st.value("step", int64_t{0}) > best_step) {
            best_step = st.value("step", int64_t{0});
            best = entry.path().string();
          }
        } catch (...) {
        }
      }
    }
    if (!best.empty()) {
      state->send({{"op", "load"}, {"dir", best}});
      state->trainer = Trainer::LoadCheckpoint(best, &topts);
      if (state->comm) state->trainer->set_communicator(state->comm);
      spdlog::info("resumed from checkpoint {} (step {}, policy version {})", best, state->trainer->step(),
                   state->trainer->policy_version());
    }
  }
  RolloutOptions ro;
  ro.groups_per_step = c.rollouts.groups_per_step;
  ro.max_staleness = c.rollouts.max_staleness;
  ro.max_queue = c.rollouts.max_queue;
  ro.log_path = c.rollouts.log;
  state->rollouts = std::make_unique<RolloutQueue>(ro, state->trainer->policy_version());
  CreateObjective("grpo", c.rollouts.grpo);  // bad rollout options fail at start, not at the first step
  state->default_engine = c.trainer.engine;
  state->limits = Limits{state->model_config.vocab_size, c.limits.max_sequence_length, c.limits.max_tokens_per_request};
  state->worker = std::make_unique<DeviceWorker>(static_cast<size_t>(c.limits.queue_depth));
  state->publish();
  state->announce("start", nullptr, 0);
  if (!c.metrics.listen.empty()) StartMetrics(state.get());

  // What GetInfo reports and never changes.
  auto& info = state->info;
  const auto& mc = state->model_config;
  info.set_architecture(mc.architecture);
  info.set_num_layers(mc.num_hidden_layers);
  info.set_hidden_size(mc.hidden_size);
  info.set_num_heads(mc.num_attention_heads);
  info.set_num_kv_heads(mc.num_key_value_heads);
  info.set_head_dim(mc.head_dim);
  info.set_vocab_size(mc.vocab_size);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  info.set_num_parameters(params);
  info.set_dtype(DtypeName(state->dtype));
  info.set_device(c.model.device);
  info.set_engine(EngineName(c.trainer.engine.kind));
  // The defaults as they resolve for a long sequence (0 = the whole sequence at once).
  const auto defaults = ResolveChunks(c.trainer.engine, int64_t{1} << 40);
  info.set_chunk(c.trainer.engine.kind == EngineKind::kStream ? defaults.chunk : 0);
  info.set_logits_chunk(defaults.logits_chunk == (int64_t{1} << 40) ? 0 : defaults.logits_chunk);
  info.set_key_chunk(c.trainer.engine.kind == EngineKind::kStream ? defaults.key_chunk : 0);
  info.set_world_size(state->comm ? state->comm->world_size() : 1);
  info.set_optimizer(c.trainer.optimizer.name);
  info.set_learning_rate(c.trainer.optimizer.lr);
  info.set_max_sequence_length(c.limits.max_sequence_length);
  info.set_max_tokens_per_request(c.limits.max_tokens_per_request);
  info.set_reference_model(c.trainer.reference.use_reference_model);
  info.set_server_version(kServerVersion);
  info.set_runtime(GetRuntimeInfo().describe());

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!c.tls.cert.empty()) {
    grpc::SslServerCredentialsOptions ssl(c.tls.client_ca.empty()
                                              ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_key_cert_pairs.push_back({ReadFile(c.tls.key, "TLS key"), ReadFile(c.tls.cert, "TLS certificate")});
    if (!c.tls.client_ca.empty()) ssl.pem_root_certs = ReadFile(c.tls.client_ca, "client CA");
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(c.listen, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(c.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(std::max<int64_t>(c.limits.max_message_bytes, kMaxWeightsChunk + 4096)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(c.keepalive.time_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(c.keepalive.timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  state->service = std::make_unique<TrainerService>(state.get());
  builder.RegisterService(state->service.get());
  state->grpc_server = builder.BuildAndStart();
  if (!state->grpc_server || port == 0) {
    state->worker->stop();
    throw Error(ErrorCode::kInternal, "could not listen on " + c.listen + " (address in use, or not a local address?)");
  }
  static_cast<TrainerService*>(state->service.get())->ScheduleRolloutStep();  // groups replayed from the log
  if (state->comm) {
    // Idle ranks wait in a collective; a ping every quarter of the timeout keeps them
    // there, and finds a dead rank within the timeout even when no request comes.
    ServerState* raw = state.get();
    state->heartbeat = std::thread([raw] {
      const auto period = std::chrono::duration<double>(raw->comm->options().timeout_seconds / 4);
      std::unique_lock<std::mutex> lock(raw->heartbeat_mutex);
      while (!raw->heartbeat_cv.wait_for(lock, period, [raw] { return raw->draining.load(); })) {
        DeviceWorker::Job job;
        job.method = "Heartbeat";
        job.run = [raw] {
          try {
            raw->send({{"op", "ping"}});
          } catch (const std::exception& e) {
            raw->mark_broken(e.what());
          }
        };
        job.drop = [](const grpc::Status&) {};
        raw->worker->submit(std::move(job));
      }
    });
  }
  auto* health = state->grpc_server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  const auto colon = c.listen.rfind(':');
  state->bound_address = c.listen.substr(0, colon) + ":" + std::to_string(port);
  std::unique_ptr<Server> server(new Server(state));
  server->port_ = port;
  spdlog::info("streambp-server {} listening on {} ({}{}); model {} ({} parameters, {}, {}); engine {}; {}",
               kServerVersion, state->bound_address, c.tls.cert.empty() ? "plaintext" : "TLS",
               c.tls.client_ca.empty() ? "" : ", client certificates required", mc.architecture, params,
               DtypeName(state->dtype), c.model.device, EngineName(c.trainer.engine.kind),
               GetRuntimeInfo().describe());
  return server;
}

Server::Server(std::shared_ptr<ServerState> state) : state_(std::move(state)) {}

Server::~Server() { Shutdown(); }

std::string Server::address() const { return state_->bound_address; }

DeviceWorker& Server::worker() { return *state_->worker; }
int64_t Server::step() const { return state_->step; }
int64_t Server::policy_version() const { return state_->version; }
int Server::metrics_port() const { return state_->metrics ? state_->metrics->port() : 0; }

std::string Server::Shutdown() {
  std::unique_lock<std::mutex> lock(state_->shutdown_mutex);
  if (state_->shut_down) return state_->shutdown_checkpoint;
  auto& s = *state_;
  spdlog::info("draining: no new requests; the running step finishes");
  s.draining = true;
  if (auto* health = s.grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(false);
    health->SetServingStatus(kServiceName, false);
  }
  {
    std::lock_guard<std::mutex> hb(s.heartbeat_mutex);
  }
  s.heartbeat_cv.notify_all();
  if (s.heartbeat.joinable()) s.heartbeat.join();
  s.worker->stop();
  s.hub.close_all();
  if (s.config.shutdown.checkpoint_on_exit && !s.config.checkpoint_dir.empty()) {
    try {
      if (s.trainer->has_pending_gradients()) {
        s.send({{"op", "zero_gradients"}});
        s.trainer->zero_gradients();
      }
      const std::string name = "shutdown-" + std::to_string(s.trainer->step());
      const auto dir = (std::filesystem::path(s.config.checkpoint_dir) / name).string();
      s.send({{"op", "save"}, {"dir", dir}});
      s.trainer->save_checkpoint(dir);
      s.shutdown_checkpoint = name;
      spdlog::info("wrote checkpoint {} on shutdown", name);
    } catch (const std::exception& e) {
      spdlog::error("could not write the shutdown checkpoint: {}", e.what());
    }
  }
  const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(s.config.shutdown.grace_seconds));
  if (s.comm && !s.broken) {
    try {
      s.send({{"op", "stop"}});  // the other ranks finish too
    } catch (const std::exception& e) {
      spdlog::warn("could not tell the other ranks to stop: {}", e.what());
    }
  }
  s.grpc_server->Shutdown(std::chrono::system_clock::now() + grace);
  s.shut_down = true;
  s.shutdown_cv.notify_all();
  spdlog::info("stopped");
  return s.shutdown_checkpoint;
}

void Server::Wait() {
  std::unique_lock<std::mutex> lock(state_->shutdown_mutex);
  state_->shutdown_cv.wait(lock, [this] { return state_->shut_down; });
}

}  // namespace streambp::server
