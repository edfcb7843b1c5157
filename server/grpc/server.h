#pragma once
// streambp-server's gRPC server: the streambp.v1.Trainer service over a TrainingHost,
// health and (optionally) reflection on one port, TLS from config, Prometheus metrics on
// another. Startup and shutdown live here; the handlers in service.cpp; the work in the host.
#include <chrono>
#include <memory>
#include <string>

#include "config.h"

namespace streambp::server {

class DeviceWorker;
class TrainingHost;
struct ServerParts;

/// Lifecycle: Create() builds the host (model, trainer), binds the port and starts serving
/// (health SERVING once ready); Shutdown() drains; the destructor shuts down.
/// Thread-safe: Shutdown() may be called from any thread (e.g. a signal watcher).
class Server {
 public:
  /// Throws InvalidArgument / NotFound for a bad config, model or TLS files, and
  /// Error(kInternal) naming the address when it cannot be bound (in use, not local).
  static std::unique_ptr<Server> Create(const ServerConfig& config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }  ///< the bound port (useful with listen "host:0")
  std::string address() const;       ///< host:port actually bound
  int metrics_port() const;          ///< the bound Prometheus port; 0 when metrics are off

  /// Graceful shutdown: health NOT_SERVING, no new calls, the running step finishes (up to
  /// shutdown.grace_seconds, then it is abandoned and rolled back), waiting jobs are
  /// answered UNAVAILABLE, then (if configured) a checkpoint "shutdown-<step>" is written.
  /// Returns the checkpoint name or "".
  std::string Shutdown();
  /// Blocks until Shutdown() has completed.
  void Wait();

  TrainingHost& host();
  /// For tests: the device worker (pause/resume to hold jobs in the queue).
  DeviceWorker& worker();
  int64_t step() const;
  int64_t policy_version() const;

 private:
  explicit Server(std::unique_ptr<ServerParts> parts);
  void guard_listener();  // the listener guard's thread (server.cpp)

  std::unique_ptr<ServerParts> parts_;
  int port_ = 0;
};

}  // namespace streambp::server
