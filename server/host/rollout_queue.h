#pragma once
// The rollout queue of the RL loop (docs/architecture.md: API semantics PushRollouts): accepted GRPO groups wait
// here until groups_per_step of them are ready for a server-side step.
//
// Durability (docs/architecture.md: Errors, admission and durability), with a rollout log: a group is acknowledged only after its record
// is appended and fsynced (RecordLog: a failed append leaves nothing behind). A step writes
// a "consumed" record with the policy version it will produce *before* that version is
// applied; if the record cannot be written the step is not applied. A restarted server
// that resumes weights at version V queues again exactly the groups consumed by steps that
// produced versions > V (or not consumed at all): every acknowledged group is trained once
// relative to the weights it resumes. A step that fails after its record was written is
// voided by a "void" record. On open, the log is compacted to the groups still waiting
// and the ids already seen.
//
// Ids: a client's group_id, or one the server makes ("srv:<boot id>:<n>", unique across
// restarts); client ids may not start with "srv:". A seen id is never queued again.
// Thread-safe.
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "record_log.h"
#include "types.h"

namespace streambp::server {

struct RolloutOptions {
  int64_t groups_per_step = 8;  ///< a server-side GRPO step runs when this many groups are queued
  int64_t max_staleness = 4;    ///< groups sampled by a version older than current - this are dropped
  int64_t max_queue = 4096;     ///< queued groups at most; more are answered "retry"
  std::string log_path;         ///< rollout log; empty = in memory only
  int64_t max_remembered_ids = 1 << 20;  ///< ids kept for duplicate detection (oldest forgotten)
  int64_t max_group_id_bytes = 128;      ///< longer client group ids are invalid
};

struct QueuedGroup {
  std::string id;
  RolloutGroup group;
};

class RolloutQueue {
 public:
  static constexpr const char* kServerIdPrefix = "srv:";

  /// Opens and replays the log (see above) for weights resumed at `resumed_version`.
  /// Throws Error naming the log when it cannot be opened or read.
  RolloutQueue(const RolloutOptions& options, int64_t resumed_version);

  /// Queues groups that passed validation, in order, and says what happened to each
  /// (accepted / duplicate / stale / retry with a message). The accepted ones are made
  /// durable with one append + fsync before this returns; if that fails, none of them is
  /// queued and each is answered "retry" with the reason (e.g. no space left).
  std::vector<RolloutAck> push(std::vector<RolloutGroup> groups, const std::vector<int>& indices,
                               int64_t current_version);

  /// Up to groups_per_step groups fresh enough for `current_version` (stale ones are
  /// dropped and counted), or nothing when fewer are ready.
  std::vector<QueuedGroup> take(int64_t current_version, int64_t* dropped);
  /// Puts groups back at the front (a step that was not applied).
  void restore(std::vector<QueuedGroup> groups);
  /// Groups taken whose commit failed: no longer in a step (a restart may replay them).
  void release(size_t groups);
  /// Durably records that `groups` are taken by the step that will produce `version` (or,
  /// for groups dropped as untrainable, by the current version). Throws (ResourceExhausted
  /// when the disk is full) when it cannot: the caller must not apply the step then.
  void commit(const std::vector<QueuedGroup>& groups, int64_t version);

  bool ready() const;
  RolloutStats stats() const;
  void set_last_step_seconds(double s);
  const RolloutOptions& options() const { return options_; }

 private:
  void remember(const std::string& id);  // under mutex_

  RolloutOptions options_;
  std::string boot_id_;
  std::unique_ptr<RecordLog> log_;
  mutable std::mutex mutex_;
  std::deque<QueuedGroup> queue_;
  std::set<std::string> seen_;
  std::deque<std::string> seen_order_;
  int64_t accepted_ = 0, consumed_ = 0, dropped_ = 0, duplicates_ = 0, steps_ = 0, next_id_ = 0;
  int64_t in_step_ = 0;  // taken by take(), not yet committed or restored
  double last_step_seconds_ = 0;
};

}  // namespace streambp::server
