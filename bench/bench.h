#pragma once
// streambp-bench internals: the engines side by side on one model and one batch — peak
// memory, step time, FLOPs, max sequence length under a budget (docs/architecture.md: Measuring, issue 6).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "streambp/batch.h"
#include "streambp/config.h"
#include "streambp/engine.h"
#include "streambp/lora.h"
#include "streambp/model.h"

namespace streambp::bench {

/// One engine configuration as the bench reports it.
struct Variant {
  std::string engine;          ///< full | checkpoint | stream
  bool logits_chunked = false;  ///< the lm_head + loss runs chunk by chunk
  EngineOptions options;        ///< what ForwardBackward gets
  std::string label() const;    ///< e.g. "checkpoint+chunked-logits"
};

/// What the step needs besides the model: the objective and its options.
struct Workload {
  std::string objective = "sft";  ///< sft | dpo | grpo
  int64_t batch = 1;              ///< sft: sequences; dpo: pairs; grpo: completions of one group
  uint64_t data_seed = 1;
  /// sft: sequences per row, packed (each seq_len / pack tokens, attending only to itself).
  int64_t pack = 1;
};

/// Synthetic sequences of exactly `seq_len` tokens (rows of a right-padded batch are all
/// seq_len long): sft sequences with a prompt quarter masked out; dpo pairs (same prompt,
/// chosen role 0 / rejected role 1); one grpo group with spread rewards. With w.pack > 1,
/// batch x pack sft sequences of seq_len / pack tokens (the last of each row the rest).
std::vector<Sequence> SyntheticSequences(const Workload& w, int64_t seq_len, int64_t vocab);
/// The batch of a step at `seq_len`: SyntheticSequences right-padded, or packed into rows of
/// seq_len with w.pack > 1.
Batch SyntheticBatch(const Workload& w, int64_t seq_len, int64_t vocab);

/// The sizes that stay alive across steps.
struct StaticBytes {
  int64_t weights = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
};

/// Where one step's wall time went, in seconds per category (BreakdownCategories():
/// attention, mlp, experts, projections, head, norms_rope, copies, embedding, other); the categories
/// sum to total_seconds. See profile.cpp.
struct TimeBreakdown {
  double total_seconds = 0;
  std::map<std::string, double> seconds;
  /// The 40 largest "category/op" pairs by exclusive time (the innermost op or scope).
  std::vector<std::pair<std::string, double>> ops;
  /// FLOPs of the matrix products the step ran (mm, addmm, bmm, baddbmm: 2 m k n each),
  /// counted from their operands' shapes.
  double gemm_flops = 0;
};
/// Runs `step` on this thread with RecordFunction callbacks attributing its time.
TimeBreakdown ProfileStep(const std::function<void()>& step);
const std::vector<std::string>& BreakdownCategories();

/// One measured point.
struct Run {
  Variant variant;
  int64_t seq_len = 0;
  int64_t batch = 0;   ///< rows of the batch
  bool oom = false;    ///< the budgeted allocator refused an allocation (or the estimate did)
  bool oom_predicted = false;  ///< skipped: the estimate is far past the limit
  bool to_peak = false;        ///< stopped once the peak had passed (Context::stop_after_peak)
  std::string oom_message;
  int64_t peak_bytes = 0;
  int64_t activation_bytes = 0;
  StaticBytes statics;
  int64_t predicted_peak_bytes = 0;
  int64_t predicted_activation_bytes = 0;
  double step_seconds = 0;               ///< median of the timed repeats
  std::vector<double> samples;           ///< every timed repeat
  double tokens_per_second = 0;
  double flops = 0;        ///< executed by this engine (analytic, recompute included)
  double model_flops = 0;  ///< 3 x forward with causal attention (the same for every engine)
  double gflops = 0;       ///< flops / step_seconds / 1e9
  double loss = 0;
  int64_t chunk = 0, logits_chunk = 0, key_chunk = 0;  ///< what the engine used
  int64_t predicted_key_chunk = 0;                     ///< the key chunk the estimate assumed
  int64_t offloaded_bytes = 0;            ///< kept in the second tier (stream:offload)
  int64_t predicted_offloaded_bytes = 0;
  /// The OS's account (/proc/self/status): resident bytes when the point started (after
  /// malloc_trim) and the peak resident bytes (VmHWM, reset at the start) over its steps.
  int64_t rss_start_bytes = 0, rss_peak_bytes = 0;
  /// The process's minor page faults (getrusage) during each timed step: fresh pages from the
  /// OS, first touched; their median in minor_faults.
  std::vector<double> fault_samples;
  double minor_faults = 0;
  /// The process's CPU seconds in the kernel (getrusage ru_stime, every thread) during each
  /// timed step: page faults, mmap/munmap and their TLB shootdowns; their median in system_seconds.
  std::vector<double> system_samples;
  double system_seconds = 0;
  /// The same in user mode (ru_utime): the CPU work of every thread, the BLAS's too. With the
  /// wall time it tells work from waiting: two engines at the same step time may do different
  /// work, one spending it in the kernel, the other computing.
  std::vector<double> user_samples;
  double user_seconds = 0;
  /// The GEMM reference measured next to each timed step (Context::gemm_n > 0): the mean of
  /// an n^3 GEMM's GFLOP/s right before and right after it. On a machine whose speed drifts
  /// within minutes, a step's share of the GEMM speed is taken against these, not against a
  /// reference measured minutes away (AdjacentGemmFractions).
  std::vector<double> gemm_samples;
  /// One more step after the timed ones, profiled (Context::profile); empty otherwise.
  TimeBreakdown breakdown;
};

/// Analytic FLOPs of one training step of `variant` (GEMMs and attention matmuls only), over
/// rows of `pack` sequences each (SyntheticBatch).
struct StepFlops {
  double executed = 0;
  double model = 0;
};
StepFlops AnalyticFlops(const ModelConfig& c, torch::Dtype dtype, int64_t rows, int64_t seq_len, const Variant& v,
                        bool sequence_pass, int64_t pack = 1);

/// The process's resident bytes (VmRSS) and peak resident bytes (VmHWM) as the kernel
/// counts them; ResetPeakRss() returns freed heap to the OS and restarts the peak (Linux:
/// /proc/self/clear_refs). 0 where /proc is not there.
int64_t ResidentBytes();
int64_t PeakResidentBytes();
void ResetPeakRss();

struct DeviceMemory;
/// Measured throughput of an n x n x n GEMM in `dtype` on the device (best of a few), GFLOP/s.
double MeasureGemmGflops(torch::Dtype dtype, int64_t n, const DeviceMemory& device);

/// Everything the runner needs; the model is owned by the caller.
/// Memory of the device the measurements run on (docs/architecture.md: Measuring): the CPU's
/// tracking allocator (live and peak bytes, a budget past which an allocation fails), or on
/// a CUDA device (CUDA builds) the caching allocator's allocated bytes, current and peak, with
/// the budget as its memory fraction. Out of memory is c10::OutOfMemoryError on both.
struct DeviceMemory {
  torch::Device device{torch::kCPU};
  int64_t live() const;
  int64_t peak() const;
  void reset_peak() const;    ///< peak := live
  int64_t total() const;      ///< the device's memory (CUDA); 0 on the CPU (no fixed size)
  std::string describe() const;  ///< "cpu", or the GPU's name, memory and CUDA versions
  void synchronize() const;   ///< waits for the device's queued work (CUDA), before a clock is read
  void release_cached() const;  ///< CUDA: the caching allocator's free blocks back to the driver

  /// A budget for a scope (bytes in all, statics included; 0 = none), restored on exit.
  class Budget {
   public:
    Budget(const DeviceMemory& memory, int64_t bytes);
    ~Budget();
    Budget(const Budget&) = delete;
    Budget& operator=(const Budget&) = delete;

   private:
    const DeviceMemory& memory_;
    int64_t previous_ = 0;
  };
};

/// An out-of-memory error: c10::OutOfMemoryError, or a CUDA library's failed allocation.
bool IsOutOfMemory(const std::exception& e);

struct Context {
  CausalLM model{nullptr};
  DeviceMemory memory;  ///< the model's device
  ModelConfig config;
  torch::Dtype dtype = torch::kFloat32;
  std::string optimizer = "adamw";
  StaticBytes statics;
  Workload workload;
  int64_t mem_limit = 0;  ///< activation bytes past which a sweep point counts as OOM (0 = none)
  int threads = 1;        ///< LibTorch intra-op threads of the measuring thread
  bool profile = false;   ///< each point: one more step with the time breakdown
  /// > 0: each timed step of MeasurePoint runs between two GEMMs of this size (Run::gemm_samples),
  /// measured outside the step's memory and RSS peaks.
  int64_t gemm_n = 0;
  /// MeasurePoint ends each step when the backward of the second-highest decoder layer starts:
  /// the peak has passed (every engine's backward goes down the layers, each freeing the stored
  /// input of the one it finished; the next allocates what the last one freed). Times are then
  /// not step times. For the max-length search (--search-to-peak).
  bool stop_after_peak = false;
  /// The max-length search's growth before its first OOM: each probe this factor longer than
  /// the last (2: doubling; near 1, e.g. 1.125, from a start just under the estimate's
  /// prediction, where each probe of a long sequence costs minutes on a GPU).
  double search_growth = 2.0;
  /// LoRA: the adapter attached to `model` (its base frozen): what trains, has gradients
  /// and optimizer state. Null: full fine-tuning.
  std::shared_ptr<LoraAdapter> adapter;
};

/// Creates gradients and optimizer state (so they are counted as live, not as activation).
void PrepareStatics(Context& ctx);

/// Runs `warmup` + `repeat` steps of one point under an activation budget (0 = none).
/// Out of memory is caught and reported in the Run; gradients are zeroed before each step.
Run MeasurePoint(Context& ctx, const Variant& v, int64_t seq_len, int64_t warmup, int64_t repeat,
                 int64_t activation_budget);

/// One point per variant at length T, its `repeat` timed steps in rounds: every variant's
/// step i runs before any variant's step i + 1 (after `warmup` steps in the first round), so
/// a slow minute of a shared machine falls on all of them; odd rounds run the variants in
/// reverse order, so none is always the one that runs second. Each Run has every round's sample
/// (median and rates from them), the largest peaks, and the profile of one step after the
/// last round (Context::profile); a round out of memory makes the point out of memory.
std::vector<Run> MeasureInRounds(Context& ctx, const std::vector<Variant>& variants, int64_t seq_len,
                                 int64_t warmup, int64_t repeat);

/// Max sequence length under an activation budget: doubling from `start`, then bisection
/// until (hi - lo) <= tol * lo. Every probe is one step under the budgeted allocator.
struct SearchResult {
  Variant variant;
  int64_t budget_bytes = 0;
  int64_t max_seq_len = 0;  ///< 0 when not even `start` fits
  int64_t first_oom = 0;    ///< the smallest length seen to fail
  int64_t probes = 0;
  double seconds = 0;
  int64_t chunk = 0, logits_chunk = 0, key_chunk = 0;  ///< stream: chunks used at max_seq_len
  bool capped = false;                  ///< reached `max_len` without failing
  std::vector<Run> runs;                ///< every probe, in order
  /// The longest length (a multiple of `align`) whose estimated activation bytes fit the
  /// budget (EstimateStepMemory, with the chunks the search would use): no step run.
  int64_t predicted_max_seq_len = 0;
};
/// probe = false: only the prediction.
SearchResult SearchMaxLength(Context& ctx, const Variant& v, int64_t budget, int64_t start, int64_t max_len,
                             double tol, bool auto_chunks, int64_t align, bool probe = true);

/// Data parallel (issue 7): a few Trainer steps (train_step: forward, backward, gradient
/// sum, clipping, AdamW) of one global batch on N processes over loopback Gloo, started from
/// this executable with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and STREAMBP_ZERO_STAGE
/// like any PyTorch job. Every rank reports per step: collective payload bytes per op
/// (Communicator::stats()), seconds spent waiting in collectives, step seconds, the
/// gradient sum's buckets (and how many started during the backward), the bytes it wrote
/// to its sockets (/proc/self/io), and its final weights' hash.
struct DistPlan {
  std::string model_dir, preset = "small", family = "qwen3", dtype = "float32", optimizer = "adamw";
  uint64_t seed = 0;
  Workload workload;                ///< objective and global batch (sharded over the ranks)
  EngineOptions engine;             ///< the stream engine and its chunk sizes
  int64_t seq_len = 1024;
  int64_t warmup = 1, steps = 3;    ///< untimed and timed steps
  int64_t micro_batch_tokens = 0;   ///< TrainerOptions::micro_batch_tokens
  int64_t grad_bucket_bytes = 0;    ///< TrainerOptions::grad_bucket_bytes (0 = default)
  int threads = 1;                  ///< threads of the whole job: each of N ranks gets threads / N
  std::vector<int> world_sizes{1, 2};
  std::vector<int> zero_stages{0};  ///< for N > 1; each with overlap on and off
};
/// The rank process (RANK etc. from the environment): runs the steps and writes
/// dir/rank<r>.json (rank 0 also dir/weights.pt). Returns the exit status.
int RunDistWorker(const DistPlan& plan, const std::string& dir, bool overlap);
/// The parent: for each world size, ZeRO stage and overlap mode starts the ranks as
/// `args` + worker flags, prints a table row and returns the rows (the "distributed" runs).
nlohmann::json RunDistributed(const DistPlan& plan, const std::vector<std::string>& args);
/// Problems of a "distributed" section (ranks that differ, a gradient not summed exactly
/// once per step, a single process that communicated); empty = fine.
std::vector<std::string> CheckDistributed(const nlohmann::json& distributed);

/// Starts `n` copies of this executable (`args`) as ranks 0..n-1 of a job on loopback
/// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, STREAMBP_ZERO_STAGE set; stdout and stderr
/// to dir/rank<r>.log) and waits for all; when one fails the others are stopped and the
/// error quotes its log.
void SpawnRanks(const std::vector<std::string>& args, int n, int zero_stage, const std::string& dir);

/// Context parallel (issue 26, docs/architecture.md: Context parallel): one stream step of a
/// sequence split over P processes on loopback Gloo, for each P of `ranks` (P = 1: one
/// process, ForwardBackward): the longest sequence whose step fits a per-rank activation
/// budget (doubling, then bisection, every probe a real step under the budgeted allocator),
/// and at `seq_len` the step time with the job's threads split over the ranks, the
/// activation peak per rank and the K/V traffic per layer (measured and by the formula).
struct CpPlan {
  std::string model_dir, preset = "small", family = "qwen3", dtype = "float32";
  uint64_t seed = 0;
  Workload workload;
  EngineOptions engine;
  std::vector<int> ranks{1, 2};
  int64_t seq_len = 2048;           ///< the timed length
  int64_t repeat = 1;               ///< timed steps at seq_len (after one untimed)
  int64_t budget = 0;               ///< activation bytes per rank for the search (0: no search)
  int64_t search_start = 512, search_max = int64_t{1} << 20, align = 8;
  double tol = 0.05;
  int threads = 1;                  ///< threads of the whole job: each of P ranks gets threads / P
};
/// A rank process of one probe or timing: writes dir/rank<r>.json (status ok | oom | failed,
/// activation peak, step seconds, collective bytes). Returns 0 unless it could not report.
int RunCpWorker(const CpPlan& plan, const std::string& dir, int64_t seq_len, int64_t budget, int64_t steps);
/// The parent: prints a table and returns the "context_parallel" section.
nlohmann::json RunContextParallel(const CpPlan& plan, const std::vector<std::string>& args);
/// Problems of that section (ranks disagreeing on the loss, a loss other than the first
/// run's, traffic off the formula, no search result); empty = fine.
std::vector<std::string> CheckContextParallel(const nlohmann::json& section);

/// LoRA vs full fine-tuning on the same base (--lora-rank): for each mode, the static bytes
/// (base weights, adapter, gradients, optimizer state), one stream step at each length of
/// `seq_lens` (activation bytes, time), and the max sequence length under a total memory
/// budget (weights + gradients + optimizer + activations). Prints a table; returns the
/// "lora" JSON section.
struct LoraPlan {
  LoraConfig lora;
  Variant stream;
  std::vector<int64_t> seq_lens;
  int64_t total_budget = 0;  ///< 0 = no search
  int64_t warmup = 0, repeat = 1;
  int64_t search_start = 512, search_max = int64_t{1} << 20, search_align = 8;
  double search_tol = 0.01;
  bool auto_chunks = true;  ///< the search's chunks: the largest fitting the budget, or the variant's
  bool lora_only = false;   ///< skip the full fine-tuning mode (its search is the plain one's)
};
nlohmann::json RunLoraComparison(Context& ctx, const LoraPlan& plan);

/// Text next to ids (--tokenizer): encode MB/s of the tokenizer (cold and warm, one core) on
/// `text_file` (repeated to at least min_bytes), adversarial inputs of that size next to it,
/// the chat format's rendering speed, and, with a
/// model, tokenizing a request of `step_tokens` tokens vs one forward-backward of them.
/// Prints a summary; returns the "text" JSON section.
struct TextBenchPlan {
  std::string tokenizer_dir;
  std::string text_file;
  size_t min_bytes = 4 << 20;
  double min_seconds = 1.0;
  int64_t step_tokens = 2048;
  CausalLM* model = nullptr;
};
nlohmann::json RunTextBench(const TextBenchPlan& plan);

/// Sample mode (--sample-prompts): one Sample of prompts x n completions, its tokens/s, next
/// to the forward-backward of the same sequences.
struct SampleBenchPlan {
  int64_t prompts = 8;
  int64_t n = 8;
  int64_t prompt_len = 128;
  int64_t max_tokens = 128;
  uint64_t seed = 0;
  CausalLM* model = nullptr;
};
nlohmann::json RunSampleBench(const SampleBenchPlan& plan);

/// Output.
/// The run of variant `label` at length T that did not run out of memory, or null.
const Run* Find(const std::vector<Run>& runs, const std::string& label, int64_t T);
/// The sweep table's header and one row (GFLOP/s as a share of the GEMM reference `gemm`).
void PrintRunHeader();
void PrintRun(const Run& r, double gemm);
/// The strongest baseline at length T: the non-stream variant (that ran) with the least
/// activation memory, or (`by_time`) the fastest one.
const Run* StrongestBaseline(const std::vector<Run>& runs, int64_t T, bool by_time);
/// Selective recompute (stream:keep next to stream and checkpoint:tiled in the run): printed
/// per length, and returned as rows of activation and time ratios against both.
nlohmann::json KeepAttentionRatios(const std::vector<Run>& runs, const std::vector<int64_t>& seq_lens);
/// --profile: the time breakdown of each profiled step and its counted GEMM FLOPs against the
/// analytic count; with `check`, the points where they differ by more than `flops_tolerance`.
std::vector<std::string> PrintProfile(const std::vector<Run>& runs, bool check, double flops_tolerance);
nlohmann::json RunJson(const Run& r);
/// Each timed step's GFLOP/s over the GEMM measured next to it (Run::gemm_samples); empty
/// without those. Median: the median of any samples (0 when empty).
std::vector<double> AdjacentGemmFractions(const Run& r);
double Median(std::vector<double> v);
/// Every probe of a max-length search, as RunJson (a search's "runs"; "probes" is their count).
nlohmann::json ProbesJson(const SearchResult& s);
std::string HumanBytes(int64_t bytes);
/// Memory and time against T, one series per variant; OOM or refused points as crosses at
/// their estimate; `budget` (0 = none) as a line; `machine` printed under the title.
void WritePlot(const std::string& png, const std::vector<Run>& runs, int64_t budget, const std::string& title,
               const std::string& machine);
/// Checks a written report: complete fields, and at every length where all three ran,
/// activation memory stream < checkpoint < full. Returns the problems (empty = fine).
std::vector<std::string> CheckReport(const nlohmann::json& report);

}  // namespace streambp::bench
