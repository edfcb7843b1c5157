// The decoder as modules (docs/architecture.md: Models): a layer composed of input_layernorm,
// self_attn, the post-attention norms and mlp, each a LibTorch module whose tree is the Hugging
// Face structure, and LoRA adapters that attach to projections by their module paths.
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "../../core/src/model/weight_gradients.h"
#include "streambp/error.h"
#include "streambp/lora.h"
#include "streambp/model.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::RandomModel;

class ModelModules : public ::testing::TestWithParam<std::string> {};

// Random A and (nonzero) B in every tensor of `adapter`, so every term and gradient counts;
// returns them.
std::vector<torch::Tensor> Randomize(LoraAdapter& adapter, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : adapter.named_parameters()) {
    out.push_back(t);
    out.back().copy_(at::normal(0.0, 0.3, t.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64)));
  }
  return out;
}

// What a test trains: the model's parameters, or (with_adapter) those of a random LoRA
// adapter (rank 2, on `targets`) attached to the model, whose base is then frozen.
std::vector<torch::Tensor> Trained(CausalLM& model, const ModelConfig& config, bool with_adapter, uint64_t seed,
                                   const std::vector<std::string>& targets) {
  if (!with_adapter) return model->parameters();
  LoraConfig lc;
  lc.r = 2;
  lc.alpha = 3;
  lc.target_modules = targets;
  auto adapter = LoraAdapter::Create(config, lc, torch::kFloat64);
  auto trained = Randomize(*adapter, seed);
  for (auto& p : trained) p.requires_grad_(true);
  for (auto& p : model->parameters()) p.requires_grad_(false);
  model->set_adapter(adapter);
  return trained;
}

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
  Randomize(*adapter, 9);
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

// A layer's backward that never reads its output (DecoderLayerImpl::backward and
// backward_queries_normed, the engines' recomputes) gives every gradient that the forward
// and autograd's backward of it give, bit for bit: in every family, so where the down
// projection leaves out its product (dense layers without a post-feedforward norm) and where it
// may not (Gemma3's norm reads the MLP's output, a mixture of experts weighs its experts'),
// with the base trained and with a LoRA adapter on a frozen base; the whole layer, and one
// chunk of query rows against the prefix's K/V with the normalized rows a leaf (as the stream
// engine runs it).
TEST(ModelModulesBackward, NotReadingTheOutputGivesTheSameGradients) {
  int compared = 0;
  for (const auto& family : testing::TinyFamilies()) {
    for (const bool with_adapter : {false, true}) {
      const auto config = testing::TinyConfig(family);
      auto model = RandomModel(config, 31, torch::kFloat64);
      const auto trained = Trained(model, config, with_adapter, 37, LoraConfig{}.target_modules);
      const int64_t B = 2, T = 11, s = 4, d = config.hidden_size;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(41);
      const auto options = torch::TensorOptions().dtype(torch::kFloat64);
      const auto x0 = at::normal(0.0, 1.0, {B, T, d}, gen, options);
      const auto grad_y = at::normal(0.0, 1.0, {B, T, d}, gen, options);
      const auto rope = model->rope_tables(torch::arange(T).unsqueeze(0).expand({B, T}), x0);
      const AttentionPattern whole(torch::ones({B, T, T}, torch::kBool).tril());
      const AttentionPattern chunk(torch::ones({B, T - s, T}, torch::kBool).tril(s));
      for (size_t l = 0; l < model->layer_list.size(); ++l) {
        auto& layer = *model->layer_list[l];
        // The gradients of one run: its leaves', then every trained tensor's.
        auto run = [&](bool queries, bool read) {
          for (auto& p : trained) p.mutable_grad() = torch::Tensor();
          InPlaceWeightGradients in_place;  // as the engines run their recomputes
          torch::AutoGradMode grad_mode(true);
          std::vector<torch::Tensor> leaves, got;
          if (!queries) {
            auto x = x0.detach().requires_grad_(true);
            leaves = {x};
            if (read) {
              torch::autograd::backward({layer.forward(x, rope, whole, AttentionTiling{4})}, {grad_y});
            } else {
              layer.backward(x, rope, whole, AttentionTiling{4}, grad_y);
            }
          } else {
            auto x_q = x0.slice(1, s, T).detach().requires_grad_(true);
            auto h_q = layer.input_layernorm(x0.slice(1, s, T)).detach().requires_grad_(true);
            auto kv_in = x0.detach().requires_grad_(true);
            const auto kv = layer.keys_values(kv_in, rope);
            const auto rope_q = rope.slice(s, T);
            const auto g = grad_y.slice(1, s, T).contiguous();
            leaves = {x_q, h_q, kv_in};
            if (read) {
              torch::autograd::backward({layer.forward_queries_normed(x_q, h_q, rope_q, kv, chunk, AttentionTiling{4})},
                                        {g});
            } else {
              layer.backward_queries_normed(x_q, h_q, rope_q, kv, chunk, AttentionTiling{4}, g);
            }
          }
          for (auto& t : leaves) got.push_back(t.grad());
          for (auto& p : trained) got.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
          return got;
        };
        for (const bool queries : {false, true}) {
          const auto reference = run(queries, /*read=*/true), got = run(queries, /*read=*/false);
          ASSERT_EQ(got.size(), reference.size());
          int nonzero = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const std::string what = family + (with_adapter ? " adapter" : "") + " layer " + std::to_string(l) +
                                     (queries ? " queries" : " whole") + " gradient " + std::to_string(i);
            ASSERT_EQ(got[i].defined(), reference[i].defined()) << what;
            if (!got[i].defined()) continue;
            nonzero += reference[i].abs().max().item<double>() > 0;
            EXPECT_TRUE(torch::equal(got[i], reference[i]))
                << what << ": max difference " << (got[i] - reference[i]).abs().max().item<double>();
          }
          EXPECT_GE(nonzero, 4) << family << (with_adapter ? " adapter" : "") << " layer " << l << (queries ? " queries" : " whole") << ": too few gradients to compare (" << got.size() << ")";
          ++compared;
        }
      }
    }
  }
  EXPECT_GE(compared, 40);
}

// K/V recomputed only to be backpropagated (the stream engine's K/V VJP) leave out V's
// projection product, and K's where no k-norm reads it, and give every gradient that the read
// K/V give, bit for bit: in every family, with the base trained and with a LoRA adapter.
TEST(ModelModulesBackward, UnreadKeysAndValuesGiveTheSameGradients) {
  int compared = 0, skipped_k = 0;
  for (const auto& family : testing::TinyFamilies()) {
    for (const bool with_adapter : {false, true}) {
      const auto config = testing::TinyConfig(family);
      auto model = RandomModel(config, 43, torch::kFloat64);
      const auto trained = Trained(model, config, with_adapter, 47, {"k_proj", "v_proj"});
      const int64_t B = 2, T = 7, d = config.hidden_size;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(53);
      const auto options = torch::TensorOptions().dtype(torch::kFloat64);
      const auto h0 = at::normal(0.0, 1.0, {B, T, d}, gen, options);
      const auto rope = model->rope_tables(torch::arange(T).unsqueeze(0).expand({B, T}), h0);
      const int64_t kvh = config.num_key_value_heads, hd = config.head_dim;
      const auto grad_k = at::normal(0.0, 1.0, {B, kvh, T, hd}, gen, options);
      const auto grad_v = at::normal(0.0, 1.0, {B, kvh, T, hd}, gen, options);
      for (size_t l = 0; l < model->layer_list.size(); ++l) {
        auto& layer = *model->layer_list[l];
        auto run = [&](bool read, KeysValues* values) {
          for (auto& p : trained) p.mutable_grad() = torch::Tensor();
          InPlaceWeightGradients in_place;  // as the stream engine runs it
          torch::AutoGradMode grad_mode(true);
          auto h = h0.detach().requires_grad_(true);
          const auto kv = layer.keys_values_normed(h, rope, read);
          *values = {kv.k.detach(), kv.v.detach()};
          torch::autograd::backward({kv.k, kv.v}, {grad_k, grad_v});
          std::vector<torch::Tensor> got{h.grad()};
          for (auto& p : trained) got.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
          return got;
        };
        KeysValues read_kv, unread_kv;
        const auto reference = run(/*read=*/true, &read_kv), got = run(/*read=*/false, &unread_kv);
        const std::string what = family + (with_adapter ? " adapter" : "") + " layer " + std::to_string(l);
        ASSERT_EQ(got.size(), reference.size()) << what;
        int nonzero = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].defined(), reference[i].defined()) << what << " gradient " << i;
          if (!got[i].defined()) continue;
          nonzero += reference[i].abs().max().item<double>() > 0;
          EXPECT_TRUE(torch::equal(got[i], reference[i]))
              << what << " gradient " << i << ": max difference " << (got[i] - reference[i]).abs().max().item<double>();
        }
        EXPECT_GE(nonzero, 3) << what << ": too few gradients to compare";
        // The products were left out: V is the adapter's term alone (zero without one), and K
        // too where no k-norm reads the projection; the read K/V are not.
        EXPECT_GT(read_kv.v.abs().max().item<double>(), 0) << what;
        EXPECT_EQ(unread_kv.v.abs().max().item<double>() == 0, !with_adapter) << what;
        EXPECT_EQ(torch::equal(unread_kv.k, read_kv.k), config.qk_norm) << what;
        skipped_k += !config.qk_norm;
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 20);
  EXPECT_GT(skipped_k, 0) << "no family without a k-norm was checked";
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
