// The TrainingHost's state on disk: checkpoints saved and loaded on the device thread, and
// weight exports (a snapshot taken there, written out on the caller's side).
#include <filesystem>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "admission.h"
#include "executor.h"
#include "host.h"
#include "host_session.h"
#include "streambp/error.h"
#include "weights_snapshot.h"

namespace streambp::server {
namespace {

// Errors name the checkpoint, never the server's paths (those go to the log).
[[noreturn]] void RethrowWithoutPaths(const std::string& dir, const std::string& what) {
  try {
    throw;
  } catch (const Error& e) {
    std::string message = e.what();
    spdlog::warn("{}: {}", what, message);
    for (size_t at; !dir.empty() && (at = message.find(dir)) != std::string::npos;) {
      message.replace(at, dir.size(), "<checkpoint_dir>");
    }
    throw Error(e.code(), message);
  }
}

}  // namespace

// --- State on disk ----------------------------------------------------------------------------

// What SaveCheckpoint and LoadCheckpoint check before they queue: admitted, the session, a
// checkpoint folder configured, a valid name (empty: the default).
std::shared_ptr<HostSession> TrainingHost::admit_checkpoint_call(const CallContext& ctx,
                                                                const std::string& name) const {
  check_admitted(ctx);
  auto s = find(ctx.session);
  if (config_.checkpoint_dir.empty()) {
    throw FailedPrecondition("no checkpoint directory is configured (checkpoint_dir in the server config)");
  }
  if (!name.empty()) ValidateCheckpointName(name);
  return s;
}

void TrainingHost::save_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done) {
  std::shared_ptr<HostSession> s;
  try {
    s = admit_checkpoint_call(ctx, name);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<CheckpointReply>(
      ctx, s, true,
      [this, s, name] {
        auto& trainer = use(*s);
        if (trainer.has_pending_gradients()) {
          throw FailedPrecondition("gradients are pending: call OptimStep (or TrainStep) before saving a checkpoint");
        }
        CheckpointReply r;
        r.name = name.empty() ? "step-" + std::to_string(trainer.step()) : name;
        const auto dir = checkpoint_path(*s, r.name);
        try {
          executor_->run(SaveCommand{s->spec.name, dir});
        } catch (...) {
          RethrowWithoutPaths(config_.checkpoint_dir, "saving checkpoint " + r.name);
        }
        for (const auto& f : std::filesystem::directory_iterator(dir)) {
          if (f.is_regular_file()) r.bytes += static_cast<int64_t>(f.file_size());
        }
        r.step = trainer.step();
        r.policy_version = trainer.policy_version();
        return Share(std::move(r));
      },
      std::move(done));
}

void TrainingHost::load_checkpoint(CallContext ctx, std::string name, Done<CheckpointReply> done) {
  std::shared_ptr<HostSession> s;
  try {
    s = admit_checkpoint_call(ctx, name);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<CheckpointReply>(
      ctx, s, true,
      [this, s, name] {
        use(*s);
        CheckpointReply r;
        const auto folder = std::filesystem::path(checkpoint_path(*s, "x")).parent_path().string();
        r.name = name.empty() ? FindNewestCheckpoint(folder) : name;
        if (r.name.empty()) throw NotFound("no complete checkpoint in the checkpoint directory yet");
        const auto dir = checkpoint_path(*s, r.name);
        if (!std::filesystem::is_directory(dir)) throw NotFound("no checkpoint named '" + r.name + "'");
        try {
          executor_->run(LoadCommand{s->spec.name, dir});
        } catch (...) {
          RethrowWithoutPaths(config_.checkpoint_dir, "loading checkpoint " + r.name);
        }
        ++s->weights_generation;
        publish_state(*s);
        announce(*s, "load", nullptr, 0);
        auto& trainer = executor_->replica().trainer(s->spec.name);
        r.step = trainer.step();
        r.policy_version = trainer.policy_version();
        return Share(std::move(r));
      },
      std::move(done));
}

void TrainingHost::export_weights(CallContext ctx, int64_t version, bool merged, Done<ExportReply> done) {
  std::shared_ptr<HostSession> s;
  try {
    check_admitted(ctx);
    s = find(ctx.session, true);
  } catch (...) {
    done({nullptr, std::current_exception()});
    return;
  }
  submit<ExportReply>(
      ctx, s, false,
      [this, s, version, merged] {
        auto& trainer = use(*s);
        trainer.activate();
        const int64_t generation = s->weights_generation;
        const bool adapter_file = trainer.adapter() && !merged;
        if (!s->snapshot || s->snapshot_generation != generation || s->snapshot_merged != merged) {
          s->snapshot.reset();  // the old version's bytes go before the new ones are made
          s->snapshot = Share(adapter_file ? MakeAdapterSnapshot(*trainer.adapter(), trainer.policy_version())
                                           : MakeWeightsSnapshot(trainer.model(), trainer.policy_version(), merged));
          s->snapshot_generation = generation;
          s->snapshot_merged = merged;
        }
        ExportReply r;
        r.snapshot = s->snapshot;
        r.files = side_files_;
        if (version != 0 && version != s->snapshot->policy_version) {
          r.note = "version " + std::to_string(version) + " is not available; serving the current version " +
                   std::to_string(s->snapshot->policy_version);
        }
        return Share(std::move(r));
      },
      std::move(done));
}

}  // namespace streambp::server
