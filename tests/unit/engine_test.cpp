// The three engines give the same loss and gradients (docs/architecture.md: Engines), and StreamBP uses less
// memory than checkpointing, which uses less than plain autograd.
#include <gtest/gtest.h>

#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/memory.h"
#include "streambp/sampler.h"
#include "test_util/fixtures.h"
#include "test_util/objective_steps.h"
#include "../../core/src/model/tiled_attention.h"

namespace streambp {
namespace {

using testing::RandomModel;
using testing::RandomSequences;
using testing::TinyConfig;

struct RunOutput {
  double loss;
  TensorMap grads;
};

RunOutput RunEngine(CausalLM& model, const Batch& batch, const EngineOptions& options) {
  ZeroGradients(*model);
  auto objective = MakeSftObjective({});
  auto result = ForwardBackward(model, batch, *objective, options);
  RunOutput out{result.loss, CollectGradients(*model)};
  ZeroGradients(*model);
  return out;
}

struct ChunkCase {
  const char* name;
  int64_t chunk;
  int64_t logits_chunk;
  int64_t key_chunk;  // stream's attention key tile (0: the default, larger than T: no tiling)
};
// Sequence lengths below give T = 12: 4 divides it, 5 and 7 do not, 1 is the extreme,
// 64 is larger than T. Key tiles of 4, 3 and 1 make chunks attend over several tiles, some
// of them masked for every key of a row (left padding, packing, the sliding window).
constexpr ChunkCase kChunkCases[] = {{"divides", 4, 6, 4},
                                     {"not_dividing", 5, 7, 3},
                                     {"one", 1, 1, 1},
                                     {"larger_than_T", 64, 64, 0}};

struct ExactnessParam {
  std::string family;
  Layout layout;
  ChunkCase chunks;
};

std::string ParamName(const ::testing::TestParamInfo<ExactnessParam>& info) {
  return info.param.family + "_" + LayoutName(info.param.layout) + "_" + info.param.chunks.name;
}

class EngineExactness : public ::testing::TestWithParam<ExactnessParam> {};

// float64: stream and checkpoint agree with full to 1e-10 relative on every parameter.
TEST_P(EngineExactness, Float64GradientsMatchFull) {
  const auto& p = GetParam();
  auto config = TinyConfig(p.family);
  auto model = RandomModel(config, 11, torch::kFloat64);
  auto seqs = RandomSequences({12, 7, 9, 3}, config.vocab_size, 5);
  // packed: rows of 16 hold several sequences each
  auto batch = MakeBatch(seqs, p.layout, p.layout == Layout::kPacked ? 16 : 0);
  ASSERT_GE(batch.rows(), 2);
  auto full = RunEngine(model, batch, {EngineKind::kFull});
  for (auto variant : {"checkpoint", "checkpoint:tiled", "stream"}) {
    const auto kind = std::string(variant) == "stream" ? EngineKind::kStream : EngineKind::kCheckpoint;
    EngineOptions options{kind, p.chunks.chunk, p.chunks.logits_chunk, false, p.chunks.key_chunk};
    // checkpoint:tiled: query blocks of `chunk`, key tiles of `key_chunk`, chunked logits.
    options.tiled_attention = std::string(variant) == "checkpoint:tiled";
    auto other = RunEngine(model, batch, options);
    auto diff = CompareGradients(full.grads, other.grads);
    EXPECT_LE(diff.max_relative, 1e-10) << variant << " worst " << diff.worst;
    EXPECT_NEAR(other.loss, full.loss, 1e-12 * std::abs(full.loss)) << variant;
  }
  // The K/V-per-chunk ablation is exact too.
  auto ablation = RunEngine(
      model, batch, {EngineKind::kStream, p.chunks.chunk, p.chunks.logits_chunk, true, p.chunks.key_chunk});
  EXPECT_LE(CompareGradients(full.grads, ablation.grads).max_relative, 1e-10);
  // Gradients are not trivially zero anywhere: every parameter receives signal, except the
  // experts of a mixture that the routers sent no token of this batch to (exactly zero there).
  const auto unused = testing::UnusedExperts(model, batch);
  for (const auto& [name, g] : full.grads) {
    if (testing::InUnusedExpert(unused, name)) {
      EXPECT_EQ(g.abs().max().item<double>(), 0) << name;
    } else if (name.find(".mlp.experts.") == std::string::npos) {
      // (An expert that only tokens without a training signal went to, e.g. prompt tokens in
      // the last layer, gets none: experts are checked by value, not for signal.)
      EXPECT_GT(g.abs().max().item<double>(), 0) << name;
    }
  }
}

std::vector<ExactnessParam> AllCases() {
  std::vector<ExactnessParam> out;
  for (const auto& f : testing::TinyFamilies()) {
    for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
      for (const auto& c : kChunkCases) out.push_back({f, layout, c});
    }
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(AllFamiliesLayoutsChunks, EngineExactness, ::testing::ValuesIn(AllCases()),
                         ParamName);

// Two threads: the tiled attention then splits each call's heads between them (the tests run
// one thread unless told). Stream and checkpoint:tiled agree with full on one thread to 1e-10
// in float64, a sliding-window family and packed rows included.
TEST(EngineThreads, TwoThreadsMatchFullOnOne) {
  testing::RestoreThreads restore;
  for (const std::string family : {"qwen3", "gemma3"}) {
    auto config = TinyConfig(family);
    auto model = RandomModel(config, 13, torch::kFloat64);
    auto seqs = RandomSequences({12, 7, 9, 3}, config.vocab_size, 7);
    for (auto layout : {Layout::kRightPad, Layout::kPacked}) {
      auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
      at::set_num_threads(1);
      auto full = RunEngine(model, batch, {EngineKind::kFull});
      at::set_num_threads(2);
      ASSERT_EQ(TiledAttentionThreads(batch.rows() * config.num_key_value_heads, torch::kCPU), 2)
          << family << " " << LayoutName(layout) << ": " << batch.rows() << " rows";
      for (bool stream : {true, false}) {
        EngineOptions options{stream ? EngineKind::kStream : EngineKind::kCheckpoint, 5, 7, false, 3};
        options.tiled_attention = !stream;
        auto other = RunEngine(model, batch, options);
        auto diff = CompareGradients(full.grads, other.grads);
        EXPECT_LE(diff.max_relative, 1e-10)
            << family << " " << LayoutName(layout) << (stream ? " stream" : " checkpoint:tiled") << " worst "
            << diff.worst;
        EXPECT_NEAR(other.loss, full.loss, 1e-12 * std::abs(full.loss)) << family;
      }
    }
  }
}

// float32: within 1e-4 relative.
TEST(EngineFloat32, GradientsMatchFull) {
  for (const auto& family : testing::TinyFamilies()) {
    auto config = TinyConfig(family);
    auto model = RandomModel(config, 3, torch::kFloat32);
    auto batch = MakeBatch(RandomSequences({40, 33, 17}, config.vocab_size, 9), Layout::kRightPad);
    auto full = RunEngine(model, batch, {EngineKind::kFull});
    for (auto [kind, tiled] : {std::pair{EngineKind::kCheckpoint, false}, std::pair{EngineKind::kCheckpoint, true},
                               std::pair{EngineKind::kStream, false}}) {
      EngineOptions options{kind, 7, 9, false, 6};
      options.tiled_attention = tiled;
      auto other = RunEngine(model, batch, options);
      auto diff = CompareGradients(full.grads, other.grads);
      EXPECT_LE(diff.max_relative, 1e-4) << family << " " << EngineName(kind) << (tiled ? ":tiled " : " ") << diff.worst;
      EXPECT_NEAR(other.loss, full.loss, 1e-5 * std::abs(full.loss));
    }
  }
}

// bfloat16 runs (norms, softmax and logits in float32) and is as accurate as plain autograd
// in bfloat16: each engine's gradients are measured against float64 autograd on the same
// (bfloat16-valued) weights, and the chunked engines may not stray further from it than
// the unchunked one does (bfloat16 itself is ~5% off on these weights, so comparing two
// bfloat16 runs with each other says little). float16 is refused on the CPU with a clear
// error instead of an internal failure deep in a kernel.
TEST(EngineBfloat16, AsAccurateAsAutogradAgainstFloat64) {
  auto config = TinyConfig("qwen3");
  auto model = RandomModel(config, 3, torch::kBFloat16);
  auto exact = RandomModel(config, 3, torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    auto low = model->named_hf_parameters();
    auto high = exact->named_hf_parameters();
    ASSERT_EQ(low.size(), high.size());
    for (size_t i = 0; i < low.size(); ++i) high[i].second.copy_(low[i].second);
  }
  auto batch = MakeBatch(RandomSequences({40, 33}, config.vocab_size, 9), Layout::kPacked, 80);
  auto truth = RunEngine(exact, batch, {EngineKind::kFull});
  auto full = RunEngine(model, batch, {EngineKind::kFull});
  const auto full_error = CompareGradients(truth.grads, full.grads);
  EXPECT_LE(full_error.max_relative, 2 * GradientTolerance(torch::kBFloat16)) << full_error.worst;
  EXPECT_NEAR(full.loss, truth.loss, 1e-2 * std::abs(truth.loss));
  for (auto kind : {EngineKind::kStream, EngineKind::kCheckpoint}) {
    auto other = RunEngine(model, batch, {kind, 7, 9, false, 6});
    const auto error = CompareGradients(truth.grads, other.grads);
    EXPECT_LE(error.max_relative, 1.25 * full_error.max_relative + 1e-3)
        << EngineName(kind) << " " << error.worst << " (autograd in bfloat16: " << full_error.max_relative << ")";
    EXPECT_NEAR(other.loss, truth.loss, 1e-2 * std::abs(truth.loss)) << EngineName(kind);
  }
  EXPECT_THROW(InitModel(config, 0, torch::kFloat16), InvalidArgument);
}

// The loss of the engines is the cross-entropy of the independent reference logits:
// the model and the chunked head compute what the HF formulas say.
TEST(EngineLoss, MatchesReferenceModelCrossEntropy) {
  for (const auto& family : testing::TinyFamilies()) {
    auto config = TinyConfig(family);
    auto model = RandomModel(config, 21, torch::kFloat64);
    auto seqs = RandomSequences({10, 6}, config.vocab_size, 2);
    double nll = 0;
    int64_t count = 0;
    for (const auto& s : seqs) {
      auto logp = torch::log_softmax(testing::ReferenceLogits(*model, s.tokens), -1);
      for (size_t t = 1; t < s.tokens.size(); ++t) {
        if (!s.loss_mask[t]) continue;
        nll -= logp[t - 1][s.tokens[t]].item<double>();
        ++count;
      }
    }
    auto batch = MakeBatch(seqs, Layout::kLeftPad);
    auto objective = MakeSftObjective({});
    auto r = ForwardBackward(model, batch, *objective, {EngineKind::kStream, 3, 4});
    EXPECT_NEAR(r.loss, nll / count, 1e-12) << family;
    EXPECT_EQ(r.targets, count);
    ZeroGradients(*model);
  }
}

TEST(EngineInputs, BadBatchIsRejectedBeforeAnythingRuns) {
  auto config = TinyConfig("qwen3");
  auto model = RandomModel(config, 1, torch::kFloat64);
  auto batch = MakeBatch(RandomSequences({5, 4}, config.vocab_size, 1), Layout::kRightPad);
  batch.input_ids[0][2] = config.vocab_size;  // one past the vocabulary
  auto objective = MakeSftObjective({});
  try {
    ForwardBackward(model, batch, *objective, {EngineKind::kStream});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  Batch empty;
  EXPECT_THROW(ForwardBackward(model, empty, *objective, {EngineKind::kFull}), InvalidArgument);
}

// Samples completions and returns the largest difference between the sampler's
// log-probabilities of its own tokens and TokenLogprobs (what ComputeLogprobs and the trainer
// use) of prompt + completion; `samples` gets the completions.
double WorstSampledLogprobError(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                const SampleOptions& options, std::vector<SampledCompletion>* samples) {
  *samples = SampleCompletions(model, prompts, options);
  std::vector<Sequence> full;
  for (const auto& c : *samples) {
    Sequence seq;
    seq.tokens = prompts[c.prompt_index];
    seq.tokens.insert(seq.tokens.end(), c.tokens.begin(), c.tokens.end());
    seq.loss_mask.assign(seq.tokens.size(), 1);
    full.push_back(seq);
  }
  auto logprobs = TokenLogprobs(model, MakeBatch(full, Layout::kRightPad));
  double worst = 0;
  for (size_t i = 0; i < samples->size(); ++i) {
    const auto& c = (*samples)[i];
    EXPECT_EQ(c.logprobs.size(), c.tokens.size());
    const int64_t plen = static_cast<int64_t>(prompts[c.prompt_index].size());
    for (size_t t = 0; t < c.tokens.size() && t < c.logprobs.size(); ++t) {
      const double want = logprobs[static_cast<int64_t>(i)][plen - 1 + static_cast<int64_t>(t)].item<double>();
      worst = std::max(worst, std::abs(c.logprobs[t] - want));
    }
  }
  return worst;
}

// Sampling with a prompt longer than a chunk: the prefill runs chunk by chunk with key
// tiles (prompts of 1300 and 700 tokens: three chunks, the last one tiled), and the
// sampled tokens' log-probabilities equal TokenLogprobs of prompt + completion (float64).
TEST(Sampler, LongPromptPrefillIsExact) {
  auto config = TinyConfig("qwen3");
  auto model = RandomModel(config, 5, torch::kFloat64);
  auto seqs = RandomSequences({1300, 700}, config.vocab_size, 8);
  SampleOptions options;
  options.n = 2;
  options.max_tokens = 4;
  options.seed = 3;
  std::vector<SampledCompletion> samples;
  EXPECT_LE(WorstSampledLogprobError(model, {seqs[0].tokens, seqs[1].tokens}, options, &samples), 1e-9);
  EXPECT_EQ(samples.size(), 4u);
}

// A model with sliding-window layers (Mistral: all of them; Qwen2: from max_window_layers on,
// here layer 1 of 2; Gemma3: layer 0 with its own RoPE base; window 5): the sampler's log-probabilities of its own tokens equal
// TokenLogprobs of prompt + completion, in float64, with completions of 12 tokens past
// prompts of 3, 9 and 600 (a prefill over two chunks): the prefill's mask and each decoding
// step see only the window, and the cache keeps only what the window needs. (The sampler
// ignored the window: 2.47 nats apart on Mistral, 1.57 on Qwen2, in this test.)
TEST(Sampler, SlidingWindowLogprobsEqualTheTrainers) {
  for (const char* family : {"mistral_window", "qwen2_window", "gemma3"}) {
    auto config = TinyConfig(family);
    ASSERT_EQ(*config.sliding_window, 5);
    auto model = RandomModel(config, 6, torch::kFloat64);
    auto seqs = RandomSequences({3, 9, 600}, config.vocab_size, 4);
    SampleOptions options;
    options.n = 2;
    options.max_tokens = 12;
    options.seed = 7;
    std::vector<SampledCompletion> samples;
    const double worst =
        WorstSampledLogprobError(model, {seqs[0].tokens, seqs[1].tokens, seqs[2].tokens}, options, &samples);
    EXPECT_LE(worst, 1e-10) << family << ": sampled log-probs differ from the trainer's";
    ASSERT_EQ(samples.size(), 6u);
    for (const auto& c : samples) EXPECT_EQ(c.tokens.size(), 12u) << family;
  }
}

// Peak tracked bytes on a sequence long enough to matter, measured in the same run.
class EngineMemory : public ::testing::Test {
 protected:
  void SetUp() override { memory::InstallTrackingAllocator(); }
  // Gradients of the parameters are allocated during the step; every engine is measured
  // from the same starting point, so they count alike.
  static int64_t Peak(CausalLM& model, const Batch& batch, const EngineOptions& options) {
    return testing::TrackedSftPeak(model, batch, options);
  }
};

TEST_F(EngineMemory, StreamBelowCheckpointBelowFull) {
  auto model = InitModel(PresetConfig("tiny"), 0, torch::kFloat32);
  auto batch = MakeBatch(RandomSequences({1024}, 256, 4), Layout::kRightPad);
  const int64_t full = Peak(model, batch, {EngineKind::kFull});
  const int64_t checkpoint = Peak(model, batch, {EngineKind::kCheckpoint});
  const int64_t stream = Peak(model, batch, {EngineKind::kStream, 128, 128});
  RecordProperty("full_bytes", std::to_string(full));
  RecordProperty("checkpoint_bytes", std::to_string(checkpoint));
  RecordProperty("stream_bytes", std::to_string(stream));
  std::printf("peak bytes at T=1024: full %lld, checkpoint %lld, stream %lld\n", (long long)full,
              (long long)checkpoint, (long long)stream);
  EXPECT_LT(stream, checkpoint);
  EXPECT_LT(checkpoint, full);
  // One layer's attention scores alone are H*T*T floats = 16 MiB; StreamBP never holds them.
  EXPECT_LT(stream, 4 * 1024 * 1024 * 4);
}

// Key tiles bound the attention working set of a chunk: with a chunk of 128 queries at
// T=2048 the untiled scores are H x 128 x 2048 floats (4 MiB per tensor, several alive);
// tiles of 128 keys cut the peak, and the gradients stay those of the untiled engine.
TEST_F(EngineMemory, KeyTilesBoundAttentionMemory) {
  auto model = InitModel(PresetConfig("tiny"), 0, torch::kFloat32);
  auto batch = MakeBatch(RandomSequences({2048}, 256, 4), Layout::kRightPad);
  const int64_t untiled = Peak(model, batch, {EngineKind::kStream, 128, 128, false, 2048});
  const int64_t tiled = Peak(model, batch, {EngineKind::kStream, 128, 128, false, 128});
  std::printf("peak bytes at T=2048, chunk 128: untiled %lld, key tiles of 128 %lld\n",
              (long long)untiled, (long long)tiled);
  const int64_t scores_bytes = 4LL * 128 * 2048 * 4;  // H x chunk x T floats
  EXPECT_LT(tiled + 3 * scores_bytes / 2, untiled);
}

// An out-of-memory error in the middle of a backward leaves nothing behind on the thread:
// the memory the step held is free once ForwardBackward has thrown (LibTorch's autograd
// would otherwise keep the failed graph's buffers until the thread's next backward), and
// the same step then runs under the same budget it fits in.
TEST_F(EngineMemory, OutOfMemoryInBackwardFreesItsBuffers) {
  auto model = InitModel(PresetConfig("tiny"), 0, torch::kFloat32);
  auto batch = MakeBatch(RandomSequences({1024}, 256, 4), Layout::kRightPad);
  for (auto kind : {EngineKind::kFull, EngineKind::kCheckpoint, EngineKind::kStream}) {
    const EngineOptions options{kind, 128, 128};
    const int64_t peak = Peak(model, batch, options);  // ends with the gradients freed
    const int64_t live_before = memory::LiveBytes();
    bool threw = false;
    {
      memory::ScopedBudget budget(live_before + peak * 3 / 4);
      auto objective = MakeSftObjective({});
      try {
        ForwardBackward(model, batch, *objective, options);
      } catch (const c10::OutOfMemoryError&) {
        threw = true;
      }
    }
    ASSERT_TRUE(threw) << EngineName(kind) << ": 3/4 of the step's peak must not fit";
    ZeroGradients(*model);  // as the Trainer does after a failed step
    EXPECT_LE(memory::LiveBytes() - live_before, peak / 20)
        << EngineName(kind) << ": the failed step's buffers are still alive";
    ZeroGradients(*model);
    memory::ScopedBudget budget(live_before + peak + peak / 10);
    auto objective = MakeSftObjective({});
    EXPECT_NO_THROW(ForwardBackward(model, batch, *objective, options)) << EngineName(kind);
    ZeroGradients(*model);
  }
}

// The analytic estimate the server refuses steps with (and picks chunk sizes by) tracks
// the measured peak of every engine: it may be conservative but never far below.
TEST_F(EngineMemory, EstimateTracksMeasuredPeak) {
  auto config = PresetConfig("tiny");
  config.vocab_size = 4096;  // so that the logits weigh as they do in real models
  auto model = InitModel(config, 0, torch::kFloat32);
  for (int64_t T : {512, 2048}) {
    auto batch = MakeBatch(RandomSequences({T, T}, config.vocab_size, 4), Layout::kRightPad);
    EngineOptions tiled{EngineKind::kCheckpoint, 256, 256, false, 512};
    tiled.tiled_attention = true;
    for (const EngineOptions& options : {EngineOptions{EngineKind::kFull}, EngineOptions{EngineKind::kCheckpoint},
                                         EngineOptions{EngineKind::kCheckpoint, 0, 256}, tiled,
                                         EngineOptions{EngineKind::kStream, 256, 256, false, 256},
                                         EngineOptions{EngineKind::kStream, 128, 512, false, 1024},
                                         EngineOptions{EngineKind::kStream}}) {  // DefaultChunks'
      if (options.kind == EngineKind::kFull && T > 512) continue;
      const auto estimate = EstimateStepMemory(config, torch::kFloat32, 2, T, options, "none");
      const int64_t measured = Peak(model, batch, options) - estimate.gradient_bytes;
      const double ratio = static_cast<double>(estimate.activation_bytes) / static_cast<double>(measured);
      std::printf("T=%lld %s%s chunk %lld logits %lld keys %lld: measured %.1f MiB, estimate %.1f MiB (%.2fx)\n",
                  (long long)T, EngineName(options.kind).c_str(), options.tiled_attention ? ":tiled" : "", (long long)estimate.chunk,
                  (long long)estimate.logits_chunk, (long long)estimate.key_chunk, measured / 1048576.0,
                  estimate.activation_bytes / 1048576.0, ratio);
      EXPECT_GE(ratio, 0.9) << "T=" << T << " " << EngineName(options.kind);
      EXPECT_LE(ratio, 2.5) << "T=" << T << " " << EngineName(options.kind);
    }
  }
}

// A bfloat16 model: the stream engine's dK/dV sinks are float32 whatever the model's dtype
// (the estimate once counted them at 2 bytes), and the head's logits exist in bfloat16 before
// their float32 upcast (without them the estimate was 0.90x of the measured peak).
TEST_F(EngineMemory, EstimateTracksMeasuredPeakInBfloat16) {
  auto config = PresetConfig("tiny");
  config.vocab_size = 4096;
  auto model = InitModel(config, 0, torch::kBFloat16);
  const int64_t T = 2048;
  auto batch = MakeBatch(RandomSequences({T, T}, config.vocab_size, 4), Layout::kRightPad);
  for (const EngineOptions& options : {EngineOptions{EngineKind::kStream, 256, 256, false, 256},
                                       EngineOptions{EngineKind::kStream, 128, 512, false, 1024}}) {
    const auto estimate = EstimateStepMemory(config, torch::kBFloat16, 2, T, options, "none");
    const int64_t measured = Peak(model, batch, options) - estimate.gradient_bytes;
    const double ratio = static_cast<double>(estimate.activation_bytes) / static_cast<double>(measured);
    std::printf("bfloat16 T=%lld stream chunk %lld keys %lld: measured %.1f MiB, estimate %.1f MiB (%.2fx)\n",
                (long long)T, (long long)estimate.chunk, (long long)estimate.key_chunk, measured / 1048576.0,
                estimate.activation_bytes / 1048576.0, ratio);
    EXPECT_GE(ratio, 0.9) << "chunk " << options.chunk;
    EXPECT_LE(ratio, 2.5) << "chunk " << options.chunk;
  }
}

// With an adapter (bfloat16 base, float32 adapter r = 16 on the seven projections): the
// estimate knows the frozen base and the adapter's casts and gradients.
TEST_F(EngineMemory, EstimateTracksMeasuredPeakWithAnAdapter) {
  auto config = PresetConfig("tiny");
  config.vocab_size = 4096;
  auto model = InitModel(config, 0, torch::kBFloat16);
  LoraConfig lora;
  lora.r = 16;
  auto adapter = LoraAdapter::Create(config, lora, torch::kFloat32);
  for (auto& p : model->parameters()) p.requires_grad_(false);
  for (auto& [name, t] : adapter->named_parameters()) t.requires_grad_(true);
  model->set_adapter(adapter);
  for (const EngineOptions& options : {EngineOptions{EngineKind::kCheckpoint, 0, 256},
                                       EngineOptions{EngineKind::kStream, 256, 256, false, 256}}) {
    const int64_t T = 2048;
    auto batch = MakeBatch(RandomSequences({T, T}, config.vocab_size, 4), Layout::kRightPad);
    const auto estimate = EstimateStepMemory(config, torch::kBFloat16, 2, T, options, "none", &lora);
    ZeroGradients(adapter->named_parameters());
    memory::ResetPeak();
    const int64_t before = memory::LiveBytes();
    auto objective = MakeSftObjective({});
    ForwardBackward(model, batch, *objective, options);
    const int64_t measured = memory::PeakBytes() - before - estimate.gradient_bytes;
    ZeroGradients(adapter->named_parameters());
    const double ratio = static_cast<double>(estimate.activation_bytes) / static_cast<double>(measured);
    std::printf("LoRA r16 T=%lld %s: measured %.1f MiB, estimate %.1f MiB (%.2fx)\n", (long long)T,
                EngineName(options.kind).c_str(), measured / 1048576.0, estimate.activation_bytes / 1048576.0, ratio);
    EXPECT_GE(ratio, 0.9) << EngineName(options.kind);
    EXPECT_LE(ratio, 2.5) << EngineName(options.kind);
    EXPECT_EQ(estimate.gradient_bytes, adapter->num_parameters() * 4);
  }
  model->set_adapter(nullptr);
}

TEST_F(EngineMemory, LogitsChunkBoundsLogitsMemory) {
  auto config = PresetConfig("tiny");
  config.vocab_size = 8192;  // make T x V dominate: 1024 x 8192 floats = 32 MiB
  auto model = InitModel(config, 0, torch::kFloat32);
  const int64_t V = config.vocab_size;
  auto b1 = MakeBatch(RandomSequences({1024}, V, 4), Layout::kRightPad);
  auto b2 = MakeBatch(RandomSequences({2048}, V, 4), Layout::kRightPad);
  // Query chunks of 1024: the stream engine's logits chunk is at most its query chunk.
  const int64_t chunked_1k = Peak(model, b1, {EngineKind::kStream, 1024, 64});
  const int64_t chunked_2k = Peak(model, b2, {EngineKind::kStream, 1024, 64});
  const int64_t whole_1k = Peak(model, b1, {EngineKind::kStream, 1024, 0});
  const int64_t logits_bytes = 1024 * V * 4;
  // Materializing the logits costs at least one T x V tensor more...
  EXPECT_GT(whole_1k, chunked_1k + logits_bytes);
  // ...while with a logits chunk, doubling T grows the peak by far less than T x V.
  EXPECT_LT(chunked_2k - chunked_1k, logits_bytes / 4);
}

// The lm_head and embedding gradients are added in place: no [V, d] gradient of a logits
// chunk or of the embedding exists next to the parameter's own (autograd would make one per
// chunk). With a large vocabulary and short sequences that transient would be the peak.
TEST_F(EngineMemory, NoVocabSizedGradientBesideTheParametersOwn) {
  for (bool tied : {false, true}) {
    auto config = PresetConfig("tiny");
    config.vocab_size = 32768;  // one [V, d] float32 matrix: 8 MiB
    config.tie_word_embeddings = tied;
    auto model = InitModel(config, 0, torch::kFloat32);
    auto batch = MakeBatch(RandomSequences({64}, config.vocab_size, 4), Layout::kRightPad);
    const int64_t matrix = config.vocab_size * config.hidden_size * 4;
    for (const EngineOptions& options : {EngineOptions{EngineKind::kStream, 32, 4}, EngineOptions{EngineKind::kCheckpoint, 0, 4}}) {
      const auto estimate = EstimateStepMemory(config, torch::kFloat32, 1, 64, options, "none");
      const int64_t activation = Peak(model, batch, options) - estimate.gradient_bytes;
      EXPECT_LT(activation, matrix / 2) << EngineName(options.kind) << (tied ? " tied" : "");
      EXPECT_GT(activation, 0);
    }
  }
}

}  // namespace
}  // namespace streambp
