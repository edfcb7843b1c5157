// Packed and left-padded rows through a variable-length kernel (streambp/attention.h:
// VarlenAttention; on CUDA the flash kernel's varlen entry). The kernel here is a float64
// reference written from its contract (each segment's causal softmax, diagonal at the bottom
// right, HF's window rule), so the planning of segments from the batch's runs, the per-row
// views of K/V, the sink's rows and the engines' use of it are checked on the CPU against the
// tiled kernel and the materialized softmax.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <torch/torch.h>

#include "streambp/attention.h"
#include "streambp/batch.h"
#include "streambp/engine.h"
#include "streambp/gradients.h"
#include "streambp/objective.h"
#include "test_util/fixtures.h"
#include "test_util/varlen_reference.h"

namespace streambp {
namespace {

// The runs of each row against the sequence ids: from 0 to T, increasing, one id per run,
// neighbours different.
TEST(Varlen, RunsFollowTheSequenceIds) {
  int rows = 0;
  for (const auto& lengths : std::vector<std::vector<int64_t>>{{4}, {4, 4}, {4, 2}, {2, 4, 3}, {3, 3, 3}, {1, 5}}) {
    const auto seqs = testing::RandomSequences(lengths, 50, 7);
    for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
      for (int64_t pack : {int64_t{0}, int64_t{7}, int64_t{12}}) {
        if (pack > 0 && layout != Layout::kPacked) continue;
        const auto b = MakeBatch(seqs, layout, pack);
        ASSERT_TRUE(b.runs);
        ASSERT_EQ(static_cast<int64_t>(b.runs->size()), b.rows());
        EXPECT_EQ(AttentionPattern::Causal(b, 0, 1, 1).runs, b.runs);
        EXPECT_EQ(b.to(torch::kCPU).runs, b.runs);
        for (int64_t r = 0; r < b.rows(); ++r, ++rows) {
          const auto& starts = (*b.runs)[r];
          ASSERT_GE(starts.size(), 2u);
          EXPECT_EQ(starts.front(), 0);
          EXPECT_EQ(starts.back(), b.length());
          for (size_t i = 0; i + 1 < starts.size(); ++i) {
            ASSERT_LT(starts[i], starts[i + 1]) << "row " << r;
            auto run = b.sequence_ids[r].slice(0, starts[i], starts[i + 1]);
            EXPECT_TRUE((run == run[0]).all().item<bool>()) << "row " << r << " run " << i;
            if (i > 0) {
              EXPECT_NE(run[0].item<int64_t>(), b.sequence_ids[r][starts[i] - 1].item<int64_t>());
            }
          }
        }
      }
    }
  }
  EXPECT_GE(rows, 40);
  EXPECT_FALSE(Batch{}.runs);  // built by hand: unknown
}

// The mask the segments give (the kernel's rule within each) is AttentionMask's, for every
// chunk of every layout, with and without a window; keys end to end.
TEST(Varlen, SegmentsGiveTheCausalMask) {
  const auto seqs = testing::RandomSequences({13, 6, 9, 2}, 50, 11);
  int compared = 0;
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
    const int64_t T = batch.length();
    for (int64_t window : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{5}}) {
      for (int64_t chunk : {int64_t{1}, int64_t{4}, int64_t{7}, T}) {
        for (int64_t s = 0; s < T; s += chunk) {
          const int64_t e = std::min(T, s + chunk);
          const auto pattern = AttentionPattern::Causal(batch, s, e, e, window);
          auto mask = torch::zeros({batch.rows(), e - s, e}, torch::kBool);
          for (int64_t b = 0; b < batch.rows(); ++b) {
            const auto segments = CausalSegments(pattern, b);
            ASSERT_FALSE(segments.empty());
            EXPECT_EQ(segments.front().q0, s);
            EXPECT_EQ(segments.back().q1, e);
            for (size_t i = 0; i < segments.size(); ++i) {
              const auto& g = segments[i];
              EXPECT_LT(g.q0, g.q1);
              EXPECT_LE(g.k0, g.q0);
              if (i > 0) {
                EXPECT_EQ(g.q0, segments[i - 1].q1);
                EXPECT_EQ(g.k0, segments[i - 1].q1);  // keys end to end
              }
              for (int64_t qi = g.q0; qi < g.q1; ++qi) {
                for (int64_t kj = g.k0; kj <= qi; ++kj) {
                  if (window == 0 || qi - kj < window) mask[b][qi - s][kj] = true;
                }
              }
            }
          }
          ASSERT_TRUE(torch::equal(mask, AttentionMask(batch, s, e, e, window)))
              << LayoutName(layout) << " window " << window << " chunk [" << s << ", " << e << ")";
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 100);
  // Unknown runs, or a given mask: no segments.
  Batch by_hand = MakeBatch(seqs, Layout::kPacked, 16);
  by_hand.runs = nullptr;
  EXPECT_TRUE(CausalSegments(AttentionPattern::Causal(by_hand, 0, 4, 4), 0).empty());
  EXPECT_TRUE(CausalSegments(AttentionPattern(torch::ones({1, 2, 2}, torch::kBool)), 0).empty());
}

// The tiled kernel's tiles start at AttentionPattern::key_start: no query of the block sees
// a key before it, and some query of some row sees the key at it (packed, left-padded, right-
// padded rows; windows; blocks inside and across sequences). Runs unknown: the window only.
TEST(Varlen, KeyStartIsTheFirstKeyABlockSees) {
  const auto seqs = testing::RandomSequences({13, 6, 9, 2}, 50, 11);
  int checked = 0;
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
    const int64_t T = batch.length();
    for (bool known : {true, false}) {
      if (!known) batch.runs = nullptr;
      for (int64_t window : {int64_t{0}, int64_t{3}}) {
        for (int64_t s = 0; s < T; s += 3) {
          const int64_t e = std::min(T, s + 5);  // blocks [s, s+5) of queries against keys [0, e)
          const auto pattern = AttentionPattern::Causal(batch, s, e, e, window);
          const int64_t k = pattern.key_start(0, e - s);
          const auto mask = pattern.dense();  // [B, e - s, e]
          ASSERT_LE(k, e);
          if (k > 0) {
            EXPECT_FALSE(mask.slice(2, 0, k).any().item<bool>()) << LayoutName(layout) << " s " << s;
          }
          if (known && k < e) {
            EXPECT_TRUE(mask.select(2, k).any().item<bool>()) << LayoutName(layout) << " s " << s << " k " << k;
          }
          if (!known) {
            EXPECT_EQ(k, window > 0 ? std::max<int64_t>(0, s - window + 1) : 0);
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 50);
}

// Largest difference relative to the largest magnitude of b.
double MaxRel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item<double>();
}

// Through the reference kernel, a call equals the tiled kernel's: outputs to 1e-12, dq, dk,
// dv to 1e-10 (every row, padding too), dK/dV into a sink with keys beyond the call's.
TEST(Varlen, EqualsTheTiledKernel) {
  const auto seqs = testing::RandomSequences({13, 6, 9, 2}, 50, 11);
  const testing::ReferenceVarlenKernel kernel;
  int compared = 0;
  for (auto layout : {Layout::kLeftPad, Layout::kPacked}) {
    const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
    const int64_t T = batch.length(), G = 2, KVH = 2, hd = 8;
    for (int64_t window : {int64_t{0}, int64_t{4}}) {
      for (int64_t s : {int64_t{0}, T / 3}) {
        const int64_t e = s == 0 ? T : std::min(T, s + 5);  // a whole row, and a chunk inside it
        const auto pattern = AttentionPattern::Causal(batch, s, e, e, window);
        const auto in = testing::RandomAttentionInputs(batch.rows(), KVH, G, e - s, T, hd, 17 + window + s);
        const auto k = in.k.slice(2, 0, e), v = in.v.slice(2, 0, e);  // a prefix view, as a stream chunk's
        const AttentionTiling keys{3};
        const AttentionCall call{in.q, k, v, pattern, G, 0.3, keys};
        const auto result = Attend(call);
        ASSERT_EQ(std::string(result.backend), "tiled");
        const auto& tiled = result.out;
        auto varlen = VarlenAttention(call, kernel);
        ASSERT_TRUE(varlen.defined());
        EXPECT_LE(MaxRel(varlen, tiled), 1e-12) << LayoutName(layout) << " window " << window << " s " << s;
        auto g = torch::randn_like(tiled);
        auto d_tiled = torch::autograd::grad({tiled}, {in.q, in.k, in.v}, {g});
        auto d_varlen = torch::autograd::grad({varlen}, {in.q, in.k, in.v}, {g});
        for (int i = 0; i < 3; ++i) EXPECT_LE(MaxRel(d_varlen[i], d_tiled[i]), 1e-10) << "input " << i;
        // With a sink of all T keys: dK/dV there, the same as autograd's.
        KeysValues sink{torch::zeros(in.k.sizes(), in.k.options().requires_grad(false)),
                        torch::zeros(in.v.sizes(), in.v.options().requires_grad(false))};
        const AttentionTiling with_sink{3, 0, &sink};
        auto sunk = VarlenAttention(AttentionCall{in.q, k, v, pattern, G, 0.3, with_sink}, kernel);
        auto dq = torch::autograd::grad({sunk}, {in.q}, {g});
        EXPECT_LE(MaxRel(dq[0], d_tiled[0]), 1e-10);
        EXPECT_LE(MaxRel(sink.k, d_tiled[1]), 1e-10);
        EXPECT_LE(MaxRel(sink.v, d_tiled[2]), 1e-10);
        if (e < T) {  // nothing past the call's keys
          EXPECT_EQ(sink.k.slice(2, e).abs().max().item<double>(), 0);
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 8);
}

TEST(Varlen, DeclinesWhatItDoesNotCompute) {
  const auto seqs = testing::RandomSequences({5, 3}, 50, 2);
  const testing::ReferenceVarlenKernel kernel;
  auto batch = MakeBatch(seqs, Layout::kPacked, 8);
  const auto in = testing::RandomAttentionInputs(1, 1, 1, 4, 8, 4, 3);
  const AttentionTiling tiles{2};
  // Queries [4, 8) against keys [0, 8): taken.
  const auto ok = AttentionPattern::Causal(batch, 4, 8, 8);
  EXPECT_TRUE(VarlenAttention(AttentionCall{in.q, in.k, in.v, ok, 1, 1.0, tiles}, kernel).defined());
  // Keys past the queries' end, a given mask, unknown runs: not taken.
  const auto short_queries = AttentionPattern::Causal(batch, 3, 7, 8);
  EXPECT_FALSE(VarlenAttention(AttentionCall{in.q, in.k, in.v, short_queries, 1, 1.0, tiles}, kernel).defined());
  const AttentionPattern given(torch::ones({1, 4, 8}, torch::kBool));
  EXPECT_FALSE(VarlenAttention(AttentionCall{in.q, in.k, in.v, given, 1, 1.0, tiles}, kernel).defined());
  batch.runs = nullptr;
  const auto unknown = AttentionPattern::Causal(batch, 4, 8, 8);
  EXPECT_FALSE(VarlenAttention(AttentionCall{in.q, in.k, in.v, unknown, 1, 1.0, tiles}, kernel).defined());
}

// The engines through it: with the reference backend first, stream and checkpoint:tiled on
// packed and left-padded batches give full's float64 gradients (1e-10) for every family
// (Gemma3's sliding layers, GQA, MoE), and the backend took their attention calls.
TEST(Varlen, EnginesThroughItMatchFull) {
  for (const auto& family : testing::TinyFamilies()) {
    auto config = testing::TinyConfig(family);
    auto model = testing::RandomModel(config, 11, torch::kFloat64);
    const auto seqs = testing::RandomSequences({12, 7, 9, 3}, config.vocab_size, 5);
    for (auto layout : {Layout::kLeftPad, Layout::kPacked}) {
      const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
      auto run = [&](const EngineOptions& options) {
        ZeroGradients(*model);
        auto objective = MakeSftObjective({});
        const double loss = ForwardBackward(model, batch, *objective, options).loss;
        auto grads = CollectGradients(*model);
        ZeroGradients(*model);
        return std::make_pair(loss, grads);
      };
      const auto full = run({EngineKind::kFull});
      testing::ReferenceVarlenBackend backend;
      ScopedAttentionBackend first(&backend);
      for (const auto& [name, options] : testing::EngineVariants(5, 7, 3)) {
        if (name != "stream" && name != "checkpoint:tiled") continue;
        const int before = backend.taken.load();
        const auto other = run(options);
        EXPECT_GT(backend.taken.load(), before) << family << " " << name;
        EXPECT_LE(CompareGradients(full.second, other.second).max_relative, 1e-10)
            << family << " " << LayoutName(layout) << " " << name;
        EXPECT_NEAR(other.first, full.first, 1e-12 * std::abs(full.first));
      }
    }
  }
}

}  // namespace
}  // namespace streambp
