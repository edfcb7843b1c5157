// Context parallel (issue 26): how much longer a sequence one StreamBP step can take when its
// positions are split over P processes, each under the same activation budget, what the step
// costs in time on the same total cores, and what the ranks exchange per layer.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "bench.h"
#include "streambp/context_parallel.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"

namespace streambp::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

ModelConfig PlanConfig(const CpPlan& plan) {
  return plan.model_dir.empty() ? PresetConfig(plan.preset, plan.family)
                                : ModelConfig::FromFile(plan.model_dir + "/config.json");
}

// What rank 0 sends per layer and step by the formula (docs/architecture.md: Context
// parallel; ContextParallelStats): K/V gathered in the forward and the backward and their
// gradients reduced once; or, heads exchanged, its rows' K/V to the ranks of their heads
// twice, its heads' dK/dV once, and the chunks' queries and outputs.
struct Traffic {
  int64_t kv = 0, grad_kv = 0, heads = 0;
};
Traffic FormulaBytesPerLayer(const CpPlan& plan, int64_t rows, int64_t T, int P) {
  const auto c = PlanConfig(plan);
  const auto dtype = ParseDtype(plan.dtype);
  const int64_t e = static_cast<int64_t>(c10::elementSize(dtype)), f = dtype == torch::kFloat64 ? 8 : 4;
  if (P <= 1) return {};
  if (!ContextExchangesHeads(c, P, plan.engine.context_exchange)) {
    const int64_t kv = 2 * rows * T * c.kv_dim();
    return {2 * kv * e, kv * f, 0};
  }
  const int64_t R = std::max<int64_t>(1, P / c.num_key_value_heads);
  const auto [s, end] = ContextShardRange(T, 0, P);
  const int64_t mine = end - s;
  return {2 * 2 * rows * mine * c.kv_dim() * R * e, 2 * rows * T * c.kv_dim() * R / P * f,
          3 * rows * (mine * c.q_dim() + T * c.q_dim() / P) * e};
}

// One run of P ranks at T under `budget` (0: none): every rank's report.
json RunRanks(const CpPlan& plan, const std::vector<std::string>& args, const fs::path& root, int P, int64_t T,
              int64_t budget, int64_t steps) {
  char name[96];
  std::snprintf(name, sizeof name, "p%d-t%lld-b%lld", P, (long long)T, (long long)budget);
  const fs::path dir = root / name;
  fs::create_directories(dir);
  auto child = args;
  child.insert(child.end(), {"--cp-worker", dir.string(), "--cp-seq-len", std::to_string(T), "--cp-budget",
                             std::to_string(budget), "--cp-steps", std::to_string(steps)});
  SpawnRanks(child, P, 0, dir.string());
  json ranks = json::array();
  for (int r = 0; r < P; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r) + ".json"));
    ranks.push_back(json::parse(in));
  }
  fs::remove_all(dir);
  return ranks;
}

bool AllOk(const json& ranks) {
  for (const auto& r : ranks) {
    if (r.at("status") != "ok") return false;
  }
  return true;
}

int64_t MaxOf(const json& ranks, const char* key) {
  int64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.at(key).get<int64_t>());
  return m;
}

}  // namespace

int RunCpWorker(const CpPlan& plan, const std::string& dir, int64_t seq_len, int64_t budget, int64_t steps) {
  const auto dist = DistOptions::FromEnv();
  ConfigureThreads(std::max(1, plan.threads / dist.world_size));
  RegisterBuiltinObjectives();
  const auto dtype = ParseDtype(plan.dtype);
  auto model = plan.model_dir.empty() ? InitModel(PresetConfig(plan.preset, plan.family), plan.seed, dtype)
                                      : LoadModel(plan.model_dir, dtype);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);  // statics, not activations
  }
  const auto batch = MakeBatch(SyntheticSequences(plan.workload, seq_len, model->config().vocab_size), Layout::kRightPad);
  auto group = dist.enabled() ? Communicator::Create(dist) : nullptr;
  json report{{"rank", dist.rank}, {"world_size", dist.world_size}, {"seq_len", seq_len},
              {"rows", batch.rows()}, {"threads", torch::get_num_threads()}};
  std::vector<double> seconds;
  int64_t activation = 0;
  ContextParallelStats stats;
  const int64_t live = memory::LiveBytes();
  try {
    memory::ScopedBudget limit(budget > 0 ? live + budget : 0);
    for (int64_t i = 0; i < 1 + steps; ++i) {
      for (auto& p : model->parameters()) p.mutable_grad().zero_();
      auto objective = CreateObjective(plan.workload.objective, json::object());
      stats = {};
      memory::ResetPeak();
      const auto t0 = Clock::now();
      const auto result = group ? ContextParallelForwardBackward(model, batch, *objective, plan.engine, *group, &stats)
                                : ForwardBackward(model, batch, *objective, plan.engine);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      activation = std::max(activation, memory::PeakBytes() - live);
      report["loss"] = result.loss;
      if (i > 0 || steps == 0) seconds.push_back(s);
      if (budget > 0) break;  // a probe: one step
    }
    report["status"] = "ok";
  } catch (const c10::OutOfMemoryError& e) {
    activation = std::max(activation, memory::PeakBytes() - live);  // the peak when it stopped
    report["status"] = "oom";
    report["message"] = std::string(e.what()).substr(0, 300);
  } catch (const std::exception& e) {
    report["status"] = "failed";
    report["message"] = std::string(e.what()).substr(0, 300);
  }
  std::sort(seconds.begin(), seconds.end());
  report["step_seconds"] = seconds.empty() ? 0.0 : seconds[seconds.size() / 2];
  report["activation_bytes"] = activation;
  report["kv_bytes"] = stats.kv_bytes;
  report["grad_kv_bytes"] = stats.grad_kv_bytes;
  report["head_bytes"] = stats.head_bytes;
  report["comm_seconds"] = stats.seconds;
  report["layers"] = stats.layers;
  std::ofstream out(fs::path(dir) / ("rank" + std::to_string(dist.rank) + ".json"));
  out << report.dump(1) << "\n";
  out.close();
  // A rank out of memory leaves its peers waiting in a collective: its exit closes their
  // connections, so they fail at once instead of at the timeout.
  return out ? 0 : 1;
}

json RunContextParallel(const CpPlan& plan, const std::vector<std::string>& args) {
  // A peer that stopped (out of memory) must not hold the others for the 600 s default.
  if (std::getenv("STREAMBP_DIST_TIMEOUT") == nullptr) ::setenv("STREAMBP_DIST_TIMEOUT", "60", 1);
  const fs::path root = fs::temp_directory_path() / ("streambp-bench-cp-" + std::to_string(::getpid()));
  fs::create_directories(root);
  json runs = json::array();
  int64_t base_len = 0;
  double base_seconds = 0;
  for (int P : plan.ranks) {
    json run{{"ranks", P}, {"threads_per_rank", std::max(1, plan.threads / P)}, {"budget_bytes", plan.budget}};
    // The search, probe by probe: every rank under the budget.
    if (plan.budget > 0) {
      const auto t0 = Clock::now();
      json probes = json::array();
      auto fits = [&](int64_t T) {
        const auto ranks = RunRanks(plan, args, root, P, T, plan.budget, 0);
        const bool ok = AllOk(ranks);
        probes.push_back({{"seq_len", T}, {"fits", ok}, {"activation_bytes", MaxOf(ranks, "activation_bytes")}});
        std::printf("  P=%d search T=%-7lld %s (activation peak of the most loaded rank %s)\n", P, (long long)T,
                    ok ? "fits" : "OOM", HumanBytes(MaxOf(ranks, "activation_bytes")).c_str());
        std::fflush(stdout);
        return ok;
      };
      auto round = [&](int64_t T) { return std::max<int64_t>(plan.align, T / plan.align * plan.align); };
      int64_t lo = 0, hi = 0;
      for (int64_t T = round(plan.search_start); T <= plan.search_max; T = round(T * 2)) {
        if (!fits(T)) {
          hi = T;
          break;
        }
        lo = T;
      }
      while (hi > 0 && lo > 0 && hi - lo > std::max<int64_t>(plan.align, static_cast<int64_t>(plan.tol * lo))) {
        const int64_t mid = round(lo + (hi - lo) / 2);
        if (mid <= lo || mid >= hi) break;
        (fits(mid) ? lo : hi) = mid;
      }
      run["max_seq_len"] = lo;
      run["first_oom"] = hi;
      run["capped"] = hi == 0;
      run["probes"] = probes;
      run["search_seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
      if (P == plan.ranks.front()) base_len = lo;
      run["max_seq_len_vs_first"] = base_len > 0 ? static_cast<double>(lo) / static_cast<double>(base_len) : 0.0;
    }
    // The timed step at seq_len, without a budget.
    const auto ranks = RunRanks(plan, args, root, P, plan.seq_len, 0, plan.repeat);
    if (!AllOk(ranks)) throw Error(ErrorCode::kInternal, "context parallel step failed: " + ranks.dump());
    double slowest = 0;
    for (const auto& r : ranks) slowest = std::max(slowest, r.at("step_seconds").get<double>());
    if (P == plan.ranks.front()) base_seconds = slowest;
    const int64_t layers = std::max<int64_t>(1, ranks[0].at("layers").get<int64_t>());
    const auto formula_bytes = FormulaBytesPerLayer(plan, ranks[0].at("rows").get<int64_t>(), plan.seq_len, P);
    bool same_loss = true;
    for (const auto& r : ranks) same_loss = same_loss && r.at("loss") == ranks[0].at("loss");
    run["seq_len"] = plan.seq_len;
    run["step_seconds"] = slowest;
    run["step_seconds_vs_first"] = base_seconds > 0 ? slowest / base_seconds : 0.0;
    run["activation_bytes_per_rank"] = MaxOf(ranks, "activation_bytes");
    // The analytic per-rank estimate the server admits steps by (streambp/estimate.h).
    run["activation_bytes_estimate_per_rank"] =
        EstimateStepMemory(PlanConfig(plan), ParseDtype(plan.dtype), ranks[0].at("rows").get<int64_t>(), plan.seq_len,
                           plan.engine, "none", nullptr, P)
            .activation_bytes;
    run["kv_bytes_per_layer"] = P > 1 ? ranks[0].at("kv_bytes").get<int64_t>() / layers : 0;
    run["grad_kv_bytes_per_layer"] = P > 1 ? ranks[0].at("grad_kv_bytes").get<int64_t>() / layers : 0;
    run["head_bytes_per_layer"] = P > 1 ? ranks[0].at("head_bytes").get<int64_t>() / layers : 0;
    run["kv_bytes_per_layer_formula"] = formula_bytes.kv;
    run["grad_kv_bytes_per_layer_formula"] = formula_bytes.grad_kv;
    run["head_bytes_per_layer_formula"] = formula_bytes.heads;
    run["exchange"] = P > 1 && ContextExchangesHeads(PlanConfig(plan), P, plan.engine.context_exchange) ? "heads"
                      : P > 1                                                                           ? "kv"
                                                                                                        : "none";
    run["comm_seconds"] = ranks[0].at("comm_seconds");
    run["loss"] = ranks[0].at("loss");
    run["same_loss_on_every_rank"] = same_loss;
    run["rank_reports"] = ranks;
    const double mib = 1024.0 * 1024.0;
    char max_len[32] = "-", vs_len[32] = "-";
    if (run.contains("max_seq_len")) {
      std::snprintf(max_len, sizeof max_len, "%lld", (long long)run["max_seq_len"].get<int64_t>());
      std::snprintf(vs_len, sizeof vs_len, "%.3f", run["max_seq_len_vs_first"].get<double>());
    }
    const double measured = static_cast<double>(run["kv_bytes_per_layer"].get<int64_t>() +
                                                run["grad_kv_bytes_per_layer"].get<int64_t>() +
                                                run["head_bytes_per_layer"].get<int64_t>()) / mib;
    const double formula = static_cast<double>(formula_bytes.kv + formula_bytes.grad_kv + formula_bytes.heads) / mib;
    std::printf("%3d %8d %9s %7s %12s %9.3f %7.3f %12.3f %12.3f %8.3f %12.8f\n", P, std::max(1, plan.threads / P), max_len,
                vs_len, HumanBytes(run["activation_bytes_per_rank"].get<int64_t>()).c_str(), slowest,
                run["step_seconds_vs_first"].get<double>(), measured, formula, run["comm_seconds"].get<double>(),
                run["loss"].get<double>());
    std::printf("    P=%d activation per rank: measured %s, estimate %s (%.2fx)\n", P,
                HumanBytes(run["activation_bytes_per_rank"].get<int64_t>()).c_str(),
                HumanBytes(run["activation_bytes_estimate_per_rank"].get<int64_t>()).c_str(),
                static_cast<double>(run["activation_bytes_estimate_per_rank"].get<int64_t>()) /
                    static_cast<double>(std::max<int64_t>(1, run["activation_bytes_per_rank"].get<int64_t>())));
    std::fflush(stdout);
    runs.push_back(run);
  }
  fs::remove_all(root);
  return runs;
}

std::vector<std::string> CheckContextParallel(const json& section) {
  std::vector<std::string> problems;
  if (!section.contains("runs") || section["runs"].empty()) return {"context_parallel: no runs"};
  const double first_loss = section["runs"][0].value("loss", 0.0);
  for (const auto& r : section["runs"]) {
    const std::string name = "context_parallel P=" + std::to_string(r.value("ranks", 0));
    if (!r.value("same_loss_on_every_rank", false)) problems.push_back(name + ": the ranks report different losses");
    // The same step split another way: the same loss up to float32 summation order.
    if (std::abs(r.value("loss", 0.0) - first_loss) > 1e-4 * std::max(1.0, std::abs(first_loss))) {
      problems.push_back(name + ": loss " + std::to_string(r.value("loss", 0.0)) + " differs from the first run's " +
                         std::to_string(first_loss));
    }
    for (const std::string kind : {"kv", "grad_kv", "head"}) {
      if (r.value("ranks", 1) > 1 && r.value(kind + "_bytes_per_layer", int64_t{-1}) !=
                                         r.value(kind + "_bytes_per_layer_formula", int64_t{-2})) {
        problems.push_back(name + ": " + kind + " traffic per layer differs from the formula");
      }
    }
    // The estimate may be conservative but never far below the measured peak (as the
    // one-process estimate is held to in tests/unit/engine_test.cpp).
    const double measured = static_cast<double>(r.value("activation_bytes_per_rank", int64_t{0}));
    const double ratio = measured > 0 ? r.value("activation_bytes_estimate_per_rank", int64_t{0}) / measured : 0.0;
    if (ratio < 0.9 || ratio > 2.5) {
      problems.push_back(name + ": the per-rank activation estimate is " + std::to_string(ratio) +
                         "x the measured peak (expected 0.9x to 2.5x)");
    }
    if (r.contains("max_seq_len") && r["max_seq_len"].get<int64_t>() <= 0) {
      problems.push_back(name + ": not even the search's start fits the budget");
    }
  }
  return problems;
}

}  // namespace streambp::bench
