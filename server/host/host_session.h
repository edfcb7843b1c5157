#pragma once
// Rank 0's state of one session (internal to the host; the replica holds its trainer).
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "history.h"
#include "policy_hub.h"
#include "rollout_queue.h"
#include "types.h"

namespace streambp::server {

/// A reply made immutable and shared (a call's result, a snapshot).
template <class T>
std::shared_ptr<const T> Share(T value) {
  return std::make_shared<const T>(std::move(value));
}

inline double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct HostSession {
  SessionSpec spec;
  /// This object's id in the process: a session deleted and created again under the same
  /// name is another incarnation, and nothing keyed by the old one (cached answers) reaches it.
  std::string incarnation;
  std::string dir;  ///< its state folder (spec.json, state/, rollouts.log); "" for the default session
  /// A sampler snapshot (SaveWeightsForSampler): the session it froze ("" for a session). Its
  /// spec.name is SnapshotKey(parent, name), its folder <parent dir>/snapshots/<name> (state/,
  /// snapshot.json); it never trains, so its state on disk is always its weights.
  std::string snapshot_of;
  SnapshotReport snapshot_info;  ///< of a sampler snapshot
  /// Set once before the session is ready and never reset (a deleted session's queue stays
  /// valid for the calls that still hold the session).
  std::unique_ptr<RolloutQueue> rollouts;
  PolicyHub hub;
  /// Set once before the session is ready and never reset, like `rollouts`.
  std::unique_ptr<History> history;
  /// Device thread: the forward-backwards since the last optimizer step, for its history
  /// record (reset when a forward-backward starts with no gradients pending).
  struct Accumulated {
    int64_t count = 0, tokens = 0, peak_memory_bytes = 0;
    double loss = 0, seconds = 0;
    std::map<std::string, std::pair<double, int64_t>> metrics;  ///< sum, count
  } accumulated;
  std::atomic<int64_t> step{0}, version{0}, pending{0};
  std::atomic<int64_t> weights_generation{0};  ///< +1 whenever its weights change
  std::shared_ptr<const WeightsSnapshot> snapshot;  ///< device thread: the last export's
  int64_t snapshot_generation = -1;
  bool snapshot_merged = false;
  std::atomic<int64_t> invalid_groups{0}, dropped_since_update{0};
  std::atomic<bool> rollout_step_scheduled{false};
  std::atomic<bool> resident{false};
  std::atomic<bool> ready{false};    ///< created (a session being created is not ready yet)
  std::atomic<bool> deleted{false};  ///< new calls do not find it
  std::atomic<int64_t> device_bytes{0}, trainable_parameters{0};
  std::atomic<int64_t> last_used_ns{std::chrono::steady_clock::now().time_since_epoch().count()};

  void touch() { last_used_ns = std::chrono::steady_clock::now().time_since_epoch().count(); }
  double idle_seconds() const {
    return static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() - last_used_ns) / 1e9;
  }
  std::string state_dir() const { return dir + "/state"; }
  bool is_snapshot() const { return !snapshot_of.empty(); }
  bool expired(double now_unix) const { return snapshot_info.expires_unix > 0 && now_unix >= snapshot_info.expires_unix; }
};

/// A session object with an incarnation of its own (see HostSession::incarnation).
inline std::shared_ptr<HostSession> NewSession() {
  static std::atomic<uint64_t> counter{0};
  auto s = std::make_shared<HostSession>();
  s->incarnation = "#";
  s->incarnation += std::to_string(++counter);
  return s;
}

}  // namespace streambp::server
