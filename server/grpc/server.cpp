#include "server.h"

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "metrics.h"
#include "service.h"
#include "streambp/error.h"
#include "streambp/memory.h"
#include "streambp/runtime.h"
#include "streams.h"

namespace streambp::server {
namespace {

constexpr const char* kServiceName = "streambp.v1.Trainer";

std::string ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound(std::string("cannot read ") + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The host's work: one log event per forward-backward and optimizer step (fields in JSON
// logs), and the Prometheus metrics when they are served.
class ServerTelemetry final : public HostTelemetry {
 public:
  ServerTelemetry(MetricsExporter* m, bool json) : m_(m), json_(json) {}
  void on_forward_backward(const std::string& session, const StepStats& s) override {
    if (m_) m_->ObserveForwardBackward({session, s.result.tokens, s.seconds, s.peak_memory_bytes, s.result.loss, s.result.metrics});
    nlohmann::json e{{"event", "forward_backward"}, {"session", session}, {"loss", s.result.loss},
                     {"tokens", s.result.tokens}, {"targets", s.result.targets}, {"seconds", s.seconds},
                     {"peak_memory_bytes", s.peak_memory_bytes}, {"policy_version", s.policy_version}};
    for (const char* key : {"reward_mean", "kl"}) {
      if (auto it = s.result.metrics.find(key); it != s.result.metrics.end()) e[key] = it->second;
    }
    log(e);
  }
  void on_optim_step(const std::string& session, const OptimStats& o, double seconds) override {
    if (m_) m_->ObserveOptimStep(session, o.optim.skipped, o.optim.reason, o.optim.grad_norm, o.optim.lr, seconds);
    nlohmann::json e{{"event", "optim_step"}, {"session", session}, {"step", o.step},
                     {"policy_version", o.policy_version}, {"grad_norm", o.optim.grad_norm}, {"lr", o.optim.lr},
                     {"seconds", seconds}};
    if (o.optim.skipped) e["skipped"] = o.optim.reason;
    log(e);
  }
  void on_train_step(const std::string&, const TrainStats&, const std::string&, double seconds) override {
    if (m_) m_->ObserveTrainStep(seconds);
  }
  void on_memory_refusal(const std::string& reason) override {
    if (m_) m_->CountOomRefusal(reason);
  }

 private:
  // JSON: the object (flattened by the log formatter); text: "event k=v k=v".
  void log(nlohmann::json& e) const {
    if (e["session"] == "") e.erase("session");
    if (!spdlog::should_log(spdlog::level::info)) return;
    if (json_) {
      spdlog::info("{}", e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return;
    }
    std::string line = e["event"].get<std::string>();
    for (const auto& [k, v] : e.items()) {
      if (k != "event") line += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
    spdlog::info("{}", line);
  }

  MetricsExporter* m_;
  bool json_;
};

void RegisterGauges(MetricsExporter& m, TrainingHost* host) {
  m.AddGaugeCallback("streambp_queue_depth", "Jobs waiting for the device (the running one not counted)",
                     [host] { return static_cast<double>(host->worker().depth()); });
  m.AddGaugeCallback("streambp_queue_capacity", "Jobs that may wait (limits.queue_depth)",
                     [host] { return static_cast<double>(host->worker().capacity()); });
  m.AddGaugeCallback("streambp_policy_version", "Version of the policy (+1 per applied optimizer step)",
                     [host] { return static_cast<double>(host->policy_version()); });
  m.AddGaugeCallback("streambp_optimizer_step", "The trainer's optimizer step (restored by LoadCheckpoint)",
                     [host] { return static_cast<double>(host->step()); });
  auto rollouts = [host](int64_t RolloutStats::*field) {
    return [host, field] { return static_cast<double>(host->rollout_stats().*field); };
  };
  m.AddCounterCallback("streambp_rollouts_accepted_total", "Rollout groups pushed and queued",
                       rollouts(&RolloutStats::accepted));
  m.AddCounterCallback("streambp_rollouts_consumed_total", "Rollout groups taken into a training step",
                       rollouts(&RolloutStats::consumed));
  m.AddCounterCallback("streambp_rollouts_dropped_total",
                       "Rollout groups dropped as stale (older than current version - rollouts.max_staleness)",
                       rollouts(&RolloutStats::dropped_stale));
  m.AddCounterCallback("streambp_rollouts_duplicates_total", "Rollout groups pushed again under a known group_id",
                       rollouts(&RolloutStats::duplicates));
  m.AddCounterCallback("streambp_rollouts_invalid_total", "Rollout groups refused or dropped as untrainable",
                       rollouts(&RolloutStats::invalid));
  m.AddGaugeCallback("streambp_rollout_queue_depth", "Rollout groups waiting for a step",
                     rollouts(&RolloutStats::queue_depth));
  m.AddGaugeCallback("streambp_tracked_memory_bytes", "Tracked tensor memory alive now (weights, optimizer, gradients)",
                     [] { return static_cast<double>(memory::LiveBytes()); });
  const auto rt = GetRuntimeInfo();
  m.SetBuildInfo({{"version", STREAMBP_VERSION}, {"libtorch", rt.torch_version}, {"blas", rt.blas},
                  {"cuda", rt.cuda ? "true" : "false"}});
}

// Keeps server reflection out of one server (the plugin is registered process-wide).
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const auto& p) { return p->name().find("reflection") != std::string::npos; }),
                   plugins->end());
  }
};

}  // namespace

// Everything a running server owns, destroyed in reverse order of construction.
struct ServerParts {
  ServerConfig config;
  std::unique_ptr<TrainingHost> host;
  std::unique_ptr<MetricsExporter> metrics;
  std::unique_ptr<ServerTelemetry> telemetry;
  std::unique_ptr<Authorizer> auth;
  std::unique_ptr<CallObserver> observer;
  std::unique_ptr<TrainerService> service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::string bound_address;
  std::mutex shutdown_mutex;
  std::condition_variable shutdown_cv;
  bool shut_down = false;
  std::string shutdown_checkpoint;
};

std::unique_ptr<Server> Server::Create(const ServerConfig& config) {
  auto p = std::make_unique<ServerParts>();
  p->config = config;
  const auto& c = p->config;
  c.Validate();
  p->host = TrainingHost::Create(c);
  if (!c.metrics.listen.empty()) {
    p->metrics = MetricsExporter::Create(c.metrics.listen, c.sessions.enabled && c.sessions.metrics_label);
    RegisterGauges(*p->metrics, p->host.get());
    spdlog::info("metrics on http://{}:{}/metrics", c.metrics.listen.substr(0, c.metrics.listen.rfind(':')),
                 p->metrics->port());
  }
  p->telemetry = std::make_unique<ServerTelemetry>(p->metrics.get(), c.log.format == "json");
  p->host->set_telemetry(p->telemetry.get());
  p->auth = std::make_unique<Authorizer>(c.auth);
  p->observer = std::make_unique<CallObserver>(c.log, p->metrics.get(), c.sessions.enabled && c.sessions.metrics_label);
  p->service = std::make_unique<TrainerService>(p->host.get(), EdgeContext{p->auth.get(), p->observer.get()});

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
  // Reflection lists the service and its messages to anyone who connects: with auth on it is
  // off unless the config says otherwise.
  const bool reflection = !p->auth->enabled() || c.auth.reflection_without_token;
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(c.listen, creds, &port);
  // One server per port: without this, gRPC sets SO_REUSEPORT and a second server on the
  // same port starts "successfully", and the kernel splits clients between two models.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(c.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::max<int64_t>(c.limits.max_message_bytes, kMaxWeightsChunk + 4096)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(c.keepalive.time_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(c.keepalive.timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.RegisterService(p->service.get());
  p->grpc_server = builder.BuildAndStart();
  if (!p->grpc_server || port == 0) {
    p->host->shutdown();
    throw Error(ErrorCode::kInternal, "could not listen on " + c.listen +
                                          ": the address is already in use (another server on this port?) or not a "
                                          "local address");
  }
  auto* health = p->grpc_server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  p->bound_address = c.listen.substr(0, c.listen.rfind(':')) + ":" + std::to_string(port);
  const auto info = p->host->info();
  spdlog::info("streambp-server {} listening on {} ({}{}{}); model {} ({} parameters, {}, {}); engine {}; {}",
               STREAMBP_VERSION, p->bound_address, c.tls.cert.empty() ? "plaintext" : "TLS",
               c.tls.client_ca.empty() ? "" : ", client certificates required",
               p->auth->enabled() ? ", bearer tokens required" : "", info.model.architecture, info.num_parameters,
               info.dtype, info.device, EngineName(info.engine.kind), GetRuntimeInfo().describe());
  std::unique_ptr<Server> server(new Server(std::move(p)));
  server->port_ = port;
  return server;
}

Server::Server(std::unique_ptr<ServerParts> parts) : parts_(std::move(parts)) {}

Server::~Server() { Shutdown(); }

std::string Server::address() const { return parts_->bound_address; }
TrainingHost& Server::host() { return *parts_->host; }
DeviceWorker& Server::worker() { return parts_->host->worker(); }
int64_t Server::step() const { return parts_->host->step(); }
int64_t Server::policy_version() const { return parts_->host->policy_version(); }
int Server::metrics_port() const { return parts_->metrics ? parts_->metrics->port() : 0; }

std::string Server::Shutdown() {
  auto& p = *parts_;
  std::unique_lock<std::mutex> lock(p.shutdown_mutex);
  if (p.shut_down) return p.shutdown_checkpoint;
  if (auto* health = p.grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(false);
    health->SetServingStatus(kServiceName, false);
  }
  p.shutdown_checkpoint = p.host->shutdown();
  const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(std::max(1.0, p.config.shutdown.grace_seconds)));
  p.grpc_server->Shutdown(std::chrono::system_clock::now() + grace);
  p.host->set_telemetry(nullptr);
  p.shut_down = true;
  p.shutdown_cv.notify_all();
  spdlog::info("stopped");
  return p.shutdown_checkpoint;
}

void Server::Wait() {
  std::unique_lock<std::mutex> lock(parts_->shutdown_mutex);
  parts_->shutdown_cv.wait(lock, [this] { return parts_->shut_down; });
}

}  // namespace streambp::server
