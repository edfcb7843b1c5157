// The ratios of a sweep and the issue targets they are held to, printed and put in the report
// (docs/results.md says which issue each target comes from).
#include <algorithm>
#include <cstdio>

#include "args.h"

namespace streambp::bench {
namespace {

std::string Verdict(bool met) { return met ? "MET" : "MISSED"; }

// Round i's steps of `a` and `b` ran next to each other (MeasureInRounds): their ratios, one
// per round (empty unless both have two or more rounds).
std::vector<double> RoundRatios(const Run& a, const Run& b) {
  std::vector<double> out;
  if (a.samples.size() < 2 || a.samples.size() != b.samples.size()) return out;
  for (size_t i = 0; i < a.samples.size(); ++i) out.push_back(a.samples[i] / b.samples[i]);
  return out;
}

// As RoundRatios, each step's seconds times the GFLOP/s of the GEMM measured next to it.
std::vector<double> GemmNormalizedRoundRatios(const Run& a, const Run& b) {
  std::vector<double> out;
  const auto plain = RoundRatios(a, b);
  if (plain.empty() || a.gemm_samples.size() != plain.size() || b.gemm_samples.size() != plain.size()) return out;
  for (size_t i = 0; i < plain.size(); ++i) out.push_back(plain[i] * a.gemm_samples[i] / b.gemm_samples[i]);
  return out;
}

}  // namespace

void ReportTargets(const TargetInputs& in, nlohmann::json& report) {
  const Args& a = in.args;
  const ModelConfig& c = in.config;
  const std::vector<Run>& runs = in.runs;
  const std::vector<Run>& ablation = in.ablation;
  const std::vector<SearchResult>& searches = in.searches;
  const int64_t budget = in.budget;
  const double gemm_ref = in.gemm_ref;
  // Ratios and the targets, from this run. Every ratio is taken against the
  // strongest baseline of the run (issue 17): at each length the non-stream variant with
  // the least activation memory, and the fastest one; for the max length the longest.
  // The plain baselines stay in the tables as what PyTorch eager does.
  std::printf("\n== ratios (this run, against the strongest baseline)\n");
  nlohmann::json targets = nlohmann::json::array();
  nlohmann::json ratios = nlohmann::json::array();
  auto target = [&](const std::string& name, double value, double limit, bool at_most) {
    const bool met = at_most ? value <= limit : value >= limit;
    std::printf("  %-70s %7.3f  (target %s %.2f)  %s\n", name.c_str(), value, at_most ? "<=" : ">=", limit,
                Verdict(met).c_str());
    targets.push_back({{"target", name}, {"value", value}, {"limit", limit}, {"at_most", at_most}, {"met", met}});
  };
  const int64_t e = c10::elementSize(in.dtype);
  // What stream holds at its least (the backward of the top layer with chunks -> 0): the
  // inputs of layers 1..L-1, g, K^, V^, dK^, dV^ (layer 0's input is looked up again).
  auto floor_bytes = [&](int64_t T) {
    return static_cast<double>(e) * a.batch * T * (c.num_hidden_layers * c.hidden_size + 4 * c.kv_dim());
  };
  for (int64_t T : a.seq_lens) {
    const Run* s = Find(runs, "stream", T);
    if (!s) continue;
    const Run* mem_base = StrongestBaseline(runs, T, /*by_time=*/false);
    const Run* time_base = StrongestBaseline(runs, T, /*by_time=*/true);
    std::printf("T=%-6lld stream activation %.3fx the floor", (long long)T, s->activation_bytes / floor_bytes(T));
    nlohmann::json row{{"seq_len", T}, {"floor_ratio", s->activation_bytes / floor_bytes(T)},
                       {"gemm_fraction", s->gflops / gemm_ref}};
    if (mem_base) {
      const double r = static_cast<double>(s->activation_bytes) / mem_base->activation_bytes;
      std::printf(", %.3fx %s (least memory of the baselines)", r, mem_base->variant.label().c_str());
      row["memory_baseline"] = mem_base->variant.label();
      row["activation_ratio"] = r;
    }
    if (time_base) {
      const double r = s->step_seconds / time_base->step_seconds;
      std::printf("; time %.3fx %s (fastest baseline)", r, time_base->variant.label().c_str());
      row["time_baseline"] = time_base->variant.label();
      row["time_ratio"] = r;
      // Round i's two steps ran next to each other: the spread of their ratios shows how far
      // the machine's drift moves the ratio of the medians; their median is the paired ratio.
      const auto rounds = RoundRatios(*s, *time_base);
      if (!rounds.empty()) {
        std::printf(" [rounds");
        for (double x : rounds) std::printf(" %.3f", x);
        std::printf("; paired median %.3f]", Median(rounds));
        row["time_ratio_rounds"] = rounds;
        row["time_ratio_paired"] = Median(rounds);
        // Each step's time in units of the GEMM measured next to it (seconds x GFLOP/s): what
        // the ratio would be had the machine run at one speed (printed; not a target).
        const auto normalized = GemmNormalizedRoundRatios(*s, *time_base);
        if (!normalized.empty()) {
          std::printf("; at the adjacent GEMM's speed %.3f", Median(normalized));
          row["time_ratio_gemm_normalized_rounds"] = normalized;
          row["time_ratio_gemm_normalized"] = Median(normalized);
        }
      }
    }
    std::printf("; %.0f%% of GEMM", 100 * s->gflops / gemm_ref);
    const double adjacent = Median(AdjacentGemmFractions(*s));
    if (adjacent > 0) {
      std::printf(" (%.0f%% of the GEMM next to its steps)", 100 * adjacent);
      row["gemm_fraction_adjacent"] = adjacent;
    }
    std::printf("\n");
    ratios.push_back(row);
    // Every objective at T=8192 (docs/results.md: The default chunk sizes): at most 0.3x
    // checkpoint:tiled's activation in no more of its time.
    const Run* tiled = Find(runs, "checkpoint:tiled", T);
    if (T == 8192 && tiled) {
      target("activation stream / checkpoint:tiled at T=8192",
             static_cast<double>(s->activation_bytes) / tiled->activation_bytes, 0.30, true);
    }
    if (T >= 4096 && tiled) {
      // With rounds, the median of the rounds' ratios: each compares two steps that ran next
      // to each other (in alternating order), so a slow minute of the machine cancels in it;
      // the ratio of the two medians compares steps minutes apart (both are printed above).
      const auto rounds = RoundRatios(*s, *tiled);
      if (rounds.empty()) {
        target("time stream / checkpoint:tiled at T=" + std::to_string(T), s->step_seconds / tiled->step_seconds,
               1.0, true);
      } else {
        target("time stream / checkpoint:tiled at T=" + std::to_string(T) + " (median of " +
                   std::to_string(rounds.size()) + " rounds' ratios)",
               Median(rounds), 1.0, true);
      }
    }
    if (a.objective != "sft") continue;
    if (T == 16384) target("activation stream / floor at T=16384", s->activation_bytes / floor_bytes(T), 1.3, true);
    if (T == 4096) target("stream GFLOP/s / GEMM GFLOP/s at T=4096", s->gflops / gemm_ref, 0.6, false);
    if (T == 8192) target("stream GFLOP/s / GEMM GFLOP/s at T=8192", s->gflops / gemm_ref, 0.5, false);
    // The same against the GEMM measured next to each step (median over the steps): on a
    // machine whose GEMM speed moves within minutes, the reference of the run's start or end
    // can be far from the speed the step ran at.
    if (T == 8192 && adjacent > 0) {
      target("stream GFLOP/s / GEMM GFLOP/s next to each step at T=8192 (median)", adjacent, 0.5, false);
    }
  }
  report["ratios"] = ratios;
  // The floor at T=16384 from a search probe when the sweep did not run that length.
  if (a.objective == "sft" && !Find(runs, "stream", 16384)) {
    for (const auto& s : searches) {
      for (const auto& r : s.runs) {
        if (s.variant.label() != "stream" || r.oom || r.seq_len != 16384) continue;
        std::printf("T=16384 (search probe, chunk %lld, logits %lld) stream activation %s\n", (long long)r.chunk,
                    (long long)r.logits_chunk, HumanBytes(r.activation_bytes).c_str());
        target("activation stream / floor at T=16384 (chunk " + std::to_string(r.chunk) + ")",
               r.activation_bytes / floor_bytes(r.seq_len), 1.3, true);
      }
    }
  }
  if (ablation.size() == 2 && !ablation[0].oom && !ablation[1].oom) {
    target("ablation: prefix-recompute time / K/V-once time - 1 at T=" + std::to_string(a.ablation_seq_len),
           ablation[1].step_seconds / ablation[0].step_seconds - 1, 0.10, false);
  }
  // Layer inputs offloaded vs on the device (stream:offload next to stream in the run).
  nlohmann::json offload = nlohmann::json::array();
  for (int64_t T : a.seq_lens) {
    const Run* s = Find(runs, "stream", T);
    const Run* o = Find(runs, "stream:offload", T);
    if (!s || !o) continue;
    const double mem = static_cast<double>(o->activation_bytes) / s->activation_bytes;
    const double time = o->step_seconds / s->step_seconds;
    const double rss = static_cast<double>(o->rss_peak_bytes) / std::max<int64_t>(1, s->rss_peak_bytes);
    std::printf("T=%-6lld offloaded: device activation %s vs %s (%.3fx), %s in the second tier; step %.1f s vs %.1f s "
                "(%+.1f%%); peak RSS %s vs %s (%.3fx)\n",
                (long long)T, HumanBytes(o->activation_bytes).c_str(), HumanBytes(s->activation_bytes).c_str(), mem,
                HumanBytes(o->offloaded_bytes).c_str(), o->step_seconds, s->step_seconds, 100 * (time - 1),
                HumanBytes(o->rss_peak_bytes).c_str(), HumanBytes(s->rss_peak_bytes).c_str(), rss);
    offload.push_back({{"seq_len", T}, {"activation_ratio", mem}, {"time_ratio", time}, {"rss_peak_ratio", rss}});
    if (T == 32768) target("device activation stream:offload / stream at T=32768", mem, 0.35, true);
    if (T == 8192) target("step time overhead of offload at T=8192 (stream:offload / stream - 1)", time - 1, 0.15, true);
  }
  report["offload"] = offload;
  report["keep_attention"] = KeepAttentionRatios(runs, a.seq_lens);
  const SearchResult* mo = nullptr;
  for (const auto& s : searches) {
    if (s.variant.label() == "stream:offload") mo = &s;
  }
  const SearchResult* ms = nullptr;
  const SearchResult* mb = nullptr;  // the baseline reaching the longest length
  for (const auto& s : searches) {
    if (s.variant.label() == "stream") {
      ms = &s;
    } else if (s.variant.engine == "stream") {
      continue;  // stream:offload and stream:keep are not baselines
    } else if (!mb || s.max_seq_len > mb->max_seq_len) {
      mb = &s;
    }
  }
  if (ms && mb && mb->max_seq_len > 0) {
    const bool exact = !ms->capped && !mb->capped;
    target("max length stream / " + mb->variant.label() + " (" + a.objective + ", " + HumanBytes(budget) + ")" +
               (exact ? "" : " [a search reached its cap: a bound, not a result]"),
           static_cast<double>(ms->max_seq_len) / mb->max_seq_len, 3.0, false);
  }
  if (ms && mo && ms->max_seq_len > 0) {
    target("max length stream:offload / stream (" + a.objective + ", " + HumanBytes(budget) + " of device memory)" +
               (mo->capped ? " [the search reached its cap: a bound]" : ""),
           static_cast<double>(mo->max_seq_len) / ms->max_seq_len, 3.0, false);
  }
  if (ms && mo && a.predict_only && ms->predicted_max_seq_len > 0) {
    std::printf("  (predicted by the estimate, not run) max length stream:offload / stream at %s: %lld / %lld = %.2fx\n",
                HumanBytes(budget).c_str(), (long long)mo->predicted_max_seq_len,
                (long long)ms->predicted_max_seq_len,
                static_cast<double>(mo->predicted_max_seq_len) / ms->predicted_max_seq_len);
  }
  report["targets"] = targets;
}

}  // namespace streambp::bench
