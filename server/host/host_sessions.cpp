// The TrainingHost's sessions: the registry (state folders on disk), residency (at most
// sessions.max_resident_sessions in device memory, the least recently used idle one written
// out), creation and deletion.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "executor.h"
#include "host.h"
#include "host_session.h"
#include "request_cache.h"
#include "rollout_queue.h"
#include "streambp/error.h"
#include "streambp/lora.h"
#include "streambp/objective.h"
#include "streambp/safetensors.h"

namespace streambp::server {
namespace {

namespace fs = std::filesystem;

// step and policy_version of a trainer checkpoint folder (0, 0 when there is none).
std::pair<int64_t, int64_t> CheckpointVersions(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "trainer_state.json");
  if (!in) return {0, 0};
  try {
    const auto j = nlohmann::json::parse(in);
    return {j.at("step").get<int64_t>(), j.at("policy_version").get<int64_t>()};
  } catch (const std::exception&) {
    return {0, 0};
  }
}

RolloutOptions RolloutOptionsOf(const ServerConfig& c, const SessionSpec& spec, const std::string& log) {
  RolloutOptions ro;
  ro.groups_per_step = spec.groups_per_step;
  ro.max_staleness = spec.max_staleness;
  ro.max_queue = c.rollouts.max_queue;
  ro.log_path = log;
  ro.max_group_id_bytes = c.limits.max_request_id_bytes;
  return ro;
}

}  // namespace

void TrainingHost::open_sessions() {
  auto& replica = executor_->replica();
  if (!config_.sessions.enabled) {
    // One session, "": the whole model, as the server always was.
    auto s = NewSession();
    s->spec.trainer = config_.trainer;
    s->spec.groups_per_step = config_.rollouts.groups_per_step;
    s->spec.max_staleness = config_.rollouts.max_staleness;
    s->spec.grpo = config_.rollouts.grpo;
    s->spec.full = true;
    bool resumed = false;
    if (config_.resume) {
      const std::string newest = FindNewestCheckpoint(config_.checkpoint_dir);
      resumed = !newest.empty();
      if (!newest.empty()) {
        executor_->run(LoadCommand{"", checkpoint_path(*s, newest)});
        spdlog::info("resumed from checkpoint {} (step {}, policy version {})", newest, replica.trainer().step(),
                     replica.trainer().policy_version());
      }
    }
    s->rollouts = std::make_unique<RolloutQueue>(RolloutOptionsOf(config_, s->spec, config_.rollouts.log),
                                                 replica.trainer().policy_version());
    open_history(*s, !resumed);
    s->resident = true;
    s->ready = true;
    s->trainable_parameters = static_cast<int64_t>(replica.trainer().trainable().size());
    sessions_[""] = s;
    publish_state(*s);
    audit(*s, {{"resumed", s->version.load()}});
    announce(*s, "start", nullptr, 0);
    return;
  }
  // Sessions on disk: each a folder with spec.json (+ state/, rollouts.log); not resident
  // until used.
  const auto root = config_.sessions_dir();
  fs::create_directories(root);
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory() || entry.path().filename().string().front() == '.') continue;
    const auto spec_path = entry.path() / "spec.json";
    if (!fs::exists(spec_path)) continue;
    try {
      std::ifstream in(spec_path);
      auto s = NewSession();
      s->spec = SessionSpec::FromJson(nlohmann::json::parse(in));
      s->dir = entry.path().string();
      CleanStaging(s->dir);
      if (!fs::exists(fs::path(s->state_dir()) / "manifest.json")) {
        spdlog::warn("session {}: no saved state in {}; skipped", s->spec.name, s->dir);
        continue;
      }
      const auto [step, version] = CheckpointVersions(s->state_dir());
      s->step = step;
      s->version = version;
      s->rollouts = std::make_unique<RolloutQueue>(
          RolloutOptionsOf(config_, s->spec, (entry.path() / "rollouts.log").string()), version);
      open_history(*s, false);
      s->ready = true;
      audit(*s, {{"resumed", version}});
      announce(*s, "start", nullptr, 0);
      sessions_[s->spec.name] = s;
      open_snapshots(s);
    } catch (const std::exception& e) {
      spdlog::error("session folder {}: {}; skipped", entry.path().string(), e.what());
    }
  }
  const auto sessions = std::count_if(sessions_.begin(), sessions_.end(), [](const auto& e) { return !e.second->is_snapshot(); });
  if (sessions > 0) spdlog::info("{} sessions on disk in {}", sessions, root);
}

void TrainingHost::write_spec(const HostSession& s) const {
  WriteFileAtomic((fs::path(s.dir) / "spec.json").string(), s.spec.ToJson().dump(2) + "\n");
}

Trainer& TrainingHost::use(HostSession& s) {
  auto& replica = executor_->replica();
  s.touch();
  if (replica.resident(s.spec.name)) return replica.trainer(s.spec.name);
  // Make room: the least recently used resident session without pending gradients.
  int64_t resident = 0;
  std::shared_ptr<HostSession> lru;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    for (const auto& [name, other] : sessions_) {
      if (!other->resident || other.get() == &s) continue;
      ++resident;
      if (other->pending == 0 && (!lru || other->last_used_ns < lru->last_used_ns)) lru = other;
    }
  }
  if (resident >= config_.sessions.max_resident_sessions) {
    if (!lru) {
      throw ResourceExhausted("sessions.max_resident_sessions (" + std::to_string(config_.sessions.max_resident_sessions) +
                              ") are in memory and each holds pending gradients; finish their steps (OptimStep) first");
    }
    evict(*lru);
  }
  executor_->run(RestoreSessionCommand{s.spec, s.state_dir()});
  s.resident = true;
  publish_state(s);
  spdlog::info("session {} read back from disk (step {}, policy version {})", s.spec.name, s.step.load(),
               s.version.load());
  return replica.trainer(s.spec.name);
}

void TrainingHost::evict(HostSession& s) {
  auto& replica = executor_->replica();
  if (!replica.resident(s.spec.name)) return;
  if (replica.trainer(s.spec.name).has_pending_gradients()) executor_->run(ZeroGradientsCommand{s.spec.name});
  // A snapshot never trains: its state folder already holds its weights (and its export
  // cache goes with it: many snapshots must not keep many copies of the weights in memory).
  if (!s.is_snapshot()) executor_->run(SaveCommand{s.spec.name, s.state_dir(), false});
  if (s.is_snapshot()) s.snapshot.reset();
  executor_->run(DropSessionCommand{s.spec.name});
  s.resident = false;
  s.device_bytes = 0;
  spdlog::info("session {} written to disk (step {}, policy version {})", s.spec.name, s.step.load(), s.version.load());
}

void TrainingHost::evict_idle() {
  const double idle = config_.sessions.idle_seconds;
  std::vector<std::shared_ptr<HostSession>> idle_sessions;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    for (const auto& [name, s] : sessions_) {
      if (s->resident && s->ready && !s->deleted && s->pending == 0 && s->idle_seconds() > idle) {
        idle_sessions.push_back(s);
      }
    }
  }
  for (auto& s : idle_sessions) {
    if (worker_->depth(s->spec.name) > 0) continue;  // work is waiting for it
    evict(*s);
  }
}

void TrainingHost::create_session(CallContext ctx, SessionRequest request, Done<SessionReport> done) {
  std::shared_ptr<HostSession> s;
  // A retry (same request id, same body) gets the first answer, also after the session
  // exists: the id is keyed by the name, since the session is not there yet.
  std::string key;
  auto refuse = [&](std::exception_ptr e) {
    if (!key.empty()) cache_->complete(key, e, nullptr, 0, /*applied=*/false);
    done({nullptr, e});
  };
  try {
    check_admitted(ctx);
    if (!ctx.request_id.empty()) {
      const std::string k = "CreateSession/" + request.spec.name + "/" + ctx.request_id;
      const bool fresh = cache_->begin(k, ctx.digest, [done](std::exception_ptr e, std::shared_ptr<const void> v) {
        done({std::static_pointer_cast<const SessionReport>(v), e});
      });
      if (!fresh) return;
      key = k;  // begun: every path below completes it
      ctx.cache_key = key;
    }
    if (!config_.sessions.enabled) {
      throw FailedPrecondition("this server runs without sessions (sessions.enabled is false)");
    }
    auto& spec = request.spec;
    ValidateSessionName(spec.name);
    if (!request.adapter_safetensors.empty()) {
      spec.lora = LoraConfig::FromPeftJson(nlohmann::json::parse(request.adapter_config_json));
    }
    if (spec.full) {
      if (!config_.sessions.allow_full_finetuning) {
        throw FailedPrecondition("full fine-tuning sessions are not allowed here (sessions.allow_full_finetuning); "
                                 "create a LoRA session");
      }
    } else {
      spec.lora.Validate(&executor_->replica().model_config());
      if (spec.lora.r > config_.sessions.max_lora_rank) {
        throw InvalidArgument("lora.r = " + std::to_string(spec.lora.r) + " is over sessions.max_lora_rank " +
                              std::to_string(config_.sessions.max_lora_rank));
      }
    }
    spec.trainer.Validate();
    if (spec.groups_per_step < 1) throw InvalidArgument("rollouts.groups_per_step must be >= 1");
    if (spec.max_staleness < 0) throw InvalidArgument("rollouts.max_staleness must be >= 0");
    CreateObjective("grpo", spec.grpo);
    s = NewSession();
    s->spec = spec;
    s->dir = (fs::path(config_.sessions_dir()) / spec.name).string();
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    if (sessions_.count(spec.name)) throw AlreadyExists("a session named '" + spec.name + "' exists");
    const auto count = std::count_if(sessions_.begin(), sessions_.end(), [](const auto& e) { return !e.second->is_snapshot(); });
    if (count >= config_.sessions.max_sessions) {
      throw ResourceExhausted("sessions.max_sessions (" + std::to_string(config_.sessions.max_sessions) +
                              ") sessions exist; delete one first");
    }
    sessions_[spec.name] = s;  // the name is taken; not ready until created
  } catch (...) {
    refuse(std::current_exception());
    return;
  }
  ctx.session = s->spec.name;
  auto req = std::make_shared<SessionRequest>(std::move(request));
  submit<SessionReport>(
      ctx, s, true,
      [this, s, req] {
        try {
          // Room first: creating counts as using a session.
          s->resident = false;
          int64_t resident = 0;
          std::shared_ptr<HostSession> lru;
          {
            std::lock_guard<std::mutex> lock(sessions_mutex_);
            for (const auto& [name, other] : sessions_) {
              if (!other->resident || other == s) continue;
              ++resident;
              if (other->pending == 0 && (!lru || other->last_used_ns < lru->last_used_ns)) lru = other;
            }
          }
          if (resident >= config_.sessions.max_resident_sessions && lru) evict(*lru);
          req->spec = s->spec;
          executor_->run(CreateSessionCommand{*req});
          s->resident = true;
          fs::create_directories(s->dir);
          write_spec(*s);
          executor_->run(SaveCommand{s->spec.name, s->state_dir(), false});  // a restart finds it
          s->rollouts = std::make_unique<RolloutQueue>(
              RolloutOptionsOf(config_, s->spec, (fs::path(s->dir) / "rollouts.log").string()), 0);
          s->trainable_parameters = static_cast<int64_t>(0);
          for (const auto& [name, p] : executor_->replica().trainer(s->spec.name).trainable()) {
            s->trainable_parameters += p.numel();
          }
          open_history(*s, true);
          publish_state(*s);
          s->ready = true;
          audit(*s, {{"resumed", 0}});
          announce(*s, "start", nullptr, 0);
          spdlog::info("session {} created ({})", s->spec.name,
                       s->spec.full ? std::string("full fine-tuning") : "LoRA r " + std::to_string(s->spec.lora.r));
        } catch (...) {
          if (executor_->replica().resident(s->spec.name)) executor_->run(DropSessionCommand{s->spec.name});
          std::error_code ec;
          fs::remove_all(s->dir, ec);
          std::lock_guard<std::mutex> lock(sessions_mutex_);
          sessions_.erase(s->spec.name);
          throw;
        }
        return Share(session_report(s->spec.name));
      },
      std::move(done));
}

void TrainingHost::delete_session(CallContext ctx, std::string name, Done<std::string> done) {
  std::shared_ptr<HostSession> s;
  // A retry of a delete that happened gets its first answer (not NotFound): the id is keyed
  // by the name, since the session is gone by then.
  std::string key;
  auto finish = [this, done](const std::string& key, Outcome<std::string> o, bool applied) {
    if (!key.empty()) cache_->complete(key, o.error, o.value, 64, applied);
    done(o);
  };
  try {
    check_admitted(ctx);
    if (!config_.sessions.enabled) throw FailedPrecondition("this server runs without sessions");
    if (!ctx.request_id.empty()) {
      const std::string k = "DeleteSession/" + name + "/" + ctx.request_id;
      const bool fresh = cache_->begin(k, ctx.digest, [done](std::exception_ptr e, std::shared_ptr<const void> v) {
        done({std::static_pointer_cast<const std::string>(v), e});
      });
      if (!fresh) return;
      key = k;  // begun: every path below completes it
    }
    s = find(name);
    s->deleted = true;  // from now on: not found; its waiting jobs are answered so
  } catch (...) {
    finish(key, {nullptr, std::current_exception()}, false);
    return;
  }
  DeviceWorker::Job job;
  job.lane = name;
  job.method = ctx.method;
  job.run = [this, s, finish, key] {
    try {
      // Sent also when the session is on disk only: the other ranks drop their copies of it.
      executor_->run(DropSessionCommand{s->spec.name, true});
      s->resident = false;
      for (auto& snapshot : snapshots_of(s->spec.name)) remove_snapshot(snapshot);
      s->hub.close_all();
      // The rollout queue stays: a push or a stats read that found the session before the
      // delete may still hold it (its groups go with the session, as the docs say).
      std::error_code ec;
      fs::remove_all(s->dir, ec);
      // Its checkpoints go too: a session created later under this name starts empty.
      if (!config_.checkpoint_dir.empty()) fs::remove_all(fs::path(config_.checkpoint_dir) / s->spec.name, ec);
      {
        std::lock_guard<std::mutex> lock(sessions_mutex_);
        auto it = sessions_.find(s->spec.name);
        if (it != sessions_.end() && it->second == s) sessions_.erase(it);
      }
      spdlog::info("session {} deleted", s->spec.name);
      finish(key, {Share(s->spec.name), nullptr}, true);
    } catch (...) {
      finish(key, {nullptr, std::current_exception()}, true);
    }
    return true;
  };
  job.drop = [finish, key, s](std::exception_ptr e) {
    s->deleted = false;  // nothing was done: the session is there again
    finish(key, {nullptr, e}, false);
  };
  if (worker_->submit(std::move(job)) != DeviceWorker::Submit::kAccepted) {
    s->deleted = false;
    finish(key, {nullptr, std::make_exception_ptr(ResourceExhausted("the request queue is full; retry with backoff"))},
           false);
  }
}

SessionReport TrainingHost::session_report(const std::string& name) const {
  std::shared_ptr<HostSession> s;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    auto it = sessions_.find(name);
    if (it == sessions_.end() || it->second->deleted || it->second->is_snapshot()) {
      throw NotFound("no session named '" + name + "'");
    }
    s = it->second;
  }
  SessionReport r;
  r.spec = s->spec;
  r.step = s->step;
  r.policy_version = s->version;
  r.resident = s->resident;
  r.trainable_parameters = s->trainable_parameters;
  if (r.trainable_parameters == 0 && !s->spec.full) {
    r.trainable_parameters = LoraParameterCount(info_.model, s->spec.lora);
  }
  r.device_bytes = s->resident ? s->device_bytes.load() : 0;
  r.idle_seconds = s->idle_seconds();
  r.pending_micro_batches = s->pending;
  return r;
}

std::vector<SessionReport> TrainingHost::list_sessions() const {
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    for (const auto& [name, s] : sessions_) {
      if (s->ready && !s->deleted && !name.empty() && !s->is_snapshot()) names.push_back(name);
    }
  }
  std::vector<SessionReport> out;
  for (const auto& n : names) {
    try {
      out.push_back(session_report(n));
    } catch (const NotFound&) {
    }
  }
  return out;
}

}  // namespace streambp::server
