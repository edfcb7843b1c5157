#include "metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "http_endpoint.h"
#include "streambp/error.h"

namespace streambp::server {

// Gauges and counters computed at scrape time from the server's own state.
class CallbackGauges final : public prometheus::Collectable {
 public:
  struct Entry {
    std::string name, help;
    prometheus::MetricType type;
    std::function<MetricsExporter::Samples()> samples;
  };
  void add(Entry e) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.push_back(std::move(e));
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<prometheus::MetricFamily> out;
    for (const auto& e : entries_) {
      prometheus::MetricFamily f;
      f.name = e.name;
      f.help = e.help;
      f.type = e.type;
      for (const auto& [labels, value] : e.samples()) {
        prometheus::ClientMetric m;
        for (const auto& [k, v] : labels) m.label.push_back({k, v});
        (e.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value) = value;
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

namespace {

// `n` bounds from `start`, each `factor` times the previous.
prometheus::Histogram::BucketBoundaries Exponential(double start, double factor, int n) {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

const auto& RequestBuckets() {
  static const auto b = Exponential(0.0005, 4, 11);  // 0.5 ms .. ~9 min
  return b;
}
const auto& StepBuckets() {
  static const auto b = Exponential(0.005, 2.5, 13);  // 5 ms .. ~10 min
  return b;
}

// Process metrics as the Prometheus client libraries name them, read from /proc at scrape time.
double ProcStatmBytes(int field) {
  std::ifstream in("/proc/self/statm");
  double pages[2] = {0, 0};
  in >> pages[0] >> pages[1];
  return pages[field] * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  double n = 0;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

double ProcessStartTime() {
  // /proc/self/stat field 22: start time in clock ticks after boot; /proc/stat btime: boot time.
  std::ifstream stat("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) ticks = std::stod(field);
  }
  std::ifstream proc("/proc/stat");
  std::string key;
  double btime = 0;
  while (proc >> key) {
    if (key == "btime") {
      proc >> btime;
      break;
    }
  }
  return btime + ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The gRPC method type of a streambp.v1.Trainer method (grpc_type label).
std::string GrpcType(const std::string& method) {
  if (method == "PushRolloutsStream") return "bidi_stream";
  if (method == "ExportWeights" || method == "WatchPolicy" || method == "ForwardBackwardProgress" ||
      method == "TrainStepProgress") {
    return "server_stream";
  }
  return "unary";
}

// A low-cardinality label of an optimizer step's skip reason.
std::string SkipReason(const std::string& reason) {
  if (reason.find("loss") != std::string::npos) return "nonfinite_loss";
  if (reason.find("grad") != std::string::npos) return "nonfinite_grad_norm";
  return "other";
}

constexpr const char* kService = "streambp.v1.Trainer";

}  // namespace

std::unique_ptr<MetricsExporter> MetricsExporter::Create(const std::string& listen, bool session_label,
                                                         std::map<std::string, HttpEndpoint::Route> pages) {
  std::unique_ptr<MetricsExporter> m(new MetricsExporter());
  m->session_label_ = session_label;
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->callbacks_ = std::make_shared<CallbackGauges>();
  auto& r = *m->registry_;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;

  // RPCs, under the names stock gRPC dashboards use (go-grpc-prometheus / grpc-ecosystem).
  m->started_ = &BuildCounter()
                     .Name("grpc_server_started_total")
                     .Help("RPCs started on the server")
                     .Register(r);
  m->handled_ = &BuildCounter()
                     .Name("grpc_server_handled_total")
                     .Help("RPCs completed on the server, by gRPC status code")
                     .Register(r);
  m->handling_seconds_ = &BuildHistogram()
                              .Name("grpc_server_handling_seconds")
                              .Help("Time from receiving an RPC to answering it (queue wait included)")
                              .Register(r);
  m->step_seconds_ = &BuildHistogram()
                          .Name("streambp_step_seconds")
                          .Help("Device time of a training step, by phase: forward_backward, optim_step, or train_step "
                                "(a whole TrainStep, or a step the server runs on pushed rollouts)")
                          .Register(r);
  m->forward_backward_seconds_ = &m->step_seconds_->Add({{"phase", "forward_backward"}}, StepBuckets());
  m->optim_seconds_ = &m->step_seconds_->Add({{"phase", "optim_step"}}, StepBuckets());
  m->train_step_seconds_ = &m->step_seconds_->Add({{"phase", "train_step"}}, StepBuckets());
  m->steps_ = &BuildCounter()
                   .Name("streambp_steps_total")
                   .Help("Optimizer steps applied (each one increments the policy version)")
                   .Register(r);
  m->skipped_steps_ = &BuildCounter()
                           .Name("streambp_skipped_steps_total")
                           .Help("Optimizer steps skipped and rolled back, by reason: nonfinite_loss, nonfinite_grad_norm")
                           .Register(r);
  m->forward_backwards_ = &BuildCounter()
                               .Name("streambp_forward_backward_total")
                               .Help("Forward-backward passes completed (gradient accumulations)")
                               .Register(r)
                               .Add({});
  m->tokens_ = &BuildCounter()
                    .Name("streambp_tokens_total")
                    .Help("Tokens processed by completed forward-backward passes")
                    .Register(r)
                    .Add({});
  // Training signals of the last step (per session with sessions.metrics_label).
  m->loss_ = &BuildGauge().Name("streambp_loss").Help("Loss of the last forward-backward").Register(r);
  m->grad_norm_ = &BuildGauge()
                       .Name("streambp_grad_norm")
                       .Help("Gradient norm of the last optimizer step, before clipping")
                       .Register(r);
  m->learning_rate_ = &BuildGauge()
                           .Name("streambp_learning_rate")
                           .Help("Learning rate of the last optimizer step")
                           .Register(r);
  m->tokens_per_second_ = &BuildGauge()
                               .Name("streambp_tokens_per_second")
                               .Help("Tokens per second of device time of the last forward-backward")
                               .Register(r);
  m->reward_mean_ = &BuildGauge()
                         .Name("streambp_reward_mean")
                         .Help("Mean reward of the last GRPO step's completions")
                         .Register(r);
  m->kl_ = &BuildGauge()
                .Name("streambp_kl")
                .Help("Mean k3 KL to the reference of the last GRPO step (when beta > 0)")
                .Register(r);
  m->oom_refusals_ = &BuildCounter()
                          .Name("streambp_oom_refusals_total")
                          .Help("Steps refused for memory: estimate = over the budget before starting, "
                                "out_of_memory = an allocation failed during the step (rolled back)")
                          .Register(r);
  m->oom_refusals_->Add({{"reason", "estimate"}});
  m->oom_refusals_->Add({{"reason", "out_of_memory"}});
  m->step_peak_memory_ = &BuildGauge()
                              .Name("streambp_step_peak_memory_bytes")
                              .Help("Peak tracked memory above the resident state during the last forward-backward")
                              .Register(r)
                              .Add({});
  m->max_peak_memory_ = &BuildGauge()
                             .Name("streambp_max_step_peak_memory_bytes")
                             .Help("Largest streambp_step_peak_memory_bytes since the server started")
                             .Register(r)
                             .Add({});
  m->build_info_ = &BuildGauge()
                        .Name("streambp_build_info")
                        .Help("Always 1; the labels describe the build and runtime")
                        .Register(r);
  if (!session_label) {  // shown at 0 before the first step
    m->steps_->Add({});
    for (const char* reason : {"nonfinite_loss", "nonfinite_grad_norm"}) m->skipped_steps_->Add({{"reason", reason}});
  }

  m->AddGaugeCallback("process_resident_memory_bytes", "Resident memory size in bytes", [] { return ProcStatmBytes(1); });
  m->AddGaugeCallback("process_virtual_memory_bytes", "Virtual memory size in bytes", [] { return ProcStatmBytes(0); });
  m->AddCounterCallback("process_cpu_seconds_total", "Total user and system CPU time spent in seconds", [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  });
  m->AddGaugeCallback("process_open_fds", "Number of open file descriptors", [] { return OpenFds(); });
  m->AddGaugeCallback("process_max_fds", "Maximum number of open file descriptors", [] {
    rlimit l{};
    getrlimit(RLIMIT_NOFILE, &l);
    return static_cast<double>(l.rlim_cur);
  });
  const double start = ProcessStartTime();
  m->AddGaugeCallback("process_start_time_seconds", "Start time of the process since the Unix epoch in seconds",
                      [start] { return start; });

  MetricsExporter* self = m.get();
  std::map<std::string, HttpEndpoint::Route> routes = std::move(pages);
  routes["/metrics"] = [self](const HttpRequest&) { return HttpAnswer{200, "text/plain; version=0.0.4; charset=utf-8", self->Render()}; };
  m->http_ = std::make_unique<HttpEndpoint>(listen, std::move(routes), HttpEndpoint::Options{});
  m->port_ = m->http_->port();
  return m;
}

MetricsExporter::~MetricsExporter() { http_.reset(); }

std::string MetricsExporter::Render() const {
  auto families = registry_->Collect();
  for (auto& f : callbacks_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

prometheus::Labels MetricsExporter::Session(const std::string& session) const {
  return session_label_ ? prometheus::Labels{{"session", session}} : prometheus::Labels{};
}

void MetricsExporter::ObserveRequestStarted(const std::string& method) {
  started_->Add({{"grpc_service", kService}, {"grpc_method", method}, {"grpc_type", GrpcType(method)}}).Increment();
}

void MetricsExporter::ObserveRequest(const std::string& method, const std::string& code, double seconds) {
  const std::string type = GrpcType(method);
  handled_->Add({{"grpc_service", kService}, {"grpc_method", method}, {"grpc_type", type}, {"grpc_code", code}})
      .Increment();
  handling_seconds_->Add({{"grpc_service", kService}, {"grpc_method", method}, {"grpc_type", type}}, RequestBuckets())
      .Observe(seconds);
}

void MetricsExporter::ObserveForwardBackward(const ForwardBackwardSample& s) {
  forward_backwards_->Increment();
  tokens_->Increment(static_cast<double>(s.tokens));
  forward_backward_seconds_->Observe(s.seconds);
  const double peak = static_cast<double>(s.peak_memory_bytes);
  step_peak_memory_->Set(peak);
  if (peak > max_peak_memory_->Value()) max_peak_memory_->Set(peak);  // one device thread calls this
  const auto labels = Session(s.session);
  loss_->Add(labels).Set(s.loss);
  if (s.seconds > 0) tokens_per_second_->Add(labels).Set(static_cast<double>(s.tokens) / s.seconds);
  if (auto it = s.metrics.find("reward_mean"); it != s.metrics.end()) reward_mean_->Add(labels).Set(it->second);
  if (auto it = s.metrics.find("kl"); it != s.metrics.end()) kl_->Add(labels).Set(it->second);
}

void MetricsExporter::ObserveOptimStep(const std::string& session, bool skipped, const std::string& reason,
                                       double grad_norm, double learning_rate, double seconds) {
  auto labels = Session(session);
  if (skipped) {
    labels["reason"] = SkipReason(reason);
    skipped_steps_->Add(labels).Increment();
  } else {
    steps_->Add(labels).Increment();
  }
  const auto plain = Session(session);
  if (std::isfinite(grad_norm)) grad_norm_->Add(plain).Set(grad_norm);
  learning_rate_->Add(plain).Set(learning_rate);
  optim_seconds_->Observe(seconds);
}

void MetricsExporter::CountOomRefusal(const std::string& reason) { oom_refusals_->Add({{"reason", reason}}).Increment(); }

void MetricsExporter::ObserveTrainStep(double seconds) { train_step_seconds_->Observe(seconds); }


void MetricsExporter::AddGaugeSamples(const std::string& name, const std::string& help, std::function<Samples()> samples) {
  callbacks_->add({name, help, prometheus::MetricType::Gauge, std::move(samples)});
}

void MetricsExporter::AddCounterSamples(const std::string& name, const std::string& help,
                                        std::function<Samples()> samples) {
  callbacks_->add({name, help, prometheus::MetricType::Counter, std::move(samples)});
}

void MetricsExporter::AddGaugeCallback(const std::string& name, const std::string& help, std::function<double()> value) {
  AddGaugeSamples(name, help, [value = std::move(value)] { return Samples{{{}, value()}}; });
}

void MetricsExporter::AddCounterCallback(const std::string& name, const std::string& help, std::function<double()> value) {
  AddCounterSamples(name, help, [value = std::move(value)] { return Samples{{{}, value()}}; });
}

void MetricsExporter::SetBuildInfo(const std::vector<std::pair<std::string, std::string>>& labels) {
  prometheus::Labels l(labels.begin(), labels.end());
  build_info_->Add(l).Set(1);
}

}  // namespace streambp::server
