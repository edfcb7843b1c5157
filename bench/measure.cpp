// Measuring one point, the max-length search and the GEMM reference (analytic FLOPs: flops.cpp).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "streambp/error.h"
#include <torch/torch.h>

#include "bench.h"
#include "streambp/estimate.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "streambp/optimizer.h"
#include "streambp/terminal_progress.h"

namespace streambp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Thrown from the progress hook to end a step whose peak has passed (Context::stop_after_peak).
struct PeakPassed {};

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The gradients of what trains, zeroed in place (they stay allocated: counted as statics).
void ZeroGradients(Context& ctx) {
  torch::NoGradGuard no_grad;
  auto zero = [](torch::Tensor p) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  };
  if (ctx.adapter) {
    for (auto& [name, p] : ctx.adapter->named_parameters()) zero(p);
  } else {
    for (auto& p : ctx.model->parameters()) zero(p);
  }
}

// Minor page faults and CPU seconds in the kernel and in user mode of the whole process so
// far (every thread's, the BLAS's too).
struct Usage {
  int64_t minor_faults = 0;
  double system_seconds = 0;
  double user_seconds = 0;
};
Usage ProcessUsage() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {static_cast<int64_t>(u.ru_minflt), u.ru_stime.tv_sec + 1e-6 * u.ru_stime.tv_usec,
          u.ru_utime.tv_sec + 1e-6 * u.ru_utime.tv_usec};
}

}  // namespace

int64_t StatusBytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;  // "...  123 kB"
  }
  return 0;
}

int64_t ResidentBytes() { return StatusBytes("VmRSS"); }
int64_t PeakResidentBytes() { return StatusBytes("VmHWM"); }

void ResetPeakRss() {
  ::malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to VmRSS (Linux >= 4.0)
}

std::string Variant::label() const {
  std::string s = engine;
  if (engine == "stream" && options.offload_layer_inputs) s += ":offload";
  if (engine == "stream" && options.keep_attention) s += ":keep";
  if (engine == "checkpoint" && options.tiled_attention) {
    s += logits_chunked ? ":tiled" : ":tiled+materialized-logits";
  } else if (engine == "checkpoint") {
    s += logits_chunked ? "+chunked-logits" : "";
  }
  if (options.recompute_kv_per_chunk) s += "+prefix-kv";
  return s;
}

std::vector<Sequence> SyntheticSequences(const Workload& w, int64_t seq_len, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(w.data_seed + 7919 * static_cast<uint64_t>(seq_len));
  auto random_tokens = [&](int64_t n) {
    auto ids = at::randint(0, vocab, {n}, gen, torch::kInt64);
    return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
  };
  const int64_t T = std::max<int64_t>(seq_len, 4);
  const int64_t prompt_len = T / 4;
  std::vector<Sequence> out;
  if (w.objective == "sft") {
    const int64_t pack = std::clamp<int64_t>(w.pack, 1, T);
    for (int64_t i = 0; i < w.batch * pack; ++i) {
      // Row i / pack's sequence i % pack: T / pack tokens, the row's last one the rest.
      const int64_t n = i % pack + 1 < pack ? T / pack : T - (pack - 1) * (T / pack);
      Sequence s;
      s.tokens = random_tokens(n);
      s.loss_mask.assign(n, 1);
      std::fill(s.loss_mask.begin(), s.loss_mask.begin() + n / 4, 0);
      out.push_back(std::move(s));
    }
    return out;
  }
  // dpo: `batch` pairs; grpo: one group of max(batch, 2) completions. Every sequence is a
  // shared prompt (a quarter) + its own completion, T tokens in all.
  const bool dpo = w.objective == "dpo";
  const int64_t units = dpo ? w.batch : 1;
  const int64_t per_unit = dpo ? 2 : std::max<int64_t>(w.batch, 2);
  for (int64_t u = 0; u < units; ++u) {
    const auto prompt = random_tokens(prompt_len);
    for (int64_t k = 0; k < per_unit; ++k) {
      Sequence s;
      s.tokens = prompt;
      const auto completion = random_tokens(T - prompt_len);
      s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      s.group = u;
      s.role = dpo ? static_cast<int>(k) : 0;
      s.reward = static_cast<double>(k) / per_unit;
      // DPO's reference log-prob: the reference model's cost is not part of the backward
      // step, so a fixed value stands in for it (uniform prediction, shifted by role).
      if (dpo) s.ref_logp = -static_cast<double>(s.num_targets()) * std::log(static_cast<double>(vocab)) - k;
      out.push_back(std::move(s));
    }
  }
  return out;
}

double MeasureGemmGflops(torch::Dtype dtype, int64_t n, const DeviceMemory& device) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto on = torch::TensorOptions().dtype(dtype).device(device.device);
  auto a = at::randn({n, n}, gen, torch::TensorOptions().dtype(torch::kFloat32)).to(on);
  auto b = at::randn({n, n}, gen, torch::TensorOptions().dtype(torch::kFloat32)).to(on);
  auto c = torch::mm(a, b);
  device.synchronize();
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    device.synchronize();
    best = std::min(best, Seconds(t0));
  }
  return 2.0 * n * n * n / best / 1e9;
}

void PrepareStatics(Context& ctx) {
  torch::NoGradGuard no_grad;
  // What trains: every parameter, or (LoRA) the adapter on a frozen base.
  const auto trained = ctx.adapter ? ctx.adapter->named_parameters() : ctx.model->named_hf_parameters();
  static std::unique_ptr<Optimizer> optimizer;
  optimizer.reset();
  for (auto& p : ctx.model->parameters()) {
    p.mutable_grad() = torch::Tensor();
    p.requires_grad_(!ctx.adapter);
  }
  ctx.model->set_adapter(ctx.adapter);
  ctx.statics = {};
  for (const auto& p : ctx.model->parameters()) ctx.statics.weights += p.numel() * p.element_size();
  if (ctx.adapter) {
    for (const auto& [name, p] : trained) ctx.statics.weights += p.numel() * p.element_size();
  }
  const int64_t before = ctx.memory.live();
  for (const auto& [name, p] : trained) {
    auto t = p;
    t.requires_grad_(true);
    t.mutable_grad() = torch::zeros_like(t);
  }
  ctx.statics.grads = ctx.memory.live() - before;
  if (ctx.optimizer != "none") {
    // The optimizer's state exists from its first step on: make one with lr 0 (no change).
    OptimizerOptions o;
    o.name = ctx.optimizer;
    if (o.name == "sgd") o.momentum = 0.9;
    const int64_t live = ctx.memory.live();
    optimizer = std::make_unique<Optimizer>(o, trained);
    optimizer->step(0.0);
    ctx.statics.optimizer = ctx.memory.live() - live;
  }
}

Batch SyntheticBatch(const Workload& w, int64_t seq_len, int64_t vocab) {
  const auto sequences = SyntheticSequences(w, seq_len, vocab);
  return w.pack > 1 ? MakeBatch(sequences, Layout::kPacked, std::max<int64_t>(seq_len, 4))
                    : MakeBatch(sequences, Layout::kRightPad);
}

// checkpoint:chunked with the default logits chunk: the one DefaultChunks picks for this length.
static Variant AtLength(const Variant& v, const ModelConfig& config, torch::Dtype dtype, int64_t seq_len) {
  Variant out = v;
  if (v.engine == "checkpoint" && v.logits_chunked && !v.options.tiled_attention && v.options.logits_chunk < 0) {
    out.options.logits_chunk = DefaultChunks(config, dtype, seq_len).logits_chunk;
  }
  return out;
}

Run MeasurePoint(Context& ctx, const Variant& variant, int64_t seq_len, int64_t warmup, int64_t repeat,
                 int64_t activation_budget) {
  const Variant v = AtLength(variant, ctx.config, ctx.dtype, seq_len);
  const auto batch = SyntheticBatch(ctx.workload, seq_len, ctx.config.vocab_size);
  const int64_t T = batch.length(), rows = batch.rows();
  Run r;
  r.variant = v;
  r.seq_len = T;
  r.batch = rows;
  r.statics = ctx.statics;
  const auto chunks = ResolveChunks(v.options, T, ctx.config, ctx.dtype);
  r.chunk = chunks.chunk;
  r.logits_chunk = chunks.logits_chunk;
  r.key_chunk = chunks.key_chunk;
  const auto estimate = EstimateStepMemory(ctx.config, ctx.dtype, rows, T, v.options, ctx.optimizer,
                                           ctx.adapter ? &ctx.adapter->config() : nullptr);
  r.predicted_key_chunk = estimate.key_chunk;
  r.predicted_offloaded_bytes = estimate.offloaded_bytes;
  r.predicted_activation_bytes = estimate.activation_bytes;
  r.predicted_peak_bytes = estimate.total();
  auto probe = CreateObjective(ctx.workload.objective, nlohmann::json::object());
  const auto flops = AnalyticFlops(ctx.config, ctx.dtype, rows, T, v, probe->needs_sequence_pass(), ctx.workload.pack);
  r.flops = flops.executed;
  r.model_flops = flops.model;
  const int64_t statics = ctx.statics.weights + ctx.statics.grads + ctx.statics.optimizer;
  const int64_t budget = activation_budget > 0 ? activation_budget : ctx.mem_limit;
  // A sweep point far past the machine limit is not run (it would take minutes to fail).
  if (activation_budget == 0 && ctx.mem_limit > 0 && estimate.activation_bytes > 2 * ctx.mem_limit) {
    r.oom = r.oom_predicted = true;
    r.oom_message = "estimated " + HumanBytes(estimate.activation_bytes) + " of activations, past 2x the limit " +
                    HumanBytes(ctx.mem_limit);
    return r;
  }
  int64_t peak = 0;
  ResetPeakRss();
  r.rss_start_bytes = ResidentBytes();
  // GEMMs next to each timed step (Run::gemm_samples): each outside the step's tracked peak
  // (before reset_peak, after the peak is read) and its RSS peak (VmHWM read before the GEMM
  // after a step, reset after the GEMM before it), its buffers returned before the step.
  const bool brackets = ctx.gemm_n > 0 && !ctx.stop_after_peak;
  int64_t rss_peak = 0;
  auto gemm_now = [&] {
    const double g = MeasureGemmGflops(ctx.dtype, ctx.gemm_n, ctx.memory);
    ctx.memory.release_cached();
    return g;
  };
  for (int64_t i = 0; i < warmup + repeat; ++i) {
    const bool timed = i >= warmup;
    double gemm_before = 0;
    if (brackets && timed) {
      rss_peak = std::max(rss_peak, PeakResidentBytes());
      gemm_before = gemm_now();
      ResetPeakRss();
    }
    ZeroGradients(ctx);
    auto objective = CreateObjective(ctx.workload.objective, nlohmann::json::object());
    ctx.memory.reset_peak();
    try {
      DeviceMemory::Budget scoped(ctx.memory, budget > 0 ? statics + budget : 0);
      // Each step runs on a fresh thread: after a backward fails (out of memory), LibTorch's
      // autograd engine keeps the failed graph's pending gradient buffers in its
      // thread-local ready queue until a later backward on that thread drains it; a thread
      // of its own takes them away with it, so one OOM never inflates the next point.
      std::exception_ptr error;
      double secs = 0;
      Usage usage;
      bool stopped = false;
      StepResult result;
      std::thread worker([&] {
        try {
          torch::set_num_threads(ctx.threads);
          ctx.memory.synchronize();
          usage = ProcessUsage();
          const auto t0 = Clock::now();
          TerminalProgress line(v.label() + " T=" + std::to_string(T));
          auto options = line.wrap(v.options);
          if (ctx.stop_after_peak) {
            options.on_progress = [shown = options.on_progress](const EngineProgress& p) {
              if (shown) shown(p);
              if (p.phase == EngineProgress::Phase::kBackward && p.layers >= 2 && p.layer == p.layers - 2) {
                throw PeakPassed{};
              }
            };
          }
          try {
            result = ForwardBackward(ctx.model, batch, *objective, options);
            objective->finish();
          } catch (const PeakPassed&) {
            stopped = true;
          }
          ctx.memory.synchronize();
          secs = Seconds(t0);
          const Usage end = ProcessUsage();
          usage = {end.minor_faults - usage.minor_faults, end.system_seconds - usage.system_seconds,
                   end.user_seconds - usage.user_seconds};
        } catch (...) {
          error = std::current_exception();
        }
      });
      worker.join();
      if (error) std::rethrow_exception(error);
      r.to_peak = stopped;
      r.loss = result.loss;
      r.offloaded_bytes = result.offloaded_bytes;
      if (i >= warmup) {
        r.samples.push_back(secs);
        r.fault_samples.push_back(static_cast<double>(usage.minor_faults));
        r.system_samples.push_back(usage.system_seconds);
        r.user_samples.push_back(usage.user_seconds);
      }
    } catch (const c10::Error& e) {
      if (!IsOutOfMemory(e)) throw;
      r.oom = true;
      r.oom_message = e.what_without_backtrace();
      ctx.memory.release_cached();
      break;
    } catch (const ResourceExhausted& e) {
      // The second tier's memory (pinned host buffers, the scratch folder): too long as well.
      r.oom = true;
      r.oom_message = e.what();
      ctx.memory.release_cached();
      break;
    } catch (const std::bad_alloc&) {
      r.oom = true;
      r.oom_message = "std::bad_alloc";
      break;
    }
    peak = std::max(peak, ctx.memory.peak());
    if (brackets && timed) {
      rss_peak = std::max(rss_peak, PeakResidentBytes());
      r.gemm_samples.push_back(0.5 * (gemm_before + gemm_now()));
    }
  }
  if (brackets && !r.gemm_samples.empty()) ResetPeakRss();  // the last GEMM is not the profiled step's
  if (ctx.profile && !r.oom) {
    ZeroGradients(ctx);
    auto objective = CreateObjective(ctx.workload.objective, nlohmann::json::object());
    std::exception_ptr error;
    std::thread worker([&] {
      try {
        torch::set_num_threads(ctx.threads);
        r.breakdown = ProfileStep([&] {
          ForwardBackward(ctx.model, batch, *objective, v.options);
          objective->finish();
        });
      } catch (...) {
        error = std::current_exception();
      }
    });
    worker.join();
    if (error) std::rethrow_exception(error);
  }
  ZeroGradients(ctx);
  r.rss_peak_bytes = std::max(rss_peak, PeakResidentBytes());
  if (r.oom) return r;
  r.peak_bytes = peak;
  r.activation_bytes = peak - statics;
  r.step_seconds = Median(r.samples);
  r.minor_faults = Median(r.fault_samples);
  r.system_seconds = Median(r.system_samples);
  r.user_seconds = Median(r.user_samples);
  if (r.step_seconds > 0) {
    r.tokens_per_second = static_cast<double>(rows * T) / r.step_seconds;
    r.gflops = r.flops / r.step_seconds / 1e9;
  }
  return r;
}

namespace {

// Adds one more round of the same point (MeasurePoint with repeat 1) to `into`.
void MergeRound(Run& into, const Run& round) {
  if (round.oom) {  // the rounds before it keep their samples
    auto samples = std::move(into.samples), faults = std::move(into.fault_samples),
         system = std::move(into.system_samples), user = std::move(into.user_samples),
         gemm = std::move(into.gemm_samples);
    into = round;
    into.samples = std::move(samples);
    into.fault_samples = std::move(faults);
    into.system_samples = std::move(system);
    into.user_samples = std::move(user);
    into.gemm_samples = std::move(gemm);
    return;
  }
  into.samples.insert(into.samples.end(), round.samples.begin(), round.samples.end());
  into.fault_samples.insert(into.fault_samples.end(), round.fault_samples.begin(), round.fault_samples.end());
  into.minor_faults = Median(into.fault_samples);
  into.system_samples.insert(into.system_samples.end(), round.system_samples.begin(), round.system_samples.end());
  into.system_seconds = Median(into.system_samples);
  into.user_samples.insert(into.user_samples.end(), round.user_samples.begin(), round.user_samples.end());
  into.user_seconds = Median(into.user_samples);
  into.gemm_samples.insert(into.gemm_samples.end(), round.gemm_samples.begin(), round.gemm_samples.end());
  into.peak_bytes = std::max(into.peak_bytes, round.peak_bytes);
  into.activation_bytes = std::max(into.activation_bytes, round.activation_bytes);
  into.rss_peak_bytes = std::max(into.rss_peak_bytes, round.rss_peak_bytes);
  into.offloaded_bytes = std::max(into.offloaded_bytes, round.offloaded_bytes);
  if (!round.breakdown.seconds.empty()) into.breakdown = round.breakdown;
  into.step_seconds = Median(into.samples);
  if (into.step_seconds > 0) {
    into.tokens_per_second = static_cast<double>(into.batch * into.seq_len) / into.step_seconds;
    into.gflops = into.flops / into.step_seconds / 1e9;
  }
}

}  // namespace

std::vector<Run> MeasureInRounds(Context& ctx, const std::vector<Variant>& variants, int64_t seq_len,
                                 int64_t warmup, int64_t repeat) {
  const bool profile = ctx.profile;
  std::vector<Run> point(variants.size());
  const size_t n = variants.size();
  for (int64_t round = 0; round < repeat; ++round) {
    ctx.profile = profile && round == repeat - 1;
    // Odd rounds run the variants in reverse (A B, B A, ...): a variant that always ran
    // second would take whatever the first one leaves (a heap to return, a warmer or cooler
    // machine) in every round.
    for (size_t i = 0; i < n; ++i) {
      const size_t k = round % 2 == 0 ? i : n - 1 - i;
      if (round > 0 && point[k].oom) continue;
      const auto r = MeasurePoint(ctx, variants[k], seq_len, round == 0 ? warmup : 0, 1, 0);
      if (round == 0) {
        point[k] = r;
      } else {
        MergeRound(point[k], r);
      }
    }
  }
  ctx.profile = profile;
  return point;
}

SearchResult SearchMaxLength(Context& ctx, const Variant& v, int64_t budget, int64_t start, int64_t max_len,
                             double tol, bool auto_chunks, int64_t align, bool probe) {
  SearchResult s;
  s.variant = v;
  s.budget_bytes = budget;
  const auto t0 = Clock::now();
  const int64_t statics = ctx.statics.weights + ctx.statics.grads + ctx.statics.optimizer;
  auto options_for = [&](int64_t T) {
    Variant x = v;
    if (auto_chunks && (v.engine == "stream" || v.options.tiled_attention)) {
      // As the server does: the largest chunks whose estimate fits the budget (for
      // checkpoint:tiled its attention blocks and the logits chunk, so the baseline gets the
      // same help from small tiles that stream gets).
      const int64_t rows = SyntheticBatch(ctx.workload, 8, ctx.config.vocab_size).rows();
      auto chosen = ChooseChunks(ctx.config, ctx.dtype, rows, T, statics + budget, ctx.optimizer,
                                 ctx.adapter ? &ctx.adapter->config() : nullptr, v.options);
      x.options.chunk = chosen.chunk;
      x.options.logits_chunk = chosen.logits_chunk;
      x.options.key_chunk = chosen.key_chunk;
    }
    return x;
  };
  auto fits = [&](int64_t T) {
    ++s.probes;
    const auto x = options_for(T);
    const auto r = MeasurePoint(ctx, x, T, 0, 1, budget);
    s.runs.push_back(r);
    std::printf("  search %-28s T=%-7lld %s (chunk %lld, logits %lld, key %lld, estimate's key %lld, %.1f s)\n",
                v.label().c_str(), static_cast<long long>(T),
                r.oom ? "OOM" : ("fits, " + HumanBytes(r.activation_bytes) + (r.to_peak ? " to its peak" : "")).c_str(), static_cast<long long>(r.chunk),
                static_cast<long long>(r.logits_chunk), static_cast<long long>(r.key_chunk),
                static_cast<long long>(r.predicted_key_chunk), r.samples.empty() ? 0.0 : r.samples[0]);
    if (r.oom) std::printf("    %s\n", r.oom_message.substr(0, r.oom_message.find('\n')).c_str());
    std::fflush(stdout);
    if (!r.oom) {
      s.chunk = r.chunk;
      s.logits_chunk = r.logits_chunk;
      s.key_chunk = r.key_chunk;
    }
    return !r.oom;
  };
  auto round = [&](int64_t T) { return std::max<int64_t>(align, T / align * align); };
  {
    const int64_t rows = SyntheticBatch(ctx.workload, 8, ctx.config.vocab_size).rows();
    auto predicted_fits = [&](int64_t T) {
      const auto x = options_for(T);
      return EstimateStepMemory(ctx.config, ctx.dtype, rows, T, x.options, ctx.optimizer,
                                ctx.adapter ? &ctx.adapter->config() : nullptr)
                 .activation_bytes <= budget;
    };
    int64_t a = 0, b = align;
    while (b <= (int64_t{1} << 26) && predicted_fits(b)) {
      a = b;
      b *= 2;
    }
    while (b - a > align) {
      const int64_t mid = round(a + (b - a) / 2);
      if (mid <= a || mid >= b) break;
      (predicted_fits(mid) ? a : b) = mid;
    }
    s.predicted_max_seq_len = a;
  }
  if (!probe) {
    s.seconds = Seconds(t0);
    return s;
  }
  int64_t lo = 0, hi = 0;
  const auto grow = [&](int64_t T) {
    return std::max(T + align, round(static_cast<int64_t>(std::ceil(ctx.search_growth * static_cast<double>(T)))));
  };
  for (int64_t T = round(start);; T = grow(T)) {
    if (T > max_len) {
      s.capped = true;
      break;
    }
    if (fits(T)) {
      lo = T;
    } else {
      hi = T;
      break;
    }
  }
  if (hi == 0 && lo > 0) {
    s.max_seq_len = lo;
  } else if (lo == 0) {
    s.first_oom = hi;
  } else {
    int64_t chunk = s.chunk, logits_chunk = s.logits_chunk, key_chunk = s.key_chunk;
    while (hi - lo > std::max<int64_t>(align, static_cast<int64_t>(tol * static_cast<double>(lo)))) {
      const int64_t mid = round(lo + (hi - lo) / 2);
      if (mid <= lo || mid >= hi) break;
      if (fits(mid)) {
        lo = mid;
        chunk = s.chunk;
        logits_chunk = s.logits_chunk;
        key_chunk = s.key_chunk;
      } else {
        hi = mid;
      }
    }
    s.max_seq_len = lo;
    s.first_oom = hi;
    s.chunk = chunk;
    s.logits_chunk = logits_chunk;
    s.key_chunk = key_chunk;
  }
  s.seconds = Seconds(t0);
  return s;
}

}  // namespace streambp::bench
