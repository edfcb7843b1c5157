// LoRA adapters: PEFT's definition, initialization and files.
#include "streambp/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "streambp/error.h"
#include "streambp/model.h"

namespace streambp {
namespace {

using nlohmann::json;

// A name's place in LoraModuleNames() (the decoder's order; past the end when unknown).
size_t ModuleRank(const std::string& name) {
  const auto& names = LoraModuleNames();
  return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
}

std::string ShapeText(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool Targets(const LoraConfig& c, const std::string& name) {
  return std::find(c.target_modules.begin(), c.target_modules.end(), name) != c.target_modules.end();
}

}  // namespace

const std::vector<std::string>& LoraModuleNames() {
  static const std::vector<std::string> names{"q_proj",  "k_proj",    "v_proj", "o_proj",
                                              "gate_proj", "up_proj", "down_proj", "lm_head"};
  return names;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> SavedModules(const ModelConfig& model,
                                                                       const LoraConfig& config) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const bool gate = std::find(config.modules_to_save.begin(), config.modules_to_save.end(), "gate") !=
                    config.modules_to_save.end();
  if (!gate) return out;
  for (int64_t i = 0; i < model.num_hidden_layers; ++i) {
    if (model.sparse_layer(i)) {
      out.emplace_back("model.layers." + std::to_string(i) + ".mlp.gate",
                       std::vector<int64_t>{model.num_experts, model.hidden_size});
    }
  }
  return out;
}

int64_t LoraParameterCount(const ModelConfig& model, const LoraConfig& config) {
  int64_t n = 0;
  for (const auto& site : ProjectionSites(model)) {
    if (Targets(config, site.name)) n += config.r * (site.in + site.out);
  }
  for (const auto& [path, shape] : SavedModules(model, config)) n += shape[0] * shape[1];
  return n;
}

double LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

void LoraConfig::Validate(const ModelConfig* model) const {
  if (r < 1) throw InvalidArgument("lora: r must be >= 1, got " + std::to_string(r));
  if (!std::isfinite(alpha) || alpha == 0) throw InvalidArgument("lora: lora_alpha must be a finite non-zero number");
  // The scale multiplies B(Ax) in the model's dtype: past this it overflows float16/bfloat16
  // ranges and PEFT's own configurations never come near (alpha is usually r to 4r).
  if (r >= 1 && std::abs(scale()) > kMaxLoraScale) {
    throw InvalidArgument("lora: lora_alpha = " + std::to_string(alpha) + " gives the scale " +
                          std::to_string(scale()) + " (alpha / " + (use_rslora ? "sqrt(r)" : "r") +
                          "), over the most allowed, " + std::to_string(static_cast<int64_t>(kMaxLoraScale)));
  }
  if (dropout != 0.0) {
    throw InvalidArgument("lora: lora_dropout = " + std::to_string(dropout) +
                          " is not supported (only 0: dropout would make steps non-reproducible here); set it to 0");
  }
  if (target_modules.empty()) throw InvalidArgument("lora: target_modules is empty");
  std::set<std::string> seen;
  for (const auto& m : target_modules) {
    if (ModuleRank(m) == LoraModuleNames().size()) {
      throw InvalidArgument("lora: target_modules has '" + m +
                            "', which this model does not have (known: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                            "up_proj, down_proj, lm_head)");
    }
    if (!seen.insert(m).second) throw InvalidArgument("lora: target_modules names '" + m + "' twice");
  }
  std::set<std::string> saved;
  for (const auto& m : modules_to_save) {
    if (m != "gate") {
      throw InvalidArgument("lora: modules_to_save has '" + m +
                            "'; only 'gate' (the mixture-of-experts router of every sparse layer) can be trained as "
                            "a full copy here");
    }
    if (!saved.insert(m).second) throw InvalidArgument("lora: modules_to_save names '" + m + "' twice");
  }
  if (model && saved.count("gate") && model->sparse_layers() == 0) {
    throw InvalidArgument("lora: modules_to_save has 'gate' (the mixture-of-experts router), but this model has no "
                          "mixture-of-experts layers; leave it out");
  }
  if (model && seen.count("lm_head") && model->tie_word_embeddings) {
    throw InvalidArgument("lora: target_modules has lm_head, but this model ties lm_head to the embedding "
                          "(tie_word_embeddings); leave lm_head out");
  }
}

LoraConfig LoraConfig::FromPeftJson(const json& j) {
  if (!j.is_object()) throw InvalidArgument("adapter_config.json must be a JSON object");
  auto field = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  try {
    const std::string type = j.value("peft_type", "");
    if (type != "LORA") {
      throw InvalidArgument("adapter_config.json: peft_type is '" + type + "'; only LORA adapters are supported");
    }
    if (const auto* t = field("task_type"); t && t->get<std::string>() != "CAUSAL_LM") {
      throw InvalidArgument("adapter_config.json: task_type is '" + t->get<std::string>() + "', expected CAUSAL_LM");
    }
    if (const auto* d = field("use_dora"); d && d->get<bool>()) {
      throw InvalidArgument("adapter_config.json: use_dora is true; DoRA adapters are not supported");
    }
    if (const auto* b = field("bias"); b && b->get<std::string>() != "none") {
      throw InvalidArgument("adapter_config.json: bias is '" + b->get<std::string>() + "'; only \"none\" is supported");
    }
    for (const char* key : {"rank_pattern", "alpha_pattern"}) {
      if (const auto* p = field(key); p && !p->empty()) {
        throw InvalidArgument(std::string("adapter_config.json: ") + key + " is not supported (one r and alpha for all)");
      }
    }
    for (const char* key : {"layers_to_transform", "layers_pattern"}) {
      if (const auto* p = field(key); p && !(p->is_array() && p->empty())) {
        throw InvalidArgument(std::string("adapter_config.json: ") + key + " is not supported");
      }
    }
    if (const auto* f = field("fan_in_fan_out"); f && f->get<bool>()) {
      throw InvalidArgument("adapter_config.json: fan_in_fan_out is true; not supported for these models");
    }
    LoraConfig c;
    c.r = j.at("r").get<int64_t>();
    c.alpha = j.contains("lora_alpha") ? j.at("lora_alpha").get<double>() : static_cast<double>(c.r);
    c.dropout = j.value("lora_dropout", 0.0);
    c.use_rslora = j.value("use_rslora", false);
    c.base_model_name_or_path = j.value("base_model_name_or_path", "");
    if (const auto* m = field("modules_to_save")) c.modules_to_save = m->get<std::vector<std::string>>();
    const auto& t = j.at("target_modules");
    if (t.is_string()) {
      if (t.get<std::string>() != "all-linear") {
        throw InvalidArgument("adapter_config.json: target_modules is the pattern '" + t.get<std::string>() +
                              "'; give a list of module names (or \"all-linear\")");
      }
      c.target_modules = LoraConfig{}.target_modules;
    } else {
      c.target_modules = t.get<std::vector<std::string>>();
      std::stable_sort(c.target_modules.begin(), c.target_modules.end(),
                       [](const std::string& a, const std::string& b) { return ModuleRank(a) < ModuleRank(b); });
    }
    c.Validate();
    return c;
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("adapter_config.json: ") + e.what());
  }
}

json LoraConfig::ToPeftJson() const {
  return json{{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"r", r},
              {"lora_alpha", alpha},
              {"lora_dropout", dropout},
              {"target_modules", target_modules},
              {"use_rslora", use_rslora},
              {"use_dora", false},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"init_lora_weights", true},
              {"inference_mode", true},
              {"modules_to_save", modules_to_save.empty() ? json(nullptr) : json(modules_to_save)},
              {"layers_to_transform", nullptr},
              {"rank_pattern", json::object()},
              {"alpha_pattern", json::object()},
              {"base_model_name_or_path", base_model_name_or_path}};
}

LoraConfig LoraConfig::FromJson(const json& j) {
  if (!j.is_object()) throw InvalidArgument("lora options must be a JSON object");
  LoraConfig c;
  for (const auto& [key, v] : j.items()) {
    try {
      if (key == "r") {
        c.r = v.get<int64_t>();
      } else if (key == "alpha") {
        c.alpha = v.get<double>();
      } else if (key == "target_modules") {
        c.target_modules = v.get<std::vector<std::string>>();
      } else if (key == "modules_to_save") {
        c.modules_to_save = v.get<std::vector<std::string>>();
      } else if (key == "use_rslora") {
        c.use_rslora = v.get<bool>();
      } else if (key == "seed") {
        c.seed = v.get<uint64_t>();
      } else if (key == "dropout") {
        c.dropout = v.get<double>();
      } else if (key == "base_model_name_or_path") {
        c.base_model_name_or_path = v.get<std::string>();
      } else {
        throw InvalidArgument("lora: unknown option '" + key +
                              "' (known: r, alpha, target_modules, modules_to_save, use_rslora, seed, dropout, "
                              "base_model_name_or_path)");
      }
    } catch (const json::exception&) {
      throw InvalidArgument("lora: option '" + key + "' has the wrong type: " + v.dump());
    }
  }
  c.Validate();
  return c;
}

json LoraConfig::ToJson() const {
  return json{{"r", r},
              {"alpha", alpha},
              {"target_modules", target_modules},
              {"modules_to_save", modules_to_save},
              {"use_rslora", use_rslora},
              {"seed", seed},
              {"dropout", dropout},
              {"base_model_name_or_path", base_model_name_or_path}};
}

std::shared_ptr<LoraAdapter> LoraAdapter::Create(const ModelConfig& model, const LoraConfig& config, torch::Dtype dtype,
                                                 const torch::Device& device, const CausalLMImpl* base) {
  config.Validate(&model);
  std::shared_ptr<LoraAdapter> a(new LoraAdapter());
  a->config_ = config;
  a->scale_ = config.scale();
  a->dtype_ = dtype;
  a->model_ = model;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  auto make = [&](int64_t out, int64_t in) {
    auto w = std::make_unique<LoraWeights>();
    // Kaiming-uniform with a = sqrt(5) (nn.Linear's default, which PEFT uses for A): the
    // bound is gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    auto values = at::empty({config.r, in}, torch::TensorOptions().dtype(torch::kFloat64));
    values.uniform_(-bound, bound, gen);
    w->a = values.to(dtype).to(device);
    w->b = torch::zeros({out, config.r}, torch::TensorOptions().dtype(dtype).device(device));
    return w;
  };
  // In the model's order, each drawn from the one generator: the same A for the same config.
  for (const auto& site : ProjectionSites(model)) {
    if (!Targets(config, site.name)) continue;
    a->weights_.emplace_back(site.path, make(site.out, site.in));
    a->by_path_[site.path] = a->weights_.back().second.get();
  }
  // The modules to save: copies of the base's weights (PEFT deep-copies the module), or zeros
  // to be loaded.
  const auto saved = SavedModules(model, config);
  std::map<std::string, torch::Tensor> from_base;
  if (base != nullptr && !saved.empty()) {
    if (base->config().num_hidden_layers != model.num_hidden_layers || base->config().num_experts != model.num_experts ||
        base->config().hidden_size != model.hidden_size) {
      throw InvalidArgument("lora: the base model given for modules_to_save has another shape than the adapter's");
    }
    for (const auto& [name, t] : base->named_hf_parameters()) from_base.emplace(name, t);
  }
  a->saved_set_ = saved.empty() || base != nullptr;
  torch::NoGradGuard no_grad;
  for (const auto& [path, shape] : saved) {
    auto w = std::make_unique<LoraWeights>();
    const auto options = torch::TensorOptions().dtype(dtype).device(device);
    w->weight = base != nullptr ? from_base.at(path + ".weight").detach().to(options).clone() : torch::zeros(shape, options);
    a->weights_.emplace_back(path, std::move(w));
    a->by_path_[path] = a->weights_.back().second.get();
  }
  return a;
}

const LoraWeights* LoraAdapter::find(const std::string& path) const {
  auto it = by_path_.find(path);
  return it == by_path_.end() ? nullptr : it->second;
}

std::vector<std::pair<std::string, torch::Tensor>> LoraAdapter::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [path, w] : weights_) {
    if (w->weight.defined()) {
      out.emplace_back(path + ".weight", w->weight);
      continue;
    }
    out.emplace_back(path + ".lora_A.weight", w->a);
    out.emplace_back(path + ".lora_B.weight", w->b);
  }
  return out;
}

TensorMap LoraAdapter::peft_tensors() const {
  TensorMap out;
  for (const auto& [name, t] : named_parameters()) out[PeftName(name)] = t.detach().clone();
  return out;
}

void LoraAdapter::load_peft_tensors(const TensorMap& tensors) {
  const auto params = named_parameters();
  std::set<std::string> expected;
  for (const auto& [name, p] : params) {
    const auto peft = PeftName(name);
    expected.insert(peft);
    auto it = tensors.find(peft);
    if (it == tensors.end()) throw InvalidArgument("adapter: tensor " + peft + " is missing");
    if (it->second.sizes() != p.sizes()) {
      const bool lora = name.ends_with("lora_A.weight") || name.ends_with("lora_B.weight");
      const bool rank = lora && it->second.dim() == 2 && p.dim() == 2 &&
                        (name.ends_with("lora_A.weight") ? it->second.size(0) != p.size(0) : it->second.size(1) != p.size(1));
      throw InvalidArgument("adapter: " + peft + " has shape " + ShapeText(it->second.sizes()) + ", expected " +
                            ShapeText(p.sizes()) +
                            (rank ? " (its rank does not match r = " + std::to_string(config_.r) + " of adapter_config.json)"
                                  : ""));
    }
    if (!it->second.is_floating_point()) throw InvalidArgument("adapter: " + peft + " is not floating point");
    if (!torch::isfinite(it->second).all().item<bool>()) {
      throw InvalidArgument("adapter: " + peft + " has non-finite values (NaN or infinity)");
    }
  }
  for (const auto& [name, t] : tensors) {
    if (!expected.count(name)) {
      throw InvalidArgument("adapter: tensor " + name +
                            " is not one of this adapter's (a module outside target_modules and modules_to_save, "
                            "or another model)");
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    auto target = p;
    target.copy_(tensors.at(PeftName(name)));
  }
  saved_set_ = true;
}

int64_t LoraAdapter::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void LoraAdapter::check_fits(const ModelConfig& m) const {
  if (!saved_set_) {
    throw InvalidArgument("the adapter's modules_to_save copies were never set: create it with the base model, or "
                          "load its tensors, before attaching it");
  }
  // The same projections at the same paths with the same shapes.
  const auto mine = ProjectionSites(model_), theirs = ProjectionSites(m);
  const bool same = mine.size() == theirs.size() &&
                    std::equal(mine.begin(), mine.end(), theirs.begin(), [](const auto& a, const auto& b) {
                      return a.path == b.path && a.in == b.in && a.out == b.out;
                    });
  if (!same) {
    const auto& a = model_;
    throw InvalidArgument("the adapter was made for a model of another shape (" + std::to_string(a.num_hidden_layers) +
                          " layers, hidden " + std::to_string(a.hidden_size) + ") than this one (" +
                          std::to_string(m.num_hidden_layers) + " layers, hidden " + std::to_string(m.hidden_size) + ")");
  }
}

std::shared_ptr<LoraAdapter> LoraAdapter::Load(const std::string& dir, const ModelConfig& model, torch::Dtype dtype,
                                               const torch::Device& device) {
  namespace fs = std::filesystem;
  const auto config_path = fs::path(dir) / "adapter_config.json";
  std::ifstream in(config_path);
  if (!in) throw NotFound("adapter folder " + dir + ": adapter_config.json is missing");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    throw InvalidArgument("adapter_config.json is not valid JSON: " + std::string(e.what()));
  }
  auto config = LoraConfig::FromPeftJson(j);
  config.Validate(&model);
  const auto weights = fs::path(dir) / "adapter_model.safetensors";
  if (!fs::exists(weights)) throw NotFound("adapter folder " + dir + ": adapter_model.safetensors is missing");
  auto file = ReadSafetensors(weights.string());
  auto adapter = Create(model, config, dtype, device);
  adapter->load_peft_tensors(file.tensors);
  return adapter;
}

void LoraAdapter::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  WriteSafetensors((fs::path(dir) / "adapter_model.safetensors").string(), peft_tensors(), {{"format", "pt"}});
  WriteFileAtomic((fs::path(dir) / "adapter_config.json").string(), config_.ToPeftJson().dump(2) + "\n");
}

TensorMap CausalLMImpl::merged_hf_tensors() const {
  auto out = hf_tensors();
  if (!adapter_) return out;
  torch::NoGradGuard no_grad;
  for (const auto& site : ProjectionSites(config_)) {
    const LoraWeights* w = adapter_->find(site.path);
    if (w == nullptr) continue;
    auto& base = out.at(site.path + ".weight");
    const auto delta = torch::matmul(w->b, w->a) * adapter_->scale();
    base = (base.to(delta.scalar_type()) + delta).to(base.scalar_type());
  }
  // A module to save is its trained copy.
  for (const auto& [path, shape] : SavedModules(config_, adapter_->config())) {
    auto& base = out.at(path + ".weight");
    base = adapter_->find(path)->weight.detach().to(base.scalar_type()).clone();
  }
  return out;
}

}  // namespace streambp
