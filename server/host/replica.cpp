#include "replica.h"

#include <functional>

#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/model.h"

namespace streambp::server {
namespace {

// The ranks agree on the outcome of a command that reads this rank's own storage (a
// checkpoint, an evicted session's state) before any of them changes anything: a rank that
// could not read makes every rank fail with its error, instead of the others entering the
// weight broadcast it skips (the group would wait there until its timeout and break).
// Rethrows this rank's error, or throws the first failed rank's.
void AgreeOnRead(Communicator* group, std::exception_ptr error, const std::string& what) {
  if (group == nullptr || group->world_size() <= 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::vector<double> failed(static_cast<size_t>(group->world_size()), 0.0);
  failed[static_cast<size_t>(group->rank())] = error ? 1.0 : 0.0;
  const auto all = group->all_reduce_scalars(failed);
  int first = -1;
  for (int r = 0; r < group->world_size() && first < 0; ++r) {
    if (all[static_cast<size_t>(r)] > 0) first = r;
  }
  if (first < 0) return;
  std::string message;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "unknown error";
    }
  }
  message = group->broadcast_bytes(message, first);
  if (error) std::rethrow_exception(error);
  throw FailedPrecondition("rank " + std::to_string(first) + " could not " + what + ": " + message +
                           " (every rank reads it from its own storage: give the ranks a shared checkpoint_dir, or "
                           "the same files on each)");
}

std::exception_ptr Attempt(const std::function<void()>& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<Replica> Replica::Create(const ServerConfig& config, const torch::Device& device,
                                         std::shared_ptr<Communicator> comm) {
  std::unique_ptr<Replica> r(new Replica());
  r->base_ = LoadOrInitModel(config.model_source(), &device);
  r->device_ = device;
  r->model_config_ = r->base_->config();
  r->dtype_ = ParseDtype(config.model.dtype);
  r->trainer_options_ = config.trainer;
  r->trainer_options_.max_sequence_length = config.limits.max_sequence_length;
  r->comm_ = std::move(comm);
  // WORLD_SIZE = data parallel x context parallel (docs/architecture.md: Context parallel).
  if (r->comm_) r->groups_ = SplitParallelGroups(r->comm_, static_cast<int>(config.parallel.context_parallel));
  r->side_files_ = ReadModelSideFiles(config.model.dir);  // into every checkpoint
  r->sessions_ = config.sessions.enabled;
  if (r->sessions_) {
    for (auto& p : r->base_->parameters()) p.requires_grad_(false);  // shared and frozen
  } else {
    auto trainer = Trainer::Create(r->base_, r->trainer_options_);
    r->adopt(*trainer);
    r->trainers_[""] = std::move(trainer);
  }
  return r;
}

void Replica::adopt(Trainer& trainer) const {
  if (groups_.data) trainer.set_communicator(groups_.data);
  if (groups_.context) trainer.set_context_parallel(groups_.context);  // docs/architecture.md: Context parallel
  if (!side_files_.empty()) trainer.set_side_files(side_files_);
}

Trainer& Replica::trainer(const std::string& session) {
  auto it = trainers_.find(session);
  if (it == trainers_.end()) {
    throw NotFound(session.empty() ? "this server hosts sessions: name one (CreateSession, ListSessions)"
                                   : "no session named '" + session + "'");
  }
  return *it->second;
}

std::vector<std::string> Replica::resident_sessions() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : trainers_) out.push_back(name);
  return out;
}

TrainerOptions Replica::options_of(const SessionSpec& spec) const {
  TrainerOptions o = spec.trainer;
  // The engine, layout, micro-batches, limits and the reference are the server's.
  o.engine = trainer_options_.engine;
  o.layout = trainer_options_.layout;
  o.micro_batch_tokens = trainer_options_.micro_batch_tokens;
  o.max_sequence_length = trainer_options_.max_sequence_length;
  o.overlap_grad_reduce = trainer_options_.overlap_grad_reduce;
  o.grad_bucket_bytes = trainer_options_.grad_bucket_bytes;
  o.reference = trainer_options_.reference;
  o.Validate();
  return o;
}

CausalLM Replica::base_copy() const {
  CausalLM copy(model_config_);
  copy->to(dtype_);
  copy->to(device_);
  copy->load_hf_tensors(base_->hf_tensors());
  return copy;
}

void Replica::create_session(const SessionRequest& request) {
  const auto& spec = request.spec;
  if (trainers_.count(spec.name)) throw AlreadyExists("a session named '" + spec.name + "' exists");
  std::unique_ptr<Trainer> trainer;
  if (spec.full) {
    trainer = Trainer::Create(base_copy(), options_of(spec));
  } else {
    std::shared_ptr<LoraAdapter> adapter;
    if (!request.adapter_safetensors.empty()) {
      // An uploaded PEFT adapter: its own config must agree with the spec's.
      auto peft = LoraConfig::FromPeftJson(nlohmann::json::parse(request.adapter_config_json));
      peft.seed = spec.lora.seed;
      adapter = LoraAdapter::Create(model_config_, peft, adapter_dtype(), device_);
      adapter->load_peft_tensors(ParseSafetensors(request.adapter_safetensors, "adapter_model.safetensors").tensors);
    } else {
      adapter = LoraAdapter::Create(model_config_, spec.lora, adapter_dtype(), device_, base_.get());
    }
    auto options = options_of(spec);
    options.reference.dir.clear();  // the reference is the base with the adapter off
    trainer = Trainer::Create(base_, options, adapter);
  }
  adopt(*trainer);
  trainers_[spec.name] = std::move(trainer);
}

void Replica::restore_session(const SessionSpec& spec, const std::string& dir) {
  if (trainers_.count(spec.name)) return;  // resident already
  auto options = options_of(spec);
  std::unique_ptr<Trainer> trainer;
  if (!spec.full) options.reference.dir.clear();  // an adapter's reference is the base with it off
  // A full checkpoint takes only base_'s device.
  AgreeOnRead(comm_.get(), Attempt([&] { trainer = Trainer::LoadCheckpoint(dir, &options, base_); }),
              "read session '" + spec.name + "' from " + dir);
  adopt(*trainer);
  trainers_[spec.name] = std::move(trainer);
}

void Replica::drop_session(const std::string& name) {
  auto it = trainers_.find(name);
  if (it == trainers_.end()) return;
  trainers_.erase(it);
  if (sessions_) base_->set_adapter(nullptr);  // the dropped adapter may be the attached one
}

void Replica::load(const std::string& session, const std::string& dir) {
  std::unique_ptr<Trainer> loaded;
  AgreeOnRead(comm_.get(), Attempt([&] { loaded = read_checkpoint(session, dir); }), "load the checkpoint " + dir);
  adopt(*loaded);
  if (!sessions_) base_ = loaded->model();  // the old weights go
  trainers_[session] = std::move(loaded);
}

std::unique_ptr<Trainer> Replica::read_checkpoint(const std::string& session, const std::string& dir) {
  auto& current = trainer(session);
  TrainerOptions options = current.options();
  const bool adapter = static_cast<bool>(current.adapter());
  auto loaded = Trainer::LoadCheckpoint(dir, &options, base_);  // full: base_ gives the device only
  auto shape = [](const ModelConfig& c) {
    auto j = c.ToJson();
    j.erase("torch_dtype");
    return j;
  };
  if (shape(loaded->model()->config()) != shape(model_config_)) {
    throw FailedPrecondition("the checkpoint holds a different model (" + loaded->model()->config().architecture +
                             ", other sizes) than this server serves");
  }
  if (adapter != static_cast<bool>(loaded->adapter())) {
    throw FailedPrecondition(adapter ? "the checkpoint holds a whole model, not an adapter of this session"
                                     : "the checkpoint holds an adapter; this session trains the whole model");
  }
  if (adapter && loaded->adapter()->config().ToJson() != current.adapter()->config().ToJson()) {
    throw FailedPrecondition("the checkpoint's adapter (r " + std::to_string(loaded->adapter()->config().r) +
                             ") is not configured as this session's (r " +
                             std::to_string(current.adapter()->config().r) + ")");
  }
  return loaded;
}

int64_t Replica::session_bytes(const std::string& session) {
  auto& t = trainer(session);
  int64_t bytes = t.optimizer_state_bytes();
  for (const auto& [name, p] : t.trainable()) {
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (p.grad().defined()) bytes += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  }
  if (const auto& reference = t.reference_model()) {  // a full session's own frozen copy
    for (const auto& p : reference->parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return bytes;
}

}  // namespace streambp::server
