#pragma once
// streambp-bench's command line: every option and its default, and the small parsers the
// modes share (byte sizes, the machine's free memory and CPU model).
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench.h"

namespace streambp::bench {

struct Args {
  std::string model_dir, preset = "small", dtype = "float32", objective = "sft", optimizer = "adamw";
  std::string device = "cpu", family = "qwen3";
  uint64_t seed = 0;
  std::vector<std::string> engines{"full", "checkpoint", "stream"};
  std::vector<int64_t> seq_lens{1024, 2048, 4096, 8192, 16384};
  int64_t pack = 1;  ///< sft: sequences per row, packed
  int64_t batch = 1, repeat = 3, warmup = 1, chunk = 0, logits_chunk = -1, key_chunk = 0;
  std::string budget = "1GiB", mem_limit = "auto";
  bool no_search = false, no_sweep = false, quick = false, check = false, profile = false;
  /// --check with --profile: how far the analytic FLOPs may be from the profiler's count.
  double flops_tolerance = 1e-9;
  std::string search_chunks = "auto";
  bool predict_only = false, search_to_peak = false;
  double search_tol = 0.01, search_growth = 2.0;
  bool lora_only = false;
  int64_t search_start = 512, search_max = int64_t{1} << 20, search_align = 8;
  int64_t ablation_seq_len = 8192, gemm_n = 2048;
  std::string json_path, plot_path, replot;
  std::string scratch_dir;  // stream:offload's scratch folder (empty: $TMPDIR or /tmp)
  int threads = 0;
  // Data parallel mode (--world-sizes).
  std::vector<int> world_sizes, zero_stages{0};
  int64_t micro_batch_tokens = 0;
  std::string grad_bucket = "0";
  std::string dist_worker;  // set in the rank processes the mode starts
  int dist_overlap = 1;
  int64_t dist_seq_len = 0;
  // Context-parallel mode (--context-parallel).
  std::vector<int> context_parallel;
  std::string context_exchange = "auto";
  std::string cp_worker;  // set in the rank processes the mode starts
  int64_t cp_seq_len = 0, cp_budget = 0, cp_steps = 0;
  // LoRA vs full fine-tuning mode (--lora-rank).
  int64_t lora_rank = 0;
  std::string tokenizer;  ///< text mode: a folder with tokenizer.json
  int64_t sample_prompts = 0, sample_n = 8, sample_prompt_len = 128, sample_max_tokens = 128;  ///< sample mode
  std::string text_file = STREAMBP_SOURCE_DIR "/README.md";
  int64_t text_bytes = 4 << 20;  ///< text mode: the English text repeated to at least this size
  double lora_alpha = 0;
  std::string total_budget = "1GiB";
};

/// Every option of streambp-bench, bound to `a`.
void AddOptions(CLI::App& app, Args& a);

/// --device, checked as the server checks it (name, CUDA present, dtype), and against the
/// modes and flags that measure the CPU only; InvalidArgument before any model is built.
torch::Device CheckedDevice(const Args& a);

/// The engine options of one variant (full and checkpoint never tile keys: key_chunk is
/// passed on and resolves to T for them), with the defaults of --device's kind.
EngineOptions Engine(const Args& a, EngineKind kind, int64_t chunk, int64_t logits_chunk);
/// The variants the flags ask for, in order (--engines: checkpoint runs its three baselines,
/// checkpoint:materialized / :chunked / :tiled one of them; stream:offload the second tier).
std::vector<Variant> MakeVariants(const Args& a);
/// The data-parallel mode's plan at `seq_len` (stream engine, the flags' sizes).
DistPlan MakeDistPlan(const Args& a, int64_t seq_len);

/// The context-parallel mode's plan (stream engine, the flags' sizes; the search under
/// --budget per rank unless --no-search).
CpPlan MakeCpPlan(const Args& a);

/// "1GiB", "512MiB", "2e9" -> bytes (InvalidArgument otherwise).
int64_t ParseBytes(const std::string& text);
/// /proc/meminfo's MemAvailable in bytes (0 if unknown).
int64_t MemAvailable();
/// /proc/cpuinfo's model name.
std::string CpuModel();

/// --replot: reads a written report and draws its plot again (nothing runs). `budget_given`:
/// --budget was on the command line (its line is drawn).
int Replot(const Args& a, bool budget_given);

/// What the ratios and targets of a sweep are computed from.
struct TargetInputs {
  const Args& args;
  const ModelConfig& config;
  torch::ScalarType dtype;
  const std::vector<Run>& runs;
  const std::vector<Run>& ablation;  ///< K/V once, prefix recompute (or empty)
  const std::vector<SearchResult>& searches;
  int64_t budget;   ///< the max-length searches' activation budget (0: none ran)
  double gemm_ref;  ///< GFLOP/s of the GEMM reference
};
/// Prints the ratios against the strongest baselines and the targets (MET / MISSED), and puts
/// them in `report` ("ratios", "offload", "keep_attention", "targets").
void ReportTargets(const TargetInputs& in, nlohmann::json& report);

}  // namespace streambp::bench
