#pragma once
// A session's training history (docs/operations.md: Training history): one record per
// optimizer step — loss, objective metrics, grad norm, learning rate, tokens/s, memory,
// policy version, wall time — kept in a bounded ring for GetHistory, appended to
// `metrics.jsonl` (one JSON object per line) and, when asked, to TensorBoard event files.
// Files are written as steps land; a failed write (full disk) is logged once and never
// fails the step. Reopening a file reads its tail back into the ring and cuts a torn last
// line (a crash mid-append) off before appending.
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/objective.h"

namespace streambp::server {

struct HistoryRecord {
  int64_t index = 0;           ///< 1, 2, ... in the session's history (kept across restarts)
  int64_t step = 0;            ///< the optimizer step after this one
  int64_t policy_version = 0;  ///< of the weights after it
  std::string source;          ///< "train" (TrainStep) | "optim_step" (ForwardBackward + OptimStep) | "rollouts"
  double time = 0;             ///< wall clock, seconds since the Unix epoch, when it ended
  double loss = 0;             ///< the forward-backwards' loss (their mean when several)
  int64_t tokens = 0;          ///< non-padding tokens trained on
  int64_t forward_backwards = 0;
  double tokens_per_second = 0;  ///< tokens / seconds
  double seconds = 0;            ///< device time of the forward-backwards and the optimizer step
  int64_t peak_memory_bytes = 0;  ///< the largest forward-backward's peak
  double grad_norm = 0;
  double learning_rate = 0;
  bool skipped = false;
  std::string skip_reason;
  int64_t groups_consumed = 0;  ///< rollout steps: the groups it trained on
  Metrics metrics;              ///< the objective's (reward_mean, kl, clip_ratio/..., ...)

  /// One metrics.jsonl line's object: the fields above flat, then the metrics by name
  /// (a metric named like a field is written "objective/<name>"); non-finite values as null.
  nlohmann::json ToJson() const;
  /// Throws nlohmann::json::exception or InvalidArgument for a line that is not a record.
  static HistoryRecord FromJson(const nlohmann::json& j);
};

struct HistoryOptions {
  std::string dir;            ///< where metrics.jsonl (and tensorboard/) go; "" = memory only
  int64_t max_records = 4096;  ///< records the ring keeps for GetHistory
  bool tensorboard = false;   ///< also write dir/tensorboard/events.out.tfevents.*
  std::string label;          ///< for log lines ("session alice")
};

class TensorBoardWriter;

class History {
 public:
  /// Reads the tail of dir/metrics.jsonl (when there is one) into the ring; never throws
  /// for a file it cannot read (logged; the history then starts empty).
  explicit History(HistoryOptions options);
  ~History();
  History(const History&) = delete;
  History& operator=(const History&) = delete;

  /// Numbers the record, keeps it and writes it out. Never throws for the files.
  void append(HistoryRecord record);
  /// Records with index > after_index, oldest first, at most max (<= 0: all kept).
  std::vector<HistoryRecord> read(int64_t after_index, int64_t max) const;
  int64_t first_index() const;  ///< the oldest kept (0 when empty)
  int64_t last_index() const;   ///< the newest (0 when none was ever written)
  int64_t write_errors() const;
  /// Moves an existing metrics.jsonl aside (metrics-<unix time>.jsonl) and empties the
  /// ring: a fresh model starting in a folder that holds an earlier run's history.
  void start_over();
  const HistoryOptions& options() const { return options_; }

 private:
  void write(const HistoryRecord& record);

  HistoryOptions options_;
  mutable std::mutex mutex_;
  std::deque<HistoryRecord> ring_;
  int64_t last_index_ = 0;
  int64_t write_errors_ = 0;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

/// The scalars of one record as TensorBoard tags ("train/loss", "train/grad_norm", ...,
/// "objective/<metric>"); skipped steps give only train/skipped.
std::vector<std::pair<std::string, double>> HistoryScalars(const HistoryRecord& record);

}  // namespace streambp::server
