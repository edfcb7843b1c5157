#include "server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <thread>
#include <fstream>
#include <mutex>
#include <sstream>

#include <grpc/support/log.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "dashboard.h"
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
  // Per session: one series each with a `session` label (at most sessions.max_sessions), or
  // one unlabelled series on a server without sessions.
  const bool sessions = host->config().sessions.enabled;
  using Samples = MetricsExporter::Samples;
  auto per_session = [host, sessions](std::function<double(const SessionReport&, const RolloutStats&)> value) {
    return [host, sessions, value]() -> Samples {
      Samples out;
      if (!sessions) {
        SessionReport r;
        r.policy_version = host->policy_version();
        r.step = host->step();
        out.push_back({{}, value(r, host->rollout_stats())});
        return out;
      }
      for (const auto& r : host->list_sessions()) {
        try {
          out.push_back({{{"session", r.spec.name}}, value(r, host->rollout_stats(r.spec.name))});
        } catch (const Error&) {  // deleted since it was listed
        }
      }
      return out;
    };
  };
  m.AddGaugeSamples("streambp_policy_version", "Version of the policy (+1 per applied optimizer step)",
                    per_session([](const SessionReport& r, const RolloutStats&) { return double(r.policy_version); }));
  m.AddGaugeSamples("streambp_optimizer_step", "The trainer's optimizer step (restored by LoadCheckpoint)",
                    per_session([](const SessionReport& r, const RolloutStats&) { return double(r.step); }));
  auto rollouts = [&per_session](int64_t RolloutStats::*field) {
    return per_session([field](const SessionReport&, const RolloutStats& s) { return static_cast<double>(s.*field); });
  };
  m.AddCounterSamples("streambp_rollouts_accepted_total", "Rollout groups pushed and queued",
                      rollouts(&RolloutStats::accepted));
  m.AddCounterSamples("streambp_rollouts_consumed_total", "Rollout groups taken into a training step",
                      rollouts(&RolloutStats::consumed));
  m.AddCounterSamples("streambp_rollouts_dropped_total",
                      "Rollout groups dropped as stale (older than current version - rollouts.max_staleness)",
                      rollouts(&RolloutStats::dropped_stale));
  m.AddCounterSamples("streambp_rollouts_duplicates_total", "Rollout groups pushed again under a known group_id",
                      rollouts(&RolloutStats::duplicates));
  m.AddCounterSamples("streambp_rollouts_invalid_total", "Rollout groups refused or dropped as untrainable",
                      rollouts(&RolloutStats::invalid));
  m.AddGaugeSamples("streambp_rollout_queue_depth", "Rollout groups waiting for a step",
                    rollouts(&RolloutStats::queue_depth));
  m.AddGaugeSamples("streambp_rollouts_in_step", "Rollout groups taken by the running step, not yet consumed",
                    rollouts(&RolloutStats::in_step));
  if (sessions) {
    m.AddGaugeSamples("streambp_sessions", "Sessions on the server, by state: resident (in device memory) or on_disk",
                      [host]() -> Samples {
                        double resident = 0, on_disk = 0;
                        for (const auto& r : host->list_sessions()) (r.resident ? resident : on_disk) += 1;
                        return {{{{"state", "resident"}}, resident}, {{{"state", "on_disk"}}, on_disk}};
                      });
  }
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

// gRPC 1.51 stops accepting on a listening port for good when accept4() fails with
// anything but EAGAIN/ECONNABORTED — e.g. EMFILE when idle connections have used up the
// descriptors — and says so only in its log ("Failed accept4: Too many open files"). The hook
// below counts those lines (and passes every line on to gRPC's own logger); each server's
// guard thread then rebuilds its listener on the same port.
std::mutex g_accept_mutex;
std::condition_variable* g_accept_cv = nullptr;  // the guards wait on it
std::atomic<uint64_t> g_accept_failures{0};
std::condition_variable g_accept_cv_storage;

void GrpcLog(gpr_log_func_args* args) {
  if (args->message != nullptr && std::strstr(args->message, "Failed accept") != nullptr) {
    g_accept_failures.fetch_add(1);
    g_accept_cv_storage.notify_all();
  }
  // As gRPC's own logger prints it (severity letter, file:line, message).
  const char* file = args->file != nullptr ? std::strrchr(args->file, '/') : nullptr;
  std::fprintf(stderr, "%s %s:%d] %s\n", gpr_log_severity_string(args->severity),
               file != nullptr ? file + 1 : (args->file != nullptr ? args->file : "?"), args->line,
               args->message != nullptr ? args->message : "");
}

void InstallGrpcLogHook() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_accept_cv = &g_accept_cv_storage;
    gpr_set_log_function(GrpcLog);
  });
}

// Raises the soft limit on open descriptors to the hard one (systemd's and containerd's soft
// default is 1024, which about a thousand idle connections use up).
void RaiseFileLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return;
  const rlim_t before = l.rlim_cur;
  if (l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &l) != 0) return;
  }
  spdlog::debug("open files: soft limit {} -> {} (hard {})", before, l.rlim_cur, l.rlim_max);
}

// Everything a running server owns, destroyed in reverse order of construction.
struct ServerParts {
  ServerConfig config;
  std::unique_ptr<TrainingHost> host;
  std::unique_ptr<MetricsExporter> metrics;
  std::unique_ptr<ServerTelemetry> telemetry;
  std::unique_ptr<Authorizer> auth;
  std::unique_ptr<CallObserver> observer;
  std::unique_ptr<TrainerService> service;
  std::unique_ptr<grpc::Server> grpc_server;  ///< replaced by the listener guard (under grpc_mutex)
  std::shared_ptr<grpc::ServerCredentials> creds;
  bool reflection = true;
  std::string bound_address;
  std::mutex grpc_mutex;
  std::thread guard;  ///< restarts the listener when gRPC stops accepting (see ListenerGuard)
  std::condition_variable guard_cv;
  bool guard_stop = false;
  uint64_t accept_failures_seen = 0;
  std::mutex shutdown_mutex;
  std::condition_variable shutdown_cv;
  bool shut_down = false;
  std::string shutdown_checkpoint;
};

// The gRPC server of `p` listening on `listen`: at start, and again when the guard rebuilds it.
std::unique_ptr<grpc::Server> BuildGrpcServer(ServerParts& p, const std::string& listen, int* port) {
  const auto& c = p.config;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!p.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddListeningPort(listen, p.creds, port);
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
  // A connection that has not finished its HTTP/2 (and TLS) handshake in 10 s is closed: a
  // socket opened and left idle holds a descriptor no longer than that.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder.RegisterService(p.service.get());
  auto server = builder.BuildAndStart();
  if (server) {
    auto* health = server->GetHealthCheckService();
    health->SetServingStatus(true);
    health->SetServingStatus(kServiceName, true);
  }
  return server;
}

std::unique_ptr<Server> Server::Create(const ServerConfig& config) {
  auto p = std::make_unique<ServerParts>();
  p->config = config;
  const auto& c = p->config;
  c.Validate();
  RaiseFileLimit();
  p->host = TrainingHost::Create(c);
  if (!c.metrics.listen.empty()) {
    const bool dashboard = DashboardEnabled(c);
    p->metrics = MetricsExporter::Create(c.metrics.listen, c.sessions.enabled && c.sessions.metrics_label,
                                         dashboard ? DashboardRoutes(p->host.get(), c)
                                                   : std::map<std::string, HttpEndpoint::Route>{});
    RegisterGauges(*p->metrics, p->host.get());
    const std::string base = "http://" + c.metrics.listen.substr(0, c.metrics.listen.rfind(':')) + ":" +
                             std::to_string(p->metrics->port());
    spdlog::info("metrics on {}/metrics", base);
    if (dashboard) spdlog::info("dashboard on {}/dashboard", base);
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
  p->creds = creds;
  // Reflection lists the service and its messages to anyone who connects: with auth on it is
  // off unless the config says otherwise.
  p->reflection = !p->auth->enabled() || c.auth.reflection_without_token;
  InstallGrpcLogHook();
  int port = 0;
  p->grpc_server = BuildGrpcServer(*p, c.listen, &port);
  if (!p->grpc_server || port == 0) {
    p->host->shutdown();
    throw Error(ErrorCode::kInternal, "could not listen on " + c.listen +
                                          ": the address is already in use (another server on this port?) or not a "
                                          "local address");
  }
  p->bound_address = c.listen.substr(0, c.listen.rfind(':')) + ":" + std::to_string(port);
  const auto info = p->host->info();
  spdlog::info("streambp-server {} listening on {} ({}{}{}); model {} ({} parameters, {}, {}); engine {}; {}",
               STREAMBP_VERSION, p->bound_address, c.tls.cert.empty() ? "plaintext" : "TLS",
               c.tls.client_ca.empty() ? "" : ", client certificates required",
               p->auth->enabled() ? ", bearer tokens required" : "", info.model.architecture, info.num_parameters,
               info.dtype, info.device, EngineName(info.engine.kind), GetRuntimeInfo().describe());
  std::unique_ptr<Server> server(new Server(std::move(p)));
  server->port_ = port;
  server->parts_->guard = std::thread([s = server.get()] { s->guard_listener(); });
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

void Server::guard_listener() {
  auto& p = *parts_;
  std::unique_lock<std::mutex> lock(g_accept_mutex);
  p.accept_failures_seen = g_accept_failures.load();
  for (;;) {
    g_accept_cv->wait_for(lock, std::chrono::seconds(1),
                          [&] { return p.guard_stop || g_accept_failures.load() != p.accept_failures_seen; });
    if (p.guard_stop) return;
    if (g_accept_failures.load() == p.accept_failures_seen) continue;
    p.accept_failures_seen = g_accept_failures.load();
    lock.unlock();
    // Closing the old server's connections gives their descriptors back; the new listener
    // takes the same port. Clients reconnect (their calls in flight end UNAVAILABLE).
    rlimit l{};
    getrlimit(RLIMIT_NOFILE, &l);
    spdlog::error("the gRPC listener stopped accepting connections (out of file descriptors: the limit is {}); "
                  "closing every connection and listening again on port {}",
                  static_cast<int64_t>(l.rlim_cur), port_);
    {
      std::lock_guard<std::mutex> g(p.grpc_mutex);
      if (p.guard_stop) return;
      p.grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      p.grpc_server.reset();
      const std::string listen = p.config.listen.substr(0, p.config.listen.rfind(':')) + ":" + std::to_string(port_);
      for (int attempt = 0; attempt < 50 && !p.grpc_server; ++attempt) {
        int port = 0;
        p.grpc_server = BuildGrpcServer(p, listen, &port);
        if (!p.grpc_server || port == 0) {
          p.grpc_server.reset();
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      }
      if (!p.grpc_server) {
        spdlog::critical("could not listen on port {} again; stopping so that a supervisor restarts the server", port_);
        std::_Exit(3);
      }
      spdlog::info("listening again on port {}", port_);
    }
    lock.lock();
    p.accept_failures_seen = g_accept_failures.load();  // lines the old listener logged while it closed
  }
}

std::string Server::Shutdown() {
  auto& p = *parts_;
  {
    std::lock_guard<std::mutex> lock(g_accept_mutex);
    p.guard_stop = true;
  }
  g_accept_cv_storage.notify_all();
  if (p.guard.joinable() && p.guard.get_id() != std::this_thread::get_id()) p.guard.join();
  std::unique_lock<std::mutex> lock(p.shutdown_mutex);
  if (p.shut_down) return p.shutdown_checkpoint;
  if (auto* health = p.grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(false);
    health->SetServingStatus(kServiceName, false);
  }
  p.shutdown_checkpoint = p.host->shutdown();
  const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(std::max(1.0, p.config.shutdown.grace_seconds)));
  {
    std::lock_guard<std::mutex> g(p.grpc_mutex);
    p.grpc_server->Shutdown(std::chrono::system_clock::now() + grace);
  }
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
