#pragma once
// Prometheus metrics of streambp-server, served over HTTP (`GET /metrics`, text format
// 0.0.4) on a port of their own, separate from the gRPC port.
//
// The registry, metric types and text serializer are prometheus-cpp's (core); the HTTP side
// is the project's own HttpEndpoint (http_endpoint.h: bounded connections and time per
// request; prometheus::Exposer's civetweb threads ask for a 100 KiB stack, which glibc
// refuses in a process with LibTorch's static TLS).
//
// Families: the standard gRPC server metrics (grpc_server_started_total, _handled_total,
// _handling_seconds, labelled grpc_service / grpc_method / grpc_type / grpc_code), the
// training signals of the last step (streambp_loss, _grad_norm, _learning_rate,
// _tokens_per_second, _reward_mean, _kl; with a `session` label when configured), step
// counters and timings, memory, the rollout queue, process_* metrics and build info.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "http_endpoint.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace streambp::server {

class CallbackGauges;

/// Owns a prometheus::Registry and the HTTP exposer that serves it.
///
/// Lifecycle: Create() registers every metric (so a scrape shows them at 0 before the
/// first request) and binds the port; the destructor stops the HTTP server before the
/// metrics go away. Thread-safe: every Observe*/Count* method may be called from any
/// thread (gRPC threads and the device thread) at any time; the callbacks of
/// AddGaugeCallback() run on the exposer's threads during a scrape and must be cheap and
/// thread-safe.
class MetricsExporter {
 public:
  /// `listen` is host:port (port 0 picks a free one, see port()). Serves GET /metrics
  /// (other paths: 404) one connection at a time on a thread of its own. Throws
  /// Error(kInternal) naming the address when it cannot be bound.
  /// `session_label`: the training signals carry a `session` label (sessions.metrics_label).
  /// `pages`: more routes served on the same port (the dashboard).
  static std::unique_ptr<MetricsExporter> Create(const std::string& listen, bool session_label = false,
                                                 std::map<std::string, HttpEndpoint::Route> pages = {});
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  int port() const { return port_; }  ///< the bound port

  /// An RPC arrived: grpc_server_started_total{grpc_service,grpc_method,grpc_type}.
  void ObserveRequestStarted(const std::string& method);
  /// An RPC was answered: grpc_server_handled_total{...,grpc_code} (code as gRPC names it,
  /// e.g. INVALID_ARGUMENT) and grpc_server_handling_seconds{...}.
  void ObserveRequest(const std::string& method, const std::string& code, double seconds);
  /// One forward-backward on the device.
  struct ForwardBackwardSample {
    std::string session;
    int64_t tokens = 0;
    double seconds = 0;
    int64_t peak_memory_bytes = 0;
    double loss = 0;
    std::map<std::string, double> metrics;  ///< the objective's (reward_mean, kl, ...)
  };
  void ObserveForwardBackward(const ForwardBackwardSample& sample);
  /// One optimizer step: applied (streambp_steps_total) or skipped
  /// (streambp_skipped_steps_total{reason}), its gradient norm and learning rate, and
  /// streambp_step_seconds{phase="optim_step"}.
  void ObserveOptimStep(const std::string& session, bool skipped, const std::string& reason, double grad_norm,
                        double learning_rate, double seconds);
  /// A step refused for memory: reason "estimate" (over limits.memory_budget_bytes before
  /// starting) or "out_of_memory" (an allocation failed during the step; rolled back).
  void CountOomRefusal(const std::string& reason);
  /// A whole step (TrainStep, or a GRPO step the server runs on pushed rollouts):
  /// streambp_step_seconds{phase="train_step"}. Its halves are observed on their own.
  void ObserveTrainStep(double seconds);

  /// Labelled values of one family, read at scrape time (e.g. one per session).
  using Samples = std::vector<std::pair<std::map<std::string, std::string>, double>>;
  void AddGaugeSamples(const std::string& name, const std::string& help, std::function<Samples()> samples);
  void AddCounterSamples(const std::string& name, const std::string& help, std::function<Samples()> samples);
  /// A gauge whose value is read at scrape time (queue depth, policy version, live memory).
  void AddGaugeCallback(const std::string& name, const std::string& help, std::function<double()> value);
  /// A counter kept elsewhere (e.g. the rollout queue's), read at scrape time; `value`
  /// must never decrease while the process lives.
  void AddCounterCallback(const std::string& name, const std::string& help, std::function<double()> value);
  /// streambp_build_info{labels...} 1 (version, LibTorch, BLAS, CUDA).
  void SetBuildInfo(const std::vector<std::pair<std::string, std::string>>& labels);

 private:
  MetricsExporter() = default;
  std::string Render() const;  // the exposition of every metric
  std::map<std::string, std::string> Session(const std::string& session) const;  // the session label, if any

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<CallbackGauges> callbacks_;
  bool session_label_ = false;
  prometheus::Family<prometheus::Counter>* started_ = nullptr;
  prometheus::Family<prometheus::Counter>* handled_ = nullptr;
  prometheus::Family<prometheus::Histogram>* handling_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* steps_ = nullptr;
  prometheus::Family<prometheus::Counter>* skipped_steps_ = nullptr;
  prometheus::Family<prometheus::Gauge>* loss_ = nullptr;
  prometheus::Family<prometheus::Gauge>* grad_norm_ = nullptr;
  prometheus::Family<prometheus::Gauge>* learning_rate_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tokens_per_second_ = nullptr;
  prometheus::Family<prometheus::Gauge>* reward_mean_ = nullptr;
  prometheus::Family<prometheus::Gauge>* kl_ = nullptr;
  prometheus::Family<prometheus::Histogram>* step_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* oom_refusals_ = nullptr;
  prometheus::Family<prometheus::Gauge>* build_info_ = nullptr;
  prometheus::Counter* forward_backwards_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Gauge* step_peak_memory_ = nullptr;
  prometheus::Gauge* max_peak_memory_ = nullptr;
  prometheus::Histogram* forward_backward_seconds_ = nullptr;
  prometheus::Histogram* optim_seconds_ = nullptr;
  prometheus::Histogram* train_step_seconds_ = nullptr;
  int port_ = 0;
  // Last: destroyed first, so no scrape runs while the metrics above go away.
  std::unique_ptr<HttpEndpoint> http_;
};

}  // namespace streambp::server
