// Every family against an independent float64 reference with its own autograd: the loop-based
// forward of tests/test_util (written from the Hugging Face definitions, reading config.json's
// fields, not the decoder's) differentiated by autograd gives the reference gradients, and
// every engine's gradients equal them (docs/architecture.md: Models, Engines). Gemma3's
// config rules (layer types, per-type RoPE, defaults, refusals) follow HF's Gemma3TextConfig.
#include <cstdio>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using nlohmann::json;

using testing::ErrorOf;

struct FamilyCase {
  std::string family;
  Layout layout;
};

class ReferenceGradients : public ::testing::TestWithParam<FamilyCase> {};

// Chunks of 5, logits chunks of 7, key tiles of 3 (smaller than the window of 5): every
// engine variant's loss and gradients equal the reference's to 1e-10 relative, every
// parameter receiving signal. Sequences hold the pad token (where the config names one), so
// the padding row's gradient is what HF's nn.Embedding(padding_idx) gives.
TEST_P(ReferenceGradients, EveryEngineMatchesTheReferenceAutograd) {
  const auto& p = GetParam();
  auto config = testing::TinyConfig(p.family);
  auto model = testing::RandomModel(config, 31, torch::kFloat64);
  auto seqs = testing::RandomSequences({13, 8, 21}, config.vocab_size, 9);
  if (config.pad_token_id) {
    for (auto& s : seqs) s.tokens[3] = *config.pad_token_id;
  }
  double gap = 1.0;
  const auto [ref_loss, ref_grads] = testing::ReferenceSft(*model, seqs, &gap);
  if (config.num_experts > 0) {
    // Mixture of experts: no token's k-th and (k+1)-th router probabilities are near a tie,
    // so the top-k choice is well defined (and the same in every engine).
    std::printf("%s: smallest top-k router margin %.6g\n", p.family.c_str(), gap);
    EXPECT_GT(gap, 1e-6) << p.family;
  }
  auto batch = MakeBatch(seqs, p.layout, p.layout == Layout::kPacked ? 24 : 0);
  for (const auto& [name, options] : testing::EngineVariants(5, 7, 3)) {
    ZeroGradients(*model);
    auto objective = MakeSftObjective({});
    auto r = ForwardBackward(model, batch, *objective, options);
    auto grads = CollectGradients(*model);
    auto diff = CompareGradients(ref_grads, grads);
    EXPECT_LE(diff.max_relative, 1e-10) << p.family << " " << name << " worst " << diff.worst;
    EXPECT_NEAR(r.loss, ref_loss, 1e-12 * std::abs(ref_loss)) << p.family << " " << name;
  }
  for (const auto& [name, g] : ref_grads) EXPECT_GT(g.abs().max().item<double>(), 0) << name;
  if (config.pad_token_id && !config.tie_word_embeddings) {
    // Untied: the padding row learns nothing (its lookups have no gradient, no head reads it).
    EXPECT_EQ(ref_grads.at("model.embed_tokens.weight")[*config.pad_token_id].abs().max().item<double>(), 0);
  }
}

std::vector<FamilyCase> Cases() {
  std::vector<FamilyCase> out;
  for (const char* f : {"llama", "qwen3_tied", "mistral_window", "qwen2_window", "gemma3", "gemma3_untied", "qwen3_moe",
                        "qwen3_moe_mixed"}) {
    for (auto layout : {Layout::kLeftPad, Layout::kPacked}) out.push_back({f, layout});
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Families, ReferenceGradients, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<FamilyCase>& info) {
                           return info.param.family + "_" + LayoutName(info.param.layout);
                         });

// A Gemma3 config.json with only what a real one must hold: HF's Gemma3TextConfig defaults
// fill the rest.
json MinimalGemma3(int64_t layers) {
  return json{{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"},
              {"vocab_size", 97},  {"hidden_size", 48},
              {"intermediate_size", 64}, {"num_hidden_layers", layers},
              {"num_attention_heads", 4}, {"num_key_value_heads", 1},
              {"head_dim", 16}};
}

TEST(Gemma3Config, DefaultsAndLayerTypesFollowHuggingFace) {
  auto c = ModelConfig::FromJson(MinimalGemma3(13));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 16.0);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_EQ(c.norm_kind, NormKind::kOffsetOne);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.final_logit_softcapping.has_value());
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_DOUBLE_EQ(*c.rope_local_base_freq, 10000.0);
  // sqrt(48) held as a float32 number, as HF's buffer holds it.
  EXPECT_EQ(c.embed_scale, static_cast<double>(std::sqrt(48.0f)));
  EXPECT_NE(c.embed_scale, std::sqrt(48.0));
  // Every sixth layer global (the default pattern), the others sliding 4096 with the local RoPE.
  for (int64_t l = 0; l < 13; ++l) {
    const bool global = (l + 1) % 6 == 0;
    EXPECT_EQ(c.window(l), global ? 0 : 4096) << l;
    EXPECT_EQ(c.rope_kind(l), global ? 0 : 1) << l;
  }
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
  auto j = MinimalGemma3(4);
  j["sliding_window_pattern"] = 2;
  j["sliding_window"] = 9;
  c = ModelConfig::FromJson(j);
  EXPECT_EQ((std::vector<int64_t>{c.window(0), c.window(1), c.window(2), c.window(3)}),
            (std::vector<int64_t>{9, 0, 9, 0}));
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  c = ModelConfig::FromJson(j);
  EXPECT_EQ(c.window(0) + c.window(1) + c.window(2) + c.window(3), 0);
  EXPECT_EQ(c.rope_kind(0), 0);
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
  // The newer layout: RoPE per layer type.
  j.erase("layer_types");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 2e5}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 3e3}}}};
  c = ModelConfig::FromJson(j);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 2e5);
  EXPECT_DOUBLE_EQ(*c.rope_local_base_freq, 3e3);
  auto explicit_pad = MinimalGemma3(2);
  explicit_pad["pad_token_id"] = nullptr;
  c = ModelConfig::FromJson(explicit_pad);
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(ModelConfig::FromJson(c.ToJson()).ToJson(), c.ToJson());
}

TEST(Gemma3Config, WhatWouldChangeTheMathIsReadOrRefusedByName) {
  auto with = [](const std::function<void(json&)>& edit) {
    json j = MinimalGemma3(2);
    edit(j);
    return ErrorOf([&] { ModelConfig::FromJson(j); });
  };
  EXPECT_NE(with([](json& j) { j["use_bidirectional_attention"] = true; }).find("use_bidirectional_attention"),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j["hidden_activation"] = "relu"; }).find("hidden_activation"), std::string::npos);
  EXPECT_NE(with([](json& j) {
              j["rope_parameters"] = {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}};
            }).find("sliding_attention"),
            std::string::npos);
  EXPECT_NE(with([](json& j) {
              j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}},
                                      {"chunked_attention", {{"rope_type", "default"}}}};
            }).find("chunked_attention"),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j["final_logit_softcapping"] = -1.0; }).find("final_logit_softcapping"),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j["query_pre_attn_scalar"] = 0; }).find("query_pre_attn_scalar"), std::string::npos);
  EXPECT_NE(with([](json& j) { j["pad_token_id"] = 97; }).find("pad_token_id 97"), std::string::npos);
  EXPECT_NE(with([](json& j) { j["architectures"] = {"Gemma3ForConditionalGeneration"}; })
                .find("'Gemma3ForConditionalGeneration' is not supported"),
            std::string::npos);
  EXPECT_EQ(with([](json&) {}), "");
}

// Each Gemma3 field is used, not silently ignored: a model built with the field changed
// computes what the reference computes with that field, and something else than before.
TEST(Gemma3Model, EveryFieldChangesTheLogitsAsTheReferenceSays) {
  const auto base = testing::TinyConfig("gemma3").ToJson();
  auto model = testing::RandomModel(ModelConfig::FromJson(base), 3, torch::kFloat64);
  const auto weights = model->hf_tensors();
  const auto tokens = testing::RandomSequences({14}, 97, 5)[0].tokens;
  auto logits = [&](const json& j) {
    CausalLM m(ModelConfig::FromJson(j));
    m->to(torch::kFloat64);
    m->load_hf_tensors(weights);
    torch::NoGradGuard no_grad;
    Sequence seq;
    seq.tokens = tokens;
    seq.loss_mask.assign(tokens.size(), 1);
    auto batch = MakeBatch({seq}, Layout::kRightPad);
    const int64_t T = batch.length();
    auto x = m->embed(batch.input_ids);
    auto rope = m->rope_tables(batch.position_ids, x);
    for (int64_t l = 0; l < m->config().num_hidden_layers; ++l) {
      x = m->layer_list[l]->forward(x, rope, AttentionMask(batch, 0, T, T, m->config().window(l)));
    }
    auto ours = m->logits(x)[0];
    auto ref = testing::ReferenceLogits(*m, tokens);
    EXPECT_LE((ours - ref).abs().max().item<double>(), 1e-12 * ref.abs().max().item<double>()) << j.dump();
    return ours;
  };
  const auto before = logits(base);
  const std::vector<std::pair<std::string, std::function<void(json&)>>> edits = {
      {"final_logit_softcapping", [](json& j) { j["final_logit_softcapping"] = nullptr; }},
      {"query_pre_attn_scalar", [](json& j) { j["query_pre_attn_scalar"] = 16; }},
      {"rope_local_base_freq", [](json& j) { j["rope_local_base_freq"] = 10000.0; }},
      {"sliding_window", [](json& j) { j["sliding_window"] = 3; }},
      {"layer_types", [](json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; }},
  };
  for (const auto& [what, edit] : edits) {
    json j = base;
    edit(j);
    EXPECT_GT((logits(j) - before).abs().max().item<double>(), 1e-6) << what << " changed nothing";
  }
  // Soft-capped logits stay inside (-3, 3).
  EXPECT_LT(before.abs().max().item<double>(), 3.0);
}

}  // namespace
}  // namespace streambp
