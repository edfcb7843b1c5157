// The TrainingHost's sampler snapshots (docs/api.md: Sampler snapshots): a session's weights
// frozen under a name. A snapshot is a read-only session of its own in the registry (key
// SnapshotKey(session, name), which no session name can be), kept in
// <session dir>/snapshots/<name>/ (state/ in the session's own state format, and
// snapshot.json), read into device memory when Sample, ComputeLogprobs or ExportWeights use
// it and dropped again like any idle session. Everything that changes a session's snapshots
// runs on the device thread, so their bounds are checked without races.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "executor.h"
#include "host.h"
#include "host_session.h"
#include "streambp/error.h"
#include "streambp/safetensors.h"

namespace streambp::server {
namespace {

namespace fs = std::filesystem;

int64_t FolderBytes(const fs::path& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  }
  return total;
}

nlohmann::json ToJson(const SnapshotReport& r) {
  return {{"session", r.session},         {"name", r.name},
          {"step", r.step},               {"policy_version", r.policy_version},
          {"bytes", r.bytes},             {"created_unix", r.created_unix},
          {"expires_unix", r.expires_unix}};
}

SnapshotReport SnapshotFromJson(const nlohmann::json& j) {
  SnapshotReport r;
  r.session = j.at("session").get<std::string>();
  r.name = j.at("name").get<std::string>();
  r.step = j.at("step").get<int64_t>();
  r.policy_version = j.at("policy_version").get<int64_t>();
  r.bytes = j.at("bytes").get<int64_t>();
  r.created_unix = j.at("created_unix").get<double>();
  r.expires_unix = j.at("expires_unix").get<double>();
  return r;
}

SnapshotReport Report(const HostSession& s) {
  SnapshotReport r = s.snapshot_info;
  r.resident = s.resident;
  return r;
}

std::string Quoted(const std::string& session, const std::string& name) {
  return "snapshot '" + name + "' of session '" + session + "'";
}

}  // namespace

std::vector<std::shared_ptr<HostSession>> TrainingHost::snapshots_of(const std::string& parent) const {
  std::vector<std::shared_ptr<HostSession>> out;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    for (const auto& [key, s] : sessions_) {
      // Ready only: a snapshot being written (device thread) is not read here.
      if (s->snapshot_of == parent && s->is_snapshot() && s->ready && !s->deleted) out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a->snapshot_info.created_unix < b->snapshot_info.created_unix;
  });
  return out;
}

void TrainingHost::open_snapshots(const std::shared_ptr<HostSession>& parent) {
  const fs::path root = fs::path(parent->dir) / "snapshots";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  const double now = UnixNow();
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.front() == '.') continue;
    try {
      std::ifstream in(entry.path() / "snapshot.json");
      if (!in || !fs::exists(entry.path() / "state" / "manifest.json")) {
        // A save that did not finish: never answered, so nobody knows it.
        fs::remove_all(entry.path(), ec);
        continue;
      }
      auto s = NewSession();
      s->snapshot_info = SnapshotFromJson(nlohmann::json::parse(in));
      s->snapshot_info.session = parent->spec.name;
      s->snapshot_info.name = name;
      if (s->expired(now)) {
        fs::remove_all(entry.path(), ec);
        spdlog::info("{} expired while the server was down; removed", Quoted(parent->spec.name, name));
        continue;
      }
      s->spec = parent->spec;
      s->spec.name = SnapshotKey(parent->spec.name, name);
      s->snapshot_of = parent->spec.name;
      s->dir = entry.path().string();
      s->step = s->snapshot_info.step;
      s->version = s->snapshot_info.policy_version;
      s->ready = true;
      sessions_[s->spec.name] = s;
    } catch (const std::exception& e) {
      spdlog::error("snapshot folder {}: {}; skipped", entry.path().string(), e.what());
    }
  }
}

void TrainingHost::save_snapshot(CallContext ctx, std::string name, double ttl_seconds, bool replace_oldest,
                                 Done<SnapshotReport> done) {
  std::shared_ptr<HostSession> parent;
  try {
    check_admitted(ctx);
    if (!config_.sessions.enabled) {
      throw FailedPrecondition("sampler snapshots need sessions (sessions.enabled); this server runs one default "
                               "session: sample from it, or export its weights (ExportWeights)");
    }
    ValidateSnapshotName(name);
    if (!std::isfinite(ttl_seconds) || ttl_seconds < 0) {
      throw InvalidArgument("ttl_seconds must be a number >= 0 (0: sessions.snapshot_ttl_seconds)");
    }
    parent = find(ctx.session);
    if (config_.sessions.max_snapshots == 0) {
      throw FailedPrecondition("sampler snapshots are turned off here (sessions.max_snapshots is 0)");
    }
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<SnapshotReport>(
      ctx, parent, true,
      [this, parent, name, ttl_seconds, replace_oldest] {
        const auto& c = config_.sessions;
        const std::string& session = parent->spec.name;
        expire_snapshots();  // the expired ones count no more
        auto existing = snapshots_of(session);
        int64_t bytes = 0;
        for (const auto& e : existing) {
          if (e->snapshot_info.name == name) {
            throw AlreadyExists(Quoted(session, name) + " exists; delete it first (DeleteSnapshot) or choose another name");
          }
          bytes += e->snapshot_info.bytes;
        }
        // A rolling window: the oldest make room while the bounds would refuse the new one (a
        // new snapshot is as large as the others), removed once the new one is written.
        std::vector<std::shared_ptr<HostSession>> replaced;
        while (replace_oldest && !existing.empty() &&
               (static_cast<int64_t>(existing.size()) >= c.max_snapshots ||
                bytes + existing.back()->snapshot_info.bytes > c.max_snapshot_bytes)) {
          bytes -= existing.front()->snapshot_info.bytes;
          replaced.push_back(existing.front());
          existing.erase(existing.begin());
        }
        if (static_cast<int64_t>(existing.size()) >= c.max_snapshots) {
          throw ResourceExhausted("session '" + session + "' holds sessions.max_snapshots (" +
                                  std::to_string(c.max_snapshots) +
                                  ") sampler snapshots; delete one first (DeleteSnapshot, ListSnapshots)");
        }
        // Every snapshot of a session has the same size: refused before it is written.
        if (!existing.empty() && bytes + existing.back()->snapshot_info.bytes > c.max_snapshot_bytes) {
          throw ResourceExhausted("the snapshots of session '" + session + "' would take " +
                                  std::to_string(bytes + existing.back()->snapshot_info.bytes) +
                                  " bytes, over sessions.max_snapshot_bytes (" + std::to_string(c.max_snapshot_bytes) +
                                  "); delete one first (DeleteSnapshot)");
        }
        auto s = NewSession();
        s->spec = parent->spec;
        s->spec.name = SnapshotKey(session, name);
        s->snapshot_of = session;
        s->dir = (fs::path(parent->dir) / "snapshots" / name).string();
        {
          std::lock_guard<std::mutex> lock(sessions_mutex_);
          if (sessions_.count(s->spec.name)) {
            throw AlreadyExists(Quoted(session, name) + " is being removed; retry in a moment");
          }
          sessions_[s->spec.name] = s;  // the name is taken; not ready until written
        }
        try {
          std::error_code ec;
          fs::remove_all(s->dir, ec);  // what a save that crashed may have left
          use(*parent);
          executor_->run(SaveCommand{session, s->state_dir(), false});
          auto& info = s->snapshot_info;
          info.session = session;
          info.name = name;
          info.step = parent->step;
          info.policy_version = parent->version;
          info.bytes = FolderBytes(s->dir);
          if (bytes + info.bytes > c.max_snapshot_bytes) {
            throw ResourceExhausted("this snapshot is " + std::to_string(info.bytes) + " bytes: the snapshots of session '" +
                                    session + "' would take " + std::to_string(bytes + info.bytes) +
                                    " bytes, over sessions.max_snapshot_bytes (" +
                                    std::to_string(c.max_snapshot_bytes) + ")" +
                                    (existing.empty() ? "" : "; delete one first (DeleteSnapshot)"));
          }
          info.created_unix = UnixNow();
          const double ttl = ttl_seconds > 0 ? ttl_seconds : c.snapshot_ttl_seconds;
          info.expires_unix = ttl > 0 ? info.created_unix + ttl : 0;
          WriteFileAtomic((fs::path(s->dir) / "snapshot.json").string(), ToJson(info).dump(2) + "\n");
          s->step = info.step;
          s->version = info.policy_version;
          for (const auto& r : replaced) {
            remove_snapshot(r);
            spdlog::info("{} replaced by '{}' (replace_oldest)", Quoted(session, r->snapshot_info.name), name);
          }
          s->ready = true;
        } catch (...) {
          std::error_code ec;
          fs::remove_all(s->dir, ec);
          std::lock_guard<std::mutex> lock(sessions_mutex_);
          auto it = sessions_.find(s->spec.name);
          if (it != sessions_.end() && it->second == s) sessions_.erase(it);
          throw;
        }
        spdlog::info("{} saved (step {}, policy version {}, {} bytes)", Quoted(session, name), s->step.load(),
                     s->version.load(), s->snapshot_info.bytes);
        return Share(Report(*s));
      },
      std::move(done));
}

void TrainingHost::delete_snapshot(CallContext ctx, std::string name, Done<std::string> done) {
  std::shared_ptr<HostSession> parent;
  try {
    check_admitted(ctx);
    if (!config_.sessions.enabled) throw FailedPrecondition("sampler snapshots need sessions (sessions.enabled)");
    ValidateSnapshotName(name);
    parent = find(ctx.session);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<std::string>(
      ctx, parent, true,
      [this, parent, name] {
        std::shared_ptr<HostSession> s;
        {
          std::lock_guard<std::mutex> lock(sessions_mutex_);
          auto it = sessions_.find(SnapshotKey(parent->spec.name, name));
          if (it != sessions_.end() && it->second->ready && !it->second->deleted) s = it->second;
        }
        if (!s) throw NotFound("session '" + parent->spec.name + "' has no snapshot named '" + name + "' (ListSnapshots)");
        remove_snapshot(s);
        spdlog::info("{} deleted", Quoted(parent->spec.name, name));
        return Share(name);
      },
      std::move(done));
}

std::vector<SnapshotReport> TrainingHost::list_snapshots(const std::string& session) const {
  find(session);  // NotFound / InvalidArgument for an unknown or empty name
  const double now = UnixNow();
  std::vector<SnapshotReport> out;
  for (const auto& s : snapshots_of(session)) {
    if (s->ready && !s->expired(now)) out.push_back(Report(*s));
  }
  return out;
}

void TrainingHost::remove_snapshot(const std::shared_ptr<HostSession>& s) {
  s->deleted = true;  // new calls do not find it; its waiting jobs are answered NotFound
  std::error_code ec;
  // snapshot.json first: a folder without it is one a restart removes, so a crash while the
  // rest goes never leaves a listed snapshot with missing files.
  fs::remove(fs::path(s->dir) / "snapshot.json", ec);
  auto forget = [&] {
    s->resident = false;
    s->device_bytes = 0;
    s->snapshot.reset();
    fs::remove_all(s->dir, ec);
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    auto it = sessions_.find(s->spec.name);
    if (it != sessions_.end() && it->second == s) sessions_.erase(it);
  };
  try {
    // Sent also when it is on disk only: the other ranks drop their copies of it.
    executor_->run(DropSessionCommand{s->spec.name, true});
  } catch (...) {
    forget();
    throw;
  }
  forget();
}

void TrainingHost::expire_snapshots() {
  const double now = UnixNow();
  std::vector<std::shared_ptr<HostSession>> expired;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    for (const auto& [key, s] : sessions_) {
      if (s->is_snapshot() && s->ready && !s->deleted && s->expired(now)) expired.push_back(s);
    }
  }
  for (const auto& s : expired) {
    remove_snapshot(s);
    spdlog::info("{} expired (its TTL); removed", Quoted(s->snapshot_of, s->snapshot_info.name));
  }
}

}  // namespace streambp::server
