// The Prometheus endpoint of a real server: scraped over HTTP on loopback (a plain
// socket GET, as Prometheus does), values checked against what the RPCs answered, and the
// exposition checked by `promtool check metrics` when promtool is installed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "device_worker.h"

namespace streambp {
namespace {

using testing::StartServer;
using testing::TestConfig;
using testing::HttpGet;
using testing::HttpResponse;
using Labels = std::map<std::string, std::string>;

// The samples of a text exposition: name -> (labels -> value).
class Scrape {
 public:
  explicit Scrape(const std::string& text) : text_(text) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      Labels labels;
      const auto brace = line.find('{');
      const auto space = line.rfind(' ');
      std::string name = line.substr(0, std::min(brace, line.find(' ')));
      if (brace != std::string::npos) {
        const auto end = line.rfind('}');
        std::string inner = line.substr(brace + 1, end - brace - 1);
        // k="v",k="v" (our label values hold no quotes or commas).
        for (size_t pos = 0; pos < inner.size();) {
          const auto eq = inner.find('=', pos);
          const auto close = inner.find('"', eq + 2);
          labels[inner.substr(pos, eq - pos)] = inner.substr(eq + 2, close - eq - 2);
          pos = close + 2;
        }
      }
      samples_[name][labels] = std::strtod(line.c_str() + space + 1, nullptr);
    }
  }
  bool has(const std::string& name, const Labels& labels = {}) const {
    auto it = samples_.find(name);
    return it != samples_.end() && it->second.count(labels) > 0;
  }
  /// The sample's value; a missing sample fails the test and reads as -1.
  double value(const std::string& name, const Labels& labels = {}) const {
    auto it = samples_.find(name);
    if (it == samples_.end() || !it->second.count(labels)) {
      ADD_FAILURE() << "no sample " << name << " with " << labels.size() << " labels in:\n" << text_;
      return -1;
    }
    return it->second.at(labels);
  }
  const std::map<std::string, std::map<Labels, double>>& samples() const { return samples_; }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::map<std::string, std::map<Labels, double>> samples_;
};

Scrape ScrapeMetrics(const server::Server& server) {
  auto r = HttpGet(server.metrics_port(), "/metrics");
  EXPECT_EQ(r.status, 200) << r.headers;
  EXPECT_NE(r.headers.find("text/plain"), std::string::npos) << r.headers;
  return Scrape(r.body);
}

server::ServerConfig MetricsConfig() {
  auto c = TestConfig();
  c.metrics.listen = "127.0.0.1:0";
  return c;
}

v1::TrainStepRequest SftStep() {
  v1::TrainStepRequest r;
  *r.mutable_batch() = client::ReadBatchJsonl(testing::WriteFile("metrics_sft.jsonl", testing::SftJsonl()), "sft");
  return r;
}

// promtool (Debian package `prometheus`) lints the exposition format and metric names.
void ExpectPromtoolAccepts(const std::string& text) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not found (Debian package prometheus): the exposition was not linted";
  }
  const auto dir = std::filesystem::temp_directory_path() / ("metrics_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto file = (dir / "scrape.txt").string(), out = (dir / "promtool.txt").string();
  std::ofstream(file) << text;
  const int rc = std::system(("promtool check metrics < " + file + " > " + out + " 2>&1").c_str());
  std::stringstream lint;
  lint << std::ifstream(out).rdbuf();
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << lint.str() << "\non:\n" << text;
  EXPECT_EQ(lint.str(), "") << "promtool check metrics complained:\n" << lint.str();
  std::filesystem::remove_all(dir);
}

TEST(Metrics, OffByDefault) {
  auto s = StartServer(TestConfig());
  EXPECT_EQ(s.server->metrics_port(), 0);
}

TEST(Metrics, ConfigSectionRejectsUnknownKeys) {
  auto c = server::ServerConfig::FromJson(nlohmann::json::parse(R"({"metrics": {"listen": "0.0.0.0:9464"}})"));
  EXPECT_EQ(c.metrics.listen, "0.0.0.0:9464");
  EXPECT_EQ(c.ToJson()["metrics"]["listen"], "0.0.0.0:9464");
  try {
    server::ServerConfig::FromJson(nlohmann::json::parse(R"({"metrics": {"listen": "", "port": 1}})"));
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.port"), std::string::npos) << e.what();
  }
  EXPECT_THROW(server::ServerConfig::FromJson(nlohmann::json::parse(R"({"metrics": {"listen": "9464"}})")),
               std::exception);
}

TEST(Metrics, ScrapeCountsTheStepsTokensAndRequests) {
  auto s = StartServer(MetricsConfig());
  ASSERT_GT(s.server->metrics_port(), 0);
  ASSERT_NE(s.server->metrics_port(), s.server->port());

  // Before any step: every family is there, at zero.
  auto first = ScrapeMetrics(*s.server);
  EXPECT_EQ(first.value("streambp_steps_total"), 0);
  EXPECT_EQ(first.value("streambp_tokens_total"), 0);
  EXPECT_EQ(first.value("streambp_policy_version"), 0);
  EXPECT_EQ(first.value("streambp_queue_depth"), 0);
  EXPECT_EQ(first.value("streambp_queue_capacity"), 64);
  EXPECT_EQ(first.value("streambp_rollouts_consumed_total"), 0);
  EXPECT_EQ(first.value("streambp_rollouts_dropped_total"), 0);
  EXPECT_EQ(first.value("streambp_rollout_queue_depth"), 0);
  EXPECT_EQ(first.value("streambp_oom_refusals_total", {{"reason", "estimate"}}), 0);
  EXPECT_EQ(first.value("streambp_skipped_steps_total", {{"reason", "nonfinite_loss"}}), 0);
  EXPECT_GT(first.value("streambp_tracked_memory_bytes"), 0);
  // Process metrics, as the Prometheus client libraries name them.
  EXPECT_GT(first.value("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(first.value("process_open_fds"), 2);
  EXPECT_GE(first.value("process_cpu_seconds_total"), 0);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(first.value("process_start_time_seconds"), now - 3600);
  EXPECT_LE(first.value("process_start_time_seconds"), now + 1);
  bool build_info = false;
  for (const auto& [labels, v] : first.samples().at("streambp_build_info")) {
    build_info = v == 1 && labels.count("version") && labels.count("libtorch") && labels.count("blas") &&
                 labels.at("cuda") == "false";
  }
  EXPECT_TRUE(build_info) << first.text();

  // 3 TrainSteps, a ForwardBackward + OptimStep, a refused request, a GetInfo.
  double tokens = 0, last_peak = 0;
  for (int i = 0; i < 3; ++i) {
    auto r = s.client->TrainStep(SftStep());
    ASSERT_TRUE(r.ok()) << r.status().error_message();
    tokens += static_cast<double>(r->stats().tokens());
    last_peak = static_cast<double>(r->stats().peak_memory_bytes());
  }
  v1::ForwardBackwardRequest fb;
  *fb.mutable_batch() = SftStep().batch();
  auto f = s.client->ForwardBackward(fb);
  ASSERT_TRUE(f.ok()) << f.status().error_message();
  tokens += static_cast<double>(f->stats().tokens());
  last_peak = static_cast<double>(f->stats().peak_memory_bytes());
  ASSERT_TRUE(s.client->OptimStep().ok());
  v1::TrainStepRequest bad;
  bad.mutable_batch()->mutable_sft()->add_examples()->add_tokens(100000);  // outside the vocabulary
  ASSERT_EQ(s.client->TrainStep(bad).code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(s.client->GetInfo().ok());

  auto m = ScrapeMetrics(*s.server);
  EXPECT_EQ(m.value("streambp_steps_total"), 4);
  EXPECT_EQ(m.value("streambp_policy_version"), 4);
  EXPECT_EQ(m.value("streambp_optimizer_step"), 4);
  EXPECT_EQ(m.value("streambp_forward_backward_total"), 4);
  EXPECT_GT(tokens, 0);
  EXPECT_EQ(m.value("streambp_tokens_total"), tokens);
  EXPECT_EQ(m.value("streambp_skipped_steps_total", {{"reason", "nonfinite_loss"}}), 0);
  EXPECT_EQ(m.value("streambp_step_seconds_count", {{"phase", "forward_backward"}}), 4);
  EXPECT_EQ(m.value("streambp_step_seconds_count", {{"phase", "optim_step"}}), 4);
  EXPECT_EQ(m.value("streambp_step_seconds_count", {{"phase", "train_step"}}), 3);  // the 3 TrainSteps
  // The training signals of the last step.
  EXPECT_NEAR(m.value("streambp_loss"), f->stats().loss(), 1e-9 * std::abs(f->stats().loss()));
  EXPECT_EQ(m.value("streambp_learning_rate"), 1e-3);
  EXPECT_GT(m.value("streambp_grad_norm"), 0);
  EXPECT_GT(m.value("streambp_tokens_per_second"), 0);
  EXPECT_GT(m.value("streambp_step_seconds_sum", {{"phase", "forward_backward"}}), 0);
  EXPECT_EQ(m.value("streambp_step_seconds_bucket", {{"phase", "forward_backward"}, {"le", "+Inf"}}), 4);
  // The standard gRPC server metrics, by method and code.
  auto rpc = [](const std::string& method, const std::string& code = "") {
    Labels l{{"grpc_service", "streambp.v1.Trainer"}, {"grpc_method", method}, {"grpc_type", "unary"}};
    if (!code.empty()) l["grpc_code"] = code;
    return l;
  };
  EXPECT_EQ(m.value("grpc_server_handled_total", rpc("TrainStep", "OK")), 3);
  EXPECT_EQ(m.value("grpc_server_handled_total", rpc("TrainStep", "INVALID_ARGUMENT")), 1);
  EXPECT_EQ(m.value("grpc_server_handled_total", rpc("ForwardBackward", "OK")), 1);
  EXPECT_EQ(m.value("grpc_server_handled_total", rpc("OptimStep", "OK")), 1);
  EXPECT_EQ(m.value("grpc_server_handled_total", rpc("GetInfo", "OK")), 1);
  EXPECT_EQ(m.value("grpc_server_started_total", rpc("TrainStep")), 4);
  EXPECT_EQ(m.value("grpc_server_handling_seconds_count", rpc("TrainStep")), 4);
  EXPECT_GT(last_peak, 0);
  EXPECT_EQ(m.value("streambp_step_peak_memory_bytes"), last_peak);
  EXPECT_GE(m.value("streambp_max_step_peak_memory_bytes"), last_peak);
  EXPECT_EQ(m.value("streambp_queue_depth"), 0);
  ExpectPromtoolAccepts(m.text());
}

TEST(Metrics, QueueDepthIsReadAtScrapeTime) {
  auto s = StartServer(MetricsConfig());
  s.server->worker().pause();
  const auto step = SftStep();  // made once: two threads writing its file at once would race
  std::vector<std::future<bool>> calls;
  for (int i = 0; i < 2; ++i) {
    calls.push_back(std::async(std::launch::async, [&s, &step] { return s.client->TrainStep(step).ok(); }));
  }
  for (int i = 0; i < 500 && s.server->worker().depth() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(s.server->worker().depth(), 2u);
  EXPECT_EQ(ScrapeMetrics(*s.server).value("streambp_queue_depth"), 2);
  s.server->worker().resume();
  for (auto& c : calls) EXPECT_TRUE(c.get());
  EXPECT_EQ(ScrapeMetrics(*s.server).value("streambp_queue_depth"), 0);
  EXPECT_EQ(ScrapeMetrics(*s.server).value("streambp_steps_total"), 2);
}

TEST(Metrics, MemoryRefusalsAndSkippedStepsAreCounted) {
  // A step over the memory budget is refused before it starts.
  {
    auto c = MetricsConfig();
    c.limits.memory_budget_bytes = 4 << 20;
    c.trainer.engine.kind = EngineKind::kFull;
    auto s = StartServer(c);
    v1::TrainStepRequest req;
    auto* e = req.mutable_batch()->mutable_sft()->add_examples();
    for (int i = 0; i < 2048; ++i) e->add_tokens(i % 256);
    ASSERT_EQ(s.client->TrainStep(req).code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    auto m = ScrapeMetrics(*s.server);
    EXPECT_EQ(m.value("streambp_oom_refusals_total", {{"reason", "estimate"}}), 1);
    EXPECT_EQ(m.value("grpc_server_handled_total", {{"grpc_service", "streambp.v1.Trainer"},
                                                    {"grpc_method", "TrainStep"},
                                                    {"grpc_type", "unary"},
                                                    {"grpc_code", "RESOURCE_EXHAUSTED"}}),
              1);
    EXPECT_EQ(m.value("streambp_steps_total"), 0);
  }
  // An absurd learning rate overflows the weights: the next steps are not finite and skipped.
  {
    auto c = MetricsConfig();
    c.trainer.optimizer.name = "sgd";
    c.trainer.optimizer.lr = 1e300;
    auto s = StartServer(c);
    int applied = 0, skipped = 0;
    for (int i = 0; i < 3; ++i) {
      auto r = s.client->TrainStep(SftStep());
      ASSERT_TRUE(r.ok()) << r.status().error_message();
      (r->optim().skipped() ? skipped : applied) += 1;
    }
    ASSERT_GT(skipped, 0) << "the overflow did not produce a non-finite step";
    auto m = ScrapeMetrics(*s.server);
    EXPECT_EQ(m.value("streambp_skipped_steps_total", {{"reason", "nonfinite_loss"}}) +
                  m.value("streambp_skipped_steps_total", {{"reason", "nonfinite_grad_norm"}}),
              skipped);
    EXPECT_EQ(m.value("streambp_steps_total"), applied);
    EXPECT_EQ(m.value("streambp_policy_version"), applied);
  }
}

}  // namespace
}  // namespace streambp
