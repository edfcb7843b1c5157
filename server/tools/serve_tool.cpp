#include "serve_tool.h"

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <pthread.h>
#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "config.h"
#include "executor.h"
#include "server.h"
#include "streambp/dist.h"
#include "streambp/model.h"
#include "streambp/runtime.h"

namespace streambp::tools {
namespace {

server::ServerConfig BuildConfig(const ServeArgs& a) {
  // The file's fields are checked together with the flags laid over them (a file with
  // sessions.enabled and --checkpoint-dir on the command line is complete).
  auto c = a.config_file.empty() ? server::ServerConfig{} : server::ServerConfig::FromFile(a.config_file, false);
  if (!a.model_dir.empty()) c.model.dir = a.model_dir;
  if (!a.preset.empty()) c.model.preset = a.preset;
  if (!a.family.empty()) c.model.family = a.family;
  if (a.seed >= 0) c.model.seed = static_cast<uint64_t>(a.seed);
  if (!a.dtype.empty()) c.model.dtype = a.dtype;
  if (!a.device.empty()) c.model.device = a.device;
  if (!a.listen.empty()) c.listen = a.listen;
  if (!a.engine.empty()) c.trainer.engine.kind = ParseEngine(a.engine);
  if (a.chunk >= 0) c.trainer.engine.chunk = a.chunk;
  if (a.logits_chunk >= -1) c.trainer.engine.logits_chunk = a.logits_chunk;
  if (a.key_chunk >= 0) c.trainer.engine.key_chunk = a.key_chunk;
  if (a.keep_attention) c.trainer.engine.keep_attention = true;
  if (!a.optimizer.empty()) c.trainer.optimizer.name = a.optimizer;
  if (a.lr >= 0) c.trainer.optimizer.lr = a.lr;
  if (!a.checkpoint_dir.empty()) c.checkpoint_dir = a.checkpoint_dir;
  if (!a.log_format.empty()) c.log.format = a.log_format;
  if (!a.tokens.empty()) c.auth.tokens = a.tokens;
  if (a.queue_depth > 0) c.limits.queue_depth = a.queue_depth;
  if (a.max_sequence_length > 0) c.limits.max_sequence_length = a.max_sequence_length;
  if (a.memory_budget >= 0) c.limits.memory_budget_bytes = a.memory_budget;
  if (a.micro_batch_tokens >= 0) c.trainer.micro_batch_tokens = a.micro_batch_tokens;
  if (a.threads > 0) c.threads = a.threads;
  if (a.context_parallel > 0) c.parallel.context_parallel = a.context_parallel;
  if (a.history_tensorboard) c.history.tensorboard = true;
  c.Validate();
  return c;
}

// %* in a pattern: the message's fields. An event logged as a JSON object (requests, steps)
// contributes its own fields ("event":"request","method":...); any other message is
// "event":"log","msg":"...". So every line is one flat JSON object.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string text(msg.payload.data(), msg.payload.size());
    std::string out;
    if (text.size() >= 2 && text.front() == '{' && text.back() == '}') {
      out = text.substr(1, text.size() - 2);
    } else {
      out = "\"event\":\"log\",\"msg\":" + nlohmann::json(text).dump();
    }
    dest.append(out.data(), out.data() + out.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

void ConfigureLogging(const server::ServerConfig& c) {
  auto logger = spdlog::stderr_color_mt("streambp");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(c.log.level));
  if (c.log.format == "json") {
    // Messages of requests are JSON objects already; others are quoted into "msg".
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l",%*})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  }
}

// SIGHUP: the log level at runtime. With --config, re-read the file and apply its
// log.level (a file that does not parse keeps the current level); without one, toggle
// between the configured level and debug. Nothing else is reloaded.
void OnSighup(const std::string& config_file, const std::string& configured_level) {
  std::string level;
  if (!config_file.empty()) {
    try {
      level = server::ServerConfig::FromFile(config_file).log.level;
    } catch (const std::exception& e) {
      spdlog::warn("SIGHUP: kept log level {}: {}", spdlog::level::to_string_view(spdlog::get_level()), e.what());
      return;
    }
  } else {
    level = spdlog::get_level() == spdlog::level::debug ? configured_level : "debug";
  }
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::log(spdlog::level::warn, "SIGHUP: log level {}{}", level, config_file.empty() ? " (toggled)" : " from " + config_file);
}

}  // namespace

int Serve(const ServeArgs& args) {
  auto config = BuildConfig(args);
  if (args.check_config) {
    // The folder, architecture, device and dtype, without the weights — unless the config is
    // meant for another machine (a GPU node, a volume mounted there).
    if (!args.no_model_check) CheckModelSource(config.model_source());
    std::printf("%s\n", config.ToJson(/*mask_secrets=*/true).dump(2).c_str());
    std::fprintf(stderr, "config OK\n");
    return 0;
  }
  // SIGTERM, SIGINT (shutdown) and SIGHUP (log level) are handled by one thread with
  // sigwait; block them everywhere before any other thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ConfigureLogging(config);
  ConfigureThreads(config.threads);
  // Ranks > 0 of a data-parallel server follow rank 0 (which serves gRPC).
  const auto dist = DistOptions::FromEnv();
  if (dist.enabled() && dist.rank > 0) {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    // Health only, so that orchestration sees this rank is alive.
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &port);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    auto health = builder.BuildAndStart();
    if (health) health->GetHealthCheckService()->SetServingStatus(true);
    spdlog::info("rank {}: health on port {}", dist.rank, port);
    const int rc = server::RunFollower(config, dist);
    if (health) health->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    return rc;
  }
  auto server = server::Server::Create(config);
  if (!args.port_file.empty()) {
    std::ofstream(args.port_file) << server->port() << "\n";
  }
  std::thread([&server, signals, file = args.config_file, level = config.log.level] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) OnSighup(file, level);
    spdlog::info("received {}, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server->Shutdown();
  }).detach();
  server->Wait();
  return 0;
}

}  // namespace streambp::tools
