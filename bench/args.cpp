#include "args.h"

#include <algorithm>
#include <fstream>
#include <map>

#include "streambp/error.h"

namespace streambp::bench {

void AddOptions(CLI::App& app, Args& a) {
  app.add_option("--model", a.model_dir, "Hugging Face model folder (default: the embedded preset)");
  app.add_option("--family", a.family,
                 "the embedded preset's family (its config.json's architecture and settings, the preset's shapes): "
                 "llama | qwen2 | qwen3 | qwen3_moe | mistral | gemma3")
      ->capture_default_str();
  app.add_option("--preset", a.preset, "embedded model: tiny | small | qwen3-8b | qwen3-30b-a3b")
      ->check(CLI::IsMember(PresetNames()));
  app.add_option("--device", a.device,
                 "cpu | cuda | cuda:N (CUDA builds): memory from the caching allocator's device statistics, "
                 "budgets as its memory fraction, timings synchronized");
  app.add_option("--seed", a.seed, "seed of the embedded model");
  app.add_option("--dtype", a.dtype, "float32 | float64 | bfloat16");
  app.add_option("--objective", a.objective, "sft | dpo | grpo")->check(CLI::IsMember({"sft", "dpo", "grpo"}));
  app.add_option("--engines", a.engines, "engines, comma separated: full, checkpoint (materialized, chunked logits and tiled), checkpoint:materialized, "
                 "checkpoint:chunked, checkpoint:tiled, stream, stream:offload (layer inputs in a scratch file), "
                 "stream:keep (each layer's attention output kept for its backward: EngineOptions::keep_attention)")
      ->delimiter(',');
  app.add_option("--seq-lens", a.seq_lens, "sequence lengths of the sweep, comma separated")->delimiter(',');
  app.add_option("--batch", a.batch, "sft: sequences; dpo: pairs; grpo: completions of one group")
      ->check(CLI::PositiveNumber);
  app.add_option("--pack", a.pack,
                 "sft: N sequences of T / N tokens per row, packed (each attends only to itself: the attention a "
                 "packed batch of RL rollouts runs); the sweep and the search")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget", a.budget,
                 "activation budget of the max-length search (e.g. 1GiB; device: the whole GPU past the statics)");
  app.add_option("--repeat", a.repeat, "timed steps per point (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps per point before the timed ones")->check(CLI::NonNegativeNumber);
  app.add_option("--chunk", a.chunk,
                 "stream: query positions per chunk; checkpoint:tiled: per attention block (0 = default: chosen from the model and T)");
  app.add_option("--logits-chunk", a.logits_chunk,
                 "positions per logits chunk of the chunked-logits variants (-1 = default: chosen from the model and T)");
  app.add_option("--key-chunk", a.key_chunk,
                 "stream and checkpoint:tiled: keys per attention tile (0 = default: chosen from the model and T)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--optimizer", a.optimizer, "optimizer whose state is counted: adamw | sgd | none")
      ->check(CLI::IsMember({"adamw", "sgd", "none"}));
  app.add_option("--mem-limit", a.mem_limit,
                 "activation bytes past which a sweep point is OOM (auto = 80% of available memory)");
  app.add_flag("--no-search", a.no_search, "skip the max-length search");
  app.add_flag("--no-sweep", a.no_sweep, "skip the sequence-length sweep");
  app.add_flag("--profile", a.profile,
               "sweep: one more step per point with the time split into attention, MLP, experts (a mixture of "
               "experts), projections, head, norms/RoPE, copies, embedding, other (RecordFunction callbacks)");
  app.add_option("--flops-tolerance", a.flops_tolerance,
                 "with --check and --profile: the largest |analytic / counted - 1| of a point's GEMM FLOPs");
  app.add_option("--search-chunks", a.search_chunks,
                 "stream chunks in the search: auto (largest fitting the budget, as the server) | fixed")
      ->check(CLI::IsMember({"auto", "fixed"}));
  app.add_option("--search-tol", a.search_tol, "bisection stops at (hi - lo) <= tol * lo");
  app.add_flag("--predict-only", a.predict_only,
               "max-length search: only the estimate's longest fitting length, no step run (for budgets whose "
               "steps would take hours)");
  app.add_flag("--search-to-peak", a.search_to_peak,
               "max-length search: a probe stops once its step's peak has passed (the top decoder layer's backward "
               "done; from there a step only frees memory) and then counts as fitting: the same lengths in a "
               "fraction of the time");
  app.add_option("--search-start", a.search_start, "first length of the doubling");
  app.add_option("--search-growth", a.search_growth,
                 "max-length search: each probe before the first OOM this factor longer than the last (2 = doubling; "
                 "e.g. 1.125 from a start just under the estimate's prediction, where probes are expensive)")
      ->capture_default_str()
      ->check(CLI::Range(1.01, 16.0));
  app.add_option("--search-max", a.search_max, "longest length tried");
  app.add_option("--search-align", a.search_align, "lengths tried are multiples of this")->check(CLI::PositiveNumber);
  app.add_option("--ablation-seq-len", a.ablation_seq_len, "length of the K/V-once vs prefix-recompute ablation (0 = off)");
  app.add_option("--gemm-n", a.gemm_n, "size of the reference GEMM");
  app.add_option("--scratch-dir", a.scratch_dir, "stream:offload: folder of the scratch file (default $TMPDIR or /tmp)");
  app.add_option("--json", a.json_path, "write the report as JSON");
  app.add_option("--plot", a.plot_path, "write the plots as PNG (gnuplot)");
  app.add_option("--replot", a.replot, "only draw --plot from a JSON report written earlier (budget line from --budget)");
  app.add_flag("--quick", a.quick, "CI smoke test: tiny model, short lengths, one repeat");
  app.add_flag("--check", a.check, "assert the report is complete and memory is ordered stream < checkpoint < full");
  app.add_option("--threads", a.threads, "LibTorch threads (0 = number of cores); data parallel: of the whole job");
  app.add_option("--world-sizes", a.world_sizes,
                 "data-parallel mode: train steps on N processes over loopback Gloo for each N (e.g. 1,2); "
                 "only this runs (first --seq-lens, --batch is the global batch, --repeat timed steps)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--context-parallel", a.context_parallel,
                 "context-parallel mode: one stream step of a sequence split over P processes on loopback Gloo for "
                 "each P (e.g. 1,2): the longest sequence under --budget of activations per rank, and the step at the "
                 "first --seq-lens with --threads split over the ranks; only this runs")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--context-exchange", a.context_exchange,
                 "context-parallel mode: how the ranks exchange attention's inputs: heads (Ulysses: each rank attends "
                 "a share of the heads, so K/V per rank shrink with P), kv (every rank gathers the whole sequence's "
                 "K/V), auto (heads where they split over P, else kv)")
      ->check(CLI::IsMember({"auto", "heads", "kv"}));
  app.add_option("--cp-worker", a.cp_worker, "internal: run as a rank, write results to this folder")->group("");
  app.add_option("--cp-seq-len", a.cp_seq_len, "internal")->group("");
  app.add_option("--cp-budget", a.cp_budget, "internal")->group("");
  app.add_option("--cp-steps", a.cp_steps, "internal")->group("");
  app.add_option("--zero-stages", a.zero_stages, "data-parallel mode: ZeRO stages for N > 1 (0, 1, 2)")
      ->delimiter(',')
      ->check(CLI::Range(0, 2));
  app.add_option("--micro-batch-tokens", a.micro_batch_tokens,
                 "data-parallel mode: padded tokens per micro-batch (0 = the rank's whole shard at once)");
  app.add_option("--grad-bucket", a.grad_bucket,
                 "data-parallel mode: bytes per overlapped gradient bucket (0 = default 25MiB)");
  app.add_option("--lora-rank", a.lora_rank,
                 "LoRA mode: full fine-tuning vs an adapter of this rank on the same base (stream engine): "
                 "weights, adapter, gradient, optimizer and activation bytes, and the max length under --total-budget")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--lora-only", a.lora_only,
               "LoRA mode: the adapter run only (the full fine-tuning run's search is the plain --engines stream one)");
  app.add_option("--lora-alpha", a.lora_alpha, "LoRA mode: alpha (default 2 x rank)");
  app.add_option("--total-budget", a.total_budget,
                 "LoRA mode: memory budget of the max-length search, statics included (0 = no search; device: the whole GPU)");
  app.add_option("--tokenizer", a.tokenizer,
                 "text mode: a tokenizer folder; encode MB/s, chat rendering, and a text request vs its step");
  app.add_option("--text-file", a.text_file, "text mode: the English text to encode")->capture_default_str();
  app.add_option("--text-bytes", a.text_bytes,
                 "text mode: the English text is repeated to at least this many bytes, and every adversarial input "
                 "is that long (16777216 = the server's default limits.max_text_bytes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30));
  app.add_option("--sample-prompts", a.sample_prompts,
                 "sample mode: time one Sample of this many prompts (random ids) x --sample-n completions, "
                 "next to the forward-backward of the same sequences")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sample-n", a.sample_n, "sample mode: completions per prompt")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--sample-prompt-len", a.sample_prompt_len, "sample mode: prompt tokens")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--sample-max-tokens", a.sample_max_tokens, "sample mode: new tokens per completion")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dist-worker", a.dist_worker, "internal: run as a rank, write results to this folder")->group("");
  app.add_option("--dist-overlap", a.dist_overlap, "internal")->group("");
  app.add_option("--dist-seq-len", a.dist_seq_len, "internal")->group("");
}

torch::Device CheckedDevice(const Args& a) {
  ModelSource source;  // the same checks of device and dtype as the server's
  source.device = a.device;
  source.dtype = a.dtype;
  source.preset = a.preset;
  source.family = a.family;
  CheckModelSource(source);
  const torch::Device device(a.device);
  if (a.budget == "device" && device.is_cpu() && !a.no_search) {
    throw InvalidArgument("--budget device needs --device cuda (on the CPU give bytes, e.g. --budget 4GiB)");
  }
  if (a.total_budget == "device" && device.is_cpu() && a.lora_rank > 0 && !a.no_search) {
    throw InvalidArgument("--total-budget device needs --device cuda (on the CPU give bytes, e.g. --total-budget 4GiB)");
  }
  if (device.is_cuda() && (!a.world_sizes.empty() || a.sample_prompts > 0 || !a.tokenizer.empty())) {
    throw InvalidArgument("--device cuda measures the engines' steps (the sweep, the search, --lora-rank); the "
                          "data-parallel, sample and text modes run on the CPU");
  }
  if (a.pack > 1 && (a.objective != "sft" || !a.world_sizes.empty() || !a.context_parallel.empty() ||
                     a.lora_rank > 0 || a.sample_prompts > 0 || !a.tokenizer.empty())) {
    throw InvalidArgument("--pack packs sft sequences for the sweep and the search; drop it for --objective " +
                          a.objective + " and the data-parallel, context-parallel, LoRA, sample and text modes");
  }
  if (device.is_cuda() && a.profile) {
    // RecordFunction times the host side of one thread; on a GPU the kernels run later.
    throw InvalidArgument("--profile times CPU steps only; on a GPU use Nsight Systems or torch.profiler");
  }
  return device;
}

int64_t ParseBytes(const std::string& text) {
  size_t pos = 0;
  double value = std::stod(text, &pos);
  std::string unit = text.substr(pos);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  std::transform(unit.begin(), unit.end(), unit.begin(), ::tolower);
  const std::map<std::string, double> units{{"", 1},      {"b", 1},        {"k", 1e3},    {"kb", 1e3},
                                            {"kib", 1024}, {"m", 1e6},       {"mb", 1e6},   {"mib", 1 << 20},
                                            {"g", 1e9},    {"gb", 1e9},      {"gib", 1 << 30}};
  auto it = units.find(unit);
  if (it == units.end()) throw InvalidArgument("bad byte size '" + text + "' (e.g. 1GiB, 512MiB, 2e9)");
  return static_cast<int64_t>(value * it->second);
}

int64_t MemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  }
  return "unknown CPU";
}

}  // namespace streambp::bench
