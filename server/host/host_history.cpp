// The training history of each session (docs/operations.md: Training history): the
// record of every optimizer step, built from the forward-backwards accumulated since the
// last one, and GetHistory.
#include <chrono>
#include <filesystem>

#include "host.h"
#include "host_session.h"
#include "streambp/error.h"

namespace streambp::server {
namespace fs = std::filesystem;

void TrainingHost::open_history(HostSession& s, bool fresh_model) {
  HistoryOptions o;
  if (config_.history.file && !config_.checkpoint_dir.empty()) {
    auto dir = fs::path(config_.checkpoint_dir);
    if (!s.spec.name.empty()) dir /= s.spec.name;
    o.dir = dir.string();
  }
  o.max_records = config_.history.max_records;
  o.tensorboard = config_.history.tensorboard;
  o.label = s.spec.name.empty() ? std::string("the training history") : "session " + s.spec.name;
  s.history = std::make_unique<History>(o);
  // A model that starts from scratch does not continue an earlier run's curves.
  if (fresh_model && s.history->last_index() > 0) s.history->start_over();
}

void TrainingHost::record_history(HostSession& s, const std::string& source, const OptimStats& optim,
                                  double optim_seconds, int64_t groups_consumed) {
  if (!s.history) return;
  const auto a = std::move(s.accumulated);
  s.accumulated = {};
  HistoryRecord r;
  r.step = optim.step;
  r.policy_version = optim.policy_version;
  r.source = source;
  r.time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  r.forward_backwards = a.count;
  r.loss = a.count > 0 ? a.loss / static_cast<double>(a.count) : 0.0;
  r.tokens = a.tokens;
  r.seconds = a.seconds + optim_seconds;
  r.tokens_per_second = r.seconds > 0 ? static_cast<double>(a.tokens) / r.seconds : 0.0;
  r.peak_memory_bytes = a.peak_memory_bytes;
  r.grad_norm = optim.optim.grad_norm;
  r.learning_rate = optim.optim.lr;
  r.skipped = optim.optim.skipped;
  r.skip_reason = optim.optim.reason;
  r.groups_consumed = groups_consumed;
  for (const auto& [name, sum] : a.metrics) r.metrics[name] = sum.first / static_cast<double>(sum.second);
  s.history->append(std::move(r));
}

HistoryReply TrainingHost::history(const std::string& session, int64_t after_index, int64_t max) const {
  auto s = find(session);
  if (after_index < 0) throw InvalidArgument("after_index must be >= 0, got " + std::to_string(after_index));
  HistoryReply reply;
  // Bounded by the answer's size as well as the ring's: GetHistory pages with after_index.
  reply.records = s->history->read(after_index, max > 0 ? std::min<int64_t>(max, kMaxHistoryPage) : kMaxHistoryPage);
  reply.first_index = s->history->first_index();
  reply.last_index = s->history->last_index();
  if (!s->history->options().dir.empty()) reply.file = (fs::path(s->history->options().dir) / "metrics.jsonl").string();
  return reply;
}

}  // namespace streambp::server
