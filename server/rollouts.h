#pragma once
// The rollout queue of the RL loop (DESIGN §6 PushRollouts): accepted GRPO groups wait
// here until groups_per_step of them are ready for a server-side step. With a rollout log
// every accepted group is appended and fsynced before it is acknowledged, and every step
// records which groups it consumed and the policy version it produced, so a restarted
// server trains each acknowledged group exactly once relative to the weights it resumes.
// Thread-safe.
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "streambp/v1/trainer.pb.h"

namespace streambp::server {

struct RolloutOptions {
  int64_t groups_per_step = 8;  ///< a server-side GRPO step runs when this many groups are queued
  int64_t max_staleness = 4;    ///< groups sampled by a version older than current - this are dropped
  int64_t max_queue = 4096;     ///< queued groups at most; more are refused (stale-safe backpressure)
  std::string log_path;         ///< rollout log (JSON lines); empty = in memory only
};

struct QueuedGroup {
  std::string id;  ///< client group id, or a server-made one
  v1::RolloutGroup group;
};

class RolloutQueue {
 public:
  /// Opens (and replays) the log: groups accepted and not consumed by a step that produced
  /// a version <= `resumed_version` are queued again, in order.
  RolloutQueue(const RolloutOptions& options, int64_t resumed_version);

  /// Queues a group that passed validation. Returns "accepted", or "duplicate" (id seen
  /// before), "stale" or "full" (not queued). Throws Error(kInternal) if the log write fails.
  std::string push(v1::RolloutGroup group, int64_t current_version, std::string* id_out);

  /// Up to groups_per_step groups fresh enough for `current_version` (stale ones at the
  /// front are dropped and counted), or nothing when fewer are ready.
  std::vector<QueuedGroup> take(int64_t current_version, int64_t* dropped);
  /// Puts groups back at the front (a step that failed).
  void restore(std::vector<QueuedGroup> groups);
  /// Records that `groups` were trained by the step that produced `version`.
  void consumed(const std::vector<QueuedGroup>& groups, int64_t version);

  bool ready() const;
  v1::RolloutStats stats() const;
  void set_last_step_seconds(double s);
  const RolloutOptions& options() const { return options_; }

 private:
  void append(const std::string& line);

  RolloutOptions options_;
  mutable std::mutex mutex_;
  std::deque<QueuedGroup> queue_;
  std::set<std::string> seen_;
  int fd_ = -1;
  int64_t accepted_ = 0, consumed_ = 0, dropped_ = 0, duplicates_ = 0, steps_ = 0, next_id_ = 0;
  double last_step_seconds_ = 0;
};

}  // namespace streambp::server
