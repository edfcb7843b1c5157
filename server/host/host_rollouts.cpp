// The TrainingHost's RL loop: pushed groups into each session's rollout queue (on the I/O
// thread: validation and the log's fsync never run in a gRPC reaction), server-run GRPO
// steps that commit together with their "consumed" record, policy watchers, the audit log.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include <spdlog/spdlog.h>

#include "admission.h"
#include "executor.h"
#include "host.h"
#include "host_session.h"
#include "rollout_input.h"
#include "rollout_queue.h"
#include "streambp/error.h"

namespace streambp::server {
namespace {

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

void TrainingHost::watch_policy(const std::string& session, PolicySink* sink, int64_t since) {
  if (draining_) throw Unavailable("the server is shutting down; retry against its replacement");
  find(session)->hub.subscribe(sink, since);
}

void TrainingHost::unwatch_policy(const std::string& session, PolicySink* sink) {
  std::shared_ptr<HostSession> s;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    s = it->second;
  }
  s->hub.unsubscribe(sink);
}

void TrainingHost::push_rollouts(CallContext ctx, std::vector<PushItem> items, Done<std::vector<RolloutAck>> done) {
  try {
    check_admitted(ctx);
    if (items.empty()) throw InvalidArgument("groups is empty");
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  auto work = [this, items = std::move(items), done]() mutable {
    std::vector<RolloutAck> acks(items.size());
    // Valid groups per session, pushed together (one append + fsync per session).
    struct Batch {
      std::shared_ptr<HostSession> session;
      std::vector<RolloutGroup> groups;
      std::vector<int> indices;
      std::vector<size_t> slots;
    };
    std::map<std::string, Batch> batches;
    for (size_t i = 0; i < items.size(); ++i) {
      auto& item = items[i];
      auto& ack = acks[i];
      ack.index = item.index;
      try {
        auto s = find(item.session);
        const int64_t current = s->version;
        ack.policy_version = current;
        if (!item.group) throw InvalidArgument(item.error);
        ack.group_id = item.group->group_id;
        const std::string field = "groups[" + std::to_string(item.index) + "]";
        if (item.group->policy_version > current) {
          throw InvalidArgument(field + ".policy_version " + std::to_string(item.group->policy_version) +
                                " is from the future (the current version is " + std::to_string(current) + ")");
        }
        CreateObjective("grpo", s->spec.grpo)->prepare(RolloutSequences(*item.group, 0, limits_, field));
        auto& b = batches[item.session];
        b.session = s;
        b.groups.push_back(std::move(*item.group));
        b.indices.push_back(item.index);
        b.slots.push_back(i);
      } catch (const std::exception& e) {
        try {
          ++find(item.session)->invalid_groups;
        } catch (...) {
        }
        ack.status = RolloutStatus::kInvalid;
        ack.message = e.what();
      }
    }
    std::vector<std::shared_ptr<HostSession>> to_schedule;
    for (auto& [name, b] : batches) {
      auto queued = b.session->rollouts->push(std::move(b.groups), b.indices, b.session->version);
      bool any_accepted = false;
      for (size_t k = 0; k < queued.size(); ++k) {
        any_accepted = any_accepted || queued[k].status == RolloutStatus::kAccepted;
        if (queued[k].status == RolloutStatus::kStale) ++b.session->dropped_since_update;
        if (queued[k].status == RolloutStatus::kInvalid) ++b.session->invalid_groups;
        acks[b.slots[k]] = std::move(queued[k]);
      }
      if (any_accepted) to_schedule.push_back(b.session);
    }
    for (auto& a : acks) {
      if (a.status != RolloutStatus::kInvalid || a.queue_depth != 0) continue;
      try {
        a.queue_depth = find(items[&a - &acks[0]].session)->rollouts->stats().queue_depth;
      } catch (...) {
      }
    }
    // The step is queued before the acks are answered: a client that sees its group
    // accepted finds the step on its way.
    for (auto& s : to_schedule) schedule_rollout_step(s);
    done({std::make_shared<const std::vector<RolloutAck>>(std::move(acks)), nullptr});
  };
  {
    std::lock_guard<std::mutex> lock(io_mutex_);
    if (io_stopping_) {
      done({nullptr, std::make_exception_ptr(Unavailable("the server is shutting down; retry later"))});
      return;
    }
    io_jobs_.push_back(std::move(work));
  }
  io_cv_.notify_one();
}

void TrainingHost::schedule_rollout_step(const std::shared_ptr<HostSession>& s) {
  if (!s->rollouts || !s->rollouts->ready() || draining_ || s->deleted) return;
  bool expected = false;
  if (!s->rollout_step_scheduled.compare_exchange_strong(expected, true)) return;
  DeviceWorker::Job job;
  job.lane = s->spec.name;
  job.method = "RolloutStep";
  job.run = [this, s] {
    bool again = false;
    try {
      again = true;
      if (!s->deleted) run_rollout_step(*s);
    } catch (const std::exception& e) {
      again = false;
      spdlog::error("rollout step of session '{}' failed: {}", s->spec.name, e.what());
    }
    if (!s->deleted) publish_state(*s);
    s->rollout_step_scheduled = false;
    if (again) schedule_rollout_step(s);
    return true;
  };
  job.drop = [s](std::exception_ptr) { s->rollout_step_scheduled = false; };
  if (worker_->submit(std::move(job)) != DeviceWorker::Submit::kAccepted) s->rollout_step_scheduled = false;
}

void TrainingHost::run_rollout_step(HostSession& s) {
  const auto start = Clock::now();
  int64_t dropped = 0;
  auto groups = s.rollouts->take(s.version, &dropped);
  s.dropped_since_update += dropped;
  if (groups.empty()) return;
  StepCommand command;
  command.session = s.spec.name;
  command.kind = StepKind::kForwardBackwardLast;
  command.objective = "grpo";
  command.options = s.spec.grpo;
  int64_t tokens = 0;
  CallContext ctx;
  ctx.method = "RolloutStep";
  ctx.session = s.spec.name;
  ctx.received = start;
  TrainStats t;
  bool committed = false;
  try {
    // Inside the try: a group that cannot become sequences is dropped and counted like a
    // failed step's, never lost between the queue and the counters.
    for (size_t g = 0; g < groups.size(); ++g) {
      auto seqs = RolloutSequences(groups[g].group, static_cast<int64_t>(g), limits_, "group " + groups[g].id);
      for (auto& q : seqs) {
        tokens += static_cast<int64_t>(q.tokens.size());
        command.sequences.push_back(std::move(q));
      }
    }
    EngineOptions engine = admission_->resolve_engine({});
    const LoraConfig* lora = config_.sessions.enabled && !s.spec.full ? &s.spec.lora : nullptr;
    command.plan = std::make_shared<const StepPlan>(
        admission_->admit_step(command.sequences, false, &engine, lora, resident_bytes(s.spec.name)));
    command.built = CreateObjective(command.objective, command.options);
    command.engine = engine;
    t.forward = run_forward_backward(ctx, s, command, engine);
    t.forward.policy_version = s.version;
    // The step and its "consumed" record commit together: the record (naming the version
    // this step produces) first; if it cannot be written the step is not applied and the
    // groups stay queued for the next try.
    try {
      s.rollouts->commit(groups, s.version + 1);
      committed = true;
    } catch (const std::exception& e) {
      executor_->run(ZeroGradientsCommand{s.spec.name});
      publish_state(s);
      spdlog::error("rollout step not applied: the rollout log cannot be written ({}); {} groups stay queued",
                    e.what(), groups.size());
      s.rollouts->restore(std::move(groups));
      s.rollouts->set_last_step_seconds(Since(start));
      throw;
    }
    t.optim = run_optim_step(s, "rollouts", std::nullopt, static_cast<int64_t>(groups.size()));
  } catch (...) {
    s.rollouts->set_last_step_seconds(Since(start));
    if (groups.empty()) throw;  // restored above
    // Groups that cannot be trained (refused, or the step failed) are dropped and counted,
    // never retried forever. Recorded as consumed: by the version the failed step would
    // have made (already written), or by the current one.
    s.invalid_groups += static_cast<int64_t>(groups.size());
    if (!committed) {
      try {
        s.rollouts->commit(groups, s.version);
      } catch (const std::exception& e) {
        s.rollouts->release(groups.size());
        spdlog::warn("rollout log: could not record {} dropped groups ({}); a restart may try them again",
                     groups.size(), e.what());
      }
    }
    throw;
  }
  s.rollouts->set_last_step_seconds(Since(start));
  if (telemetry_) telemetry_->on_train_step(s.spec.name, t, "rollouts", Since(start));
  if (t.optim.optim.skipped) {
    spdlog::warn("rollout step skipped: {}", t.optim.optim.reason);
    return;
  }
  announce(s, "rollouts", &t.forward.result, static_cast<int64_t>(groups.size()));
  {
    std::vector<std::string> ids;
    for (const auto& g : groups) ids.push_back(g.id);
    audit(s, {{"version", s.version.load()}, {"ids", ids}});
  }
  const int64_t every = config_.rollouts.checkpoint_every;
  if (every > 0 && s.version % every == 0) {
    const std::string name = "policy-v" + std::to_string(s.version.load());
    try {
      executor_->run(SaveCommand{s.spec.name, checkpoint_path(s, name)});
    } catch (const std::exception& e) {
      spdlog::error("could not write checkpoint {}: {}", name, e.what());
    }
  }
  spdlog::info("rollout step{}: policy version {} from {} groups ({} tokens) in {:.2f} s",
               s.spec.name.empty() ? "" : " of session " + s.spec.name, s.version.load(), groups.size(), tokens,
               Since(start));
}

void TrainingHost::audit(const HostSession& s, const nlohmann::json& record) {
  if (config_.rollouts.audit_log.empty()) return;
  nlohmann::json line = record;
  line["run"] = run_id_;
  if (!s.spec.name.empty()) line["session"] = s.spec.name;
  const std::string text = line.dump() + "\n";
  const int fd = ::open(config_.rollouts.audit_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("rollouts.audit_log: cannot open: {}", std::strerror(errno));
    return;
  }
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(fd) != 0) {
    spdlog::warn("rollouts.audit_log: cannot write: {}", std::strerror(errno));
  }
  ::close(fd);
}

}  // namespace streambp::server
