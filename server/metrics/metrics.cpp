#include "metrics.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <exception>
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

#include "streambp/error.h"

namespace streambp::server {

// Gauges and counters computed at scrape time from the server's own state.
class CallbackGauges final : public prometheus::Collectable {
 public:
  struct Entry {
    std::string name, help;
    prometheus::MetricType type;
    std::function<double()> value;
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
      prometheus::ClientMetric m;
      (e.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value) = e.value();
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

// A minimal HTTP/1.0 server for scrapes: one thread, one connection at a time (a slow
// client is cut off after kIoTimeout), GET|HEAD /metrics -> 200, other paths 404, other
// methods 405; every answer closes the connection.
class HttpEndpoint {
 public:
  /// Binds and starts serving; throws Error(kInternal) when `listen` cannot be bound.
  HttpEndpoint(const std::string& listen, std::function<std::string()> render) : render_(std::move(render)) {
    const auto colon = listen.rfind(':');
    std::string host = listen.substr(0, colon), port = listen.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      throw Error(ErrorCode::kInternal, "metrics: cannot resolve " + listen + ": " + gai_strerror(rc));
    }
    std::string why = "no address";
    for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
        listen_fd_ = fd;
      } else {
        why = std::strerror(errno);
        close(fd);
      }
    }
    freeaddrinfo(found);
    if (listen_fd_ < 0) throw Error(ErrorCode::kInternal, "metrics: could not listen on " + listen + ": " + why);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    if (pipe2(wake_, O_CLOEXEC) != 0) {
      close(listen_fd_);
      throw Error(ErrorCode::kInternal, "metrics: pipe2 failed");
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~HttpEndpoint() {
    const char stop = 1;
    if (write(wake_[1], &stop, 1) != 1) shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  static constexpr int kIoTimeoutSeconds = 5;
  static constexpr size_t kMaxRequest = 16 << 10;

  void loop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) return;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      serve(fd);
      close(fd);
    }
  }

  void serve(int fd) const {
    timeval timeout{kIoTimeoutSeconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos &&
           request.size() < kMaxRequest) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::istringstream line(request.substr(0, request.find('\n')));
    std::string method, target;
    line >> method >> target;
    target = target.substr(0, target.find('?'));
    std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
    if (method != "GET" && method != "HEAD") {
      status = "405 Method Not Allowed";
      type = "text/plain";
      body = "only GET /metrics\n";
    } else if (target != "/metrics") {
      status = "404 Not Found";
      type = "text/plain";
      body = "metrics are at /metrics\n";
    } else {
      try {
        body = render_();
      } catch (const std::exception& e) {
        status = "500 Internal Server Error";
        type = "text/plain";
        body = std::string(e.what()) + "\n";
      }
    }
    std::string out = "HTTP/1.0 " + status + "\r\nContent-Type: " + type +
                      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    if (method != "HEAD") out += body;
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  std::function<std::string()> render_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
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

}  // namespace

std::unique_ptr<MetricsExporter> MetricsExporter::Create(const std::string& listen) {
  std::unique_ptr<MetricsExporter> m(new MetricsExporter());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->callbacks_ = std::make_shared<CallbackGauges>();
  auto& r = *m->registry_;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;

  m->requests_ = &BuildCounter()
                      .Name("streambp_requests_total")
                      .Help("RPCs answered, by method and gRPC status code")
                      .Register(r);
  m->request_seconds_ = &BuildHistogram()
                             .Name("streambp_request_seconds")
                             .Help("Time from receiving an RPC to answering it (queue wait included), by method")
                             .Register(r);
  m->step_seconds_ = &BuildHistogram()
                          .Name("streambp_step_seconds")
                          .Help("Device time of a training step, by phase: forward_backward, optim_step, or train_step "
                                "(both, run by the server on pushed rollouts)")
                          .Register(r);
  m->forward_backward_seconds_ = &m->step_seconds_->Add({{"phase", "forward_backward"}}, StepBuckets());
  m->optim_seconds_ = &m->step_seconds_->Add({{"phase", "optim_step"}}, StepBuckets());
  m->train_step_seconds_ = &m->step_seconds_->Add({{"phase", "train_step"}}, StepBuckets());
  m->steps_ = &BuildCounter()
                   .Name("streambp_steps_total")
                   .Help("Optimizer steps applied (each one increments the policy version)")
                   .Register(r)
                   .Add({});
  m->skipped_steps_ = &BuildCounter()
                           .Name("streambp_skipped_steps_total")
                           .Help("Optimizer steps skipped and rolled back because the loss or a gradient was not finite")
                           .Register(r)
                           .Add({});
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

  MetricsExporter* self = m.get();
  m->http_ = std::make_unique<HttpEndpoint>(listen, [self] { return self->Render(); });
  m->port_ = m->http_->port();
  return m;
}

MetricsExporter::~MetricsExporter() { http_.reset(); }

std::string MetricsExporter::Render() const {
  auto families = registry_->Collect();
  for (auto& f : callbacks_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

void MetricsExporter::ObserveRequest(const std::string& method, const std::string& code, double seconds) {
  requests_->Add({{"method", method}, {"code", code}}).Increment();
  request_seconds_->Add({{"method", method}}, RequestBuckets()).Observe(seconds);
}

void MetricsExporter::ObserveForwardBackward(int64_t tokens, double seconds, int64_t peak_memory_bytes) {
  forward_backwards_->Increment();
  tokens_->Increment(static_cast<double>(tokens));
  forward_backward_seconds_->Observe(seconds);
  const double peak = static_cast<double>(peak_memory_bytes);
  step_peak_memory_->Set(peak);
  if (peak > max_peak_memory_->Value()) max_peak_memory_->Set(peak);  // one device thread calls this
}

void MetricsExporter::ObserveOptimStep(bool skipped, double seconds) {
  (skipped ? skipped_steps_ : steps_)->Increment();
  optim_seconds_->Observe(seconds);
}

void MetricsExporter::CountOomRefusal(const std::string& reason) { oom_refusals_->Add({{"reason", reason}}).Increment(); }

void MetricsExporter::ObserveTrainStep(double seconds) { train_step_seconds_->Observe(seconds); }

void MetricsExporter::AddGaugeCallback(const std::string& name, const std::string& help, std::function<double()> value) {
  callbacks_->add({name, help, prometheus::MetricType::Gauge, std::move(value)});
}

void MetricsExporter::AddCounterCallback(const std::string& name, const std::string& help, std::function<double()> value) {
  callbacks_->add({name, help, prometheus::MetricType::Counter, std::move(value)});
}

void MetricsExporter::SetBuildInfo(const std::vector<std::pair<std::string, std::string>>& labels) {
  prometheus::Labels l(labels.begin(), labels.end());
  build_info_->Add(l).Set(1);
}

}  // namespace streambp::server
