// The decoder as modules (docs/architecture.md: Models): a layer composed of input_layernorm,
// self_attn, the post-attention norms and mlp, each a LibTorch module whose tree is the Hugging
// Face structure, and LoRA adapters that attach to projections by their module paths.
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "streambp/error.h"
#include "streambp/lora.h"
#include "streambp/model.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::RandomModel;

class ModelModules : public ::testing::TestWithParam<std::string> {};

// The module tree's parameter names are HF's: "layers.0.self_attn.q_proj.weight" is
// model.layers.0.self_attn.q_proj.weight, so nothing maps one to the other by hand.
TEST_P(ModelModules, TheModuleTreeIsTheHuggingFaceStructure) {
  const auto config = PresetConfig("tiny", GetParam());
  auto model = InitModel(config, 3, torch::kFloat64);
  std::set<std::string> tree, hf;
  for (const auto& item : model->named_parameters()) {
    tree.insert(item.key().starts_with("lm_head") ? item.key() : "model." + item.key());
  }
  for (const auto& [name, t] : model->named_hf_parameters()) hf.insert(name);
  EXPECT_EQ(tree, hf);
  EXPECT_FALSE(hf.empty());
}

// Every projection a layer has is where ProjectionSites (what adapters are made from) says,
// with the shape it says; the untied lm_head is the last site.
TEST_P(ModelModules, ProjectionSitesAreTheLayersProjections) {
  const auto config = PresetConfig("tiny", GetParam());
  auto model = InitModel(config, 3, torch::kFloat64);
  std::vector<std::tuple<std::string, int64_t, int64_t>> modules, sites;
  for (size_t i = 0; i < model->layer_list.size(); ++i) {
    for (const auto& [name, p] : model->layer_list[i]->projections()) {
      modules.emplace_back("model.layers." + std::to_string(i) + "." + name, p->weight.size(1), p->weight.size(0));
    }
  }
  if (model->lm_head) modules.emplace_back("lm_head", model->lm_head->weight.size(1), model->lm_head->weight.size(0));
  for (const auto& s : ProjectionSites(config)) {
    sites.emplace_back(s.path, s.in, s.out);
    EXPECT_EQ(s.path.substr(s.path.rfind('.') + 1), s.name);
  }
  EXPECT_EQ(modules, sites);
  // Four attention projections per layer, and three per MLP: one dense MLP, or each expert's.
  const int64_t mlps = config.num_experts > 0 ? config.num_experts : 1;
  EXPECT_EQ(sites.size(), (4 + 3 * mlps) * config.num_hidden_layers + (config.tie_word_embeddings ? 0 : 1));
}

INSTANTIATE_TEST_SUITE_P(Families, ModelModules, ::testing::ValuesIn(FamilyNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// HF's order within a layer (what checkpoints, the deterministic initialization and the
// optimizer's state follow): attention, then MLP, then the norms.
TEST(ModelModulesOrder, ParametersKeepHuggingFaceOrder) {
  auto model = InitModel(PresetConfig("tiny", "qwen3"), 3, torch::kFloat64);
  std::vector<std::string> layer0;
  for (const auto& [name, t] : model->named_hf_parameters()) {
    if (name.starts_with("model.layers.0.")) layer0.push_back(name.substr(std::string("model.layers.0.").size()));
  }
  const std::vector<std::string> expected{
      "self_attn.q_proj.weight", "self_attn.k_proj.weight",  "self_attn.v_proj.weight", "self_attn.o_proj.weight",
      "self_attn.q_norm.weight", "self_attn.k_norm.weight",  "mlp.gate_proj.weight",    "mlp.up_proj.weight",
      "mlp.down_proj.weight",    "input_layernorm.weight", "post_attention_layernorm.weight"};
  EXPECT_EQ(layer0, expected);
}

// An adapter naming up_proj and q_proj changes exactly those weights when merged, and the
// model with it attached computes what the merged model computes: it attached where it names.
TEST(ModelModulesLora, AnAdapterAttachesToTheProjectionsItNames) {
  const auto config = PresetConfig("tiny", "llama");
  auto model = RandomModel(config, 5, torch::kFloat64);
  LoraConfig lc;
  lc.r = 3;
  lc.alpha = 5;
  lc.target_modules = {"q_proj", "up_proj"};
  auto adapter = LoraAdapter::Create(config, lc, torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
    for (auto& [name, t] : adapter->named_parameters()) {
      auto p = t;
      p.copy_(at::normal(0.0, 0.3, p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64)));
    }
  }
  const auto paths = adapter->named_parameters();
  ASSERT_EQ(paths.size(), 2u * 2 * config.num_hidden_layers);
  EXPECT_EQ(paths[0].first, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(paths[2].first, "model.layers.0.mlp.up_proj.lora_A.weight");
  EXPECT_NE(adapter->find("model.layers.1.mlp.up_proj"), nullptr);
  EXPECT_EQ(adapter->find("model.layers.1.mlp.down_proj"), nullptr);
  EXPECT_EQ(adapter->find("lm_head"), nullptr);
  EXPECT_EQ(LoraParameterCount(config, lc), adapter->num_parameters());

  const auto base = model->hf_tensors();
  model->set_adapter(adapter);
  const auto merged = model->merged_hf_tensors();
  for (const auto& [name, t] : base) {
    const bool targeted = name.ends_with("self_attn.q_proj.weight") || name.ends_with("mlp.up_proj.weight");
    EXPECT_EQ(!torch::equal(t, merged.at(name)), targeted) << name;
  }
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, config.vocab_size, {2, 9}, at::make_generator<at::CPUGeneratorImpl>(2));
  auto run = [&](CausalLMImpl& m) {
    const auto positions = torch::arange(9).unsqueeze(0).expand({2, 9});
    auto h = m.embed(ids);
    const auto rope = m.rope_tables(positions, h);
    const AttentionPattern mask(torch::ones({2, 9, 9}, torch::kBool).tril());
    for (auto& layer : m.layer_list) h = layer->forward(h, rope, mask);
    return m.logits(h);
  };
  const auto with_adapter = run(*model);
  auto plain = RandomModel(config, 5, torch::kFloat64);
  plain->load_hf_tensors(merged);
  const auto with_merged = run(*plain);
  EXPECT_LT((with_adapter - with_merged).abs().max().item<double>(), 1e-12);
  model->set_adapter(nullptr);
  EXPECT_GT((run(*model) - with_adapter).abs().max().item<double>(), 1e-6);  // detached: the base again
}

// An adapter made for another model shape is refused by name of what differs, nothing attached.
TEST(ModelModulesLora, AnAdapterOfAnotherShapeIsRefused) {
  auto config = PresetConfig("tiny", "qwen3");
  auto other = config;
  other.intermediate_size += 8;
  auto adapter = LoraAdapter::Create(other, LoraConfig{}, torch::kFloat64);
  auto model = RandomModel(config, 5, torch::kFloat64);
  try {
    model->set_adapter(adapter);
    FAIL() << "attached an adapter of another shape";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("another shape"), std::string::npos) << e.what();
  }
  EXPECT_EQ(model->adapter(), nullptr);
}

}  // namespace
}  // namespace streambp
