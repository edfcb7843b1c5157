#pragma once
// Prometheus metrics of streambp-server, served over HTTP (`GET /metrics`, text format
// 0.0.4) on a port of their own, separate from the gRPC port.
//
// The registry, metric types and text serializer are prometheus-cpp's (core). The HTTP
// side is a small endpoint of ours rather than prometheus::Exposer: Exposer's civetweb
// starts its threads with a fixed 100 KiB stack, and in a process that links Debian's
// LibTorch (static TLS of OpenBLAS + glog + torch is ~100 KiB) pthread_create refuses
// that stack with EINVAL, so Exposer cannot start at all.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
class HttpEndpoint;

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
  static std::unique_ptr<MetricsExporter> Create(const std::string& listen);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  int port() const { return port_; }  ///< the bound port

  /// One answered RPC: streambp_requests_total{method,code}, streambp_request_seconds{method}.
  void ObserveRequest(const std::string& method, const std::string& code, double seconds);
  /// One forward-backward on the device: tokens, streambp_step_seconds{phase="forward_backward"},
  /// the step's peak tracked memory.
  void ObserveForwardBackward(int64_t tokens, double seconds, int64_t peak_memory_bytes);
  /// One optimizer step: applied (streambp_steps_total) or skipped (non-finite loss or
  /// gradient: streambp_skipped_steps_total), and streambp_step_seconds{phase="optim_step"}.
  void ObserveOptimStep(bool skipped, double seconds);
  /// A step refused for memory: reason "estimate" (over limits.memory_budget_bytes before
  /// starting) or "out_of_memory" (an allocation failed during the step; rolled back).
  void CountOomRefusal(const std::string& reason);
  /// A whole step (TrainStep, or a GRPO step the server runs on pushed rollouts):
  /// streambp_step_seconds{phase="train_step"}. Its halves are observed on their own.
  void ObserveTrainStep(double seconds);

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

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<CallbackGauges> callbacks_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* request_seconds_ = nullptr;
  prometheus::Family<prometheus::Histogram>* step_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* oom_refusals_ = nullptr;
  prometheus::Family<prometheus::Gauge>* build_info_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* skipped_steps_ = nullptr;
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
