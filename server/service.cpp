// The streambp.v1.Trainer service (gRPC callback API) and the Server that hosts it.
// Handlers authorize, validate and convert on the gRPC thread, then hand the work to the
// device-owner thread; they never wait for training. Every answer is logged once.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <nlohmann/json.hpp>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "convert.h"
#include "request_cache.h"
#include "server.h"
#include "status.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/memory.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"
#include "streambp/safetensors.h"
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

  explicit ServerState(const ServerConfig& c) : config(c), cache(static_cast<size_t>(c.limits.request_id_cache)) {}

  void publish() {
    step = trainer->step();
    version = trainer->policy_version();
    pending = trainer->has_pending_gradients() ? 1 : 0;
  }

  void log_request(const std::string& method, const std::string& request_id, int64_t tokens, double seconds,
                   const grpc::Status& status) {
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
  std::string sha_, config_json_;
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
        RunForwardBackward(*step, r->mutable_stats());
      };
    });
  }

  grpc::ServerUnaryReactor* TrainStep(grpc::CallbackServerContext* ctx, const v1::TrainStepRequest* req,
                                      v1::TrainStepResponse* resp) override {
    return Dispatch<v1::TrainStepResponse>(ctx, "TrainStep", Access::kWrite, req->request_id(), resp,
                                           [this, req](int64_t& tokens) {
      auto step = PrepareStep(*req, tokens);
      return [this, step](v1::TrainStepResponse* r) {
        RunForwardBackward(*step, r->mutable_stats());
        RunOptimStep(r->mutable_optim());
      };
    });
  }

  grpc::ServerUnaryReactor* OptimStep(grpc::CallbackServerContext* ctx, const v1::OptimStepRequest* req,
                                      v1::OptimStepResponse* resp) override {
    return Dispatch<v1::OptimStepResponse>(ctx, "OptimStep", Access::kWrite, req->request_id(), resp,
                                           [this](int64_t&) {
      return [this](v1::OptimStepResponse* r) { RunOptimStep(r); };
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
        s_->trainer = std::move(loaded);
        r->set_name(n);
        r->set_step(s_->trainer->step());
        r->set_policy_version(s_->trainer->policy_version());
      };
    });
  }

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
    job.run = [this, writer] {
      try {
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
    s_->check_budget(step->input);
    return step;
  }

  void RunForwardBackward(const PreparedStep& step, v1::StepStats* stats) {
    const auto start = Clock::now();
    memory::ResetPeak();
    const int64_t live_before = memory::LiveBytes();
    StepResult result;
    {
      memory::ScopedBudget budget(s_->config.limits.memory_budget_bytes);
      result = s_->trainer->forward_backward(step.input.sequences, *step.objective, &step.input.engine);
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
    stats->set_peak_memory_bytes(memory::PeakBytes() - live_before);
    stats->set_seconds(Seconds(start));
  }

  void RunOptimStep(v1::OptimStepResponse* r) {
    const auto o = s_->trainer->optim_step();
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

}  // namespace

std::unique_ptr<Server> Server::Create(const ServerConfig& config) {
  config.Validate();
  RegisterBuiltinObjectives();
  memory::InstallTrackingAllocator();
  auto state = std::make_shared<ServerState>(config);
  auto& c = state->config;
  state->dtype = ParseDtype(c.model.dtype);
  const torch::Device device(c.model.device);
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
  state->default_engine = c.trainer.engine;
  state->limits = Limits{state->model_config.vocab_size, c.limits.max_sequence_length, c.limits.max_tokens_per_request};
  state->worker = std::make_unique<DeviceWorker>(static_cast<size_t>(c.limits.queue_depth));
  state->publish();

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
  info.set_world_size(1);
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
  s.worker->stop();
  if (s.config.shutdown.checkpoint_on_exit && !s.config.checkpoint_dir.empty()) {
    try {
      if (s.trainer->has_pending_gradients()) s.trainer->zero_gradients();
      const std::string name = "shutdown-" + std::to_string(s.trainer->step());
      s.trainer->save_checkpoint((std::filesystem::path(s.config.checkpoint_dir) / name).string());
      s.shutdown_checkpoint = name;
      spdlog::info("wrote checkpoint {} on shutdown", name);
    } catch (const std::exception& e) {
      spdlog::error("could not write the shutdown checkpoint: {}", e.what());
    }
  }
  const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(s.config.shutdown.grace_seconds));
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
