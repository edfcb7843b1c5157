// Trainer checkpoints: one folder, written under a temporary name, fsynced and renamed;
// verified against its manifest (size + SHA-256 of every file) before anything is read.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <ATen/core/Generator.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/digest.h"
#include "streambp/error.h"
#include "streambp/safetensors.h"
#include "streambp/trainer.h"
#include "train_internal.h"

namespace streambp {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "streambp-trainer-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kStagingDir = ".staging";

void FsyncDir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw Error(ErrorCode::kInternal, "cannot open folder " + dir.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0)
    throw Error(ErrorCode::kInternal, "cannot fsync folder " + dir.string() + ": " + std::strerror(err));
}

// The folder path without a trailing separator ("ckpt/" -> "ckpt").
fs::path CleanDir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p.empty()) throw InvalidArgument("checkpoint folder name is empty");
  return p;
}

fs::path StagingDir(const fs::path& target) {
  return (target.parent_path().empty() ? fs::path(".") : target.parent_path()) / kStagingDir;
}

std::string ReadFileBytes(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(what + " is missing (cannot open " + path.string() + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InvalidArgument(what + ": cannot read " + path.string());
  return ss.str();
}

json ParseJson(const std::string& bytes, const std::string& what) {
  try {
    return json::parse(bytes);
  } catch (const json::exception& e) {
    throw InvalidArgument(what + " is not valid JSON: " + e.what());
  }
}

// Reads every file the manifest lists and checks its size and SHA-256. Returns the bytes.
std::map<std::string, std::string> ReadVerified(const fs::path& dir) {
  const std::string where = "checkpoint " + dir.string() + ": ";
  const auto manifest = ParseJson(ReadFileBytes(dir / kManifest, where + kManifest), where + kManifest);
  const auto corrupt = [&](const std::string& why) {
    return InvalidArgument(where + std::string(kManifest) + " is corrupt: " + why);
  };
  if (!manifest.is_object() || manifest.value("format", "") != kFormat) {
    throw corrupt("not a streambp trainer checkpoint manifest");
  }
  if (!manifest.contains("files") || !manifest["files"].is_array()) throw corrupt("no 'files' list");
  std::map<std::string, std::string> files;
  for (const auto& entry : manifest["files"]) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("size") || !entry["size"].is_number_unsigned() || !entry.contains("sha256") ||
        !entry["sha256"].is_string()) {
      throw corrupt("every file needs a name, a size and a sha256");
    }
    const auto name = entry["name"].get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name == kManifest) {
      throw corrupt("bad file name '" + name + "'");
    }
    auto bytes = ReadFileBytes(dir / name, where + name);
    const auto size = entry["size"].get<uint64_t>();
    if (bytes.size() != size) {
      throw InvalidArgument(where + name + " has " + std::to_string(bytes.size()) +
                            " bytes, the manifest says " + std::to_string(size) + " (truncated or modified)");
    }
    if (Sha256Hex(bytes) != entry["sha256"].get<std::string>()) {
      throw InvalidArgument(where + name +
                            " does not match its SHA-256 in the manifest (corrupt or modified)");
    }
    files[name] = std::move(bytes);
  }
  const bool adapter = files.count("adapter_model.safetensors") > 0;
  const std::vector<const char*> required =
      adapter ? std::vector<const char*>{"adapter_config.json", "adapter_model.safetensors", "base_config.json",
                                         "optimizer.safetensors", "trainer_state.json"}
              : std::vector<const char*>{"config.json", "model.safetensors", "optimizer.safetensors",
                                         "trainer_state.json"};
  for (const char* r : required) {
    if (!files.count(r)) throw corrupt(std::string(r) + " is not listed");
  }
  return files;
}

// One file of a checkpoint: bytes, or tensors written as safetensors.
struct CheckpointFile {
  std::string name;
  std::string bytes;
  TensorMap tensors;
  Metadata metadata;
  bool is_tensors = false;
};

// The model's parameters under their Hugging Face names, as views: saving runs on the
// thread that trains, so they do not change while they are written.
TensorMap ParameterViews(const CausalLMImpl& model) {
  TensorMap out;
  for (const auto& [name, p] : model.named_hf_parameters()) out[name] = p.detach();
  return out;
}

}  // namespace

void Trainer::save_checkpoint(const std::string& dir, bool with_side_files) const {
  const fs::path target = CleanDir(dir);
  // Temporary folders live in a hidden ".staging" folder beside the checkpoints: a name no
  // checkpoint can have, so saving never deletes a user's folder, and CleanStaging() removes
  // what an interrupted save left behind.
  const fs::path staging = StagingDir(target);
  const fs::path tmp = staging / (target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const auto dtype = train::ModelDtype(*model_);

  // The files: small ones as bytes, tensors streamed to disk one at a time (no copy of the
  // weights or of the optimizer state is made: an 8B model's would be tens of GiB). The
  // manifest gets each file's size and SHA-256 as it is written.
  std::vector<CheckpointFile> files;
  auto text = [&](std::string name, std::string bytes) { files.push_back({std::move(name), std::move(bytes), {}, {}}); };
  auto tensors = [&](std::string name, TensorMap map, Metadata meta) {
    files.push_back({std::move(name), {}, std::move(map), std::move(meta), true});
  };
  auto config = model_->config();
  config.torch_dtype = DtypeName(dtype);
  if (adapter_) {
    // The adapter in PEFT's files (loadable by PEFT/vLLM as is) and the base's identity.
    text("adapter_config.json", adapter_->config().ToPeftJson().dump(2) + "\n");
    tensors("adapter_model.safetensors", adapter_->peft_tensors(), {{"format", "pt"}});
    text("base_config.json", config.ToJson().dump(2) + "\n");
  } else {
    text("config.json", config.ToJson().dump(2) + "\n");
    tensors("model.safetensors", ParameterViews(*model_), {{"format", "pt"}});
  }
  auto optimizer_state = optimizer_->state();
  if (comm_ && comm_->world_size() > 1 && comm_->options().zero_stage >= 1) {
    // ZeRO: each rank holds the state of its own parameters; gather it (collective), so the
    // checkpoint is the state of one process and loads anywhere.
    for (int r = 0; r < comm_->world_size(); ++r) {
      const auto bytes = comm_->broadcast_bytes(r == comm_->rank() ? SerializeSafetensors(optimizer_->state()) : "", r);
      for (auto& [key, t] : ParseSafetensors(bytes, "optimizer state of rank " + std::to_string(r)).tensors) {
        const std::string param = key.substr(key.find('/') + 1);
        if (owner_.count(param) && owner_.at(param) == r) optimizer_state[key] = t;
      }
    }
  }
  // Rank 0 writes the (identical) checkpoint, of a data-parallel or a context-parallel group:
  // the ranks may share the folder, and two writers of one checkpoint would race.
  if ((comm_ && comm_->rank() != 0) || (cp_ && cp_->rank() != 0)) return;
  optimizer_state["rng_state"] = generator_.get_state().clone();
  tensors("optimizer.safetensors", std::move(optimizer_state), {{"optimizer", options_.optimizer.name}});
  if (reference_) tensors("reference.safetensors", ParameterViews(*reference_), {{"format", "pt"}});
  json state = {{"format", kFormat},
                {"version", kVersion},
                {"step", step_},
                {"policy_version", policy_version_},
                {"dtype", DtypeName(dtype)},
                {"has_reference", static_cast<bool>(reference_)},
                {"options", options_.ToJson()}};
  if (adapter_) {
    state["adapter"] = adapter_->config().ToJson();
    state["adapter_dtype"] = DtypeName(adapter_->dtype());
    state["base_sha256"] = base_identity();
  }
  text("trainer_state.json", state.dump(2) + "\n");
  if (with_side_files) {
    for (const auto& [name, bytes] : side_files_) text(name, bytes);
  }
  json manifest = {{"format", kFormat}, {"version", kVersion}, {"files", json::array()}};

  try {
    fs::create_directories(staging);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    for (const auto& f : files) {
      const auto path = (tmp / f.name).string();
      const auto written = f.is_tensors ? WriteSafetensors(path, f.tensors, f.metadata, /*sha256=*/true)
                                        : WriteFileAtomic(path, f.bytes, /*sha256=*/true);
      manifest["files"].push_back({{"name", f.name}, {"size", written.size}, {"sha256", written.sha256}});
    }
    WriteFileAtomic((tmp / kManifest).string(), manifest.dump(2) + "\n");
    FsyncDir(tmp);
    const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    if (fs::exists(target)) {
      // Keep the old checkpoint until the new one is in place.
      const fs::path old = staging / (target.filename().string() + ".old-" + std::to_string(::getpid()));
      fs::remove_all(old);
      fs::rename(target, old);
      fs::rename(tmp, target);
      FsyncDir(parent);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, target);
    }
    FsyncDir(parent);
    std::error_code ignored;
    fs::remove(staging, ignored);  // only when empty: another save may be using it
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    if (e.code() == std::errc::no_space_on_device) {
      throw ResourceExhausted("saving checkpoint " + target.filename().string() +
                              ": no space left on the device; nothing was replaced");
    }
    throw Error(ErrorCode::kInternal, "saving checkpoint " + target.string() + ": " + e.what());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

std::unique_ptr<Trainer> Trainer::LoadCheckpoint(const std::string& dir, const TrainerOptions* override,
                                                 CausalLM base) {
  const fs::path path = CleanDir(dir);
  if (!fs::is_directory(path)) throw NotFound("checkpoint folder " + path.string() + " does not exist");
  const std::string where = "checkpoint " + path.string() + ": ";
  auto files = ReadVerified(path);

  const auto state = ParseJson(files.at("trainer_state.json"), where + "trainer_state.json");
  TrainerOptions saved;
  int64_t step = 0, policy_version = 0;
  torch::Dtype dtype = torch::kFloat32;
  bool has_reference = false;
  try {
    if (state.at("format").get<std::string>() != kFormat || state.at("version").get<int>() != kVersion) {
      throw InvalidArgument(where + "trainer_state.json: unsupported format or version");
    }
    step = state.at("step").get<int64_t>();
    policy_version = state.at("policy_version").get<int64_t>();
    dtype = ParseDtype(state.at("dtype").get<std::string>());
    has_reference = state.at("has_reference").get<bool>();
    saved = TrainerOptions::FromJson(state.at("options"));
  } catch (const json::exception& e) {
    throw InvalidArgument(where + "trainer_state.json: " + e.what());
  }
  if (has_reference != static_cast<bool>(files.count("reference.safetensors"))) {
    throw InvalidArgument(where + "trainer_state.json and the manifest disagree about reference.safetensors");
  }
  const TrainerOptions options = override ? *override : saved;
  options.Validate();
  if (options.optimizer.name != saved.optimizer.name) {
    throw InvalidArgument("optimizer.name: the checkpoint holds " + saved.optimizer.name + " state, not " +
                          options.optimizer.name);
  }

  const bool is_adapter = files.count("adapter_model.safetensors") > 0;
  std::shared_ptr<LoraAdapter> adapter;
  CausalLM model{nullptr};
  const torch::Device device = base ? base->named_hf_parameters().front().second.device() : torch::Device(torch::kCPU);
  if (is_adapter) {
    if (!base) {
      throw InvalidArgument(where + "holds a LoRA adapter: load it onto its base model (the base weights are not "
                                    "in the checkpoint)");
    }
    const auto config = ModelConfig::FromJson(ParseJson(files.at("base_config.json"), where + "base_config.json"));
    auto shape = [](const ModelConfig& c) {
      auto j = c.ToJson();
      j.erase("torch_dtype");
      return j;
    };
    std::string saved_sha;
    LoraConfig lora;
    torch::Dtype adapter_dtype = torch::kFloat32;
    try {
      saved_sha = state.at("base_sha256").get<std::string>();
      lora = LoraConfig::FromJson(state.at("adapter"));
      adapter_dtype = ParseDtype(state.at("adapter_dtype").get<std::string>());
    } catch (const json::exception& e) {
      throw InvalidArgument(where + "trainer_state.json: " + e.what());
    }
    const std::string base_sha = BaseIdentity(*base);
    if (shape(base->config()) != shape(config) || base_sha != saved_sha) {
      throw InvalidArgument(where + "the adapter was trained on a different base (weights SHA-256 " +
                            saved_sha.substr(0, 16) + "...) than this model (" + base_sha.substr(0, 16) +
                            "...); load it onto the base it was trained on");
    }
    adapter = LoraAdapter::Create(base->config(), lora, adapter_dtype, device);
    try {
      adapter->load_peft_tensors(
          ParseSafetensors(files.at("adapter_model.safetensors"), where + "adapter_model.safetensors").tensors);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + e.what());
    }
    model = base;
  } else {
    const auto config = ModelConfig::FromJson(ParseJson(files.at("config.json"), where + "config.json"));
    model = train::ModelFromTensors(
        config, ParseSafetensors(files.at("model.safetensors"), where + "model.safetensors").tensors, dtype, device);
    files.erase("model.safetensors");
  }
  const auto& config = model->config();
  CausalLM reference{nullptr};
  if (is_adapter && options.reference.use_reference_model && options.reference.dir.empty()) {
    // the base with the adapter off: nothing to load
  } else if (options.reference.use_reference_model) {
    if (has_reference) {
      reference = train::ModelFromTensors(
          config,
          ParseSafetensors(files.at("reference.safetensors"), where + "reference.safetensors").tensors, dtype,
          device);
      train::Freeze(*reference);
    } else if (!options.reference.dir.empty()) {
      reference = train::MakeReference(*model, options.reference);
    } else {
      throw InvalidArgument(where +
                            "no reference weights saved: disable reference.use_reference_model or give "
                            "reference.dir");
    }
  }
  auto optimizer = ParseSafetensors(files.at("optimizer.safetensors"), where + "optimizer.safetensors");
  auto rng = optimizer.tensors.find("rng_state");
  if (rng == optimizer.tensors.end() || rng->second.scalar_type() != torch::kUInt8) {
    throw InvalidArgument(where + "optimizer.safetensors: rng_state (uint8) is missing");
  }
  const auto rng_state = rng->second;
  optimizer.tensors.erase(rng);

  auto trainer =
      std::unique_ptr<Trainer>(new Trainer(std::move(model), std::move(reference), options, std::move(adapter)));
  try {
    trainer->optimizer_->load_state(optimizer.tensors);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(where + "optimizer.safetensors: " + e.what());
  }
  try {
    trainer->generator_.set_state(rng_state);
  } catch (const c10::Error& e) {
    throw InvalidArgument(where + "optimizer.safetensors: bad rng_state: " + e.what_without_backtrace());
  }
  trainer->step_ = step;
  trainer->policy_version_ = policy_version;
  for (const auto& name : ModelSideFileNames()) {
    if (files.count(name)) trainer->side_files_.emplace_back(name, files.at(name));
  }
  return trainer;
}

std::string BaseIdentity(const CausalLMImpl& model) {
  Sha256 sha;
  for (const auto& [name, p] : model.named_hf_parameters()) {
    auto t = p.detach().to(torch::kCPU).contiguous();
    std::string shape;
    for (auto d : t.sizes()) shape += std::to_string(d) + ",";
    sha.update(name + "|" + DtypeName(t.scalar_type()) + "|" + shape + "|");
    sha.update(std::string_view(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size()));
  }
  return sha.hex();
}

const std::string& Trainer::base_identity() const {
  if (base_identity_.empty()) base_identity_ = BaseIdentity(*model_);
  return base_identity_;
}

std::string FindNewestCheckpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::string best;
  int64_t best_step = -1;
  fs::file_time_type best_time;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto manifest = entry.path() / kManifest;
    if (name.empty() || name.front() == '.' || !entry.is_directory(ec) || !fs::exists(manifest, ec)) continue;
    int64_t step = 0;
    try {
      step = ParseJson(ReadFileBytes(entry.path() / "trainer_state.json", "trainer_state.json"), name)
                 .at("step")
                 .get<int64_t>();
    } catch (...) {
      continue;  // incomplete or not ours
    }
    const auto time = fs::last_write_time(manifest, ec);
    const bool newer = step > best_step || (step == best_step && (time > best_time || (time == best_time && name > best)));
    if (newer) {
      best = name;
      best_step = step;
      best_time = time;
    }
  }
  return best;
}

void CleanStaging(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(fs::path(dir) / kStagingDir, ec);
}

}  // namespace streambp
