#include "history.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <spdlog/spdlog.h>

#include "streambp/error.h"
#include "streambp/history_line.h"
#include "tensorboard.h"

namespace streambp::server {
namespace fs = std::filesystem;
namespace {

double NumberOf(const nlohmann::json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

constexpr const char* kFile = "metrics.jsonl";

}  // namespace

nlohmann::json HistoryRecord::ToJson() const {
  nlohmann::json j = {{"index", index},
                      {"step", step},
                      {"policy_version", policy_version},
                      {"source", source},
                      {"time", time},
                      {"loss", HistoryNumber(loss)},
                      {"tokens", tokens},
                      {"forward_backwards", forward_backwards},
                      {"tokens_per_second", HistoryNumber(tokens_per_second)},
                      {"seconds", seconds},
                      {"peak_memory_bytes", peak_memory_bytes},
                      {"grad_norm", HistoryNumber(grad_norm)},
                      {"learning_rate", learning_rate},
                      {"skipped", skipped},
                      {"skip_reason", skip_reason},
                      {"groups_consumed", groups_consumed}};
  for (const auto& [name, value] : metrics) {
    j[HistoryMetricKey(name)] = HistoryNumber(value);
  }
  return j;
}

HistoryRecord HistoryRecord::FromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("index") || !j.contains("step")) {
    throw InvalidArgument("not a history record (an object with index and step)");
  }
  HistoryRecord r;
  r.index = j.at("index").get<int64_t>();
  r.step = j.at("step").get<int64_t>();
  r.policy_version = j.value("policy_version", int64_t{0});
  r.source = j.value("source", std::string());
  r.time = j.value("time", 0.0);
  r.loss = j.contains("loss") ? NumberOf(j.at("loss")) : 0.0;
  r.tokens = j.value("tokens", int64_t{0});
  r.forward_backwards = j.value("forward_backwards", int64_t{0});
  r.tokens_per_second = j.contains("tokens_per_second") ? NumberOf(j.at("tokens_per_second")) : 0.0;
  r.seconds = j.value("seconds", 0.0);
  r.peak_memory_bytes = j.value("peak_memory_bytes", int64_t{0});
  r.grad_norm = j.contains("grad_norm") ? NumberOf(j.at("grad_norm")) : 0.0;
  r.learning_rate = j.value("learning_rate", 0.0);
  r.skipped = j.value("skipped", false);
  r.skip_reason = j.value("skip_reason", std::string());
  r.groups_consumed = j.value("groups_consumed", int64_t{0});
  for (const auto& [key, value] : j.items()) {
    if (std::find(kHistoryFields.begin(), kHistoryFields.end(), key) != kHistoryFields.end()) continue;
    const std::string name = key.rfind("objective/", 0) == 0 ? key.substr(10) : key;
    r.metrics[name] = NumberOf(value);
  }
  return r;
}

std::vector<std::pair<std::string, double>> HistoryScalars(const HistoryRecord& r) {
  if (r.skipped) return {{"train/skipped", 1.0}};
  std::vector<std::pair<std::string, double>> s = {{"train/loss", r.loss},
                                                   {"train/grad_norm", r.grad_norm},
                                                   {"train/learning_rate", r.learning_rate},
                                                   {"train/tokens", static_cast<double>(r.tokens)},
                                                   {"train/tokens_per_second", r.tokens_per_second},
                                                   {"train/seconds", r.seconds},
                                                   {"train/peak_memory_bytes", static_cast<double>(r.peak_memory_bytes)},
                                                   {"train/policy_version", static_cast<double>(r.policy_version)}};
  if (r.source == "rollouts") s.emplace_back("rollouts/groups_consumed", static_cast<double>(r.groups_consumed));
  for (const auto& [name, value] : r.metrics) s.emplace_back("objective/" + name, value);
  return s;
}

History::History(HistoryOptions options) : options_(std::move(options)) {
  options_.max_records = std::max<int64_t>(options_.max_records, 1);
  if (options_.dir.empty()) return;
  const auto path = fs::path(options_.dir) / kFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  int64_t bad = 0;
  bool torn = false;
  while (std::getline(in, line)) {
    torn = in.eof();  // the last line had no newline: a crash mid-append
    if (line.empty()) continue;
    try {
      auto r = HistoryRecord::FromJson(nlohmann::json::parse(line));
      last_index_ = std::max(last_index_, r.index);
      ring_.push_back(std::move(r));
      if (static_cast<int64_t>(ring_.size()) > options_.max_records) ring_.pop_front();
    } catch (const std::exception&) {
      ++bad;
    }
  }
  in.close();
  if (torn) {
    // The next append starts on a line of its own.
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << '\n';
  }
  if (bad > 0) spdlog::warn("{}: {} lines of {} are not records; skipped", options_.label, bad, path.string());
}

History::~History() = default;

void History::append(HistoryRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  record.index = ++last_index_;
  ring_.push_back(record);
  if (static_cast<int64_t>(ring_.size()) > options_.max_records) ring_.pop_front();
  if (!options_.dir.empty()) write(record);
}

void History::write(const HistoryRecord& record) {
  auto fail = [&](const std::string& what) {
    if (write_errors_++ == 0) {
      spdlog::warn("{}: cannot write its training history ({}); it stays in memory (GetHistory)", options_.label,
                   what);
    }
  };
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  const std::string path = (fs::path(options_.dir) / kFile).string();
  const std::string line = record.ToJson().dump() + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    fail(path + ": " + std::strerror(errno));
  } else {
    const ssize_t n = ::write(fd, line.data(), line.size());
    if (n != static_cast<ssize_t>(line.size())) {
      fail(path + ": " + (n < 0 ? std::string(std::strerror(errno)) : "short write"));
      // A partial line is cut off so the next append starts clean.
      if (n > 0) {
        struct stat st {};
        if (::fstat(fd, &st) == 0 && ::ftruncate(fd, st.st_size - n) != 0) fail("cannot cut a partial line");
      }
    }
    ::close(fd);
  }
  if (!options_.tensorboard) return;
  try {
    if (!tensorboard_) tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(options_.dir) / "tensorboard").string());
    if (!tensorboard_->write_scalars(record.step, record.time, HistoryScalars(record))) fail(tensorboard_->path());
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

std::vector<HistoryRecord> History::read(int64_t after_index, int64_t max) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<HistoryRecord> out;
  // Indexes increase along the ring: the page starts where after_index ends, found by bisection.
  auto it = std::upper_bound(ring_.begin(), ring_.end(), after_index,
                             [](int64_t after, const HistoryRecord& r) { return after < r.index; });
  for (; it != ring_.end() && (max <= 0 || static_cast<int64_t>(out.size()) < max); ++it) out.push_back(*it);
  return out;
}

int64_t History::first_index() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.empty() ? 0 : ring_.front().index;
}

int64_t History::last_index() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_index_;
}

int64_t History::write_errors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return write_errors_;
}

void History::start_over() {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.clear();
  last_index_ = 0;
  tensorboard_.reset();
  if (options_.dir.empty()) return;
  const auto path = fs::path(options_.dir) / kFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto aside = fs::path(options_.dir) / ("metrics-" + std::to_string(seconds) + ".jsonl");
  fs::rename(path, aside, ec);
  if (ec) {
    spdlog::warn("{}: cannot move the earlier run's {} aside ({}); appending to it", options_.label, path.string(),
                 ec.message());
  } else {
    spdlog::info("{}: the earlier run's history moved to {}", options_.label, aside.string());
  }
}

}  // namespace streambp::server
