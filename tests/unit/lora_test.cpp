// LoRA adapters (docs/architecture.md: Models): exact adapter gradients through every engine, checked against
// an independent computation (the gradient of the merged weight W + s B A by plain autograd
// on a model without any adapter code, turned into dA = s B^T G and dB = s G A^T), a
// frozen base, PEFT files, merged export, reference from the base, checkpoints.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "streambp/data.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/trainer.h"
#include "test_util/fixtures.h"
#include "test_util/top_k.h"

namespace streambp {
namespace {

using testing::RandomModel;
using testing::RandomSequences;
using testing::TinyConfig;

// An adapter with random A and (nonzero) B (and a random router copy when it saves the
// router), so every term and gradient is exercised.
std::shared_ptr<LoraAdapter> RandomAdapter(const ModelConfig& model, LoraConfig config, uint64_t seed,
                                           torch::Dtype dtype = torch::kFloat64, const CausalLMImpl* base = nullptr) {
  auto adapter = LoraAdapter::Create(model, config, dtype, torch::kCPU, base);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : adapter->named_parameters()) {
    auto p = t;
    p.copy_(at::normal(0.0, 0.3, p.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat64)));
  }
  return adapter;
}

LoraConfig AllTargets(const ModelConfig& model, int64_t r, bool rslora) {
  LoraConfig c;
  c.r = r;
  c.alpha = 1.5 * static_cast<double>(r) + 1;
  c.use_rslora = rslora;
  if (!model.tie_word_embeddings) c.target_modules.push_back("lm_head");
  if (model.sparse_layers() > 0) c.modules_to_save = {"gate"};  // the router trains too
  return c;
}

std::vector<Sequence> SftSequences(int64_t vocab, uint64_t seed) { return RandomSequences({12, 7, 9, 3}, vocab, seed); }

std::vector<Sequence> DpoSequences(int64_t vocab, uint64_t seed) {
  auto raw = RandomSequences({4, 6, 3, 5, 7, 2}, vocab, seed);
  std::vector<Sequence> out;
  for (int p = 0; p < 2; ++p) {
    nlohmann::json j{{"prompt", raw[3 * p].tokens}, {"chosen", raw[3 * p + 1].tokens},
                     {"rejected", raw[3 * p + 2].tokens}, {"ref_chosen_logp", -10.0 - p},
                     {"ref_rejected_logp", -12.5 + 0.7 * p}};
    for (auto& s : ParseDpoExample(j, "pair", p)) out.push_back(s);
  }
  return out;
}

std::vector<Sequence> GrpoSequences(int64_t vocab, uint64_t seed) {
  auto raw = RandomSequences({3, 4, 6, 2, 5, 2, 3, 7}, vocab, seed);
  std::vector<Sequence> out;
  size_t next = 0;
  for (int g = 0; g < 2; ++g) {
    const auto prompt = raw[next++].tokens;
    for (int c = 0; c < 3; ++c) {
      Sequence s;
      s.tokens = prompt;
      const auto& comp = raw[next++ % raw.size()].tokens;
      s.tokens.insert(s.tokens.end(), comp.begin(), comp.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      s.group = g;
      s.reward = std::sin(1.3 * (c + 1) + g);
      s.sampler_logprobs.assign(prompt.size(), 0.0);
      for (size_t t = 0; t < comp.size(); ++t) s.sampler_logprobs.push_back(-4.0 - 0.1 * static_cast<double>(t + c));
      out.push_back(s);
    }
  }
  return out;
}

bool IsTinkerLoss(const std::string& kind) {
  return kind == "importance_sampling" || kind == "ppo" || kind == "cispo" || kind == "dro" ||
         kind.rfind("cross_entropy", 0) == 0;
}

std::unique_ptr<Objective> MakeObjective(const std::string& kind) {
  if (IsTinkerLoss(kind)) {  // clips that leave tokens on both sides
    RegisterBuiltinObjectives();
    if (kind == "ppo" || kind == "cispo") {
      return CreateObjective(kind, {{"clip_low_threshold", 0.8}, {"clip_high_threshold", 1.1}});
    }
    if (kind == "cross_entropy_top_k") return CreateObjective("cross_entropy", nlohmann::json::object());
    return CreateObjective(kind, kind == "dro" ? nlohmann::json{{"beta", 0.3}} : nlohmann::json::object());
  }
  if (kind == "sft") return MakeSftObjective({});
  if (kind == "weighted") return MakeWeightedLogprobsObjective({});
  if (kind == "dpo") return MakeDpoObjective({});
  GrpoOptions o;
  o.old_logprobs = "sampler";
  o.loss_type = "grpo";
  return MakeGrpoObjective(o);
}

std::vector<Sequence> Sequences(const std::string& kind, int64_t vocab, uint64_t seed) {
  if (kind == "sft") return SftSequences(vocab, seed);
  if (kind == "dpo") return DpoSequences(vocab, seed);
  if (IsTinkerLoss(kind)) {  // sampler log-probs around a random model's, advantages and weights of both signs
    auto seqs = SftSequences(vocab, seed);
    const double typical = -std::log(static_cast<double>(vocab));
    for (auto& s : seqs) {
      const size_t n = s.tokens.size();
      s.sampler_logprobs.assign(n, 0.0);
      s.advantages.assign(n, 0.0);
      s.token_weights.assign(n, 0.0);
      for (size_t t = 1; t < n; ++t) {
        s.sampler_logprobs[t] = typical + 0.5 * std::sin(1.7 * static_cast<double>(t) + static_cast<double>(n));
        s.advantages[t] = std::cos(0.9 * static_cast<double>(t * n));
        s.token_weights[t] = 0.4 * std::sin(static_cast<double>(t) + 0.5);
      }
    }
    if (kind == "cross_entropy_top_k") testing::AddTopK(seqs, vocab, 3);
    return seqs;
  }
  if (kind == "weighted") {  // client weights of both signs, some zero
    auto seqs = SftSequences(vocab, seed);
    for (auto& s : seqs) {
      s.token_weights.assign(s.tokens.size(), 0.0);
      for (size_t t = 1; t < s.tokens.size(); ++t) s.token_weights[t] = t % 3 == 0 ? 0.0 : 0.3 * std::sin(double(t));
    }
    return seqs;
  }
  return GrpoSequences(vocab, seed);
}

struct LoraCase {
  std::string family;
  int64_t r;
  bool rslora;
  std::string objective;
  Layout layout;
};

std::string CaseName(const ::testing::TestParamInfo<LoraCase>& info) {
  const auto& c = info.param;
  return c.family + "_r" + std::to_string(c.r) + (c.rslora ? "_rslora_" : "_") + c.objective + "_" +
         LayoutName(c.layout);
}

class LoraExactness : public ::testing::TestWithParam<LoraCase> {};

// Every engine gives the adapter gradient of the independent computation (1e-10 relative),
// and the same loss (1e-12); base weights get no gradient.
TEST_P(LoraExactness, AdapterGradientsEqualTheMergedWeightsGradient) {
  const auto& c = GetParam();
  const auto config = TinyConfig(c.family);
  auto model = RandomModel(config, 11, torch::kFloat64);
  auto adapter = RandomAdapter(config, AllTargets(config, c.r, c.rslora), 23, torch::kFloat64, model.get());
  const auto seqs = Sequences(c.objective, config.vocab_size, 5);
  const auto batch = MakeBatch(seqs, c.layout, c.layout == Layout::kPacked ? 16 : 0);

  // The independent side: a plain model holding W + s B A, full autograd, no adapter code.
  auto merged = RandomModel(config, 11, torch::kFloat64);
  model->set_adapter(adapter);
  merged->load_hf_tensors(model->merged_hf_tensors());
  model->set_adapter(nullptr);
  for (auto& p : merged->parameters()) p.requires_grad_(true);
  ZeroGradients(*merged);
  auto ref_objective = MakeObjective(c.objective);
  const auto ref = ForwardBackward(merged, batch, *ref_objective, {EngineKind::kFull});
  const auto g_merged = CollectGradients(*merged);
  TensorMap expected, params;
  const double s = adapter->scale();
  for (const auto& [name, t] : adapter->named_parameters()) params[name] = t.detach();
  for (const auto& [name, a] : params) {
    if (!name.ends_with(".lora_A.weight")) continue;
    const std::string module = name.substr(0, name.size() - std::string(".lora_A.weight").size());
    const auto& G = g_merged.at(module + ".weight");  // dL/dW of the merged weight
    const auto& b = params.at(module + ".lora_B.weight");
    expected[name] = s * torch::matmul(b.t(), G);                       // dL/dA = s B^T G
    expected[module + ".lora_B.weight"] = s * torch::matmul(G, a.t());  // dL/dB = s G A^T
  }
  // A module to save (the MoE router) is the merged model's weight: the same gradient.
  for (const auto& [name, w] : params) {
    if (name.ends_with(".mlp.gate.weight")) expected[name] = g_merged.at(name);
  }
  ASSERT_EQ(expected.size(), params.size());

  // The adapter side: a frozen base, the adapter attached, each engine.
  for (auto& p : model->parameters()) p.requires_grad_(false);
  for (auto& [name, t] : adapter->named_parameters()) t.requires_grad_(true);
  model->set_adapter(adapter);
  for (const auto& [name, options] : testing::EngineVariants(5, 3, 3)) {
    ZeroGradients(adapter->named_parameters());
    auto objective = MakeObjective(c.objective);
    const auto r = ForwardBackward(model, batch, *objective, options);
    EXPECT_NEAR(r.loss, ref.loss, 1e-12 * std::max(1.0, std::abs(ref.loss))) << name;
    const auto diff = CompareGradients(expected, CollectGradients(adapter->named_parameters()));
    EXPECT_LE(diff.max_relative, 1e-10) << name << " worst " << diff.worst;
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "a base weight got a gradient";
  }
  // Every adapter weight receives signal, but those of experts no token was routed to.
  const auto unused = testing::UnusedExperts(model, batch);
  for (const auto& [name, g] : expected) {
    if (testing::InUnusedExpert(unused, name)) {
      EXPECT_EQ(g.abs().max().item<double>(), 0) << name;
    } else if (name.find(".mlp.experts.") == std::string::npos) {
      // (An expert that only tokens without a training signal went to, e.g. prompt tokens in
      // the last layer, gets none: experts are checked by value, not for signal.)
      EXPECT_GT(g.abs().max().item<double>(), 0) << name;
    }
  }
}

std::vector<LoraCase> Cases() {
  std::vector<LoraCase> out;
  const std::pair<int64_t, bool> ranks[] = {{1, false}, {4, true}, {8, false}};
  // qwen3_moe_mixed: adapters on every expert's projections and a dense layer's, one rank.
  for (const char* family : {"llama3_tied", "qwen2", "qwen3", "llama_bias", "qwen3_moe_mixed"}) {
    for (const auto& [r, rslora] : ranks) {
      if (std::string(family) == "qwen3_moe_mixed" && r != 4) continue;
      for (const char* objective : {"sft", "dpo", "grpo", "weighted"}) {
        if (std::string(objective) == "weighted" && r != 4) continue;  // one rank is enough for it
        for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
          out.push_back({family, r, rslora, objective, layout});
        }
      }
    }
  }
  // Tinker's losses (their exactness against the loss written out per token is
  // policy_losses_test's): one family, one rank, every layout.
  for (const char* objective : {"importance_sampling", "ppo", "cispo", "dro", "cross_entropy", "cross_entropy_top_k"}) {
    for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
      out.push_back({"qwen3", 4, true, objective, layout});
    }
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(FamiliesRanksObjectivesLayouts, LoraExactness, ::testing::ValuesIn(Cases()), CaseName);

TEST(Lora, MergedWeightsGiveTheAdapterLogitsOfTheIndependentDecoder) {
  for (const char* family : {"llama3_tied", "qwen2", "qwen3", "qwen3_moe"}) {
    const auto config = TinyConfig(family);
    auto model = RandomModel(config, 3, torch::kFloat64);
    auto adapter = RandomAdapter(config, AllTargets(config, 4, false), 9, torch::kFloat64, model.get());
    model->set_adapter(adapter);
    const std::vector<int64_t> tokens = {5, 17, 3, 88, 42, 9, 60};
    auto batch = MakeBatch({Sequence{tokens}}, Layout::kRightPad);
    torch::Tensor with_adapter;
    {
      torch::NoGradGuard no_grad;
      auto x = model->embed(batch.input_ids);
      auto rope = model->rope_tables(batch.position_ids, x);
      auto mask = AttentionMask(batch, 0, batch.length(), batch.length());
      for (auto& layer : model->layer_list) x = layer->forward(x, rope, mask);
      with_adapter = model->logits(x)[0];
    }
    auto merged = RandomModel(config, 3, torch::kFloat64);
    merged->load_hf_tensors(model->merged_hf_tensors());
    const auto reference = testing::ReferenceLogits(*merged, tokens);  // loop-based, from the HF formulas
    const double diff = (with_adapter - reference).abs().max().item<double>();
    EXPECT_LE(diff, 1e-12 * std::max(1.0, reference.abs().max().item<double>())) << family;
  }
}

TEST(Lora, PeftFilesRoundTripBitExact) {
  const auto config = TinyConfig("qwen3");
  auto lora = AllTargets(config, 4, true);
  lora.base_model_name_or_path = "tiny-qwen3";
  auto adapter = RandomAdapter(config, lora, 4);
  const auto dir = testing::TempDir("peft");
  adapter->save(dir);
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
  EXPECT_EQ(j.at("peft_type"), "LORA");
  EXPECT_EQ(j.at("task_type"), "CAUSAL_LM");
  EXPECT_EQ(j.at("r"), 4);
  EXPECT_EQ(j.at("use_rslora"), true);
  EXPECT_EQ(j.at("bias"), "none");
  EXPECT_EQ(j.at("base_model_name_or_path"), "tiny-qwen3");
  const auto file = ReadSafetensors(dir + "/adapter_model.safetensors");
  EXPECT_TRUE(file.tensors.count("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(file.tensors.count("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"));
  EXPECT_TRUE(file.tensors.count("base_model.model.lm_head.lora_A.weight"));
  EXPECT_EQ(file.tensors.size(), static_cast<size_t>(2 * (7 * config.num_hidden_layers + 1)));
  auto loaded = LoraAdapter::Load(dir, config, torch::kFloat64);
  EXPECT_EQ(loaded->scale(), adapter->scale());
  const auto a = adapter->peft_tensors(), b = loaded->peft_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Lora, BadAdaptersAreClearErrors) {
  const auto config = TinyConfig("qwen3");
  const auto dir = testing::TempDir("peft-bad");
  auto adapter = RandomAdapter(config, AllTargets(config, 4, false), 4);
  adapter->save(dir);
  auto rewrite_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
    edit(j);
    std::ofstream(dir + "/adapter_config.json") << j.dump();
  };
  const auto original = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
  auto load = [&] { LoraAdapter::Load(dir, config, torch::kFloat64); };
  rewrite_config([](auto& j) { j["target_modules"].push_back("w_proj"); });
  EXPECT_NE(ErrorOf(load).find("'w_proj', which this model does not have"), std::string::npos) << ErrorOf(load);
  rewrite_config([&](auto& j) { j = original; j["r"] = 8; });
  EXPECT_NE(ErrorOf(load).find("its rank does not match r = 8"), std::string::npos) << ErrorOf(load);
  rewrite_config([&](auto& j) { j = original; j["lora_dropout"] = 0.1; });
  EXPECT_NE(ErrorOf(load).find("lora_dropout"), std::string::npos) << ErrorOf(load);
  rewrite_config([&](auto& j) { j = original; j["use_dora"] = true; });
  EXPECT_NE(ErrorOf(load).find("DoRA"), std::string::npos) << ErrorOf(load);
  rewrite_config([&](auto& j) { j = original; j["peft_type"] = "IA3"; });
  EXPECT_NE(ErrorOf(load).find("peft_type is 'IA3'"), std::string::npos) << ErrorOf(load);
  rewrite_config([&](auto& j) { j = original; });
  auto tensors = ReadSafetensors(dir + "/adapter_model.safetensors").tensors;
  tensors.erase("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
  WriteSafetensors(dir + "/adapter_model.safetensors", tensors);
  EXPECT_NE(ErrorOf(load).find("v_proj.lora_B.weight is missing"), std::string::npos) << ErrorOf(load);
  // lm_head on a model that ties it to the embedding.
  const auto tied = TinyConfig("qwen3_tied");
  LoraConfig with_head;
  with_head.target_modules = {"q_proj", "lm_head"};
  EXPECT_NE(ErrorOf([&] { LoraAdapter::Create(tied, with_head, torch::kFloat64); }).find("ties lm_head"),
            std::string::npos);
}

TrainerOptions AdapterTrainerOptions() {
  TrainerOptions o;
  o.optimizer.name = "adamw";
  o.optimizer.lr = 1e-2;
  o.engine = {EngineKind::kStream, 5, 3, false, 3};
  o.reference.use_reference_model = false;
  return o;
}

TEST(Lora, TrainingChangesOnlyTheAdapterAndCheckpointsResumeOnTheSameBaseOnly) {
  const auto config = TinyConfig("qwen2");
  auto model = RandomModel(config, 1, torch::kFloat64);
  const auto base_before = model->hf_tensors();
  auto lora = AllTargets(config, 4, false);
  lora.seed = 7;
  auto trainer = Trainer::Create(model, AdapterTrainerOptions(), LoraAdapter::Create(config, lora, torch::kFloat64));
  const auto adapter_before = trainer->adapter()->peft_tensors();
  auto objective = MakeSftObjective({});
  const auto seqs = SftSequences(config.vocab_size, 3);
  for (int i = 0; i < 2; ++i) trainer->train_step(seqs, *objective);
  for (const auto& [name, t] : model->hf_tensors()) EXPECT_TRUE(torch::equal(t, base_before.at(name))) << name;
  int changed = 0;
  for (const auto& [name, t] : trainer->adapter()->peft_tensors()) changed += !torch::equal(t, adapter_before.at(name));
  EXPECT_EQ(changed, static_cast<int>(adapter_before.size()));  // B leaves zero after the first step, then A moves

  const auto dir = testing::TempDir("lora-ckpt") + "/c";
  trainer->save_checkpoint(dir);
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter_model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));  // the base is not copied
  auto resumed = Trainer::LoadCheckpoint(dir, nullptr, model);
  EXPECT_EQ(resumed->step(), 2);
  // The same next step, bit for bit.
  trainer->train_step(seqs, *objective);
  resumed->train_step(seqs, *objective);
  const auto a = trainer->adapter()->peft_tensors(), b = resumed->adapter()->peft_tensors();
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  // Another base is refused, naming the reason.
  auto other = RandomModel(config, 2, torch::kFloat64);
  EXPECT_NE(ErrorOf([&] { Trainer::LoadCheckpoint(dir, nullptr, other); }).find("trained on a different base"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Trainer::LoadCheckpoint(dir); }).find("onto its base model"), std::string::npos);
}

// A bfloat16 base with a float32 adapter: gradients close to the float64 computation,
// float32 optimizer state, the base untouched.
TEST(Lora, Bfloat16BaseWithAFloat32Adapter) {
  const auto config = TinyConfig("qwen3");
  auto base16 = RandomModel(config, 1, torch::kBFloat16);
  auto base64 = RandomModel(config, 1, torch::kFloat64);
  base64->load_hf_tensors(base16->hf_tensors());  // the same (rounded) weights
  auto a32 = RandomAdapter(config, AllTargets(config, 4, false), 2, torch::kFloat32);
  auto a32_copy = LoraAdapter::Create(config, AllTargets(config, 4, false), torch::kFloat32);
  a32_copy->load_peft_tensors(a32->peft_tensors());
  auto a64 = LoraAdapter::Create(config, AllTargets(config, 4, false), torch::kFloat64);
  a64->load_peft_tensors(a32->peft_tensors());
  const auto seqs = SftSequences(config.vocab_size, 3);
  auto grads = [&](CausalLM& model, const std::shared_ptr<LoraAdapter>& adapter) {
    for (auto& p : model->parameters()) p.requires_grad_(false);
    for (auto& [name, t] : adapter->named_parameters()) t.requires_grad_(true);
    model->set_adapter(adapter);
    ZeroGradients(adapter->named_parameters());
    auto objective = MakeSftObjective({});
    ForwardBackward(model, MakeBatch(seqs, Layout::kPacked), *objective, {EngineKind::kStream, 5, 3, false, 3});
    return CollectGradients(adapter->named_parameters());
  };
  const auto g16 = grads(base16, a32), g64 = grads(base64, a64);
  for (const auto& [name, g] : g16) EXPECT_EQ(g.scalar_type(), torch::kFloat32) << name;
  // bfloat16 activations (8 mantissa bits) through the base cost what they cost without an
  // adapter: the adapter's error (as one vector) is no worse than the base's own
  // full-fine-tuning gradient in bfloat16 against float64.
  auto vector_error = [](const TensorMap& ref, const TensorMap& other) {
    double diff = 0, norm = 0;
    for (const auto& [name, g] : ref) {
      diff += (other.at(name).to(torch::kFloat64) - g.to(torch::kFloat64)).pow(2).sum().item<double>();
      norm += g.to(torch::kFloat64).pow(2).sum().item<double>();
    }
    return std::sqrt(diff / norm);
  };
  auto full_grads = [&](CausalLM& model) {
    model->set_adapter(nullptr);
    for (auto& p : model->parameters()) p.requires_grad_(true);
    ZeroGradients(*model);
    auto objective = MakeSftObjective({});
    ForwardBackward(model, MakeBatch(seqs, Layout::kPacked), *objective, {EngineKind::kStream, 5, 3, false, 3});
    auto g = CollectGradients(*model);
    ZeroGradients(*model);
    return g;
  };
  const double adapter_error = vector_error(g64, g16);
  // The same function without adapter code: the merged weights, in float64 and in bfloat16.
  base64->set_adapter(a64);
  const auto merged_weights = base64->merged_hf_tensors();
  base64->set_adapter(nullptr);
  auto merged64 = RandomModel(config, 1, torch::kFloat64), merged16 = RandomModel(config, 1, torch::kBFloat16);
  merged64->load_hf_tensors(merged_weights);
  merged16->load_hf_tensors(merged_weights);
  const double base_error = vector_error(full_grads(merged64), full_grads(merged16));
  std::printf("bfloat16 base: adapter gradient error %.3g; the merged model's gradient in bfloat16: %.3g\n",
              adapter_error, base_error);
  EXPECT_LE(adapter_error, 1.5 * base_error);
  EXPECT_LE(adapter_error, 0.1);

  auto options = AdapterTrainerOptions();
  auto trainer = Trainer::Create(base16, options, a32_copy);
  const auto before = base16->hf_tensors();
  auto objective = MakeSftObjective({});
  trainer->train_step(seqs, *objective);
  for (const auto& [key, t] : trainer->optimizer().state()) {
    if (key != "rng_state" && !key.starts_with("step/")) {
      EXPECT_EQ(t.scalar_type(), torch::kFloat32) << key;
    }
  }
  for (const auto& [name, t] : base16->hf_tensors()) EXPECT_TRUE(torch::equal(t, before.at(name))) << name;
}

TEST(Lora, DpoReferenceFromTheBaseEqualsTheSameReferenceGivenExplicitly) {
  const auto config = TinyConfig("qwen3");
  auto model = RandomModel(config, 1, torch::kFloat64);
  auto adapter = RandomAdapter(config, AllTargets(config, 4, false), 5);
  auto seqs = DpoSequences(config.vocab_size, 8);
  for (auto& s : seqs) s.ref_logp.reset();

  auto options = AdapterTrainerOptions();
  options.reference.use_reference_model = true;  // the base with the adapter off
  auto from_base = Trainer::Create(model, options, adapter);
  auto dpo = MakeDpoObjective({});
  const auto r1 = from_base->forward_backward(seqs, *dpo);
  const auto g1 = CollectGradients(adapter->named_parameters());
  from_base->zero_gradients();

  // The reference sums computed here on the base alone, then given with the pairs.
  auto explicit_seqs = seqs;
  {
    ScopedAdapter off(*model, nullptr);
    auto batch = MakeBatch(seqs, Layout::kRightPad);
    auto logp = TokenLogprobs(model, batch, 64);
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto mask = (batch.sequence_ids == static_cast<int64_t>(i)) & batch.target_mask;
      explicit_seqs[i].ref_logp = (logp * mask.to(torch::kFloat64)).sum().item<double>();
    }
  }
  options.reference.use_reference_model = false;
  auto given = Trainer::Create(model, options, adapter);
  auto dpo2 = MakeDpoObjective({});
  const auto r2 = given->forward_backward(explicit_seqs, *dpo2);
  const auto g2 = CollectGradients(adapter->named_parameters());
  EXPECT_NEAR(r1.loss, r2.loss, 1e-12 * std::abs(r2.loss));
  EXPECT_LE(CompareGradients(g2, g1).max_relative, 1e-12);
}

}  // namespace
}  // namespace streambp
