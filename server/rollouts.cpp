#include "rollouts.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "streambp/error.h"

namespace streambp::server {
namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64(const std::string& in) {
  std::string out;
  int val = 0, bits = -6;
  for (unsigned char c : in) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(kB64[(val >> bits) & 0x3F]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(kB64[((val << 8) >> (bits + 8)) & 0x3F]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

std::string Unbase64(const std::string& in) {
  int table[256];
  std::fill(std::begin(table), std::end(table), -1);
  for (int i = 0; i < 64; ++i) table[static_cast<unsigned char>(kB64[i])] = i;
  std::string out;
  int val = 0, bits = -8;
  for (unsigned char c : in) {
    if (table[c] == -1) break;
    val = (val << 6) + table[c];
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

}  // namespace

RolloutQueue::RolloutQueue(const RolloutOptions& options, int64_t resumed_version) : options_(options) {
  if (options_.log_path.empty()) return;
  // Replay: accepted groups in order; consumed records say which step took them.
  std::vector<QueuedGroup> accepted;
  std::map<std::string, int64_t> consumed_by;
  {
    std::ifstream in(options_.log_path);
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        continue;  // a torn last line from a crash: that group was never acknowledged
      }
      const std::string type = j.value("type", "");
      if (type == "group") {
        QueuedGroup g;
        g.id = j.value("id", "");
        if (!g.group.ParseFromString(Unbase64(j.value("data", "")))) continue;
        accepted.push_back(std::move(g));
      } else if (type == "consumed") {
        for (const auto& id : j.value("ids", std::vector<std::string>{})) consumed_by[id] = j.value("version", 0);
      }
    }
  }
  for (auto& g : accepted) {
    seen_.insert(g.id);
    ++accepted_;
    auto it = consumed_by.find(g.id);
    if (it != consumed_by.end() && it->second <= resumed_version) {
      ++consumed_;
      continue;
    }
    queue_.push_back(std::move(g));
  }
  next_id_ = accepted_;
  fd_ = ::open(options_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error(ErrorCode::kInternal, "cannot open the rollout log " + options_.log_path + ": " + std::strerror(errno));
  }
}

void RolloutQueue::append(const std::string& line) {
  if (fd_ < 0) return;
  std::string data = line + "\n";
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kInternal, std::string("writing the rollout log: ") + std::strerror(errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd_) != 0) throw Error(ErrorCode::kInternal, std::string("fsync of the rollout log: ") + std::strerror(errno));
}

std::string RolloutQueue::push(v1::RolloutGroup group, int64_t current_version, std::string* id_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string id = group.group_id().empty() ? "server-" + std::to_string(next_id_++) : group.group_id();
  if (id_out) *id_out = id;
  if (seen_.count(id)) {
    ++duplicates_;
    return "duplicate";
  }
  if (group.policy_version() < current_version - options_.max_staleness) {
    ++dropped_;
    return "stale";
  }
  if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) return "full";
  append(nlohmann::json{{"type", "group"}, {"id", id}, {"data", Base64(group.SerializeAsString())}}.dump());
  seen_.insert(id);
  ++accepted_;
  queue_.push_back(QueuedGroup{id, std::move(group)});
  return "accepted";
}

std::vector<QueuedGroup> RolloutQueue::take(int64_t current_version, int64_t* dropped) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n_dropped = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->group.policy_version() < current_version - options_.max_staleness) {
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
  return out;
}

void RolloutQueue::restore(std::vector<QueuedGroup> groups) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) queue_.push_front(std::move(*it));
}

void RolloutQueue::consumed(const std::vector<QueuedGroup>& groups, int64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& g : groups) ids.push_back(g.id);
  append(nlohmann::json{{"type", "consumed"}, {"ids", ids}, {"version", version}}.dump());
  consumed_ += static_cast<int64_t>(groups.size());
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

v1::RolloutStats RolloutQueue::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  v1::RolloutStats s;
  s.set_queue_depth(static_cast<int64_t>(queue_.size()));
  s.set_accepted(accepted_);
  s.set_consumed(consumed_);
  s.set_dropped_stale(dropped_);
  s.set_duplicates(duplicates_);
  s.set_steps_run(steps_);
  s.set_last_step_seconds(last_step_seconds_);
  s.set_groups_per_step(options_.groups_per_step);
  s.set_max_staleness(options_.max_staleness);
  return s;
}

}  // namespace streambp::server
