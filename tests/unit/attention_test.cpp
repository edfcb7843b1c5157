// The attention seam (streambp/attention.h): which backend takes a call, and every backend
// that takes one computes the materialized softmax's output and gradients (float64).
#include <gtest/gtest.h>

#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "streambp/attention.h"
#include "streambp/batch.h"
#include "test_util/fixtures.h"
#include "../../core/src/model/tiled_attention.h"

namespace streambp {
namespace {

const AttentionBackend& Backend(const std::string& name) {
  for (const auto* b : AttentionBackends()) {
    if (name == b->name()) return *b;
  }
  throw std::runtime_error("no backend " + name);
}

TEST(Attention, BackendsInTheOrderTheyAreTried) {
  std::vector<std::string> names;
  for (const auto* b : AttentionBackends()) names.emplace_back(b->name());
  EXPECT_EQ(names, (std::vector<std::string>{"fused", "tiled", "materialized"}));
}

// Tiled calls go to the tiled kernel (the fused one declines on the CPU), untiled ones to
// the materialized softmax; each backend declines what it does not compute.
TEST(Attention, EachCallGoesToTheBackendThatComputesIt) {
  auto batch = MakeBatch(testing::RandomSequences({12, 7}, 50, 3), Layout::kRightPad);
  const int64_t T = batch.length(), s = 4, G = 2;
  auto in = testing::RandomAttentionInputs(batch.rows(), 2, G, T - s, T, 8, 5);
  const auto pattern = AttentionPattern::Causal(batch, s, T, T);
  KeysValues sink{torch::zeros(in.k.sizes(), in.k.options()), torch::zeros(in.v.sizes(), in.v.options())};
  const AttentionTiling none{}, keys{4}, blocks{0, 3}, big{64}, with_sink{0, 0, &sink};
  struct Case {
    const AttentionTiling& tiling;
    const char* backend;
  };
  for (const auto& [tiling, backend] : {Case{none, "materialized"}, Case{big, "materialized"}, Case{keys, "tiled"},
                                         Case{blocks, "tiled"}, Case{with_sink, "tiled"}}) {
    const AttentionCall call{in.q, in.k, in.v, pattern, G, 0.3, tiling};
    EXPECT_EQ(std::string(Attend(call).backend), backend)
        << "key tile " << tiling.key_tile << ", query block " << tiling.query_tile;
    EXPECT_FALSE(Backend("fused").attend(call).defined());  // CPU tensors (and float64)
    EXPECT_EQ(Backend("tiled").attend(call).defined(), call.tiled());
    EXPECT_EQ(Backend("materialized").attend(call).defined(), tiling.grad_sink == nullptr);
  }
}

// Every backend that takes a call equals the materialized softmax: outputs to 1e-12 and
// dq, dk, dv to 1e-10, for right padding, left padding and packing, with and without a
// window; through a sink dK/dV arrive in the sink instead.
TEST(Attention, BackendsAgreeWithTheMaterializedSoftmax) {
  const auto seqs = testing::RandomSequences({13, 6, 9}, 50, 11);
  int compared = 0;
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 16 : 0);
    const int64_t T = batch.length(), s = T / 3, G = 2;
    for (int64_t window : {int64_t{0}, int64_t{4}}) {
      const auto pattern = AttentionPattern::Causal(batch, s, T, T, window);
      auto in = testing::RandomAttentionInputs(batch.rows(), 2, G, T - s, T, 8, 17 + window);
      auto weight = torch::linspace(-1, 1, in.q.numel(), in.q.options()).view(in.q.sizes());
      auto run = [&](const AttentionBackend& backend, const AttentionTiling& tiling) {
        auto out = backend.attend(AttentionCall{in.q, in.k, in.v, pattern, G, 0.35, tiling});
        EXPECT_TRUE(out.defined()) << backend.name();
        auto grads = torch::autograd::grad({(out * weight).sum()}, {in.q, in.k, in.v}, {}, false, false, true);
        grads.insert(grads.begin(), out.detach());
        return grads;
      };
      const auto reference = run(Backend("materialized"), AttentionTiling{});
      KeysValues sink{torch::zeros(in.k.sizes(), in.k.options()), torch::zeros(in.v.sizes(), in.v.options())};
      for (const AttentionTiling& tiling : {AttentionTiling{3}, AttentionTiling{5, 2}, AttentionTiling{4, 0, &sink}}) {
        const auto got = run(Backend("tiled"), tiling);
        const std::string where = std::string(LayoutName(layout)) + " window " + std::to_string(window) +
                                  " tile " + std::to_string(tiling.key_tile);
        const double scale = reference[0].abs().max().item<double>();
        EXPECT_LE((got[0] - reference[0]).abs().max().item<double>(), 1e-12 * scale) << where;
        for (int i = 1; i <= 3; ++i) {
          // With a sink, dK and dV are in the sink (float64 here) and not returned.
          const auto g = tiling.grad_sink && i > 1 ? (i == 2 ? sink.k : sink.v) : got[i];
          ASSERT_TRUE(g.defined()) << where << " gradient " << i;
          const double r = reference[i].abs().max().item<double>();
          ASSERT_GT(r, 0);
          EXPECT_LE((g - reference[i]).abs().max().item<double>(), 1e-10 * r) << where << " gradient " << i;
        }
        if (tiling.grad_sink) {
          EXPECT_FALSE(got[2].defined() || got[3].defined()) << where;
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 18);
}

// AttentionTiling::kept: a call that records writes its output and log-sum-exp there (the
// output equal to the call's, bit for bit); a replaying call returns what is there without
// running the tiles (a changed buffer changes its output), and with the recorded buffer its
// dq, dk, dv are those of the call that recorded, bit for bit. A kept call is always tiled:
// neither the fused kernel nor the materialized softmax takes it.
TEST(Attention, KeptOutputsAreRecordedAndReplayed) {
  auto batch = MakeBatch(testing::RandomSequences({12, 7}, 50, 3), Layout::kRightPad);
  const int64_t T = batch.length(), s = 4, G = 2, KVH = 2, hd = 8, R = (T - s) * G;
  auto in = testing::RandomAttentionInputs(batch.rows(), KVH, G, T - s, T, hd, 29);
  const auto pattern = AttentionPattern::Causal(batch, s, T, T, 5);
  auto weight = torch::linspace(-1, 1, in.q.numel(), in.q.options()).view(in.q.sizes());
  const int64_t BK = batch.rows() * KVH;
  AttentionKept record{torch::full({BK, R, hd}, 7.0, in.q.options()), torch::full({BK, R, 1}, 7.0, in.q.options()),
                       false};
  auto run = [&](const AttentionTiling& tiling) {
    const AttentionCall call{in.q, in.k, in.v, pattern, G, 0.35, tiling};
    if (tiling.kept != nullptr) {
      EXPECT_TRUE(call.tiled());
      EXPECT_FALSE(Backend("fused").attend(call).defined());
      EXPECT_FALSE(Backend("materialized").attend(call).defined());
    }
    auto out = Attend(call).out;
    auto grads = torch::autograd::grad({(out * weight).sum()}, {in.q, in.k, in.v});
    grads.insert(grads.begin(), out.detach());
    return grads;
  };
  AttentionTiling recording{3};
  recording.kept = &record;
  const auto recorded = run(recording);
  const auto plain = run(AttentionTiling{3});
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(recorded[i], plain[i])) << i;
  // [B*KVH, R, hd] is the output's own layout.
  EXPECT_TRUE(torch::equal(record.out.view(in.q.sizes()), plain[0]));
  EXPECT_TRUE(torch::isfinite(record.lse).all().item<bool>());
  AttentionKept replay{record.out, record.lse, true};
  AttentionTiling replaying{3};
  replaying.kept = &replay;
  const auto replayed = run(replaying);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(replayed[i], plain[i])) << i;
  // Not recomputed: the output is whatever the buffer holds.
  AttentionKept doubled{record.out * 2, record.lse, true};
  replaying.kept = &doubled;
  EXPECT_TRUE(torch::equal(run(replaying)[0], plain[0] * 2));
  // A buffer of the wrong shape is an error naming the shapes.
  AttentionKept wrong{record.out.slice(1, 0, R - 2), record.lse, true};
  replaying.kept = &wrong;
  try {
    run(replaying);
    ADD_FAILURE() << "a kept output of the wrong shape was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the kept output must be"), std::string::npos) << e.what();
  }
}

// On the CPU the tiled kernel plans a causal pattern's key tiles from the sequence ids (no
// mask for the tiles that need none); where it cannot read the ids directly (here: ids that
// are not contiguous, the same values) it plans from every tile's mask, as it always did.
// Both give the same output and gradients bit for bit, through a sink too, for padding on
// either side, packing and a window, with key tiles and query blocks of several sizes; the
// pattern given as a mask tensor (keys up to L, not the causal limit, so other tile widths)
// agrees to rounding.
TEST(Attention, TilesPlannedFromSequenceIdsEqualTilesPlannedFromMasks) {
  const auto seqs = testing::RandomSequences({40, 17, 29, 8}, 50, 31);
  int compared = 0;
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 48 : 0);
    const int64_t T = batch.length(), G = 2;
    for (int64_t start : {int64_t{0}, T / 3}) {
      for (int64_t window : {int64_t{0}, int64_t{6}}) {
        const auto causal = AttentionPattern::Causal(batch, start, T, T, window);
        auto strided = causal;
        strided.sequence_ids = causal.sequence_ids.t().contiguous().t();
        ASSERT_FALSE(strided.sequence_ids.is_contiguous());
        const AttentionPattern given(causal.dense());
        auto in = testing::RandomAttentionInputs(batch.rows(), 2, G, T - start, T, 8, 41 + window + start);
        auto weight = torch::linspace(-1, 1, in.q.numel(), in.q.options()).view(in.q.sizes());
        for (const auto& [key_tile, query_tile] : {std::pair<int64_t, int64_t>{4, 0}, {7, 5}, {16, 3}}) {
          auto run = [&](const AttentionPattern& pattern, bool sink) {
            KeysValues kv{torch::zeros(in.k.sizes(), in.k.options()), torch::zeros(in.v.sizes(), in.v.options())};
            const AttentionTiling tiling{key_tile, query_tile, sink ? &kv : nullptr};
            auto out = Backend("tiled").attend(AttentionCall{in.q, in.k, in.v, pattern, G, 0.4, tiling});
            auto grads = torch::autograd::grad({(out * weight).sum()}, {in.q, in.k, in.v}, {}, false, false, true);
            if (sink) grads = {grads[0], kv.k, kv.v};
            grads.insert(grads.begin(), out.detach());
            return grads;
          };
          for (bool sink : {false, true}) {
            const auto from_ids = run(causal, sink), from_masks = run(strided, sink), given_mask = run(given, sink);
            const std::string where = std::string(LayoutName(layout)) + " start " + std::to_string(start) + " window " +
                                      std::to_string(window) + " tiles " + std::to_string(key_tile) + "/" +
                                      std::to_string(query_tile) + (sink ? " sink" : "");
            for (size_t i = 0; i < from_ids.size(); ++i) {
              ASSERT_TRUE(from_ids[i].defined() && from_masks[i].defined()) << where << " tensor " << i;
              EXPECT_TRUE(torch::equal(from_ids[i], from_masks[i])) << where << " tensor " << i;
              EXPECT_LE((from_ids[i] - given_mask[i]).abs().max().item<double>(),
                        1e-12 * given_mask[i].abs().max().item<double>())
                  << where << " tensor " << i;
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 72);
}

// On the CPU a tiled call splits its B*KVH key/value heads among the intra-op threads when
// they share evenly (TiledAttentionThreads), each thread running its heads' tiles with
// one-thread products. The output and dq, dk, dv (through a sink too) are those of one thread,
// bit for bit: batch rows with different padding and documents (each head's mask row is its
// batch row's), a window, query blocks, and head counts that split (6 on 2 or 3 threads) or do
// not (3 on 2 threads runs as one).
TEST(Attention, TiledHeadsSplitAmongThreadsEqualOneThread) {
  testing::RestoreThreads restore;
  const auto cpu = torch::Device(torch::kCPU);
  at::set_num_threads(2);
  EXPECT_EQ(TiledAttentionThreads(6, cpu), 2);
  EXPECT_EQ(TiledAttentionThreads(3, cpu), 1);
  EXPECT_EQ(TiledAttentionThreads(9, cpu), 2);
  EXPECT_EQ(TiledAttentionThreads(1, cpu), 1);
  at::set_num_threads(3);
  EXPECT_EQ(TiledAttentionThreads(6, cpu), 3);
  EXPECT_EQ(TiledAttentionThreads(4, cpu), 1);
  at::set_num_threads(1);
  EXPECT_EQ(TiledAttentionThreads(6, cpu), 1);

  const auto seqs = testing::RandomSequences({21, 9, 16}, 50, 57);
  int compared = 0;
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 24 : 0);
    const int64_t T = batch.length(), G = 2, start = T / 4;
    for (int64_t KVH : {int64_t{2}, int64_t{1}}) {
      for (int64_t window : {int64_t{0}, int64_t{5}}) {
        const auto pattern = AttentionPattern::Causal(batch, start, T, T, window);
        auto in = testing::RandomAttentionInputs(batch.rows(), KVH, G, T - start, T, 8, 61 + window + KVH);
        auto weight = torch::linspace(-1, 1, in.q.numel(), in.q.options()).view(in.q.sizes());
        for (bool sink : {false, true}) {
          auto run = [&](int threads) {
            at::set_num_threads(threads);
            KeysValues kv{torch::zeros(in.k.sizes(), in.k.options()), torch::zeros(in.v.sizes(), in.v.options())};
            const AttentionTiling tiling{4, 5, sink ? &kv : nullptr};
            auto out = TiledAttention(in.q, in.k, in.v, pattern, G, 0.4, tiling);
            auto grads = torch::autograd::grad({(out * weight).sum()}, {in.q, in.k, in.v}, {}, false, false, true);
            if (sink) grads = {grads[0], kv.k, kv.v};
            grads.insert(grads.begin(), out.detach());
            return grads;
          };
          const auto one = run(1);
          for (int threads : {2, 3}) {
            const auto got = run(threads);
            const std::string where = std::string(LayoutName(layout)) + " kv heads " + std::to_string(KVH) +
                                      " window " + std::to_string(window) + " threads " + std::to_string(threads) +
                                      (sink ? " sink" : "");
            for (size_t i = 0; i < one.size(); ++i) {
              ASSERT_TRUE(got[i].defined() && one[i].defined()) << where << " tensor " << i;
              ASSERT_GT(one[i].abs().max().item<double>(), 0) << where << " tensor " << i;
              EXPECT_TRUE(torch::equal(got[i], one[i])) << where << " tensor " << i;
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 48);
}

// A key tile that the pattern masks in part over a block's rows (the causal diagonal, a
// window's edge) is visited in pieces of rows, each over the keys its rows may see; the plan
// covers every allowed (query, key) pair exactly once, reads no key twice for a row, and is
// the same whether planned from the sequence ids or from the tiles' masks (the flags read
// back). Pieces are taken only where they save an eighth of the tile.
TEST(Attention, TilesMaskedInPartRunInRowPieces) {
  // One sequence of 32, queries [16, 32), one block of 16, key tiles of 16: the keys [0, 16)
  // whole, the diagonal tile in four pieces of four rows, 5/8 of its square.
  auto visits = [](const std::vector<TiledVisit>& plan) {
    std::vector<std::array<int64_t, 5>> out;
    for (const auto& v : plan) out.push_back({v.q0, v.q1, v.k0, v.k1, v.masked});
    return out;
  };
  const auto one = MakeBatch(testing::RandomSequences({32}, 50, 3), Layout::kRightPad);
  EXPECT_EQ(visits(TiledAttentionPlan(AttentionPattern::Causal(one, 16, 32, 32), 0, 16, 16)),
            (std::vector<std::array<int64_t, 5>>{
                {0, 16, 0, 16, 0}, {0, 4, 16, 20, 1}, {4, 8, 16, 24, 1}, {8, 12, 16, 28, 1}, {12, 16, 16, 32, 1}}));
  // Four rows against a 64-key tile whose diagonal is 4 x 4: pieces would compute 250 of 256
  // pairs, so the tile runs whole.
  const auto longer = MakeBatch(testing::RandomSequences({64}, 50, 5), Layout::kRightPad);
  EXPECT_EQ(visits(TiledAttentionPlan(AttentionPattern::Causal(longer, 60, 64, 64), 0, 4, 64)),
            (std::vector<std::array<int64_t, 5>>{{0, 4, 0, 64, 1}}));

  const auto seqs = testing::RandomSequences({40, 17, 29, 8}, 50, 31);
  int pieced = 0, planned = 0;
  for (auto layout : {Layout::kRightPad, Layout::kLeftPad, Layout::kPacked}) {
    const auto batch = MakeBatch(seqs, layout, layout == Layout::kPacked ? 48 : 0);
    const int64_t T = batch.length();
    for (int64_t start : {int64_t{0}, T / 3}) {
      for (int64_t window : {int64_t{0}, int64_t{6}}) {
        const auto causal = AttentionPattern::Causal(batch, start, T, T, window);
        auto strided = causal;
        strided.sequence_ids = causal.sequence_ids.t().contiguous().t();
        const auto allowed = causal.dense().any(0);  // [C, L]: some batch row allows the pair
        for (const auto& [key_tile, block] : {std::pair<int64_t, int64_t>{8, 16}, {16, 12}, {5, 40}}) {
          auto covered = torch::zeros({T - start, T}, torch::kInt64);
          const std::string where = std::string(LayoutName(layout)) + " start " + std::to_string(start) + " window " +
                                    std::to_string(window) + " tiles " + std::to_string(key_tile) + "/" +
                                    std::to_string(block);
          for (int64_t q0 = 0; q0 < T - start; q0 += block) {
            const int64_t q1 = std::min(T - start, q0 + block);
            const auto plan = TiledAttentionPlan(causal, q0, q1, key_tile);
            const auto from_masks = TiledAttentionPlan(strided, q0, q1, key_tile);
            ASSERT_EQ(plan.size(), from_masks.size()) << where << " block " << q0;
            for (size_t i = 0; i < plan.size(); ++i) {
              const auto &a = plan[i], &b = from_masks[i];
              EXPECT_TRUE(a.q0 == b.q0 && a.q1 == b.q1 && a.k0 == b.k0 && a.k1 == b.k1)
                  << where << " block " << q0 << " visit " << i;
              ASSERT_TRUE(a.q0 >= q0 && a.q1 <= q1 && a.q0 < a.q1 && a.k0 < a.k1) << where;
              covered.slice(0, a.q0, a.q1).slice(1, a.k0, a.k1) += 1;
              pieced += (a.q0 != q0 || a.q1 != q1) ? 1 : 0;
              // Unmasked visits allow every pair.
              if (!a.masked) {
                EXPECT_TRUE(causal.block(a.q0, a.q1, a.k0, a.k1).all().item<bool>()) << where;
              }
            }
            ++planned;
          }
          EXPECT_TRUE(covered.masked_select(allowed).eq(1).all().item<bool>())
              << where << ": an allowed pair not visited exactly once";
          EXPECT_LE(covered.max().item<int64_t>(), 1) << where;
        }
      }
    }
  }
  EXPECT_GT(planned, 0);
  EXPECT_GT(pieced, 50) << "no tile ran in pieces";
}

}  // namespace
}  // namespace streambp
