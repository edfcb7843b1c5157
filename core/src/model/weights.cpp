// Parameter names (the HF table), deterministic initialization, loading and saving.
#include <filesystem>
#include <optional>
#include <fstream>
#include <algorithm>
#include <iterator>

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#if defined(STREAMBP_WITH_CUDA)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include "streambp/error.h"
#include "streambp/model.h"

namespace streambp {
namespace {

std::string ShapeString(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> CausalLMImpl::named_hf_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", embed_tokens->weight);
  for (size_t i = 0; i < layer_list.size(); ++i) layer_list[i]->append_hf_parameters("model.layers." + std::to_string(i), out);
  out.emplace_back("model.norm.weight", norm->weight);
  if (lm_head) out.emplace_back("lm_head.weight", lm_head->weight);
  return out;
}

void CausalLMImpl::load_hf_tensors(const TensorMap& tensors) {
  auto params = named_hf_parameters();
  // Validate everything first, so that a bad file leaves the model as it was.
  std::set<std::string> expected;
  for (const auto& [name, p] : params) {
    expected.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw InvalidArgument("loading " + name + ": tensor missing from the checkpoint");
    }
    if (it->second.sizes() != p.sizes()) {
      throw InvalidArgument("loading " + name + ": shape " + ShapeString(it->second.sizes()) +
                            ", expected " + ShapeString(p.sizes()));
    }
    if (!it->second.is_floating_point()) {
      throw InvalidArgument("loading " + name + ": dtype " +
                            std::string(c10::toString(it->second.scalar_type())) +
                            " is not a floating-point type");
    }
  }
  for (const auto& [name, t] : tensors) {
    if (expected.count(name)) continue;
    if (name == "lm_head.weight" && config_.tie_word_embeddings) continue;
    if (name.ends_with("rotary_emb.inv_freq")) continue;
    throw InvalidArgument("loading " + name + ": the checkpoint has a tensor that " +
                          config_.architecture + " with this config.json does not use");
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params) p.copy_(tensors.at(name));
}

TensorMap CausalLMImpl::hf_tensors() const {
  TensorMap out;
  for (const auto& [name, p] : named_hf_parameters()) out[name] = p.detach().clone();
  return out;
}

torch::Dtype ParseDtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "f32") return torch::kFloat32;
  if (name == "float64" || name == "fp64" || name == "f64" || name == "double") return torch::kFloat64;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "f16" || name == "half") return torch::kFloat16;
  throw InvalidArgument("unknown dtype '" + name + "' (known: float32, float64, bfloat16, float16)");
}

std::string DtypeName(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32: return "float32";
    case torch::kFloat64: return "float64";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    default: return std::string(c10::toString(dtype));
  }
}

void CheckDtypeOnDevice(torch::Dtype dtype, const torch::Device& device) {
  if (dtype == torch::kFloat16 && device.is_cpu()) {
    throw InvalidArgument(
        "dtype float16 is not supported on the CPU (LibTorch has no float16 matrix multiply "
        "there); use bfloat16, float32 or float64, or a cuda device");
  }
}

CausalLM InitModel(const ModelConfig& config, uint64_t seed, torch::Dtype dtype, const torch::Device& device) {
  CheckDtypeOnDevice(dtype, device);
  CausalLM model(config);
  torch::NoGradGuard no_grad;
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
#if defined(STREAMBP_WITH_CUDA)
  const bool on_device = device.is_cuda() && count > kHostDrawParameters;
#else
  const bool on_device = false;  // no CUDA generator in this build: the CPU draws
#endif
  if (on_device || dtype == torch::kFloat16) {
    model->to(device);  // float16 lives on the accelerator only
    model->to(dtype);
  } else {
    model->to(dtype);
  }
  // Values are drawn in float64 from a private generator, in the fixed order of the HF
  // table, so the same seed gives the same model in every dtype and on every machine.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
#if defined(STREAMBP_WITH_CUDA)
  if (on_device) {
    gen = at::make_generator<at::CUDAGeneratorImpl>(device.has_index() ? device.index() : c10::DeviceIndex{0});
    gen.set_current_seed(seed);
  }
#endif
  for (auto& [name, p] : model->named_hf_parameters()) {
    if (name.ends_with("norm.weight")) {
      p.fill_(config.norm_kind == NormKind::kOffsetOne ? 0.0 : 1.0);  // the identity: x·w or x·(1 + w)
    } else if (name.ends_with(".bias")) {
      p.zero_();
    } else if (on_device) {
      p.copy_(at::normal(0.0, 0.02, p.sizes(), gen, p.options().dtype(torch::kFloat32)));
    } else {
      p.copy_(at::normal(0.0, 0.02, p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64)));
    }
  }
  model->to(device);
  return model;
}

CausalLM LoadModel(const std::string& dir, torch::Dtype dtype, const torch::Device& device) {
  namespace fs = std::filesystem;
  CheckDtypeOnDevice(dtype, device);
  if (!fs::is_directory(dir)) throw NotFound("model folder " + dir + " does not exist");
  const auto config = ModelConfig::FromFile((fs::path(dir) / "config.json").string());
  auto tensors = LoadModelWeights(dir);
  CausalLM model(config);
  if (dtype == torch::kFloat16) {
    model->to(device);  // float16 lives on the accelerator only
    model->to(dtype);
  } else {
    model->to(dtype);
  }
  model->load_hf_tensors(tensors);
  model->to(device);
  return model;
}

void SaveModel(const CausalLM& model, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  auto config = model->config();
  const auto params = model->named_hf_parameters();
  config.torch_dtype = DtypeName(params.front().second.scalar_type());
  TensorMap views;  // streamed to the file as they are: no copy of the weights
  for (const auto& [name, p] : params) views[name] = p.detach();
  WriteSafetensors((fs::path(dir) / "model.safetensors").string(), views, {{"format", "pt"}});
  WriteFileAtomic((fs::path(dir) / "config.json").string(), config.ToJson().dump(2) + "\n");
}

const std::vector<std::string>& ModelSideFileNames() {
  static const std::vector<std::string> names = {"tokenizer.json",          "tokenizer_config.json",
                                                 "special_tokens_map.json", "generation_config.json",
                                                 "chat_template.jinja",     "vocab.json",
                                                 "merges.txt"};
  return names;
}

std::vector<std::pair<std::string, std::string>> ReadModelSideFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> out;
  if (dir.empty()) return out;
  for (const auto& name : ModelSideFileNames()) {
    const fs::path path = fs::path(dir) / name;
    if (!fs::is_regular_file(path)) continue;
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) throw InvalidArgument("cannot read " + path.string());
    out.emplace_back(name, std::move(bytes));
  }
  return out;
}

void WriteModelSideFiles(const std::vector<std::pair<std::string, std::string>>& files, const std::string& dir) {
  namespace fs = std::filesystem;
  for (const auto& [name, bytes] : files) WriteFileAtomic((fs::path(dir) / name).string(), bytes);
}

std::vector<int64_t> ModelEosTokenIds(const ModelConfig& config, const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<int64_t> ids = config.eos_token_ids;
  if (ids.empty() && config.eos_token_id) ids.push_back(*config.eos_token_id);
  const fs::path path = fs::path(dir) / "generation_config.json";
  if (!dir.empty() && fs::is_regular_file(path)) {
    std::ifstream in(path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument(path.string() + " is not valid JSON (" + e.what() + ")");
    }
    auto add = [&](const nlohmann::json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        throw InvalidArgument(path.string() + ": eos_token_id must be a token id or a list of them, got " + v.dump());
      }
      if (std::find(ids.begin(), ids.end(), v.get<int64_t>()) == ids.end()) ids.push_back(v.get<int64_t>());
    };
    if (auto e = j.find("eos_token_id"); j.is_object() && e != j.end() && !e->is_null()) {
      if (e->is_array()) {
        for (const auto& v : *e) add(v);
      } else {
        add(*e);
      }
    }
  }
  return ids;
}

std::string ModelSource::describe() const {
  if (!dir.empty()) return dir;
  return "embedded " + preset + " preset" + (family == "qwen3" ? "" : " as " + family) + " (seed " +
         std::to_string(seed) + ")";
}

void CheckModelSource(const ModelSource& source) {
  namespace fs = std::filesystem;
  const auto dtype = ParseDtype(source.dtype);
  std::optional<torch::Device> device;
  try {
    device.emplace(source.device);
  } catch (const c10::Error&) {
    throw InvalidArgument("model.device '" + source.device + "' is not a device (cpu, cuda or cuda:N)");
  }
  if (device->is_cuda()) {
    if (!torch::cuda::is_available()) {
      throw InvalidArgument("model.device is " + source.device +
                            " but this build of LibTorch has no CUDA device to use (a CPU-only build, or no GPU "
                            "visible); use --device cpu, or a CUDA build (docs/gpu.md)");
    }
    if (device->has_index() && device->index() >= static_cast<int64_t>(torch::cuda::device_count())) {
      throw InvalidArgument("model.device is " + source.device + " but only " +
                            std::to_string(torch::cuda::device_count()) + " CUDA devices are visible");
    }
  } else if (!device->is_cpu()) {
    throw InvalidArgument("model.device '" + source.device + "' is not supported (cpu, cuda or cuda:N)");
  }
  CheckDtypeOnDevice(dtype, *device);
  if (source.dir.empty()) {
    PresetConfig(source.preset, source.family);
    return;
  }
  if (!fs::is_directory(source.dir)) {
    throw NotFound("model folder " + source.dir + " does not exist (a Hugging Face folder with config.json and "
                   "model.safetensors; or leave model.dir empty for the embedded preset)");
  }
  const auto config = (fs::path(source.dir) / "config.json").string();
  if (!fs::exists(config)) throw NotFound("model folder " + source.dir + " has no config.json");
  ModelConfig::FromFile(config);
}

CausalLM LoadOrInitModel(const ModelSource& source, const torch::Device* device) {
  {
    // The device, dtype and folder first, with errors that say what to do (a CUDA device on a
    // CPU build would otherwise fail deep inside LibTorch).
    ModelSource checked = source;
    if (device != nullptr) checked.device = device->str();
    CheckModelSource(checked);
  }
  const auto dtype = ParseDtype(source.dtype);
  torch::Device target = device ? *device : torch::Device(source.device);
  if (!source.dir.empty()) return LoadModel(source.dir, dtype, target);
  return InitModel(PresetConfig(source.preset, source.family), source.seed, dtype, target);
}

}  // namespace streambp
