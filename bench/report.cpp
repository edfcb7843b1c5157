// JSON, plots (gnuplot) and the consistency check of a report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "args.h"
#include "bench.h"

namespace streambp::bench {

std::string HumanBytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  }
  return buf;
}

nlohmann::json ProbesJson(const SearchResult& s) {
  auto probes = nlohmann::json::array();
  for (const auto& r : s.runs) probes.push_back(RunJson(r));
  return probes;
}

std::vector<double> AdjacentGemmFractions(const Run& r) {
  std::vector<double> out;
  if (r.gemm_samples.size() != r.samples.size()) return out;
  for (size_t i = 0; i < r.samples.size(); ++i) {
    if (r.samples[i] > 0 && r.gemm_samples[i] > 0) out.push_back(r.flops / r.samples[i] / 1e9 / r.gemm_samples[i]);
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json RunJson(const Run& r) {
  nlohmann::json j{{"engine", r.variant.engine},
                   {"logits_chunked", r.variant.logits_chunked},
                   {"recompute_kv_per_chunk", r.variant.options.recompute_kv_per_chunk},
                   {"tiled_attention", r.variant.options.tiled_attention},
                   {"label", r.variant.label()},
                   {"seq_len", r.seq_len},
                   {"batch", r.batch},
                   {"chunk", r.chunk},
                   {"logits_chunk", r.logits_chunk},
                   {"key_chunk", r.key_chunk},
                   {"predicted_key_chunk", r.predicted_key_chunk},
                   {"oom", r.oom},
                   {"to_peak", r.to_peak},
                   {"weights_bytes", r.statics.weights},
                   {"grad_bytes", r.statics.grads},
                   {"optimizer_bytes", r.statics.optimizer},
                   {"predicted_peak_bytes", r.predicted_peak_bytes},
                   {"predicted_activation_bytes", r.predicted_activation_bytes},
                   {"flops", r.flops},
                   {"model_flops", r.model_flops},
                   {"offload_layer_inputs", r.variant.options.offload_layer_inputs},
                   {"keep_attention", r.variant.options.keep_attention},
                   {"predicted_offloaded_bytes", r.predicted_offloaded_bytes},
                   {"rss_start_bytes", r.rss_start_bytes},
                   {"rss_peak_bytes", r.rss_peak_bytes}};
  if (r.oom) {
    j["oom_predicted"] = r.oom_predicted;
    j["oom_message"] = r.oom_message;
    for (const char* k : {"peak_bytes", "activation_bytes", "step_seconds", "tokens_per_second", "gflops"}) {
      j[k] = nullptr;
    }
    return j;
  }
  j["peak_bytes"] = r.peak_bytes;
  j["offloaded_bytes"] = r.offloaded_bytes;
  if (r.breakdown.total_seconds > 0) {
    j["time_breakdown"] = {{"total_seconds", r.breakdown.total_seconds},
                           {"seconds", r.breakdown.seconds},
                           {"gemm_flops_counted", r.breakdown.gemm_flops},
                           {"top_ops", r.breakdown.ops}};
  }
  j["activation_bytes"] = r.activation_bytes;
  j["step_seconds"] = r.step_seconds;
  j["step_seconds_samples"] = r.samples;
  j["minor_faults_per_step"] = r.minor_faults;
  j["minor_faults_samples"] = r.fault_samples;
  j["system_seconds_per_step"] = r.system_seconds;
  j["system_seconds_samples"] = r.system_samples;
  j["user_seconds_per_step"] = r.user_seconds;
  j["user_seconds_samples"] = r.user_samples;
  if (!r.gemm_samples.empty()) {
    j["gemm_gflops_samples"] = r.gemm_samples;
    j["gemm_fraction_samples"] = AdjacentGemmFractions(r);
  }
  j["tokens_per_second"] = r.tokens_per_second;
  j["gflops"] = r.gflops;
  j["loss"] = r.loss;
  return j;
}

namespace {

// A gnuplot double-quoted string ("\n" breaks the line).
std::string GnuplotString(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

void WritePlot(const std::string& png, const std::vector<Run>& runs, int64_t budget, const std::string& title,
               const std::string& machine) {
  namespace fs = std::filesystem;
  std::map<std::string, std::vector<const Run*>> series;
  std::vector<const Run*> failed;  // OOM or refused: drawn at their estimate, as crosses
  size_t samples = 0;
  for (const auto& r : runs) {
    if (!r.oom) {
      series[r.variant.label()].push_back(&r);
      samples = samples == 0 ? r.samples.size() : std::min(samples, r.samples.size());
    } else if (r.predicted_activation_bytes > 0) {
      failed.push_back(&r);
    }
  }
  if (series.empty()) return;
  const fs::path dir = fs::temp_directory_path() / ("streambp-bench-plot-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string mem_plot, time_plot;
  int index = 0;
  const int n_series = static_cast<int>(series.size());
  for (const auto& [label, points] : series) {
    // Earlier series are drawn wider, later ones on top of them, so that lines which coincide
    // (engines within 1% of each other's time) stay visible as nested stripes.
    const int wider = n_series - 1 - index;
    const std::string width = std::to_string(1.5 + 2.5 * wider);
    const auto file = dir / ("series" + std::to_string(index++) + ".dat");
    std::ofstream out(file);
    for (const Run* r : points) {
      out << r->seq_len << " " << r->activation_bytes / (1024.0 * 1024.0) << " " << r->step_seconds << "\n";
    }
    // A single point is drawn as a point (a line needs two): the legend entry stays visible.
    const std::string style = points.size() > 1 ? "linespoints lw " + width + " ps 1.5"
                                                : "points ps " + std::to_string(2 + wider);
    const std::string sep = mem_plot.empty() ? "" : ", ";
    mem_plot += sep + "'" + file.string() + "' using 1:2 with " + style + " title '" + label + "'";
    time_plot += sep + "'" + file.string() + "' using 1:3 with " + style + " title '" + label + "'";
  }
  if (!failed.empty()) {
    const auto file = dir / "failed.dat";
    std::ofstream out(file);
    for (const Run* r : failed) out << r->seq_len << " " << r->predicted_activation_bytes / (1024.0 * 1024.0) << "\n";
    mem_plot += ", '" + file.string() + "' using 1:2 with points pt 2 ps 2 lc rgb 'black' title 'OOM or refused (at its estimate)'";
  }
  if (budget > 0) {
    mem_plot += ", " + std::to_string(budget / (1024.0 * 1024.0)) + " with lines dt 2 lc rgb 'red' lw 2 title 'budget " +
                HumanBytes(budget) + "'";
  }
  const std::string time_title = samples > 1 ? "forward + backward time (median of " + std::to_string(samples) + " steps)"
                                             : "forward + backward time (one timed step per point)";
  const auto script = dir / "plot.gp";
  {
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 1400,600 font 'sans,10' noenhanced\n"
       << "set output '" << png << "'\n"
       << "set multiplot layout 1,2 title " << GnuplotString(machine.empty() ? title : title + "\n" + machine) << "\n"
       << "set logscale x 2\nset logscale y\nset grid\nset key top left\n"
       << "set xlabel 'sequence length (tokens)'\n"
       << "set ylabel 'activation memory (MiB)'\nset title 'peak activation memory (peak - weights - grads - optimizer)'\n"
       << "plot " << mem_plot << "\n"
       << "set ylabel 'step time (s)'\nset title " << GnuplotString(time_title) << "\n"
       << "plot " << time_plot << "\n"
       << "unset multiplot\n";
  }
  const std::string cmd = "gnuplot '" + script.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "warning: gnuplot failed or is missing (apt-get install gnuplot-nox); no plot written\n");
  }
  fs::remove_all(dir);
}

std::vector<std::string> CheckReport(const nlohmann::json& report) {
  std::vector<std::string> problems;
  for (const char* k : {"machine", "model", "objective", "runs", "max_seq_len"}) {
    if (!report.contains(k)) problems.push_back(std::string("missing top-level key '") + k + "'");
  }
  if (!problems.empty()) return problems;
  for (const char* k : {"description", "blas", "threads", "gemm_gflops"}) {
    if (!report["machine"].contains(k)) problems.push_back(std::string("machine: missing '") + k + "'");
  }
  const char* fields[] = {"engine", "logits_chunked", "seq_len", "batch", "peak_bytes", "activation_bytes",
                          "weights_bytes", "grad_bytes", "optimizer_bytes", "step_seconds",
                          "tokens_per_second", "gflops"};
  // activation bytes per (seq_len, label)
  std::map<int64_t, std::map<std::string, int64_t>> act;
  if (report["runs"].empty()) problems.push_back("no runs");
  for (const auto& r : report["runs"]) {
    for (const char* k : fields) {
      if (!r.contains(k)) problems.push_back("run: missing '" + std::string(k) + "'");
    }
    if (r.value("oom", false)) continue;
    // A sweep point has one timed step per round (a search probe has one).
    const int64_t repeat = report.value("repeat", int64_t{0});
    if (repeat > 0 && !r.value("to_peak", false) && r.contains("step_seconds_samples") &&
        static_cast<int64_t>(r["step_seconds_samples"].size()) != repeat) {
      problems.push_back("run " + r.value("label", std::string("?")) + " T=" + std::to_string(r.value("seq_len", 0)) +
                         ": " + std::to_string(r["step_seconds_samples"].size()) + " timed steps, not --repeat " +
                         std::to_string(repeat));
    }
    // Each timed step's faults and kernel seconds next to its time, and (a sweep's) the GEMM
    // measured next to it.
    if (r.contains("gemm_gflops_samples") &&
        (r["gemm_gflops_samples"].size() != r.value("step_seconds_samples", nlohmann::json::array()).size() ||
         !std::all_of(r["gemm_gflops_samples"].begin(), r["gemm_gflops_samples"].end(),
                      [](const nlohmann::json& g) { return g.is_number() && g.get<double>() > 0; }))) {
      problems.push_back("run " + r.value("label", std::string("?")) + " T=" + std::to_string(r.value("seq_len", 0)) +
                         ": 'gemm_gflops_samples' is not one positive GFLOP/s per timed step");
    }
    if (r.contains("step_seconds_samples")) {
      for (const char* k : {"minor_faults_samples", "system_seconds_samples", "user_seconds_samples"}) {
        if (!r.contains(k) || r[k].size() != r["step_seconds_samples"].size()) {
          problems.push_back("run " + r.value("label", std::string("?")) + " T=" +
                             std::to_string(r.value("seq_len", 0)) + ": '" + k + "' is not one per timed step");
        }
      }
    }
    for (const char* k : {"peak_bytes", "activation_bytes", "weights_bytes", "grad_bytes", "step_seconds",
                          "tokens_per_second", "gflops"}) {
      if (!r.contains(k) || !r[k].is_number() || !(r[k].get<double>() > 0)) {
        problems.push_back("run " + r.value("label", std::string("?")) + " T=" + std::to_string(r.value("seq_len", 0)) +
                           ": '" + k + "' is not a positive number");
      }
    }
    if (r.contains("activation_bytes") && r["activation_bytes"].is_number()) {
      act[r["seq_len"].get<int64_t>()][r["label"].get<std::string>()] = r["activation_bytes"].get<int64_t>();
    }
  }
  int ordered = 0;
  for (const auto& [T, by] : act) {
    auto has = [&](const char* l) { return by.count(l) > 0; };
    if (!has("stream") || !has("checkpoint") || !has("full")) continue;
    ++ordered;
    const int64_t s = by.at("stream"), c = by.at("checkpoint"), f = by.at("full");
    if (!(s < c && c < f)) {
      problems.push_back("T=" + std::to_string(T) + ": activation memory not ordered stream < checkpoint < full (" +
                         std::to_string(s) + ", " + std::to_string(c) + ", " + std::to_string(f) + ")");
    }
    if (has("checkpoint+chunked-logits") && !(s < by.at("checkpoint+chunked-logits"))) {
      problems.push_back("T=" + std::to_string(T) + ": stream not below checkpoint with chunked logits");
    }
  }
  if (ordered == 0) problems.push_back("no sequence length where stream, checkpoint and full all ran");
  for (const auto& m : report["max_seq_len"]) {
    for (const char* k : {"engine", "logits_chunked", "budget_bytes", "max_seq_len"}) {
      if (!m.contains(k)) problems.push_back("max_seq_len: missing '" + std::string(k) + "'");
    }
  }
  return problems;
}

namespace {
double Mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
}  // namespace

const Run* Find(const std::vector<Run>& runs, const std::string& label, int64_t T) {
  for (const auto& r : runs) {
    if (r.variant.label() == label && r.seq_len == T && !r.oom) return &r;
  }
  return nullptr;
}

// chunk, logits, key: what the engine used; est.key: the key chunk the estimate assumed.
void PrintRunHeader() {
  std::printf("%-28s %6s %3s %6s %6s %6s %7s %10s %10s %10s %6s %9s %9s %8s %6s %6s %8s %9s %9s %6s %7s\n", "engine", "T",
              "B", "chunk", "logits", "key", "est.key", "peak MiB", "act MiB", "pred MiB", "pred/m", "step s", "tok/s",
              "GFLOP/s", "%GEMM", "%adj", "off MiB", "RSS MiB", "faults", "sys s", "user s");
}

void PrintRun(const Run& r, double gemm) {
  if (r.oom) {
    std::printf("%-28s %6lld %3lld %6lld %6lld %6lld %7lld  OOM%s\n", r.variant.label().c_str(), (long long)r.seq_len,
                (long long)r.batch, (long long)r.chunk, (long long)r.logits_chunk, (long long)r.key_chunk,
                (long long)r.predicted_key_chunk,
                r.oom_predicted ? " (predicted by the estimate; not run)" : " (budgeted allocator refused)");
  } else {
    // %adj: the median over the timed steps of each step's GFLOP/s over the GEMM measured next to it.
    const auto adjacent = AdjacentGemmFractions(r);
    char adj[16] = "-";
    if (!adjacent.empty()) std::snprintf(adj, sizeof adj, "%.1f%%", 100.0 * Median(adjacent));
    std::printf("%-28s %6lld %3lld %6lld %6lld %6lld %7lld %10.1f %10.1f %10.1f %6.2f %9.3f %9.0f %8.1f %5.1f%% %6s "
                "%8.1f %9.1f %9.0f %6.2f %7.2f\n",
                r.variant.label().c_str(), (long long)r.seq_len, (long long)r.batch, (long long)r.chunk,
                (long long)r.logits_chunk, (long long)r.key_chunk, (long long)r.predicted_key_chunk,
                Mib(r.peak_bytes), Mib(r.activation_bytes),
                Mib(r.predicted_activation_bytes),
                static_cast<double>(r.predicted_activation_bytes) / std::max<int64_t>(1, r.activation_bytes),
                r.step_seconds, r.tokens_per_second, r.gflops, 100.0 * r.gflops / gemm, adj, Mib(r.offloaded_bytes),
                Mib(r.rss_peak_bytes), r.minor_faults, r.system_seconds, r.user_seconds);
  }
  std::fflush(stdout);
}

// The strongest baseline at length T: the non-stream variant (that ran) with the least
// activation memory, or the fastest one.
const Run* StrongestBaseline(const std::vector<Run>& runs, int64_t T, bool by_time) {
  const Run* best = nullptr;
  for (const auto& r : runs) {
    if (r.oom || r.seq_len != T || r.variant.engine == "stream") continue;
    const bool better = !best || (by_time ? r.step_seconds < best->step_seconds
                                          : r.activation_bytes < best->activation_bytes);
    if (better) best = &r;
  }
  return best;
}

nlohmann::json KeepAttentionRatios(const std::vector<Run>& runs, const std::vector<int64_t>& seq_lens) {
  nlohmann::json keep = nlohmann::json::array();
  for (int64_t T : seq_lens) {
    const Run* s = Find(runs, "stream", T);
    const Run* k = Find(runs, "stream:keep", T);
    const Run* tiled = Find(runs, "checkpoint:tiled", T);
    if (!k) continue;
    nlohmann::json row{{"seq_len", T}};
    std::printf("T=%-6lld attention kept: activation %s, step %.1f s", (long long)T,
                HumanBytes(k->activation_bytes).c_str(), k->step_seconds);
    for (const auto& [name, base] : {std::pair{"stream", s}, std::pair{"checkpoint:tiled", tiled}}) {
      if (!base) continue;
      const double mem = static_cast<double>(k->activation_bytes) / base->activation_bytes;
      const double time = k->step_seconds / base->step_seconds;
      std::printf("; vs %s: activation %.3fx, time %.3fx", name, mem, time);
      row[std::string(name) + "_activation_ratio"] = mem;
      row[std::string(name) + "_time_ratio"] = time;
    }
    std::printf("\n");
    keep.push_back(row);
  }
  return keep;
}

std::vector<std::string> PrintProfile(const std::vector<Run>& runs, bool check, double flops_tolerance) {
  std::vector<std::string> problems;
  if (runs.empty()) return problems;
  std::printf("\n== time breakdown (one profiled step per point; seconds and share of the step)\n%-28s %6s %8s", "engine",
              "T", "step s");
  for (const auto& c : BreakdownCategories()) std::printf(" %16s", c.c_str());
  std::printf("\n");
  for (const auto& r : runs) {
    if (r.oom || r.breakdown.total_seconds <= 0) continue;
    std::printf("%-28s %6lld %8.2f", r.variant.label().c_str(), (long long)r.seq_len, r.breakdown.total_seconds);
    for (const auto& c : BreakdownCategories()) {
      const double t = r.breakdown.seconds.count(c) ? r.breakdown.seconds.at(c) : 0.0;
      std::printf(" %8.2f (%4.1f%%)", t, 100 * t / r.breakdown.total_seconds);
    }
    std::printf("\n");
  }
  // The FLOP count behind GFLOP/s and %GEMM against the profiler's count of the products the
  // profiled step ran (from their operands' shapes).
  std::printf("\n== GEMM FLOPs of the profiled step: counted from the products' shapes vs the analytic count\n"
              "%-28s %6s %16s %16s %9s\n", "engine", "T", "counted", "analytic", "analytic/counted");
  for (const auto& r : runs) {
    if (r.oom || r.breakdown.total_seconds <= 0) continue;
    const double ratio = r.flops / r.breakdown.gemm_flops;
    std::printf("%-28s %6lld %16.6e %16.6e %9.6f\n", r.variant.label().c_str(), (long long)r.seq_len,
                r.breakdown.gemm_flops, r.flops, ratio);
    if (check && !(std::abs(ratio - 1) <= flops_tolerance)) {
      problems.push_back(r.variant.label() + " at T=" + std::to_string(r.seq_len) + ": the analytic FLOPs are " +
                         std::to_string(ratio) + " x the counted ones (--flops-tolerance " +
                         std::to_string(flops_tolerance) + ")");
    }
  }
  return problems;
}

// --replot: the plot of a written report again, without running anything.
int Replot(const Args& a, bool budget_given) {
  std::ifstream in(a.replot);
  const auto report = nlohmann::json::parse(in);
  std::vector<Run> runs;
  for (const auto& j : report.at("runs")) {
    Run r;
    r.oom = j.value("oom", false);
    r.predicted_activation_bytes = j.value("predicted_activation_bytes", int64_t{0});
    if (j.contains("step_seconds_samples")) r.samples = j["step_seconds_samples"].get<std::vector<double>>();
    r.variant.engine = j.at("engine");
    r.variant.logits_chunked = j.at("logits_chunked");
    r.variant.options.recompute_kv_per_chunk = j.value("recompute_kv_per_chunk", false);
    r.variant.options.tiled_attention = j.value("tiled_attention", false);
    r.variant.options.offload_layer_inputs = j.value("offload_layer_inputs", false);
    r.variant.options.keep_attention = j.value("keep_attention", false);
    r.seq_len = j.at("seq_len");
    if (!r.oom) {
      r.activation_bytes = j.at("activation_bytes");
      r.step_seconds = j.at("step_seconds");
    }
    runs.push_back(r);
  }
  // The budget line only when asked for (a sweep's report has none of its own).
  WritePlot(a.plot_path, runs, budget_given ? ParseBytes(a.budget) : 0,
            "streambp-bench: " + report.value("objective", std::string("?")) + ", " +
                report["model"].value("source", std::string("?")) + " (" +
                report["model"].value("family", std::string("?")) + "), " +
                report["model"].value("dtype", std::string("?")),
            report["machine"].value("description", std::string()));
  std::printf("plot: %s\n", a.plot_path.c_str());
  return 0;
}

}  // namespace streambp::bench
