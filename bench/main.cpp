// streambp-bench: the engines side by side on the same model and data (issue 6, docs/architecture.md: Measuring).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "args.h"
#include "bench.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"
#include "streambp/trainer.h"

using namespace streambp;
using namespace streambp::bench;

int main(int argc, char** argv) {
  UseCpuBlasKernels(argv);  // may restart the process with OpenBLAS's kernels for this CPU
  memory::InstallTrackingAllocator();
  Args a;
  CLI::App app{"streambp-bench: memory, time and max sequence length of the engines, side by side"};
  AddOptions(app, a);
  CLI11_PARSE(app, argc, argv);

  try {
    if (!a.replot.empty()) return Replot(a, app.count("--budget") > 0);
    if (a.quick) {
      a.preset = "tiny";
      a.model_dir.clear();
      if (app.count("--seq-lens") == 0) a.seq_lens = {256, 512};
      if (app.count("--budget") == 0) a.budget = "8MiB";
      if (app.count("--repeat") == 0) a.repeat = 1;
      if (app.count("--warmup") == 0) a.warmup = 0;
      if (app.count("--ablation-seq-len") == 0) a.ablation_seq_len = 512;
      if (app.count("--chunk") == 0) a.chunk = 64;
      if (app.count("--logits-chunk") == 0) a.logits_chunk = 128;
      if (app.count("--search-start") == 0) a.search_start = 128;
      if (app.count("--search-tol") == 0) a.search_tol = 0.05;
      // Bounded: with key tiles the stream search would go on to ~4k tokens, minutes on a
      // loaded CI machine; 2048 is already past 6x checkpoint's length at 8 MiB.
      if (app.count("--search-max") == 0) a.search_max = 2048;
      if (app.count("--gemm-n") == 0) a.gemm_n = 512;
      if (app.count("--key-chunk") == 0) a.key_chunk = 128;  // T=512 runs tile by tile
    }
    if (!a.world_sizes.empty() && app.count("--batch") == 0) {
      // Two sequences per rank at the largest N (a rank without one would only add zeros).
      a.batch = 2 * *std::max_element(a.world_sizes.begin(), a.world_sizes.end());
    }
    if (!a.dist_worker.empty()) return RunDistWorker(MakeDistPlan(a, a.dist_seq_len), a.dist_worker, a.dist_overlap != 0);
    if (!a.cp_worker.empty()) return RunCpWorker(MakeCpPlan(a), a.cp_worker, a.cp_seq_len, a.cp_budget, a.cp_steps);
    ConfigureThreads(a.threads);
    RegisterBuiltinObjectives();
    Context ctx;
    ctx.dtype = ParseDtype(a.dtype);
    ctx.memory.device = CheckedDevice(a);
    ctx.model = a.model_dir.empty() ? InitModel(PresetConfig(a.preset, a.family), a.seed, ctx.dtype, ctx.memory.device)
                                    : LoadModel(a.model_dir, ctx.dtype, ctx.memory.device);
    ctx.config = ctx.model->config();
    ctx.optimizer = a.optimizer;
    ctx.threads = torch::get_num_threads();
    ctx.search_growth = a.search_growth;
    ctx.workload = {a.objective, a.batch, 1, a.pack};
    ctx.profile = a.profile;
    PrepareStatics(ctx);
    const int64_t statics = ctx.statics.weights + ctx.statics.grads + ctx.statics.optimizer;
    // --budget device: the whole GPU past the statics (the search then runs to the real OOM).
    const int64_t budget = a.no_search          ? 0
                           : a.budget == "device" ? std::max<int64_t>(0, ctx.memory.total() - statics)
                                                  : ParseBytes(a.budget);
    // auto: 80% of the available RAM on the CPU; on a GPU the whole device (a point past it
    // fails with the allocator's out-of-memory error, the real limit).
    const int64_t machine = ctx.memory.device.is_cpu() ? MemAvailable() * 8 / 10 : ctx.memory.total();
    ctx.mem_limit = a.mem_limit == "auto" ? std::max<int64_t>(0, machine - statics) : ParseBytes(a.mem_limit);

    // The machine, and the GEMM throughput that makes GFLOP/s comparable across machines.
    const auto runtime = GetRuntimeInfo();
    const double gemm = MeasureGemmGflops(ctx.dtype, a.gemm_n, ctx.memory);
    std::ostringstream machine_line;
    machine_line << CpuModel() << ", " << std::thread::hardware_concurrency() << " cores, "
                 << HumanBytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE)) << " RAM; "
                 << runtime.describe() << "; device " << ctx.memory.describe() << "; GEMM " << a.gemm_n << "^3 "
                 << a.dtype << ": " << static_cast<int>(std::lround(gemm)) << " GFLOP/s";
    std::printf("machine:   %s\n", machine_line.str().c_str());
    const auto& c = ctx.config;
    int64_t params = 0;
    for (const auto& p : ctx.model->parameters()) params += p.numel();
    std::printf("model:     %s, %lld layers, d=%lld, d_ff=%lld, heads %lld/%lld x %lld, vocab %lld, %.1fM parameters, %s\n",
                a.model_dir.empty() ? ("preset " + a.preset + " as " + a.family).c_str() : a.model_dir.c_str(),
                (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.intermediate_size,
                (long long)c.num_attention_heads, (long long)c.num_key_value_heads, (long long)c.head_dim,
                (long long)c.vocab_size, params / 1e6, a.dtype.c_str());
    if (c.num_experts > 0) {
      std::printf("experts:   %lld sparse layers of %lld experts (d_ff %lld), %lld per token%s\n",
                  (long long)c.sparse_layers(), (long long)c.num_experts, (long long)c.moe_intermediate_size,
                  (long long)c.num_experts_per_tok, c.norm_topk_prob ? ", renormalised" : "");
    }
    std::printf("objective: %s, batch %lld%s; weights %s, gradients %s, %s state %s; sweep limit %s of activations\n\n",
                a.objective.c_str(), (long long)a.batch,
                a.pack > 1 ? (", " + std::to_string(a.pack) + " sequences packed per row").c_str() : "",
                HumanBytes(ctx.statics.weights).c_str(),
                HumanBytes(ctx.statics.grads).c_str(), a.optimizer.c_str(), HumanBytes(ctx.statics.optimizer).c_str(),
                HumanBytes(ctx.mem_limit).c_str());

    nlohmann::json report;
    report["machine"] = {{"description", machine_line.str()},
                         {"cpu", CpuModel()},
                         {"cores", std::thread::hardware_concurrency()},
                         {"torch", runtime.torch_version},
                         {"blas", runtime.blas},
                         {"blas_core", runtime.blas_core},
                         {"blas_core_fallback", runtime.blas_fallback},
                         {"softmax_rows", runtime.softmax_rows},
                         {"threads", runtime.threads},
                         {"device", ctx.memory.describe()},
                         {"device_memory_bytes", ctx.memory.total()},
                         {"gemm_n", a.gemm_n},
                         {"gemm_gflops", gemm}};
    report["model"] = {{"source", a.model_dir.empty() ? "preset:" + a.preset : a.model_dir},
                       {"family", a.model_dir.empty() ? a.family : c.model_type},
                       {"config", c.ToJson()},
                       {"parameters", params},
                       {"dtype", a.dtype}};
    report["objective"] = a.objective;
    report["batch"] = a.batch;
    report["pack"] = a.pack;
    report["repeat"] = a.repeat;
    report["command"] = [&] {
      std::string s;
      for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
      return s;
    }();

    auto write_json = [&] {
      if (a.json_path.empty()) return;
      std::ofstream out(a.json_path);
      out << report.dump(2) << "\n";
      out.close();
      if (!out) throw std::runtime_error("cannot write " + a.json_path);
      std::printf("\njson: %s\n", a.json_path.c_str());
    };

    if (!a.world_sizes.empty()) {
      const int64_t T = a.seq_lens.front();
      const auto plan = MakeDistPlan(a, T);
      const auto resolved = ResolveChunks(plan.engine, T, plan.model_dir.empty() ? PresetConfig(plan.preset, plan.family)
                                                                               : ModelConfig::FromFile(plan.model_dir + "/config.json"),
                                          ParseDtype(plan.dtype));
      std::printf("== data parallel: %s, stream (chunk %lld, logits chunk %lld, key chunk %lld), T=%lld, global batch %lld, "
                  "micro-batch tokens %lld; train_step (forward, backward, gradient sum, clip, %s); %lld warm-up + %lld "
                  "timed steps; N processes on loopback Gloo, %d threads in all (threads / N per rank)\n",
                  a.objective.c_str(), (long long)resolved.chunk, (long long)resolved.logits_chunk,
                  (long long)resolved.key_chunk, (long long)T, (long long)a.batch, (long long)a.micro_batch_tokens,
                  plan.optimizer.c_str(), (long long)plan.warmup, (long long)plan.steps, plan.threads);
      std::printf("   step s: median over steps of the slowest rank; comm s: waiting in any collective; grad s: waiting for the "
                  "gradient sum; grad MiB: its payload; bkts(bwd): its buckets (started during the backward); ring MiB: "
                  "bytes a rank sends per step under ring/chain algorithms; sent MiB: bytes a rank wrote to its sockets "
                  "(/proc/self/io); same: identical weights on every rank; vs N=1: max relative weight difference\n");
      std::vector<std::string> args(argv, argv + argc);
      args.insert(args.end(), {"--dist-seq-len", std::to_string(T)});
      report["distributed"] = {{"seq_len", T},
                               {"engine", EngineOptionsToJson(plan.engine)},
                               {"global_batch", a.batch},
                               {"micro_batch_tokens", a.micro_batch_tokens},
                               {"grad_bucket_bytes", plan.grad_bucket_bytes > 0 ? plan.grad_bucket_bytes : kDefaultGradBucketBytes},
                               {"threads", plan.threads},
                               {"runs", RunDistributed(plan, args)}};
      write_json();
      if (a.check) {
        const auto problems = CheckDistributed(report["distributed"]);
        for (const auto& p : problems) std::printf("check: FAIL: %s\n", p.c_str());
        if (!problems.empty()) return 1;
        std::printf("check: PASS (identical weights on every rank; the whole gradient summed once per step)\n");
      }
      return 0;
    }

    if (!a.context_parallel.empty()) {
      const auto plan = MakeCpPlan(a);
      const auto resolved = ResolveChunks(plan.engine, plan.seq_len, ctx.config, ctx.dtype);
      std::printf("== context parallel: %s, stream (chunk %lld, logits chunk %lld, key chunk %lld at T=%lld on one "
                  "process; a rank resolves them for its own positions), batch %lld; P processes on loopback Gloo, %d "
                  "threads in all (threads / P per rank)%s\n",
                  a.objective.c_str(), (long long)resolved.chunk, (long long)resolved.logits_chunk,
                  (long long)resolved.key_chunk, (long long)plan.seq_len, (long long)a.batch, plan.threads,
                  plan.budget > 0 ? ("; search under " + HumanBytes(plan.budget) + " of activations per rank").c_str() : "");
      std::printf("   max T: longest sequence fitting the budget (to the first OOM); act/rank: activation peak of the "
                  "most loaded rank at T=%lld; step s: its slowest rank; K/V MiB/layer: what rank 0 sends per layer and "
                  "step (K/V and dK/dV; heads exchanged, also the chunks' queries and outputs), measured and by the "
                  "formula; --context-exchange %s\n",
                  (long long)plan.seq_len, a.context_exchange.c_str());
      std::printf("%3s %8s %9s %7s %12s %9s %7s %12s %12s %8s %12s\n", "P", "thr/rank", "max T", "vs P1", "act/rank",
                  "step s", "vs P1", "K/V MiB/lyr", "formula MiB", "comm s", "loss");
      std::vector<std::string> args(argv, argv + argc);
      report["context_parallel"] = {{"seq_len", plan.seq_len},
                                    {"engine", EngineOptionsToJson(plan.engine)},
                                    {"context_exchange", a.context_exchange},
                                    {"batch", a.batch},
                                    {"threads", plan.threads},
                                    {"budget_bytes_per_rank", plan.budget},
                                    {"runs", RunContextParallel(plan, args)}};
      write_json();
      if (a.check) {
        const auto problems = CheckContextParallel(report["context_parallel"]);
        for (const auto& p : problems) std::printf("check: FAIL: %s\n", p.c_str());
        if (!problems.empty()) return 1;
        std::printf("check: PASS (every rank reports the same loss; K/V traffic per layer as the formula says)\n");
      }
      return 0;
    }

    if (a.sample_prompts > 0) {
      SampleBenchPlan plan;
      plan.prompts = a.sample_prompts;
      plan.n = a.sample_n;
      plan.prompt_len = a.sample_prompt_len;
      plan.max_tokens = a.sample_max_tokens;
      plan.seed = a.seed;
      plan.model = &ctx.model;
      report["sample"] = RunSampleBench(plan);
      write_json();
      if (a.check) {
        const auto& r = report["sample"];
        const bool ok = r["generated_tokens"] == a.sample_prompts * a.sample_n * a.sample_max_tokens &&
                        r["tokens_per_second"] > 0 && r["step_seconds"] > 0;
        std::printf("check: %s (every completion ran to max_tokens; both were timed)\n", ok ? "PASS" : "FAIL");
        if (!ok) return 1;
      }
      return 0;
    }

    if (!a.tokenizer.empty()) {
      TextBenchPlan plan;
      plan.tokenizer_dir = a.tokenizer;
      plan.text_file = a.text_file;
      plan.min_bytes = static_cast<size_t>(a.text_bytes);
      plan.model = &ctx.model;
      if (a.quick) {
        plan.min_bytes = 1 << 20;
        plan.min_seconds = 0.3;
        plan.step_tokens = 512;
      }
      report["text"] = RunTextBench(plan);
      write_json();
      if (a.check) {
        const auto& t = report["text"];
        const bool ok = t["encode_warm_mb_s"] > 0 && t["tokens"] > 0 && t.contains("request");
        std::printf("check: %s (the tokenizer encoded the text; the request was timed)\n", ok ? "PASS" : "FAIL");
        if (!ok) return 1;
      }
      return 0;
    }
    if (a.lora_rank > 0) {
      LoraPlan plan;
      plan.lora.r = a.lora_rank;
      plan.lora.alpha = a.lora_alpha > 0 ? a.lora_alpha : 2.0 * static_cast<double>(a.lora_rank);
      plan.stream = Variant{"stream", true, Engine(a, EngineKind::kStream, a.chunk, a.logits_chunk)};
      plan.seq_lens = a.seq_lens;
      plan.total_budget = a.no_search                ? 0
                          : a.total_budget == "device" ? ctx.memory.total()  // the whole GPU: the real OOM
                                                       : ParseBytes(a.total_budget);
      plan.warmup = a.warmup;
      plan.repeat = a.repeat;
      plan.search_start = a.search_start;
      plan.search_max = a.search_max;
      plan.search_tol = a.search_tol;
      plan.search_align = a.search_align;
      plan.auto_chunks = a.search_chunks == "auto";
      plan.lora_only = a.lora_only;
      ctx.stop_after_peak = a.search_to_peak;
      report["lora"] = RunLoraComparison(ctx, plan);
      ctx.stop_after_peak = false;
      write_json();
      if (a.check) {
        const auto& modes = report["lora"]["modes"];
        const auto& lora = modes.back();
        const bool ok = modes.size() == (a.lora_only ? 1u : 2u) && lora["mode"] != "full" &&
                        (a.lora_only ? lora["gradient_bytes"] < lora["weights_bytes"]
                                     : lora["gradient_bytes"] < modes[0]["gradient_bytes"] &&
                                           lora["optimizer_bytes"] < modes[0]["optimizer_bytes"]);
        std::printf("check: %s (the adapter run keeps gradients and optimizer state of the adapter only)\n",
                    ok ? "PASS" : "FAIL");
        if (!ok) return 1;
      }
      return 0;
    }

    const auto variants = MakeVariants(a);
    std::vector<Run> runs;
    ctx.gemm_n = a.gemm_n;  // the sweep's and the ablation's steps between two GEMMs (Run::gemm_samples)
    if (!a.no_sweep) {
      auto size = [](int64_t n) { return n > 0 ? std::to_string(n) : std::string("default"); };
      std::printf("== sweep: %lld warm-up + %lld timed step(s) per point, in rounds (each engine's step i before any "
                  "engine's step i+1, so a slow minute of the machine falls on all of them); stream chunk %s, logits "
                  "chunk %s, key chunk %s (default: chosen from the model and T, docs/architecture.md: Chunk sizes; "
                  "the columns show them)\n",
                  (long long)a.warmup, (long long)a.repeat, size(a.chunk).c_str(), size(a.logits_chunk).c_str(),
                  size(a.key_chunk).c_str());
      PrintRunHeader();
      for (int64_t T : a.seq_lens) {
        for (auto& r : MeasureInRounds(ctx, variants, T, a.warmup, a.repeat)) {
          runs.push_back(std::move(r));
          PrintRun(runs.back(), gemm);
        }
      }
    }
    report["runs"] = nlohmann::json::array();
    for (const auto& r : runs) report["runs"].push_back(RunJson(r));
    // --check with --profile: the analytic FLOPs against the profiled steps' counted ones.
    const std::vector<std::string> flop_problems =
        a.profile ? PrintProfile(runs, a.check, a.flops_tolerance) : std::vector<std::string>{};

    // Ablation: K/V once per layer vs recomputed over the prefix for every chunk.
    std::vector<Run> ablation;
    const bool has_stream = std::find(a.engines.begin(), a.engines.end(), std::string("stream")) != a.engines.end();
    if (a.ablation_seq_len > 0 && has_stream) {
      std::printf("\n== ablation: K/V once per layer vs prefix recompute per chunk, T=%lld\n",
                  (long long)a.ablation_seq_len);
      PrintRunHeader();
      Variant once{"stream", true, Engine(a, EngineKind::kStream, a.chunk, a.logits_chunk)};
      Variant prefix = once;
      prefix.options.recompute_kv_per_chunk = true;
      for (const auto& v : {once, prefix}) {
        const Run* same = Find(runs, v.label(), a.ablation_seq_len);
        ablation.push_back(same ? *same : MeasurePoint(ctx, v, a.ablation_seq_len, a.warmup, a.repeat, 0));
        PrintRun(ablation.back(), gemm);
      }
      if (!ablation[0].oom && !ablation[1].oom) {
        std::printf("K/V once: %.2fx the time, %.2fx the activation memory of prefix recompute\n",
                    ablation[0].step_seconds / ablation[1].step_seconds,
                    static_cast<double>(ablation[0].activation_bytes) / ablation[1].activation_bytes);
      }
    }
    report["ablation"] = nlohmann::json::array();
    for (const auto& r : ablation) report["ablation"].push_back(RunJson(r));

    // Max sequence length under the activation budget.
    report["max_seq_len"] = nlohmann::json::array();
    std::vector<SearchResult> searches;
    ctx.gemm_n = 0;
    if (budget > 0) {
      std::printf("\n== max sequence length under an activation budget of %s (from %lld, %gx per probe to the first OOM, then bisection to %.0f%%)\n",
                  HumanBytes(budget).c_str(), (long long)a.search_start, a.search_growth, 100 * a.search_tol);
      if (a.search_to_peak && !a.predict_only) {
        std::printf("   (--search-to-peak: each probe stops once the backward of layer L-2 starts; its time is not a "
                    "step's)\n");
      }
      ctx.stop_after_peak = a.search_to_peak;
      for (const auto& v : variants) {
        searches.push_back(SearchMaxLength(ctx, v, budget, a.search_start, a.search_max, a.search_tol,
                                           a.search_chunks == "auto", a.search_align, !a.predict_only));
        const auto& s = searches.back();
        std::printf("%-28s max T = %lld%s (first OOM at %lld; chunk %lld, logits %lld, key %lld; %lld probes, %.0f s); "
                    "the estimate predicts %lld\n",
                    v.label().c_str(), (long long)s.max_seq_len, s.capped ? " (search cap reached)" : "",
                    (long long)s.first_oom, (long long)s.chunk, (long long)s.logits_chunk, (long long)s.key_chunk,
                    (long long)s.probes, s.seconds, (long long)s.predicted_max_seq_len);
        std::fflush(stdout);
        report["max_seq_len"].push_back({{"engine", v.engine},
                                         {"logits_chunked", v.logits_chunked},
                                         {"tiled_attention", v.options.tiled_attention},
                                         {"offload_layer_inputs", v.options.offload_layer_inputs},
                                         {"label", v.label()},
                                         {"budget_bytes", budget},
                                         {"max_seq_len", s.max_seq_len},
                                         {"first_oom_seq_len", s.first_oom},
                                         {"chunk", s.chunk},
                                         {"logits_chunk", s.logits_chunk},
                                         {"key_chunk", s.key_chunk},
                                         {"capped", s.capped},
                                         {"predicted_max_seq_len", s.predicted_max_seq_len},
                                         {"probed", !a.predict_only},
                                         {"to_peak", a.search_to_peak},
                                         {"growth", a.search_growth},
                                         {"probes", s.probes},
                                         {"seconds", s.seconds},
                                         {"batch", a.batch},
                                         {"objective", a.objective},
                                         {"runs", ProbesJson(s)}});
      }
      ctx.stop_after_peak = false;
    }

    // GEMM again at the end: the reference is the better of the two (a busy machine at the
    // start must not make every GFLOP/s look better than it is).
    const double gemm_end = MeasureGemmGflops(ctx.dtype, a.gemm_n, ctx.memory);
    report["machine"]["gemm_gflops_start"] = gemm;
    report["machine"]["gemm_gflops_end"] = gemm_end;
    const double gemm_ref = std::max(gemm, gemm_end);
    report["machine"]["gemm_gflops"] = gemm_ref;
    std::printf("\nGEMM reference: %.0f GFLOP/s at the start, %.0f at the end; ratios below use %.0f\n", gemm, gemm_end,
                gemm_ref);
    ReportTargets({a, c, ctx.dtype, runs, ablation, searches, budget, gemm_ref}, report);

    write_json();
    if (!a.plot_path.empty()) {
      WritePlot(a.plot_path, runs, budget,
                "streambp-bench: " + a.objective + ", " + (a.model_dir.empty() ? a.preset : a.model_dir) + " (" +
                    report["model"].value("family", std::string("?")) + "), " + a.dtype,
                machine_line.str());
      std::printf("plot: %s\n", a.plot_path.c_str());
    }
    if (a.check) {
      nlohmann::json written = report;
      if (!a.json_path.empty()) {
        std::ifstream in(a.json_path);
        written = nlohmann::json::parse(in);
      }
      auto problems = CheckReport(written);
      problems.insert(problems.end(), flop_problems.begin(), flop_problems.end());
      if (!a.plot_path.empty() && !std::ifstream(a.plot_path).good()) problems.push_back("no plot written");
      for (const auto& p : problems) std::printf("check: FAIL: %s\n", p.c_str());
      if (!problems.empty()) return 1;
      std::printf("check: PASS (report complete; activation memory stream < checkpoint < full%s)\n",
                  a.profile ? "; analytic FLOPs = the profiled steps' counted GEMM FLOPs" : "");
    }
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "streambp-bench: %s\n", ex.what());
    return 1;
  }
}
