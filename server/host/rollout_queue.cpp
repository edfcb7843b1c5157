#include "rollout_queue.h"

#include <map>
#include <random>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "streambp/error.h"

namespace streambp::server {
namespace {

using nlohmann::json;

// Records are CBOR objects: {"t": "group"|"consumed"|"seen", ...}.
std::string Encode(const json& j) {
  const auto bytes = json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

json GroupRecord(const std::string& id, const RolloutGroup& g) {
  json completions = json::array();
  for (const auto& c : g.completions) {
    json record{{"tokens", c.tokens}, {"reward", c.reward}, {"logprobs", c.logprobs}, {"advantages", c.advantages}};
    if (!c.routed_experts.empty()) record["routed_experts"] = c.routed_experts;
    completions.push_back(std::move(record));
  }
  return {{"t", "group"}, {"id", id}, {"prompt", g.prompt}, {"completions", completions},
          {"version", g.policy_version}, {"group_id", g.group_id}};
}

RolloutGroup GroupFromRecord(const json& j) {
  RolloutGroup g;
  g.prompt = j.at("prompt").get<std::vector<int64_t>>();
  g.policy_version = j.at("version").get<int64_t>();
  g.group_id = j.value("group_id", "");
  for (const auto& c : j.at("completions")) {
    RolloutCompletion rc;
    rc.tokens = c.at("tokens").get<std::vector<int64_t>>();
    rc.reward = c.at("reward").get<double>();
    rc.logprobs = c.at("logprobs").get<std::vector<double>>();
    rc.advantages = c.at("advantages").get<std::vector<double>>();
    if (c.contains("routed_experts")) rc.routed_experts = c.at("routed_experts").get<std::vector<int32_t>>();
    g.completions.push_back(std::move(rc));
  }
  return g;
}

std::vector<std::string> Ids(const std::vector<QueuedGroup>& groups) {
  std::vector<std::string> ids;
  for (const auto& g : groups) ids.push_back(g.id);
  return ids;
}

std::string BootId() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

const char* RolloutStatusName(RolloutStatus status) {
  switch (status) {
    case RolloutStatus::kAccepted: return "accepted";
    case RolloutStatus::kDuplicate: return "duplicate";
    case RolloutStatus::kStale: return "stale";
    case RolloutStatus::kInvalid: return "invalid";
    case RolloutStatus::kRetry: return "retry";
  }
  return "invalid";
}

RolloutQueue::RolloutQueue(const RolloutOptions& options, int64_t resumed_version)
    : options_(options), boot_id_(BootId()) {
  if (options_.log_path.empty()) return;
  std::vector<std::string> records;
  int64_t dropped_bytes = 0;
  log_ = RecordLog::Open(options_.log_path, &records, &dropped_bytes);
  if (dropped_bytes > 0) {
    spdlog::warn("rollout log {}: cut off a torn tail of {} bytes (an append interrupted by a crash; it was never "
                 "acknowledged)", options_.log_path, dropped_bytes);
  }
  // Replay: groups in order; which step consumed each (the version it produced).
  std::vector<QueuedGroup> accepted;
  std::map<std::string, int64_t> consumed_by;
  std::vector<std::string> remembered;
  for (size_t i = 0; i < records.size(); ++i) {
    try {
      const json j = json::from_cbor(records[i]);
      const std::string type = j.at("t").get<std::string>();
      if (type == "group") {
        accepted.push_back(QueuedGroup{j.at("id").get<std::string>(), GroupFromRecord(j)});
      } else if (type == "consumed") {
        for (const auto& id : j.at("ids")) consumed_by[id.get<std::string>()] = j.at("version").get<int64_t>();
      } else if (type == "seen") {
        for (const auto& id : j.at("ids")) remembered.push_back(id.get<std::string>());
      }
    } catch (const std::exception& e) {
      // A record whose checksum matched but does not decode: written by a newer version?
      throw Error(ErrorCode::kInternal, "rollout log " + options_.log_path + ": record " + std::to_string(i) +
                                            " cannot be read: " + e.what());
    }
  }
  for (const auto& id : remembered) remember(id);
  std::vector<std::string> done;
  for (auto& g : accepted) {
    remember(g.id);
    ++accepted_;
    auto it = consumed_by.find(g.id);
    if (it != consumed_by.end() && it->second <= resumed_version) {
      ++consumed_;
      done.push_back(g.id);
      continue;
    }
    queue_.push_back(std::move(g));
  }
  // Compaction: what is still needed, nothing else.
  std::vector<std::string> compact;
  compact.push_back(Encode({{"t", "seen"}, {"ids", std::vector<std::string>(seen_order_.begin(), seen_order_.end())}}));
  for (const auto& g : queue_) compact.push_back(Encode(GroupRecord(g.id, g.group)));
  try {
    log_->rewrite(compact);
  } catch (const std::exception& e) {
    spdlog::warn("rollout log {}: not compacted ({}); appending to it as it is", options_.log_path, e.what());
  }
  if (!queue_.empty()) {
    spdlog::info("rollout log {}: {} acknowledged groups waiting to be trained", options_.log_path, queue_.size());
  }
}

void RolloutQueue::remember(const std::string& id) {
  if (!seen_.insert(id).second) return;
  seen_order_.push_back(id);
  while (static_cast<int64_t>(seen_order_.size()) > options_.max_remembered_ids) {
    seen_.erase(seen_order_.front());
    seen_order_.pop_front();
  }
}

std::vector<RolloutAck> RolloutQueue::push(std::vector<RolloutGroup> groups, const std::vector<int>& indices,
                                           int64_t current_version) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RolloutAck> acks(groups.size());
  std::vector<size_t> candidates;
  std::vector<std::string> ids(groups.size());
  std::set<std::string> in_batch;
  int64_t queued = static_cast<int64_t>(queue_.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    auto& ack = acks[i];
    ack.index = indices[i];
    ack.policy_version = current_version;
    const auto& g = groups[i];
    if (g.group_id.rfind(kServerIdPrefix, 0) == 0) {
      ack.status = RolloutStatus::kInvalid;
      ack.group_id = g.group_id;
      ack.message = "group_id may not start with '" + std::string(kServerIdPrefix) +
                    "' (the server's own ids); leave it empty for a server-made id";
      continue;
    }
    if (static_cast<int64_t>(g.group_id.size()) > options_.max_group_id_bytes) {
      ack.status = RolloutStatus::kInvalid;
      ack.group_id = g.group_id.substr(0, 32) + "...";
      ack.message = "group_id is " + std::to_string(g.group_id.size()) + " bytes; at most " +
                    std::to_string(options_.max_group_id_bytes);
      continue;
    }
    ids[i] = g.group_id.empty() ? kServerIdPrefix + boot_id_ + ":" + std::to_string(next_id_ + candidates.size())
                                : g.group_id;
    ack.group_id = ids[i];
    if (seen_.count(ids[i]) || in_batch.count(ids[i])) {
      ++duplicates_;
      ack.status = RolloutStatus::kDuplicate;
      ack.message = "group_id '" + ids[i] + "' was pushed before; it is not trained twice";
      continue;
    }
    if (g.policy_version < current_version - options_.max_staleness) {
      ++dropped_;
      ack.status = RolloutStatus::kStale;
      ack.message = "sampled by version " + std::to_string(g.policy_version) + ", older than current " +
                    std::to_string(current_version) + " - max_staleness " + std::to_string(options_.max_staleness);
      continue;
    }
    if (queued >= options_.max_queue) {
      ack.status = RolloutStatus::kRetry;
      ack.message = "the rollout queue is full (rollouts.max_queue " + std::to_string(options_.max_queue) +
                    "); push it again later";
      continue;
    }
    in_batch.insert(ids[i]);
    candidates.push_back(i);
    ++queued;
  }
  if (!candidates.empty()) {
    if (log_) {
      std::vector<std::string> records;
      for (size_t i : candidates) records.push_back(Encode(GroupRecord(ids[i], groups[i])));
      try {
        log_->append(records);
      } catch (const std::exception& e) {
        for (size_t i : candidates) {
          acks[i].status = RolloutStatus::kRetry;
          acks[i].message = std::string("not queued: ") + e.what() + "; push it again later";
        }
        candidates.clear();
      }
    }
    for (size_t i : candidates) {
      if (groups[i].group_id.empty()) ++next_id_;
      remember(ids[i]);
      ++accepted_;
      acks[i].status = RolloutStatus::kAccepted;
      queue_.push_back(QueuedGroup{ids[i], std::move(groups[i])});
    }
  }
  for (auto& ack : acks) ack.queue_depth = static_cast<int64_t>(queue_.size());
  return acks;
}

std::vector<QueuedGroup> RolloutQueue::take(int64_t current_version, int64_t* dropped) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n_dropped = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->group.policy_version < current_version - options_.max_staleness) {
      it = queue_.erase(it);
      ++n_dropped;
    } else {
      ++it;
    }
  }
  dropped_ += n_dropped;
  if (dropped) *dropped = n_dropped;
  std::vector<QueuedGroup> out;
  if (static_cast<int64_t>(queue_.size()) < options_.groups_per_step) return out;
  for (int64_t i = 0; i < options_.groups_per_step; ++i) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  in_step_ += static_cast<int64_t>(out.size());
  return out;
}

void RolloutQueue::restore(std::vector<QueuedGroup> groups) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_step_ -= static_cast<int64_t>(groups.size());
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) queue_.push_front(std::move(*it));
}

void RolloutQueue::release(size_t groups) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_step_ -= static_cast<int64_t>(groups);
}

void RolloutQueue::commit(const std::vector<QueuedGroup>& groups, int64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (log_) log_->append({Encode({{"t", "consumed"}, {"ids", Ids(groups)}, {"version", version}})});
  consumed_ += static_cast<int64_t>(groups.size());
  in_step_ -= static_cast<int64_t>(groups.size());
  ++steps_;
}

bool RolloutQueue::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(queue_.size()) >= options_.groups_per_step;
}

void RolloutQueue::set_last_step_seconds(double s) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_step_seconds_ = s;
}

RolloutStats RolloutQueue::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  RolloutStats s;
  s.queue_depth = static_cast<int64_t>(queue_.size());
  s.accepted = accepted_;
  s.consumed = consumed_;
  s.in_step = in_step_;
  s.dropped_stale = dropped_;
  s.duplicates = duplicates_;
  s.steps_run = steps_;
  s.last_step_seconds = last_step_seconds_;
  s.groups_per_step = options_.groups_per_step;
  s.max_staleness = options_.max_staleness;
  return s;
}

}  // namespace streambp::server
