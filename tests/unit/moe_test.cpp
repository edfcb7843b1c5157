// Mixture-of-experts models (docs/architecture.md: Models): Qwen3-MoE's configuration as
// HF's Qwen3MoeConfig reads it, its parameters and files under HF's names, adapters on the
// experts under PEFT's names, and the sizes the memory estimate counts. Exactness against
// the independent reference is in families_test.cpp (qwen3_moe, qwen3_moe_mixed) and, for
// adapters and every objective, in lora_test.cpp.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/sampler.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"
#include "test_util/trainer_fixtures.h"

namespace streambp {
namespace {

using nlohmann::json;
using testing::ErrorOf;

// A Qwen3-MoE config.json with only the fields a real one must hold.
json MinimalQwen3Moe(int64_t layers) {
  return json{{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", 97},
              {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", layers},
              {"num_attention_heads", 4}, {"head_dim", 8}};
}

std::vector<int64_t> SparseLayers(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.sparse_layer(l)) out.push_back(l);
  }
  return out;
}

TEST(Qwen3MoeConfig, DefaultsAndSparseLayersFollowHuggingFace) {
  auto c = ModelConfig::FromJson(MinimalQwen3Moe(4));
  // Qwen3MoeConfig's defaults.
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.001);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(SparseLayers(c), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
  // Qwen3MoeDecoderLayer: sparse unless in mlp_only_layers, and only every decoder_sparse_step-th.
  auto j = MinimalQwen3Moe(4);
  j["mlp_only_layers"] = {0, 2};
  EXPECT_EQ(SparseLayers(ModelConfig::FromJson(j)), (std::vector<int64_t>{1, 3}));
  j["mlp_only_layers"] = {1};
  j["decoder_sparse_step"] = 2;
  c = ModelConfig::FromJson(j);
  EXPECT_EQ(SparseLayers(c), (std::vector<int64_t>{3}));
  EXPECT_EQ(c.sparse_layers(), 1);
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
  j["mlp_only_layers"] = nullptr;  // HF: None is []
  j["num_experts"] = 0;            // no experts: every layer dense
  EXPECT_EQ(SparseLayers(ModelConfig::FromJson(j)), std::vector<int64_t>{});
  // Windows: Qwen3MoeConfig has no max_window_layers; with use_sliding_window every layer slides.
  j = MinimalQwen3Moe(3);
  j["sliding_window"] = 7;
  EXPECT_EQ(ModelConfig::FromJson(j).window(2), 0);  // use_sliding_window defaults to false
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 2;
  c = ModelConfig::FromJson(j);
  EXPECT_EQ((std::vector<int64_t>{c.window(0), c.window(1), c.window(2)}), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
}

TEST(Qwen3MoeConfig, BadFieldsAreRefusedByName) {
  auto with = [](const std::function<void(json&)>& edit) {
    json j = MinimalQwen3Moe(2);
    edit(j);
    return ErrorOf([&] { ModelConfig::FromJson(j); });
  };
  EXPECT_EQ(with([](json&) {}), "");
  const std::vector<std::pair<std::string, std::function<void(json&)>>> cases = {
      {"num_experts_per_tok must be between 1 and num_experts (4), got 5",
       [](json& j) {
         j["num_experts"] = 4;
         j["num_experts_per_tok"] = 5;
       }},
      {"num_experts_per_tok must be between 1", [](json& j) { j["num_experts_per_tok"] = 0; }},
      {"moe_intermediate_size must be > 0", [](json& j) { j["moe_intermediate_size"] = 0; }},
      {"decoder_sparse_step must be >= 1", [](json& j) { j["decoder_sparse_step"] = 0; }},
      {"mlp_only_layers names layer 2; the model has layers 0..1", [](json& j) { j["mlp_only_layers"] = {2}; }},
      {"mlp_only_layers entry \"x\"", [](json& j) { j["mlp_only_layers"] = {"x"}; }},
      {"num_experts must be >= 0", [](json& j) { j["num_experts"] = -1; }},
      {"router_aux_loss_coef must be a finite number >= 0", [](json& j) { j["router_aux_loss_coef"] = -0.5; }},
  };
  for (const auto& [expected, edit] : cases) {
    const auto error = with(edit);
    EXPECT_NE(error.find(expected), std::string::npos) << "expected '" << expected << "', got '" << error << "'";
  }
}

// The router and every expert under HF's names and shapes (what Qwen3-30B-A3B's safetensors
// hold); a dense layer keeps its own MLP; save and load round-trip, and a file missing an
// expert is refused naming the tensor.
TEST(Qwen3MoeModel, ParametersAndFilesUseHuggingFaceNames) {
  const auto config = testing::TinyConfig("qwen3_moe_mixed");
  auto model = testing::RandomModel(config, 4, torch::kFloat64);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, p] : model->named_hf_parameters()) shapes[name] = p.sizes().vec();
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(shapes.count("model.layers.0.mlp.gate.weight"), 0u);
  for (int64_t l : {1, 2}) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    EXPECT_EQ(shapes.at(p + "gate.weight"), (std::vector<int64_t>{5, 32}));
    EXPECT_EQ(shapes.count(p + "gate_proj.weight"), 0u);
    for (int64_t e = 0; e < 5; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      EXPECT_EQ(shapes.at(x + "gate_proj.weight"), (std::vector<int64_t>{20, 32}));
      EXPECT_EQ(shapes.at(x + "up_proj.weight"), (std::vector<int64_t>{20, 32}));
      EXPECT_EQ(shapes.at(x + "down_proj.weight"), (std::vector<int64_t>{32, 20}));
    }
  }
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  // The estimate counts every parameter (float64: 8 bytes each).
  EXPECT_EQ(EstimateStepMemory(config, torch::kFloat64, 1, 8, {EngineKind::kStream}, "none").weights_bytes, 8 * numel);

  const auto dir = testing::TempDir("moe-save");
  SaveModel(model, dir);
  auto loaded = LoadModel(dir, torch::kFloat64);
  auto written = loaded->config().ToJson(), original = config.ToJson();
  written.erase("torch_dtype");  // the file records the weights' dtype
  original.erase("torch_dtype");
  EXPECT_EQ(written, original);
  const auto tokens = testing::RandomSequences({9}, config.vocab_size, 3)[0].tokens;
  EXPECT_TRUE(torch::equal(testing::ReferenceLogits(*loaded, tokens), testing::ReferenceLogits(*model, tokens)));
  auto tensors = model->hf_tensors();
  tensors.erase("model.layers.2.mlp.experts.3.up_proj.weight");
  EXPECT_NE(ErrorOf([&] { loaded->load_hf_tensors(tensors); })
                .find("loading model.layers.2.mlp.experts.3.up_proj.weight: tensor missing"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// Qwen3-30B-A3B's parameter count (HF: 30.5B) from the preset's shapes, and its active
// parameters per token (3.3B) as the bench's FLOP count uses them.
TEST(Qwen3MoeModel, The30BPresetHasQwen3_30B_A3BsParameters) {
  const auto c = PresetConfig("qwen3-30b-a3b");
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.sparse_layers(), 48);
  const int64_t d = 2048, attention = d * 4096 + 2 * d * 512 + 4096 * d + 2 * d + 2 * 128;
  const int64_t total = 48 * (attention + d * 128 + 128 * 3 * d * 768) + 2 * 151936 * d + d;
  EXPECT_EQ(total, int64_t{30532122624});
  EXPECT_EQ(EstimateStepMemory(c, torch::kBFloat16, 1, 1024, {EngineKind::kStream}, "none").weights_bytes, 2 * total);
  const int64_t active = 48 * (attention + d * 128 + 8 * 3 * d * 768) + 2 * 151936 * d + d;
  EXPECT_NEAR(static_cast<double>(active) / 1e9, 3.35, 0.01);
  EXPECT_NE(ErrorOf([] { PresetConfig("qwen3-30b-a3b", "llama"); }).find("qwen3_moe"), std::string::npos);
}

// A mixture of experts' chunk graph is k experts' rows of width moe_intermediate_size (and the
// router), not the dense MLP's: the estimate of a layer's graph (checkpointing's peak at this
// length) grows by exactly those rows with top-k and with the experts' width.
TEST(Qwen3MoeModel, TheEstimateCountsTheExpertsWorkingSet) {
  auto j = PresetConfig("small", "qwen3_moe").ToJson();
  auto activation = [&](int64_t k, int64_t width) {
    j["num_experts_per_tok"] = k;
    j["moe_intermediate_size"] = width;
    return EstimateStepMemory(ModelConfig::FromJson(j), torch::kFloat32, 1, 4096, {EngineKind::kCheckpoint})
        .activation_bytes;
  };
  EXPECT_EQ(activation(8, 384) - activation(2, 384), 4096 * 6 * (4 * 512 + 5 * 384) * 4);
  EXPECT_EQ(activation(2, 1536) - activation(2, 384), 4096 * 2 * 5 * (1536 - 384) * 4);
  // Per row: the router's three E-wide rows at 4 bytes, and k * (4 d + 5 moe_intermediate) at 4.
  EXPECT_DOUBLE_EQ(FeedForwardBytesPerRow(PresetConfig("small", "qwen3_moe"), 4, 4), 3 * 8 * 4 + 2 * (4 * 512 + 5 * 384) * 4);
}

// Adapters target each expert's projections by PEFT's module names; the router is not a
// target; the files use PEFT's per-expert names.
TEST(Qwen3MoeLora, ExpertProjectionsAreTargetsUnderPeftNames) {
  const auto config = testing::TinyConfig("qwen3_moe");
  LoraConfig lora;
  lora.r = 3;
  lora.alpha = 6;
  lora.target_modules = {"q_proj", "gate_proj", "down_proj"};
  auto adapter = LoraAdapter::Create(config, lora, torch::kFloat64);
  const auto tensors = adapter->peft_tensors();
  EXPECT_EQ(tensors.count("base_model.model.model.layers.1.mlp.experts.4.gate_proj.lora_A.weight"), 1u);
  EXPECT_EQ(tensors.at("base_model.model.model.layers.0.mlp.experts.5.down_proj.lora_B.weight").sizes().vec(),
            (std::vector<int64_t>{32, 3}));
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(name.find("mlp.gate.lora"), std::string::npos) << name;
    EXPECT_EQ(name.find("up_proj"), std::string::npos) << name;
  }
  // q_proj (32 -> 64) per layer, and gate_proj (32 -> 24) and down_proj (24 -> 32) per expert.
  const int64_t expected = 2 * (3 * (32 + 64) + 6 * 2 * 3 * (32 + 24));
  EXPECT_EQ(adapter->num_parameters(), expected);
  EXPECT_EQ(LoraParameterCount(config, lora), expected);
  lora.target_modules = {"gate"};
  EXPECT_NE(ErrorOf([&] { lora.Validate(&config); }).find("'gate', which this model does not have"), std::string::npos);
}

// The router stays frozen under an adapter unless modules_to_save asks for it: without it the
// adapter holds no router weight and no base weight gets a gradient; with it every sparse
// layer's mlp.gate gets a trainable copy (the base's values), counted by LoraParameterCount,
// whose gradient in every engine is the float64 reference's router gradient from HF's
// definitions, the load-balancing loss included; dense layers have no copy.
TEST(Qwen3MoeLora, TheRouterIsFrozenUnlessModulesToSaveAsksForIt) {
  auto config = testing::TinyConfig("qwen3_moe_mixed");
  config.output_router_logits = true;
  config.router_aux_loss_coef = 0.3;
  auto model = testing::RandomModel(config, 31, torch::kFloat64);
  for (auto& p : model->parameters()) p.requires_grad_(false);
  const auto seqs = testing::RandomSequences({13, 8, 21}, config.vocab_size, 9);
  const auto batch = MakeBatch(seqs, Layout::kPacked, 24);
  LoraConfig lora;
  lora.r = 3;
  lora.alpha = 6;
  lora.target_modules = {"q_proj", "gate_proj"};
  const auto frozen = LoraAdapter::Create(config, lora, torch::kFloat64);
  for (const auto& [name, t] : frozen->named_parameters()) EXPECT_EQ(name.find("mlp.gate.weight"), std::string::npos);
  {
    for (auto& [name, t] : frozen->named_parameters()) t.requires_grad_(true);
    ScopedAdapter attached(*model, frozen);
    auto objective = MakeSftObjective({});
    ForwardBackward(model, batch, *objective, {EngineKind::kStream, 5, 7});
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "a base weight got a gradient";
  }

  lora.modules_to_save = {"gate"};
  const auto asked = LoraAdapter::Create(config, lora, torch::kFloat64, torch::kCPU, model.get());
  const auto base = model->hf_tensors();
  std::vector<std::string> copies;
  for (const auto& [name, t] : asked->named_parameters()) {
    if (name.ends_with(".mlp.gate.weight")) {
      copies.push_back(name);
      EXPECT_TRUE(torch::equal(t, base.at(name))) << name << ": a copy starts as the base's router";
    }
  }
  ASSERT_EQ(copies.size(), static_cast<size_t>(config.sparse_layers()));
  for (const auto& name : copies) EXPECT_TRUE(config.sparse_layer(std::stoll(name.substr(13))));  // "model.layers.N"
  const int64_t per_router = config.num_experts * config.hidden_size;
  EXPECT_EQ(asked->num_parameters(), frozen->num_parameters() + config.sparse_layers() * per_router);
  EXPECT_EQ(LoraParameterCount(config, lora), asked->num_parameters());

  const auto [ref_loss, ref_grads] = testing::ReferenceSft(*model, seqs, nullptr, 0.3);
  TensorMap expected;
  for (const auto& name : copies) expected[name] = ref_grads.at(name);
  for (auto& [name, t] : asked->named_parameters()) t.requires_grad_(true);
  ScopedAdapter attached(*model, asked);
  for (const auto& [name, options] : testing::EngineVariants(5, 7, 3)) {
    ZeroGradients(asked->named_parameters());
    auto objective = MakeSftObjective({});
    const auto r = ForwardBackward(model, batch, *objective, options);
    EXPECT_NEAR(r.loss, ref_loss, 1e-12 * std::abs(ref_loss)) << name;  // B = 0: the base's function
    TensorMap got;
    for (const auto& [param, g] : CollectGradients(asked->named_parameters())) {
      if (expected.count(param)) got[param] = g;
    }
    const auto diff = CompareGradients(expected, got);
    EXPECT_LE(diff.max_relative, 1e-10) << name << " worst " << diff.worst;
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "a base weight got a gradient";
  }
  for (const auto& [name, g] : expected) EXPECT_GT(g.abs().max().item<double>(), 0) << name;
  ZeroGradients(asked->named_parameters());
}

// A trained router copy: saved under PEFT's names (".modules_to_save.default" left out, as
// PEFT writes them) with modules_to_save in adapter_config.json, loaded back bit for bit,
// folded into a merged export as the router's weight, and resumed from a checkpoint; the base
// never changes. Wrong uses are clear errors.
TEST(Qwen3MoeLora, ATrainedRouterSavesLoadsMergesAndResumes) {
  const auto config = testing::TinyConfig("qwen3_moe_mixed");
  auto model = testing::RandomModel(config, 3, torch::kFloat64);
  const auto base_before = model->hf_tensors();
  LoraConfig lora;
  lora.r = 2;
  lora.alpha = 4;
  lora.target_modules = {"v_proj", "down_proj"};
  lora.modules_to_save = {"gate"};
  TrainerOptions options = testing::ExactTrainerOptions();
  options.optimizer.name = "adamw";
  options.optimizer.lr = 1e-2;
  auto trainer =
      Trainer::Create(model, options, LoraAdapter::Create(config, lora, torch::kFloat64, torch::kCPU, model.get()));
  auto objective = MakeSftObjective({});
  const auto seqs = testing::RandomSequences({9, 12, 5}, config.vocab_size, 6);
  for (int i = 0; i < 2; ++i) trainer->train_step(seqs, *objective);
  for (const auto& [name, t] : model->hf_tensors()) EXPECT_TRUE(torch::equal(t, base_before.at(name))) << name;
  const auto adapter = trainer->adapter();
  const auto tensors = adapter->peft_tensors();
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const auto name = "base_model.model.model.layers." + std::to_string(l) + ".mlp.gate.weight";
    ASSERT_EQ(tensors.count(name), config.sparse_layer(l) ? 1u : 0u) << name;
    if (config.sparse_layer(l)) {
      EXPECT_FALSE(torch::equal(tensors.at(name), base_before.at(name.substr(17)))) << name << " did not train";
    }
  }

  const auto dir = testing::TempDir("moe-router-adapter");
  adapter->save(dir);
  const auto j = json::parse(std::ifstream(dir + "/adapter_config.json"));
  EXPECT_EQ(j.at("modules_to_save"), json::array({"gate"}));
  auto loaded = LoraAdapter::Load(dir, config, torch::kFloat64);
  for (const auto& [name, t] : loaded->peft_tensors()) EXPECT_TRUE(torch::equal(t, tensors.at(name))) << name;
  EXPECT_EQ(loaded->peft_tensors().size(), tensors.size());
  {
    ScopedAdapter attached(*model, loaded);
    const auto merged = model->merged_hf_tensors();
    for (const auto& [name, t] : tensors) {
      if (name.ends_with(".mlp.gate.weight")) {
        EXPECT_TRUE(torch::equal(merged.at(name.substr(17)), t)) << name;
      }
    }
  }

  const auto ckpt = testing::TempDir("moe-router-ckpt") + "/c";
  trainer->save_checkpoint(ckpt);
  auto resumed = Trainer::LoadCheckpoint(ckpt, nullptr, model);
  trainer->train_step(seqs, *objective);
  resumed->train_step(seqs, *objective);
  const auto a = trainer->adapter()->peft_tensors(), b = resumed->adapter()->peft_tensors();
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;

  // Errors: another module to save, the router of a dense model, a missing copy, a copy never set.
  auto rewrite = [&](const std::function<void(json&)>& edit) {
    auto k = j;
    edit(k);
    std::ofstream(dir + "/adapter_config.json") << k.dump();
    return ErrorOf([&] { LoraAdapter::Load(dir, config, torch::kFloat64); });
  };
  EXPECT_NE(rewrite([](json& k) { k["modules_to_save"] = {"gate", "lm_head"}; })
                .find("modules_to_save has 'lm_head'; only 'gate' (the mixture-of-experts router"),
            std::string::npos);
  EXPECT_NE(rewrite([](json& k) { k["modules_to_save"] = {"gate", "gate"}; }).find("names 'gate' twice"),
            std::string::npos);
  EXPECT_NE(rewrite([](json& k) { k["modules_to_save"] = nullptr; }).find("mlp.gate.weight is not one of"),
            std::string::npos);
  rewrite([](json&) {});
  auto without = tensors;
  without.erase("base_model.model.model.layers.1.mlp.gate.weight");
  WriteSafetensors(dir + "/adapter_model.safetensors", without);
  EXPECT_NE(ErrorOf([&] { LoraAdapter::Load(dir, config, torch::kFloat64); })
                .find("base_model.model.model.layers.1.mlp.gate.weight is missing"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { LoraAdapter::Create(testing::TinyConfig("qwen3"), lora, torch::kFloat64); })
                .find("modules_to_save has 'gate' (the mixture-of-experts router), but this model has no "
                      "mixture-of-experts layers"),
            std::string::npos);
  auto unset = LoraAdapter::Create(config, lora, torch::kFloat64);
  const auto attached_before = model->adapter();  // the trainer's
  EXPECT_NE(ErrorOf([&] { ScopedAdapter attached(*model, unset); }).find("modules_to_save copies were never set"),
            std::string::npos);
  EXPECT_EQ(model->adapter(), attached_before);
}

// Random routing for every (token, sparse layer) of the sequences: k distinct experts, or -1
// (the router's choice) for about one in four.
void RandomRouting(std::vector<Sequence>& seqs, const ModelConfig& c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t k = c.num_experts_per_tok, layers = c.sparse_layers();
  for (auto& s : seqs) {
    s.routed_experts.clear();
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      for (int64_t j = 0; j < layers; ++j) {
        const bool router = at::randint(0, 4, {1}, gen, torch::kInt64).item<int64_t>() == 0;
        const auto order = at::randperm(c.num_experts, gen, torch::kInt64);
        for (int64_t i = 0; i < k; ++i) s.routed_experts.push_back(router ? -1 : static_cast<int32_t>(order[i].item<int64_t>()));
      }
    }
  }
}

class Qwen3MoeReplay : public ::testing::TestWithParam<testing::FamilyLayout> {};

// Given experts, every engine's loss and gradients equal the reference's with the routing
// forced to them (the router's probabilities of the given experts as weights, renormalised as
// configured), the router's gradient included; the step reports the share of given choices
// the router would not have made.
TEST_P(Qwen3MoeReplay, EveryEngineTrainsTheGivenExpertsExactly) {
  const auto& [family, layout] = GetParam();
  const auto config = testing::TinyConfig(family);
  auto model = testing::RandomModel(config, 31, torch::kFloat64);
  auto seqs = testing::RandomSequences({13, 8, 21}, config.vocab_size, 9);
  RandomRouting(seqs, config, 5);
  double gap = 1.0;
  const auto [ref_loss, ref_grads] = testing::ReferenceSft(*model, seqs, &gap);
  EXPECT_GT(gap, 1e-6);
  const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 24 : 0);
  for (const auto& [name, options] : testing::EngineVariants(5, 7, 3)) {
    ZeroGradients(*model);
    auto objective = MakeSftObjective({});
    const auto r = ForwardBackward(model, batch, *objective, options);
    const auto diff = CompareGradients(ref_grads, CollectGradients(*model));
    EXPECT_LE(diff.max_relative, 1e-10) << family << " " << name << " worst " << diff.worst;
    EXPECT_NEAR(r.loss, ref_loss, 1e-12 * std::abs(ref_loss)) << family << " " << name;
    EXPECT_GT(r.routing_decisions, 0) << name;
    EXPECT_GT(r.routing_mismatches, 0) << name;  // random choices: most differ from the router's
    EXPECT_LE(r.routing_mismatches, r.routing_decisions) << name;
  }
  ZeroGradients(*model);
  for (const auto& [name, g] : ref_grads) EXPECT_GT(g.abs().max().item<double>(), 0) << name;
}

INSTANTIATE_TEST_SUITE_P(Families, Qwen3MoeReplay, ::testing::ValuesIn(testing::MoeFamilyLayouts()),
                         [](const auto& info) { return testing::FamilyLayoutName(info.param); });

// Replaying what the routers chose themselves (RecordRouting, as a sampler records it) is
// training without a replay, bit for bit, with no decision reported as different.
TEST(Qwen3MoeReplay, ReplayingTheRoutersOwnChoiceChangesNothing) {
  const auto config = testing::TinyConfig("qwen3_moe_mixed");
  auto model = testing::RandomModel(config, 17, torch::kFloat64);
  auto seqs = testing::RandomSequences({11, 6, 9}, config.vocab_size, 4);
  const auto original = seqs;
  const auto plain = MakeBatch(seqs, Layout::kPacked, 16);
  const auto recorded = RecordRouting(model, plain);
  ASSERT_EQ(recorded.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(recorded[i].size(), seqs[i].tokens.size() * 2 * 3);
    for (int32_t e : recorded[i]) ASSERT_TRUE(e >= 0 && e < 5);
    seqs[i].routed_experts = recorded[i];
  }
  const auto replayed = MakeBatch(seqs, Layout::kRightPad);  // another layout: the same routing per token
  for (const auto& [name, options] : testing::EngineVariants(4, 5, 3)) {
    ZeroGradients(*model);
    auto a = MakeSftObjective({});
    const auto without = ForwardBackward(model, plain, *a, options);
    const auto g_without = CollectGradients(*model);
    ZeroGradients(*model);
    auto b = MakeSftObjective({});
    const auto with = ForwardBackward(model, replayed, *b, options);
    EXPECT_LE(CompareGradients(g_without, CollectGradients(*model)).max_relative, 1e-12) << name;
    EXPECT_NEAR(with.loss, without.loss, 1e-13) << name;
    EXPECT_GT(with.routing_decisions, 0) << name;
    EXPECT_EQ(with.routing_mismatches, 0) << name;
    EXPECT_EQ(without.routing_decisions, 0) << name;
  }
  ZeroGradients(*model);
  // Log-probs with the replay are those without.
  const auto difference = TokenLogprobs(model, replayed) - TokenLogprobs(model, MakeBatch(original, Layout::kRightPad));
  EXPECT_LE(difference.abs().max().item<double>(), 1e-13);
}

// The sampler records the experts of every token it feeds (the prompt's in the chunked
// prefill, each new token's in its decode step): they are what a forward over prompt +
// completion routes (float64: no near-ties), the last token -1 (never fed). Training with
// them replays them: every given decision counted, none different from the router's.
// Slicing the generation (SampleRun, as the server does) records the same.
TEST(Qwen3MoeReplay, TheSamplerRecordsWhatTrainingReplays) {
  const auto config = testing::TinyConfig("qwen3_moe_mixed");  // layer 0 dense, 2 sparse layers, 3 of 5 experts
  auto model = testing::RandomModel(config, 23, torch::kFloat64);
  const std::vector<std::vector<int64_t>> prompts = {{3, 5, 7, 9, 11, 13, 2}, {4, 8}};
  SampleOptions options;
  options.n = 2;
  options.max_tokens = 6;
  options.seed = 3;
  options.record_routing = true;
  const auto completions = SampleCompletions(model, prompts, options);
  const int64_t width = config.sparse_layers() * config.num_experts_per_tok;
  ASSERT_EQ(width, 6);
  std::vector<Sequence> seqs;
  int64_t replayed = 0;
  for (const auto& c : completions) {
    Sequence s;
    s.tokens = prompts[c.prompt_index];
    s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
    s.loss_mask.assign(s.tokens.size(), 1);
    ASSERT_EQ(c.routed_experts.size(), s.tokens.size() * width);
    const auto own = RecordRouting(model, MakeBatch({s}, Layout::kRightPad))[0];
    const size_t fed = (s.tokens.size() - 1) * width;
    EXPECT_EQ(std::vector<int32_t>(c.routed_experts.begin(), c.routed_experts.begin() + fed),
              std::vector<int32_t>(own.begin(), own.begin() + fed));
    EXPECT_EQ(std::vector<int32_t>(c.routed_experts.begin() + fed, c.routed_experts.end()), std::vector<int32_t>(width, -1));
    s.routed_experts = c.routed_experts;
    replayed += static_cast<int64_t>(fed);
    seqs.push_back(s);
  }
  auto objective = MakeSftObjective({});
  const auto r = ForwardBackward(model, MakeBatch(seqs, Layout::kPacked), *objective, {EngineKind::kStream, 3, 4});
  EXPECT_EQ(r.routing_decisions, 2 * replayed);  // stream's forward and its recompute each count
  EXPECT_EQ(r.routing_mismatches, 0);
  ZeroGradients(*model);
  // In slices of one decode step, as the server runs it: the same record.
  SampleRun run(model, prompts, options);
  while (!run.step(1)) {
  }
  const auto sliced = run.take();
  for (size_t i = 0; i < completions.size(); ++i) EXPECT_EQ(sliced[i].routed_experts, completions[i].routed_experts);
  // Not asked, or a dense model: nothing recorded.
  options.record_routing = false;
  EXPECT_TRUE(SampleCompletions(model, prompts, options)[0].routed_experts.empty());
  options.record_routing = true;
  auto dense = testing::RandomModel(testing::TinyConfig("qwen3"), 2, torch::kFloat64);
  EXPECT_TRUE(SampleCompletions(dense, prompts, options)[0].routed_experts.empty());
}

// A trainer step reports the share of replayed choices the routers would have made
// differently (metric routing_mismatch); a step without a replay reports none.
TEST(Qwen3MoeReplay, TheTrainerReportsTheShareOfDifferingChoices) {
  const auto config = testing::TinyConfig("qwen3_moe");
  auto trainer = Trainer::Create(testing::RandomModel(config, 5, torch::kFloat64), testing::ExactTrainerOptions());
  auto seqs = testing::RandomSequences({9, 12}, config.vocab_size, 6);
  auto sft = MakeSftObjective({});
  EXPECT_EQ(trainer->forward_backward(seqs, *sft).metrics.count("routing_mismatch"), 0u);
  trainer->zero_gradients();
  RandomRouting(seqs, config, 7);
  const auto r = trainer->forward_backward(seqs, *sft);
  ASSERT_GT(r.routing_decisions, 0);
  EXPECT_DOUBLE_EQ(r.metrics.at("routing_mismatch"),
                   static_cast<double>(r.routing_mismatches) / static_cast<double>(r.routing_decisions));
  // Random choices of 2 of 6 experts: about 2/3 of them differ from the router's top 2.
  EXPECT_GT(r.metrics.at("routing_mismatch"), 0.4);
  EXPECT_LT(r.metrics.at("routing_mismatch"), 0.9);
  trainer->zero_gradients();
}

// Malformed routing is refused naming routed_experts before anything runs: no gradient appears.
TEST(Qwen3MoeReplay, MalformedRoutingIsAClearErrorAndChangesNothing) {
  const auto config = testing::TinyConfig("qwen3_moe");  // 2 sparse layers, 2 of 6 experts
  auto model = testing::RandomModel(config, 2, torch::kFloat64);
  const auto base = testing::RandomSequences({5, 4}, config.vocab_size, 1);
  auto with = [&](const std::function<void(std::vector<int32_t>&)>& edit) {
    auto seqs = base;  // sequence 0 routed by the router, sequence 1 fully given
    for (int32_t t = 0; t < 4; ++t) {
      for (int32_t j = 0; j < 2; ++j) seqs[1].routed_experts.insert(seqs[1].routed_experts.end(), {(t + j) % 6, (t + j + 1) % 6});
    }
    edit(seqs[1].routed_experts);
    return ErrorOf([&] {
      auto objective = MakeSftObjective({});
      ForwardBackward(model, MakeBatch(seqs, Layout::kRightPad), *objective, {EngineKind::kStream, 2, 3});
    });
  };
  const std::vector<std::pair<std::string, std::function<void(std::vector<int32_t>&)>>> cases = {
      {"routed_experts has 17 entries for 4 tokens", [](auto& r) { r.push_back(0); }},
      {"routed_experts: 2 entries per token, but this model routes each token to 2 experts (num_experts_per_tok) "
       "in each of 2 sparse layers",
       [](auto& r) { r.resize(8); }},
      {"routed_experts: expert id 6 is outside [0, 6)", [](auto& r) { r[5] = 6; }},
      {"routed_experts: expert id -2 is outside", [](auto& r) { r[0] = -2; }},
      {"routed_experts: a token names the same expert twice", [](auto& r) { r[3] = r[2]; }},
      {"either all given or all -1", [](auto& r) { r[6] = -1; }},
  };
  for (const auto& [expected, edit] : cases) {
    const auto error = with(edit);
    EXPECT_NE(error.find(expected), std::string::npos) << "expected '" << expected << "', got '" << error << "'";
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << expected;
  }
  EXPECT_EQ(with([](auto&) {}), "");
  ZeroGradients(*model);
  // A dense model has nothing to route.
  auto dense = testing::RandomModel(testing::TinyConfig("qwen3"), 2, torch::kFloat64);
  auto seqs = base;
  seqs[0].routed_experts.assign(5 * 2, 0);
  const auto error = ErrorOf([&] {
    auto objective = MakeSftObjective({});
    ForwardBackward(dense, MakeBatch(seqs, Layout::kRightPad), *objective, {EngineKind::kFull});
  });
  EXPECT_NE(error.find("routed_experts: given, but this model has no mixture-of-experts layers"), std::string::npos)
      << error;
}

}  // namespace
}  // namespace streambp
