// The decoder against an independent reference, configs, and HF-format loading/saving.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/error.h"
#include "streambp/model.h"
#include "streambp/safetensors.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using nlohmann::json;

using testing::ErrorOf;

// Forward of each family equals the loop-based reference in float64; in a padded or
// packed batch each sequence's logits equal those of the sequence alone.
TEST(Decoder, LogitsMatchReferenceInEveryLayout) {
  for (const auto& family : testing::TinyFamilies()) {
    auto config = testing::TinyConfig(family);
    auto model = testing::RandomModel(config, 13, torch::kFloat64);
    auto seqs = testing::RandomSequences({11, 4, 8}, config.vocab_size, 17);
    for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
      auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
      torch::NoGradGuard no_grad;
      const int64_t T = batch.length();
      auto x = model->embed(batch.input_ids);
      auto rope = model->rope_tables(batch.position_ids, x);
      for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
        x = model->layer_list[l]->forward(x, rope, AttentionMask(batch, 0, T, T, config.window(l)));
      }
      auto logits = model->logits(x);
      for (size_t i = 0; i < seqs.size(); ++i) {
        auto where = (batch.sequence_ids == static_cast<int64_t>(i)).nonzero();
        ASSERT_EQ(where.size(0), static_cast<int64_t>(seqs[i].tokens.size()));
        const int64_t row = where[0][0].item<int64_t>(), start = where[0][1].item<int64_t>();
        auto ours = logits[row].slice(0, start, start + seqs[i].tokens.size());
        auto ref = testing::ReferenceLogits(*model, seqs[i].tokens);
        EXPECT_LE((ours - ref).abs().max().item<double>(), 1e-12 * ref.abs().max().item<double>())
            << family << " " << LayoutName(layout) << " sequence " << i;
      }
    }
  }
}

// Attention over key tiles (online softmax, recomputing backward) equals the materialized
// softmax: outputs to 1e-12 and the gradients of the chunk input, K, V and every layer
// parameter to 1e-10 (float64), for tiles that divide the keys, that do not, of one key,
// and with rows whose first tiles are masked entirely (left padding, packing, window);
// also with query blocks (checkpoint:tiled's attention) and with the mask built tile by
// tile from the batch (AttentionPattern::Causal) instead of given.
TEST(Decoder, TiledAttentionEqualsMaterialized) {
  for (const auto& family : testing::TinyFamilies()) {
    auto config = testing::TinyConfig(family);
    auto model = testing::RandomModel(config, 21, torch::kFloat64);
    auto& layer = *model->layer_list[0];
    auto seqs = testing::RandomSequences({14, 5, 9, 3}, config.vocab_size, 23);
    for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
      auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
      const int64_t T = batch.length(), s = T / 3, e = T;
      torch::Tensor x_all;
      Rope rope;
      {
        torch::NoGradGuard no_grad;
        x_all = model->embed(batch.input_ids);
        rope = model->rope_tables(batch.position_ids, x_all);
      }
      auto mask = AttentionMask(batch, s, e, e, config.sliding_window.value_or(0));
      auto run = [&](AttentionTiling tiling, bool pattern) {
        auto x_q = x_all.slice(1, s, e).detach().requires_grad_(true);
        auto kv_in = x_all.detach().requires_grad_(true);
        KeysValues kv = layer.keys_values(kv_in, rope);
        auto rope_q = rope.slice(s, e);
        auto y = layer.forward_queries(
            x_q, rope_q, kv,
            pattern ? AttentionPattern::Causal(batch, s, e, e, config.sliding_window.value_or(0)) : AttentionPattern(mask),
            tiling);
        auto weight = torch::linspace(-1, 1, y.numel(), y.options()).view(y.sizes());
        std::vector<torch::Tensor> inputs{x_q, kv_in};
        for (const auto& p : layer.parameters()) inputs.push_back(p);
        auto grads = torch::autograd::grad({(y * weight).sum()}, inputs);
        grads.insert(grads.begin(), y.detach());
        return grads;
      };
      const auto reference = run({}, false);
      const std::pair<AttentionTiling, bool> cases[] = {{{4}, false}, {{5}, false}, {{1}, false}, {{4, 3}, true},
                                                        {{5, 1}, true}, {{0, 2}, true}, {{3}, true}};
      for (const auto& [tiling, pattern] : cases) {
        const std::string tile = std::to_string(tiling.key_tile) + " x queries " + std::to_string(tiling.query_tile) +
                                 (pattern ? " (pattern)" : "");
        const auto tiled = run(tiling, pattern);
        ASSERT_EQ(tiled.size(), reference.size());
        const double scale = reference[0].abs().max().item<double>();
        EXPECT_LE((tiled[0] - reference[0]).abs().max().item<double>(), 1e-12 * scale)
            << family << " " << LayoutName(layout) << " tile " << tile << " output";
        for (size_t i = 1; i < tiled.size(); ++i) {
          const double g = reference[i].abs().max().item<double>();
          ASSERT_GT(g, 0) << "gradient " << i << " is zero: the comparison would prove nothing";
          EXPECT_LE((tiled[i] - reference[i]).abs().max().item<double>(), 1e-10 * g)
              << family << " " << LayoutName(layout) << " tile " << tile << " gradient " << i;
        }
      }
    }
  }
}

TEST(Decoder, SlidingWindowChangesAttention) {
  // A check that the window is not silently ignored: the same weights without the window
  // give different logits beyond the window.
  auto config = testing::TinyConfig("mistral_window");
  auto model = testing::RandomModel(config, 2, torch::kFloat64);
  auto unwindowed_config = config;
  unwindowed_config.sliding_window.reset();
  CausalLM unwindowed(unwindowed_config);
  unwindowed->to(torch::kFloat64);
  unwindowed->load_hf_tensors(model->hf_tensors());
  auto tokens = testing::RandomSequences({12}, config.vocab_size, 3)[0].tokens;
  auto a = testing::ReferenceLogits(*model, tokens);
  auto b = testing::ReferenceLogits(*unwindowed, tokens);
  EXPECT_LT((a.slice(0, 0, 5) - b.slice(0, 0, 5)).abs().max().item<double>(), 1e-12);
  EXPECT_GT((a.slice(0, 6) - b.slice(0, 6)).abs().max().item<double>(), 1e-6);
}

// Gemma3's local RoPE table is built only when a layer is local: an all-global config gets the
// global table alone, and its logits are those of the same weights with no local base at all.
TEST(Decoder, LocalRopeTablesOnlyForLocalLayers) {
  auto config = testing::TinyConfig("gemma3");
  ASSERT_TRUE(config.rope_local_base_freq.has_value());
  auto model = testing::RandomModel(config, 5, torch::kFloat64);
  const auto positions = torch::arange(6, torch::kInt64).unsqueeze(0);
  const auto like = torch::zeros({1}, torch::kFloat64);
  EXPECT_EQ(model->rope_tables(positions, like).kinds.size(), 2u);
  auto global = config;
  global.layer_types.assign(static_cast<size_t>(config.num_hidden_layers), "full_attention");
  CausalLM all_global(global);
  all_global->to(torch::kFloat64);
  all_global->load_hf_tensors(model->hf_tensors());
  EXPECT_EQ(all_global->rope_tables(positions, like).kinds.size(), 1u);
  auto no_local_base = global;
  no_local_base.rope_local_base_freq.reset();
  CausalLM plain(no_local_base);
  plain->to(torch::kFloat64);
  plain->load_hf_tensors(model->hf_tensors());
  auto tokens = testing::RandomSequences({9}, config.vocab_size, 4)[0].tokens;
  EXPECT_TRUE(torch::equal(testing::ReferenceLogits(*all_global, tokens), testing::ReferenceLogits(*plain, tokens)));
}

TEST(Config, ParsesEveryFamilyAndRoundTrips) {
  for (const auto& family : testing::TinyFamilies()) {
    auto c = testing::TinyConfig(family);
    auto back = ModelConfig::FromJson(c.ToJson());
    EXPECT_EQ(back.ToJson(), c.ToJson()) << family;
  }
  auto q2 = testing::TinyConfig("qwen2");
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.o_proj_bias);
  auto q3 = testing::TinyConfig("qwen3");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_dim, 16);
  EXPECT_EQ(testing::TinyConfig("llama").head_dim, 8);
  EXPECT_EQ(testing::TinyConfig("llama_bias").rope_scaling.type, "llama3");
  EXPECT_EQ(*testing::TinyConfig("mistral_window").sliding_window, 5);
  EXPECT_EQ(testing::TinyConfig("mistral_window").window(0), 5);
  EXPECT_EQ(testing::TinyConfig("qwen2_window").window(0), 0);
  EXPECT_EQ(testing::TinyConfig("qwen2_window").window(1), 5);
  auto tiny = PresetConfig("tiny");
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.vocab_size, 256);
  auto small = PresetConfig("small");
  EXPECT_EQ(small.hidden_size, 512);
  EXPECT_EQ(small.vocab_size, 32000);
}

TEST(Config, RopeParametersLayoutIsAccepted) {
  auto j = testing::TinyConfig("llama").ToJson();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 500000.0}};
  auto c = ModelConfig::FromJson(j);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
}

TEST(Config, ErrorsNameTheProblem) {
  auto base = testing::TinyConfig("llama").ToJson();
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    return ErrorOf([&] { ModelConfig::FromJson(j); });
  };
  EXPECT_NE(with([](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; }).find("'GPT2LMHeadModel' is not supported"),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j.erase("hidden_size"); }).find("'hidden_size'"), std::string::npos);
  EXPECT_NE(with([](json& j) { j["num_key_value_heads"] = 3; }).find("num_key_value_heads"), std::string::npos);
  EXPECT_NE(with([](json& j) { j["hidden_act"] = "gelu"; }).find("hidden_act"), std::string::npos);
  EXPECT_NE(with([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2}}; }).find("'yarn'"),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j.erase("architectures"); }).find("architectures"), std::string::npos);
}

// The qwen3-8b preset (docs/gpu.md) has Qwen3-8B's shapes: its parameter count, from the
// config by HF's layout, is Qwen3-8B's (8,190,735,360: the 16,381,470,720 bytes of its bf16
// safetensors index), and it is listed, without building 8e9 parameters here.
TEST(Config, Qwen3_8bPresetHasTheRealShapes) {
  const auto c = PresetConfig("qwen3-8b");
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t layer = d * c.q_dim() + 2 * d * c.kv_dim() + c.q_dim() * d + 3 * d * f + 2 * d + 2 * c.head_dim;
  EXPECT_EQ(c.num_hidden_layers * layer + 2 * c.vocab_size * d + d, int64_t{8190735360});
  const auto names = PresetNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen3-8b"), names.end());
  try {
    PresetConfig("qwen3-9b");
    FAIL() << "an unknown preset was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("known: tiny, small, qwen3-8b"), std::string::npos) << e.what();
  }
}

// Which layers slide follows HF's configuration classes: Qwen2/Qwen3 only with
// use_sliding_window, from max_window_layers on (default 28), or by an explicit layer_types;
// Mistral on every layer; an unknown layer type or a window switched on without its size is
// refused by name.
TEST(Config, SlidingWindowLayersFollowHuggingFace) {
  auto qwen = testing::TinyConfig("qwen2").ToJson();
  qwen["num_hidden_layers"] = 4;
  auto windows = [](const json& j) {
    auto c = ModelConfig::FromJson(j);
    std::vector<int64_t> w;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) w.push_back(c.window(l));
    EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
    return w;
  };
  qwen["sliding_window"] = 7;
  qwen["use_sliding_window"] = false;
  EXPECT_EQ(windows(qwen), (std::vector<int64_t>{0, 0, 0, 0}));
  qwen["use_sliding_window"] = true;
  qwen["max_window_layers"] = 2;
  EXPECT_EQ(windows(qwen), (std::vector<int64_t>{0, 0, 7, 7}));
  qwen.erase("max_window_layers");
  EXPECT_EQ(windows(qwen), (std::vector<int64_t>{0, 0, 0, 0}));  // HF's default 28 > 4 layers
  qwen["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(windows(qwen), (std::vector<int64_t>{7, 0, 7, 0}));
  qwen["architectures"] = {"Qwen3ForCausalLM"};
  EXPECT_EQ(windows(qwen), (std::vector<int64_t>{7, 0, 7, 0}));
  qwen["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  EXPECT_NE(ErrorOf([&] { ModelConfig::FromJson(qwen); }).find("chunked_attention"), std::string::npos);
  qwen["layer_types"] = {"sliding_attention"};
  EXPECT_NE(ErrorOf([&] { ModelConfig::FromJson(qwen); }).find("one type per layer"), std::string::npos);
  qwen.erase("layer_types");
  qwen["sliding_window"] = nullptr;
  EXPECT_NE(ErrorOf([&] { ModelConfig::FromJson(qwen); }).find("sliding_window is not set"), std::string::npos);
  auto mistral = testing::TinyConfig("mistral_window").ToJson();
  EXPECT_EQ(windows(mistral), (std::vector<int64_t>{5, 5}));
  mistral["sliding_window"] = nullptr;
  mistral.erase("layer_types");
  EXPECT_EQ(windows(mistral), (std::vector<int64_t>{0, 0}));
}

TEST(ModelFiles, SaveAndLoadRoundTripEveryFamily) {
  for (const auto& family : testing::TinyFamilies()) {
    auto config = testing::TinyConfig(family);
    auto model = testing::RandomModel(config, 5, torch::kFloat32);
    auto dir = testing::TempDir("roundtrip-" + family);
    SaveModel(model, dir);
    auto loaded = LoadModel(dir, torch::kFloat32);
    auto a = model->hf_tensors(), b = loaded->hf_tensors();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << family << " " << name;
    auto file = ReadSafetensors(dir + "/model.safetensors");
    EXPECT_EQ(file.tensors.count("lm_head.weight"), config.tie_word_embeddings ? 0u : 1u) << family;
    EXPECT_EQ(ModelConfig::FromFile(dir + "/config.json").ToJson()["tie_word_embeddings"],
              config.tie_word_embeddings);
    std::filesystem::remove_all(dir);
  }
}

TEST(ModelFiles, WeightsConvertToTheConfiguredDtype) {
  auto model = testing::RandomModel(testing::TinyConfig("qwen3"), 5, torch::kFloat32);
  auto dir = testing::TempDir("dtype");
  SaveModel(model, dir);
  auto as64 = LoadModel(dir, torch::kFloat64);
  auto asbf16 = LoadModel(dir, torch::kBFloat16);
  for (const auto& [name, t] : model->hf_tensors()) {
    EXPECT_TRUE(torch::equal(as64->hf_tensors().at(name), t.to(torch::kFloat64))) << name;
    EXPECT_EQ(asbf16->hf_tensors().at(name).scalar_type(), torch::kBFloat16);
  }
  std::filesystem::remove_all(dir);
}

TEST(ModelFiles, MissingOrMisShapedTensorIsAnErrorNamingIt) {
  auto config = testing::TinyConfig("qwen3");
  auto model = testing::RandomModel(config, 5, torch::kFloat32);
  auto before = model->hf_tensors();
  auto tensors = model->hf_tensors();
  tensors.erase("model.layers.1.self_attn.k_norm.weight");
  EXPECT_NE(ErrorOf([&] { model->load_hf_tensors(tensors); }).find("model.layers.1.self_attn.k_norm.weight"),
            std::string::npos);
  tensors = model->hf_tensors();
  tensors["model.layers.0.self_attn.q_proj.weight"] = torch::zeros({64, 31});
  auto msg = ErrorOf([&] { model->load_hf_tensors(tensors); });
  EXPECT_NE(msg.find("model.layers.0.self_attn.q_proj.weight: shape [64, 31], expected [64, 32]"),
            std::string::npos) << msg;
  tensors = model->hf_tensors();
  tensors["model.layers.9.mlp.up_proj.weight"] = torch::zeros({2});
  EXPECT_NE(ErrorOf([&] { model->load_hf_tensors(tensors); }).find("model.layers.9.mlp.up_proj.weight"),
            std::string::npos);
  // A failed load leaves the model as it was (the bad tensors were zeros).
  for (const auto& [name, t] : model->hf_tensors()) EXPECT_TRUE(torch::equal(t, before.at(name))) << name;
  EXPECT_THROW(LoadModel("/nonexistent/model", torch::kFloat32), NotFound);
}

TEST(ModelFiles, InitIsDeterministicAcrossDtypes) {
  auto a = InitModel(PresetConfig("tiny"), 42, torch::kFloat64);
  auto b = InitModel(PresetConfig("tiny"), 42, torch::kFloat32);
  auto c = InitModel(PresetConfig("tiny"), 43, torch::kFloat32);
  for (const auto& [name, t] : a->hf_tensors()) {
    EXPECT_TRUE(torch::equal(t.to(torch::kFloat32), b->hf_tensors().at(name))) << name;
  }
  EXPECT_FALSE(torch::equal(b->hf_tensors().at("model.embed_tokens.weight"),
                            c->hf_tensors().at("model.embed_tokens.weight")));
}

}  // namespace
}  // namespace streambp
