// Tiled attention's softmax steps (core/src/model/softmax_rows.h): the fused CPU passes and the
// LibTorch ops (a GPU's path) both compute the online softmax's recurrences, checked against the
// formulas written out here in float64, on every version of the passes this CPU runs; the float32 exp is
// within 2 units in the last place.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../../core/src/model/softmax_rows.h"
#include "../../core/src/model/tiled_attention.h"
#include "streambp/attention.h"
#include "streambp/batch.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs f with the fused passes on or off, restoring the setting.
template <typename F>
auto WithFused(bool on, const F& f) {
  const bool was = SetFusedSoftmaxRows(on);
  struct Restore {
    bool was;
    ~Restore() { SetFusedSoftmaxRows(was); }
  } restore{was};
  return f();
}

// The ways a pass runs: "ops" (LibTorch ops, a GPU's path) and each version of the fused CPU
// passes this CPU runs (SoftmaxRowIsas: "avx512f", "avx2+fma", "baseline").
std::vector<std::string> Paths() {
  std::vector<std::string> paths{"ops"};
  for (const auto& isa : SoftmaxRowIsas()) paths.push_back(isa);
  return paths;
}

// Runs f on `path`, restoring the settings.
template <typename F>
auto WithPath(const std::string& path, const F& f) {
  const bool fused = path != "ops";
  const std::string isa = fused ? SetSoftmaxRowIsa(path) : SoftmaxRowIsa();
  struct Restore {
    std::string isa;
    ~Restore() { SetSoftmaxRowIsa(isa); }
  } restore{isa};
  return WithFused(fused, f);
}

// The version the passes choose follows the CPU's features as the kernel reports them
// (/proc/cpuinfo), whatever its model: a compiler's dispatch by CPU model once left an AMD
// EPYC on the scalar baseline.
TEST(SoftmaxRows, TheFastestVersionThisCpuRunsIsChosen) {
  const auto isas = SoftmaxRowIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), "baseline");
  EXPECT_EQ(SoftmaxRowIsa(), isas.front());
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  ASSERT_FALSE(flags.empty()) << "/proc/cpuinfo has no flags line to compare the choice with";
  auto has = [&](const std::string& f) { return flags.find(" " + f + " ") != std::string::npos; };
  const std::string want = has("avx512f") && has("avx2") && has("fma") ? "avx512f"
                           : has("avx2") && has("fma")                 ? "avx2+fma"
                                                                       : "baseline";
  EXPECT_EQ(SoftmaxRowIsa(), want) << "flags:" << flags;
#endif
  try {
    SetSoftmaxRowIsa("sse9");
    ADD_FAILURE() << "an unknown version was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no version 'sse9' on this CPU (it runs: "), std::string::npos) << e.what();
  }
  EXPECT_EQ(SoftmaxRowIsa(), isas.front()) << "a refused version changed the setting";
}

TEST(SoftmaxRows, Float32ExpIsWithinTwoUnitsInTheLastPlace) {
  // Every 2^-9 from -87.3 to 88, and the float grid near 0 where e^x is near 1.
  auto x = torch::cat({torch::arange(-87.3, 88.0, 1.0 / 512, torch::kFloat64).to(torch::kFloat32),
                       torch::linspace(-1e-3, 1e-3, 20001, torch::kFloat32)});
  for (const auto& isa : SoftmaxRowIsas()) {
    WithPath(isa, [&] {
      const auto got = SoftmaxExp(x).to(torch::kFloat64);
      const auto exact = x.to(torch::kFloat64).exp();
      // One unit in the last place of the float nearest each exact value.
      const auto nearest = exact.to(torch::kFloat32);
      const auto ulp = (torch::nextafter(nearest, torch::full_like(nearest, INFINITY)) - nearest).to(torch::kFloat64);
      const double worst = ((got - exact).abs() / ulp).max().item<double>();
      EXPECT_LE(worst, 2.0) << isa << ": units in the last place";
      EXPECT_GT(worst, 0.0) << isa;  // a polynomial, not the exact value: the check can fail
      const auto special = torch::tensor({-kInf, -200.0, -88.0, 0.0, 89.0, kInf, std::nan("")}, torch::kFloat32);
      const auto e = SoftmaxExp(special);
      EXPECT_EQ(e[0].item<float>(), 0.0f);
      EXPECT_EQ(e[1].item<float>(), 0.0f);
      EXPECT_EQ(e[2].item<float>(), 0.0f);
      EXPECT_EQ(e[3].item<float>(), 1.0f);  // the row's max gets exactly 1
      EXPECT_TRUE(std::isinf(e[4].item<float>()) && std::isinf(e[5].item<float>()));
      EXPECT_TRUE(std::isnan(e[6].item<float>()));
      return 0;
    });
  }
}

struct Tile {
  torch::Tensor s, m, l, acc;  // m, l, acc: views of a block's rows [1, 7)
};

// Scores [2, 6, 37] with masked entries, one row masked throughout, and a block's running max,
// sum and output (rows 1..6 of 8) that have seen some keys (one row none: m = -inf).
Tile MakeTile(torch::Dtype dtype) {
  torch::manual_seed(5);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  auto s = torch::randn({2, 6, 37}, o) * 3;
  s.masked_fill_(torch::rand({2, 6, 37}, o) < 0.3, -kInf);
  s[1][2].fill_(-kInf);
  auto m = torch::randn({2, 8, 1}, o) + 1;
  m[0][3].fill_(-kInf);
  auto l = torch::rand({2, 8, 1}, o) * 4 + 0.5;
  l[0][3].fill_(0);
  auto acc = torch::randn({2, 8, 5}, o);
  acc[0][3].fill_(0);
  return {s.to(dtype), m.to(dtype).slice(1, 1, 7), l.to(dtype).slice(1, 1, 7), acc.to(dtype).slice(1, 1, 7)};
}

// The step's recurrences in float64, from the tile's inputs.
Tile ReferenceStep(const Tile& in, bool first) {
  auto s = in.s.to(torch::kFloat64), m = in.m.to(torch::kFloat64), l = in.l.to(torch::kFloat64);
  auto acc = in.acc.to(torch::kFloat64);
  auto now = first ? s.amax(-1, true) : torch::maximum(m, s.amax(-1, true));
  auto shift = torch::where(now == -kInf, torch::zeros_like(now), now);
  auto e = (s - shift).exp();
  if (first) return {e, now, e.sum(-1, true), acc};
  auto alpha = (m - shift).exp();
  return {e, now, l * alpha + e.sum(-1, true), acc * alpha};
}

void ExpectNear(const torch::Tensor& got, const torch::Tensor& want, double rel, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const auto g = got.to(torch::kFloat64);
  // -inf (a row with no key yet) must match exactly; everything else to rel.
  EXPECT_TRUE(torch::equal(g == -kInf, want == -kInf)) << what;
  const auto finite = want != -kInf;
  const double scale = std::max(1.0, want.masked_select(finite).abs().max().item<double>());
  EXPECT_LE((g.masked_select(finite) - want.masked_select(finite)).abs().max().item<double>(), rel * scale) << what;
}

// Both paths, float64 (to rounding) and float32 (to its precision), first tile or not, with
// masked entries, a row masked throughout and a row that has seen no key.
TEST(SoftmaxRows, OnlineStepComputesTheRecurrences) {
  int checked = 0;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double rel = dtype == torch::kFloat64 ? 1e-14 : 4e-6;
    for (const auto& path : Paths()) {
      for (bool first : {true, false}) {
        const auto in = MakeTile(dtype);
        const auto want = ReferenceStep(in, first);
        Tile got{in.s.clone(), in.m.clone(), in.l.clone(), in.acc.clone()};
        // Views with a block's strides, as the kernel gets them.
        auto m_block = torch::zeros({2, 8, 1}, in.m.options()), l_block = torch::zeros({2, 8, 1}, in.l.options());
        auto acc_block = torch::zeros({2, 8, 5}, in.acc.options());
        auto m = m_block.slice(1, 1, 7), l = l_block.slice(1, 1, 7), acc = acc_block.slice(1, 1, 7);
        m.copy_(in.m);
        l.copy_(in.l);
        acc.copy_(in.acc);
        WithPath(path, [&] {
          OnlineSoftmaxStep(got.s, m, l, first ? torch::Tensor() : acc, first);
          return 0;
        });
        const std::string what = std::string(c10::toString(dtype)) + " " + path + (first ? " first" : " next");
        ExpectNear(got.s, want.s, rel, what + " probabilities");
        ExpectNear(m, want.m, rel, what + " max");
        ExpectNear(l, want.l, rel, what + " sum");
        ExpectNear(acc, want.acc, rel, what + " output");
        EXPECT_EQ(m_block[0][0].item<double>(), 0.0) << what << ": a row outside the view was written";
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * static_cast<int>(Paths().size()));
}

TEST(SoftmaxRows, GradStepComputesProbabilitiesAndScoreGradients) {
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double rel = dtype == torch::kFloat64 ? 1e-14 : 4e-6;
    torch::manual_seed(9);
    const auto o = torch::TensorOptions().dtype(torch::kFloat64);
    auto s = torch::randn({3, 5, 29}, o) * 2;
    s.masked_fill_(torch::rand({3, 5, 29}, o) < 0.3, -kInf);
    s.select(2, 0).fill_(0.5);  // every row allows a key
    const auto lse = torch::logsumexp(s, -1, true) + 0.25;  // as a later tile's rows have it
    auto dp = torch::randn({3, 5, 29}, o);
    const auto D = torch::randn({3, 9, 1}, o).slice(1, 2, 7);  // a view with a block's strides
    const auto p = (s - lse).exp();
    const auto ds = p * (dp - D);
    for (const auto& path : Paths()) {
      auto gs = s.to(dtype).clone(), gdp = dp.to(dtype).clone();
      WithPath(path, [&] {
        SoftmaxGradStep(gs, gdp, lse.to(dtype), D.to(dtype));
        return 0;
      });
      const std::string what = std::string(c10::toString(dtype)) + " " + path;
      ExpectNear(gs, p, rel, what + " probabilities");
      ExpectNear(gdp, ds, rel, what + " score gradients");
      EXPECT_TRUE(torch::equal(gs.to(torch::kFloat64) == 0, p == 0)) << what << ": masked entries are 0";
    }
  }
}

// The whole tiled kernel in float32 with the fused passes and with the ops: both as close to
// the float64 materialized softmax as float32 allows, and to each other.
TEST(SoftmaxRows, TiledAttentionInFloat32MatchesFloat64EitherWay) {
  const auto seqs = testing::RandomSequences({40, 23}, 50, 3);
  const auto batch = MakeBatch(seqs, Layout::kRightPad);
  const int64_t T = batch.length(), G = 2;
  const auto pattern = AttentionPattern::Causal(batch, 0, T, T, 0);
  const auto in = testing::RandomAttentionInputs(batch.rows(), 2, G, T, T, 16, 7);
  auto run = [&](torch::Dtype dtype, bool tiled) {
    auto q = in.q.detach().to(dtype).requires_grad_(), k = in.k.detach().to(dtype).requires_grad_();
    auto v = in.v.detach().to(dtype).requires_grad_();
    const auto weight = torch::linspace(-1, 1, q.numel(), q.options()).view(q.sizes());
    auto out = tiled ? TiledAttention(q, k, v, pattern, G, 0.25, AttentionTiling{8, 16})
                     : Attend(AttentionCall{q, k, v, pattern, G, 0.25, AttentionTiling{}}).out;
    auto grads = torch::autograd::grad({(out * weight).sum()}, {q, k, v});
    grads.insert(grads.begin(), out.detach());
    for (auto& g : grads) g = g.to(torch::kFloat64);
    return grads;
  };
  const auto reference = run(torch::kFloat64, false);
  const auto ops = WithPath("ops", [&] { return run(torch::kFloat32, true); });
  for (const auto& isa : SoftmaxRowIsas()) {
    const auto fused = WithPath(isa, [&] { return run(torch::kFloat32, true); });
    for (size_t i = 0; i < reference.size(); ++i) {
      const double scale = reference[i].abs().max().item<double>();
      ASSERT_GT(scale, 0);
      EXPECT_LE((fused[i] - reference[i]).abs().max().item<double>(), 2e-5 * scale) << isa << ", tensor " << i;
      EXPECT_LE((ops[i] - reference[i]).abs().max().item<double>(), 2e-5 * scale) << "ops, tensor " << i;
      EXPECT_LE((fused[i] - ops[i]).abs().max().item<double>(), 2e-5 * scale) << isa << " vs ops, tensor " << i;
    }
  }
}

// log p(target) and its gradient, both paths, against log_softmax in float64: rows with a
// very large logit, -inf logits, and targets anywhere in the row; non-contiguous targets.
TEST(SoftmaxRows, TargetLogprobsAndTheirGradient) {
  torch::manual_seed(4);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  auto logits = torch::randn({3, 5, 301}, o) * 4;
  logits[0][1][7] = 60.0;
  logits[2][3].slice(0, 0, 100).fill_(-kInf);
  const auto targets = torch::randint(100, 301, {5, 3}, torch::kLong).t();  // [3, 5], not contiguous
  const auto weight = torch::randn({3, 5}, o);
  auto reference = [&] {
    auto x = logits.clone().requires_grad_();
    auto lp = x.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    auto grad = torch::autograd::grad({(lp * weight).sum()}, {x})[0];
    return std::make_pair(lp.detach(), grad);
  }();
  int checked = 0;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double rel = dtype == torch::kFloat64 ? 1e-13 : 4e-6;
    for (const auto& path : Paths()) {
      auto x = logits.to(dtype).requires_grad_();
      const auto lp = WithPath(path, [&] { return TargetLogprobs(x, targets); });
      const auto grad = torch::autograd::grad({(lp * weight.to(dtype)).sum()}, {x})[0];
      const std::string what = std::string(c10::toString(dtype)) + " " + path;
      ASSERT_EQ(lp.scalar_type(), dtype) << what;
      ExpectNear(lp, reference.first, rel, what + " log-probabilities");
      ExpectNear(grad, reference.second, rel, what + " gradient");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * static_cast<int>(Paths().size()));
  // A target outside the vocabulary is an error on either path, not a read past the row.
  const auto bad = torch::full({3, 5}, 301, torch::kLong);
  for (const auto& path : Paths()) {
    EXPECT_THROW(WithPath(path, [&] { return TargetLogprobs(logits, bad); }), c10::Error) << path;
  }
}

// Whether each target is its row's argmax (SFT's token accuracy), on every path, is what
// LibTorch's argmax says: ties go to the first largest logit, a NaN wins, the first one.
TEST(SoftmaxRows, TargetIsTopAsArgmaxPicksIt) {
  torch::manual_seed(5);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto logits = torch::randn({2, 8, 40}, torch::kFloat64);
  logits[0][0].fill_(1.5);                                  // all equal: index 0 is the argmax
  logits[0][1].fill_(1.5);
  logits[0][2][3] = logits[0][2][11] = 9.0;                 // a tie at the top: 3
  logits[0][3][3] = logits[0][3][11] = 9.0;
  logits[0][4][6] = nan;                                    // NaNs: the first one, 6
  logits[0][4][20] = nan;
  logits[0][5][20] = nan;
  logits[0][5][6] = nan;
  logits[0][6].fill_(-kInf);                                // all -inf: index 0
  logits[0][7][30] = kInf;                                  // +inf
  // Targets chosen so that each kind of row has a hit and a miss.
  auto targets = torch::randint(0, 40, {2, 8}, torch::kLong);
  targets[0][0] = 0;
  targets[0][1] = 5;
  targets[0][2] = 3;
  targets[0][3] = 11;
  targets[0][4] = 6;
  targets[0][5] = 20;
  targets[0][6] = 0;
  targets[0][7] = 30;
  for (int64_t i = 0; i < 8; ++i) targets[1][i] = (logits[1][i].argmax().item<int64_t>() + i % 2) % 40;  // hit, miss
  const auto expected = logits.argmax(-1) == targets;
  ASSERT_EQ(expected.sum().item<int64_t>(), 9);  // rows 0, 2, 4, 6, 7 of the first and four of the second
  int checked = 0;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const auto x = logits.to(dtype);
    ASSERT_TRUE(torch::equal(x.argmax(-1) == targets, expected));
    for (const auto& path : Paths()) {
      torch::Tensor is_top;
      const auto lp = WithPath(path, [&] { return TargetLogprobs(x, targets, &is_top); });
      const std::string what = std::string(c10::toString(dtype)) + " " + path;
      ASSERT_TRUE(is_top.defined()) << what;
      EXPECT_EQ(is_top.scalar_type(), torch::kBool) << what;
      EXPECT_TRUE(torch::equal(is_top, expected)) << what << "\n" << is_top << "\n" << expected;
      // Asked for nothing, it computes the same log-probabilities.
      const auto plain = WithPath(path, [&] { return TargetLogprobs(x, targets); });
      EXPECT_TRUE(torch::equal(lp.nan_to_num(0, 0, 0), plain.nan_to_num(0, 0, 0))) << what;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * static_cast<int>(Paths().size()));
}

// The entropy of softmax(logits), both paths, against -sum p log p in float64 over the
// entries with p > 0; the fused path also gives a row with -inf logits its finite entropy.
TEST(SoftmaxRows, RowEntropyIsTheSoftmaxEntropy) {
  torch::manual_seed(8);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  auto logits = torch::randn({2, 3, 257}, o) * 3;
  logits[1][2][11] = 40.0;  // a row that is nearly one-hot
  const auto logp = logits.log_softmax(-1);
  const auto want = -(logp.exp() * logp).sum(-1);
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const double rel = dtype == torch::kFloat64 ? 1e-13 : 4e-6;
    for (const auto& path : Paths()) {
      const auto got = WithPath(path, [&] { return RowEntropy(logits.to(dtype)); });
      const std::string what = std::string(c10::toString(dtype)) + " " + path;
      ASSERT_EQ(got.scalar_type(), dtype) << what;
      ExpectNear(got, want, rel, what);
    }
  }
  auto masked = logits.clone();
  masked[0][1].slice(0, 0, 50).fill_(-kInf);
  const auto lp = masked.log_softmax(-1);
  const auto p = lp.exp();
  const auto with_zeros = -torch::where(p > 0, p * lp, torch::zeros_like(p)).sum(-1);
  ExpectNear(WithFused(true, [&] { return RowEntropy(masked); }), with_zeros, 1e-13, "-inf logits");
  for (const auto& isa : SoftmaxRowIsas()) {
    ExpectNear(WithPath(isa, [&] { return RowEntropy(masked.to(torch::kFloat32)); }), with_zeros, 4e-6,
               isa + ", -inf logits");
  }
}

}  // namespace
}  // namespace streambp
