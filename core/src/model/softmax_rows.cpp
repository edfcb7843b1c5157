// Tiled attention's softmax passes (softmax_rows.h). As LibTorch ops, a tile's forward step
// is ~10 passes over its scores (max, subtract, exp, sum, ...) and its backward 4, each over
// the whole tile, which is larger than the second-level cache at the default sizes; here
// each row is loaded once and every pass over it runs while it is in the first-level cache.
// The float32 exp is a polynomial the compiler vectorizes (softmax_rows_loops.inc), built
// for AVX-512, AVX2 + FMA and the baseline instruction set, and the version is chosen from
// the CPU's features once (SoftmaxRowIsas). The file is compiled with -fno-trapping-math, so
// that the conversions and selects of that exp may run on every lane (core/CMakeLists.txt).
#include "softmax_rows.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace streambp {
namespace {

std::atomic<bool>& FusedOn() {
  static std::atomic<bool> on{true};
  return on;
}

// The float32 row loops (softmax_rows_loops.inc), one version per instruction set.
struct RowLoops {
  float (*row_max)(const float*, int64_t);
  float (*exp_shift_sum)(float*, int64_t, float);
  void (*exp_grad)(float*, float*, int64_t, float, float);
  float (*exp_sum)(const float*, int64_t, float);
  void (*scaled_exp)(float*, const float*, int64_t, float, float);
  void (*exp_moments)(const float*, int64_t, float, float*, float*);
};

// The portable build (x86-64's baseline is SSE2, where this exp stays scalar), and on x86-64
// with GCC or Clang the AVX2 + FMA and AVX-512 builds too. The version is chosen from the CPU's
// features (__builtin_cpu_supports), not its model: GCC's target_clones("arch=haswell") picks
// its clone on Haswell CPUs only (__builtin_cpu_is), which left the passes scalar on an AMD
// EPYC (a T = 4096 stream step took 23.3 s there with them scalar, 14.5 s with AVX2).
#define STREAMBP_ROWS_NS rows_baseline
#define STREAMBP_ROWS_TARGET
#include "softmax_rows_loops.inc"
#undef STREAMBP_ROWS_NS
#undef STREAMBP_ROWS_TARGET
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STREAMBP_ROWS_X86 1
#define STREAMBP_ROWS_NS rows_avx2
#define STREAMBP_ROWS_TARGET __attribute__((target("avx2,fma")))
#include "softmax_rows_loops.inc"
#undef STREAMBP_ROWS_NS
#undef STREAMBP_ROWS_TARGET
#define STREAMBP_ROWS_NS rows_avx512
#define STREAMBP_ROWS_TARGET __attribute__((target("avx512f,avx2,fma")))
#include "softmax_rows_loops.inc"
#undef STREAMBP_ROWS_NS
#undef STREAMBP_ROWS_TARGET
#endif

struct RowIsa {
  const char* name;
  const RowLoops* loops;
};

// The versions this CPU runs, best first.
const std::vector<RowIsa>& RunnableIsas() {
  static const std::vector<RowIsa> isas = [] {
    std::vector<RowIsa> v;
#ifdef STREAMBP_ROWS_X86
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f")) v.push_back({"avx512f", &rows_avx512::kLoops});
    if (avx2) v.push_back({"avx2+fma", &rows_avx2::kLoops});
#endif
    v.push_back({"baseline", &rows_baseline::kLoops});
    return v;
  }();
  return isas;
}

std::atomic<size_t>& ActiveIsa() {
  static std::atomic<size_t> at{0};
  return at;
}

const RowLoops& Loops() { return *RunnableIsas()[ActiveIsa().load(std::memory_order_relaxed)].loops; }

// The row loops, float32 (the chosen version) and float64 (std::exp: the exactness tests' path).
float RowMax(const float* x, int64_t n) { return Loops().row_max(x, n); }

double RowMax(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float ExpShiftSum(float* x, int64_t n, float shift) { return Loops().exp_shift_sum(x, n, shift); }

double ExpShiftSum(double* x, int64_t n, double shift) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

void ExpGrad(float* s, float* dp, int64_t n, float lse, float D) { Loops().exp_grad(s, dp, n, lse, D); }

void ExpGrad(double* s, double* dp, int64_t n, double lse, double D) {
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - lse);
    dp[i] = (dp[i] - D) * s[i];
  }
}

float ExpSum(const float* x, int64_t n, float shift) { return Loops().exp_sum(x, n, shift); }

double ExpSum(const double* x, int64_t n, double shift) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - shift);
  return sum;
}

void ScaledExp(float* out, const float* x, int64_t n, float lse, float scale) {
  Loops().scaled_exp(out, x, n, lse, scale);
}

void ScaledExp(double* out, const double* x, int64_t n, double lse, double scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = scale * std::exp(x[i] - lse);
}

void ExpMoments(const float* x, int64_t n, float shift, float* sum, float* weighted) {
  Loops().exp_moments(x, n, shift, sum, weighted);
}

void ExpMoments(const double* x, int64_t n, double shift, double* sum, double* weighted) {
  double s0 = 0.0, s1 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double y = x[i] - shift;
    const double e = std::exp(y);
    s0 += e;
    s1 += e == 0.0 ? 0.0 : e * y;
  }
  *sum = s0;
  *weighted = s1;
}

float ScalarExp(float x) { return std::exp(x); }
double ScalarExp(double x) { return std::exp(x); }

// Element (b, r, 0) of a [n, R, C] tensor whose last dimension is contiguous.
template <typename T>
struct Rows {
  T* data;
  int64_t s0, s1;
  explicit Rows(const torch::Tensor& t) : data(t.data_ptr<T>()), s0(t.stride(0)), s1(t.stride(1)) {}
  T* at(int64_t b, int64_t r) const { return data + b * s0 + r * s1; }
};

// Rows per task of at::parallel_for: each is ~1 us at the default key tile.
constexpr int64_t kRowGrain = 16;

template <typename T>
void OnlineStepRows(const torch::Tensor& s, const torch::Tensor& m, const torch::Tensor& l, const torch::Tensor& acc,
                    bool first) {
  const int64_t R = s.size(1), K = s.size(2), hd = first ? 0 : acc.size(2);
  const Rows<T> S(s), M(m), L(l);
  const Rows<T> A = first ? Rows<T>(m) : Rows<T>(acc);
  at::parallel_for(0, s.size(0) * R, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / R, r = i % R;
      T* row = S.at(b, r);
      T* mr = M.at(b, r);
      T* lr = L.at(b, r);
      const T tile_max = RowMax(row, K);
      const T old = first ? -std::numeric_limits<T>::infinity() : *mr;
      const T now = tile_max > old ? tile_max : old;
      const T shift = std::isinf(now) ? T(0) : now;
      const T sum = ExpShiftSum(row, K, shift);
      if (first) {
        *lr = sum;
      } else {
        const T alpha = ScalarExp(old - shift);
        *lr = *lr * alpha + sum;
        T* a = A.at(b, r);
        for (int64_t j = 0; j < hd; ++j) a[j] *= alpha;
      }
      *mr = now;
    }
  });
}

template <typename T>
void GradStepRows(const torch::Tensor& s, const torch::Tensor& dp, const torch::Tensor& lse, const torch::Tensor& D) {
  const int64_t R = s.size(1), K = s.size(2);
  const Rows<T> S(s), P(dp), E(lse), DD(D);
  at::parallel_for(0, s.size(0) * R, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / R, r = i % R;
      ExpGrad(S.at(b, r), P.at(b, r), K, *E.at(b, r), *DD.at(b, r));
    }
  });
}

// Whether the fused passes take these tensors: all on the CPU in float32 or float64, the
// rows of every one contiguous.
bool Fusable(std::initializer_list<const torch::Tensor*> ts) {
  if (!FusedOn().load()) return false;
  const auto dtype = (*ts.begin())->scalar_type();
  if (dtype != torch::kFloat32 && dtype != torch::kFloat64) return false;
  for (const auto* t : ts) {
    if (!t->defined()) continue;
    if (!t->device().is_cpu() || t->scalar_type() != dtype || t->dim() != 3 || t->stride(2) != 1) return false;
  }
  return true;
}

// Whether index t of a row is its argmax as LibTorch's argmax picks it: the first NaN where the
// row has one, else the first of its largest values (`top`, the largest that is not NaN).
template <typename T>
bool IsArgmax(const T* row, int64_t V, int64_t t, T top, bool has_nan) {
  if (has_nan) {
    for (int64_t j = 0; j < V; ++j) {
      if (std::isnan(row[j])) return j == t;
    }
  }
  if (!(row[t] == top)) return false;
  // Ties before t, counted without an early exit so that the loop vectorizes: it runs in every
  // row whose target holds the max (most rows of a well-trained model), over up to V entries.
  int64_t earlier = 0;
#pragma omp simd reduction(+ : earlier)
  for (int64_t j = 0; j < t; ++j) earlier += row[j] == top ? 1 : 0;
  return earlier == 0;
}

// logit[target] - logsumexp(logits) per row of contiguous logits [N, V], and its backward in one
// pass per row: d logits = g (onehot(target) - e^(logits - lse)).
struct TargetLogprobsFunction : public torch::autograd::Function<TargetLogprobsFunction> {
  // `is_top`: when defined, whether each row's target is its argmax, from the same read of the
  // row as its max (a second pass over the row only up to the target, and only where the target
  // holds the max).
  template <typename T>
  static void Forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& lse,
                      const torch::Tensor& out, const torch::Tensor& is_top) {
    const int64_t V = x.size(1);
    const T* xs = x.data_ptr<T>();
    const int64_t* ts = t.data_ptr<int64_t>();
    T* ls = lse.data_ptr<T>();
    T* os = out.data_ptr<T>();
    bool* hits = is_top.defined() ? is_top.data_ptr<bool>() : nullptr;
    at::parallel_for(0, x.size(0), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const T* row = xs + i * V;
        const T top = RowMax(row, V);
        const T shift = std::isinf(top) ? T(0) : top;  // as LibTorch's logsumexp: +-inf rows keep their inf
        ls[i] = std::log(ExpSum(row, V, shift)) + shift;
        os[i] = row[ts[i]] - ls[i];
        // The sum is NaN exactly where the row holds a NaN (RowMax passes over them).
        if (hits != nullptr) hits[i] = IsArgmax(row, V, ts[i], top, std::isnan(ls[i]));
      }
    });
  }

  template <typename T>
  static void Backward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& lse,
                       const torch::Tensor& g, const torch::Tensor& grad) {
    const int64_t V = x.size(1);
    const T* xs = x.data_ptr<T>();
    const int64_t* ts = t.data_ptr<int64_t>();
    const T* ls = lse.data_ptr<T>();
    const T* gs = g.data_ptr<T>();
    T* out = grad.data_ptr<T>();
    at::parallel_for(0, x.size(0), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        T* row = out + i * V;
        ScaledExp(row, xs + i * V, V, ls[i], -gs[i]);
        row[ts[i]] += gs[i];
      }
    });
  }

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, torch::Tensor* target_is_top) {
    const int64_t V = logits.size(-1);
    const auto x = logits.reshape({-1, V});
    const auto t = targets.reshape({-1}).contiguous();
    TORCH_CHECK(t.size(0) == x.size(0), "TargetLogprobs: ", t.size(0), " targets for ", x.size(0), " rows");
    const auto [low, high] = t.aminmax();
    TORCH_CHECK(low.item<int64_t>() >= 0 && high.item<int64_t>() < V, "TargetLogprobs: targets must be in [0, ", V,
                ")");
    auto lse = torch::empty({x.size(0)}, x.options());
    auto out = torch::empty({x.size(0)}, x.options());
    torch::Tensor is_top;
    if (target_is_top != nullptr) is_top = torch::empty({x.size(0)}, x.options().dtype(torch::kBool));
    if (x.scalar_type() == torch::kFloat32) {
      Forward<float>(x, t, lse, out, is_top);
    } else {
      Forward<double>(x, t, lse, out, is_top);
    }
    if (target_is_top != nullptr) *target_is_top = is_top.view(targets.sizes());
    ctx->save_for_backward({x, t, lse});
    ctx->saved_data["sizes"] = logits.sizes().vec();
    return out.view(targets.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &t = saved[1], &lse = saved[2];
    const auto g = grads[0].reshape({-1}).to(x.scalar_type()).contiguous();
    auto grad = torch::empty(x.sizes(), x.options());
    if (x.scalar_type() == torch::kFloat32) {
      Backward<float>(x, t, lse, g, grad);
    } else {
      Backward<double>(x, t, lse, g, grad);
    }
    return {grad.view(ctx->saved_data["sizes"].toIntVector()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TargetLogprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                             torch::Tensor* target_is_top) {
  const bool fused = FusedOn().load() && logits.device().is_cpu() && logits.is_contiguous() &&
                     (logits.scalar_type() == torch::kFloat32 || logits.scalar_type() == torch::kFloat64) &&
                     targets.scalar_type() == torch::kInt64 && targets.device().is_cpu() && logits.dim() >= 1 &&
                     targets.sizes() == logits.sizes().slice(0, logits.dim() - 1) && logits.size(-1) > 0;
  if (fused) return TargetLogprobsFunction::apply(logits, targets, target_is_top);
  if (target_is_top != nullptr) {
    torch::NoGradGuard no_grad;
    *target_is_top = logits.argmax(-1) == targets;
  }
  // The gather first: autograd then runs logsumexp's backward before the gather's, so its
  // temporaries come and go before the gather's full-size gradient exists.
  auto target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  return target_logit - logits.logsumexp(-1);
}

namespace {

template <typename T>
void EntropyRows(const torch::Tensor& x, const torch::Tensor& out) {
  const int64_t V = x.size(1);
  const T* xs = x.data_ptr<T>();
  T* os = out.data_ptr<T>();
  at::parallel_for(0, x.size(0), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* row = xs + i * V;
      const T top = RowMax(row, V);
      const T shift = std::isinf(top) ? T(0) : top;
      T sum, weighted;
      ExpMoments(row, V, shift, &sum, &weighted);
      // -sum p log p with p = e^(x - shift) / sum: log sum - sum p (x - shift).
      os[i] = std::log(sum) - weighted / sum;
    }
  });
}

}  // namespace

torch::Tensor RowEntropy(const torch::Tensor& logits) {
  torch::NoGradGuard no_grad;
  const bool fused = FusedOn().load() && logits.device().is_cpu() && logits.dim() >= 1 && logits.size(-1) > 0 &&
                     (logits.scalar_type() == torch::kFloat32 || logits.scalar_type() == torch::kFloat64);
  if (!fused) {
    const auto logp = torch::log_softmax(logits, -1);
    return -(logp.exp() * logp).sum(-1);
  }
  const auto x = logits.reshape({-1, logits.size(-1)}).contiguous();
  auto out = torch::empty({x.size(0)}, x.options());
  if (x.scalar_type() == torch::kFloat32) {
    EntropyRows<float>(x, out);
  } else {
    EntropyRows<double>(x, out);
  }
  return out.view(logits.sizes().slice(0, logits.dim() - 1));
}

void OnlineSoftmaxStep(const torch::Tensor& s, const torch::Tensor& m, const torch::Tensor& l,
                       const torch::Tensor& acc, bool first) {
  const torch::Tensor none;
  if (Fusable({&s, &m, &l, first ? &none : &acc})) {
    if (s.scalar_type() == torch::kFloat32) {
      OnlineStepRows<float>(s, m, l, acc, first);
    } else {
      OnlineStepRows<double>(s, m, l, acc, first);
    }
    return;
  }
  const auto tile_max = s.amax(-1, /*keepdim=*/true);  // not max(), which also finds the indices
  const auto now = first ? tile_max : torch::maximum(m, tile_max);
  const auto shift = torch::where(torch::isinf(now), torch::zeros_like(now), now);
  s.sub_(shift).exp_();
  if (first) {
    l.copy_(s.sum(-1, /*keepdim=*/true));
  } else {
    const auto alpha = (m - shift).exp_();
    l.mul_(alpha).add_(s.sum(-1, /*keepdim=*/true));
    acc.mul_(alpha);
  }
  m.copy_(now);
}

void SoftmaxGradStep(const torch::Tensor& s, const torch::Tensor& dp, const torch::Tensor& lse,
                     const torch::Tensor& D) {
  if (Fusable({&s, &dp, &lse, &D})) {
    if (s.scalar_type() == torch::kFloat32) {
      GradStepRows<float>(s, dp, lse, D);
    } else {
      GradStepRows<double>(s, dp, lse, D);
    }
    return;
  }
  s.sub_(lse).exp_();
  dp.sub_(D).mul_(s);
}

torch::Tensor SoftmaxExp(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "SoftmaxExp: a float32 CPU tensor");
  auto y = x.contiguous().clone();
  ExpShiftSum(y.data_ptr<float>(), y.numel(), 0.0f);
  return y;
}

std::vector<std::string> SoftmaxRowIsas() {
  std::vector<std::string> names;
  for (const auto& isa : RunnableIsas()) names.emplace_back(isa.name);
  return names;
}

std::string SoftmaxRowIsa() { return RunnableIsas()[ActiveIsa().load()].name; }

std::string SetSoftmaxRowIsa(const std::string& name) {
  const auto& isas = RunnableIsas();
  for (size_t i = 0; i < isas.size(); ++i) {
    if (name == isas[i].name) return isas[ActiveIsa().exchange(i)].name;
  }
  std::string known;
  for (const auto& isa : isas) known += std::string(known.empty() ? "" : ", ") + isa.name;
  throw std::invalid_argument("softmax rows: no version '" + name + "' on this CPU (it runs: " + known + ")");
}

bool SetFusedSoftmaxRows(bool on) { return FusedOn().exchange(on); }

}  // namespace streambp
