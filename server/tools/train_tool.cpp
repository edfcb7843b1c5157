#include "train_tool.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "streambp/context_parallel.h"
#include "streambp/data.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"
#include "streambp/lora.h"
#include "streambp/trainer.h"
#include "tools.h"

namespace streambp::tools {
namespace {

// Examples: runs of sequences of one group (a DPO pair, a GRPO group), or one ungrouped
// sequence. A step takes whole examples.
std::vector<std::vector<Sequence>> Examples(const std::vector<Sequence>& sequences) {
  std::vector<std::vector<Sequence>> out;
  for (const auto& s : sequences) {
    if (out.empty() || s.group < 0 || out.back().back().group != s.group) out.emplace_back();
    out.back().push_back(s);
  }
  return out;
}

std::string FormatMetrics(const Metrics& metrics) {
  std::string out;
  char buf[128];
  for (const auto& [k, v] : metrics) {
    std::snprintf(buf, sizeof buf, "%s%s=%.4g", out.empty() ? "  " : " ", k.c_str(), v);
    out += buf;
  }
  return out;
}

}  // namespace

int Train(const TrainArgs& args) {
  if (args.steps <= 0) throw InvalidArgument("--steps must be > 0");
  if (args.batch_size < 0) throw InvalidArgument("--batch-size must be >= 0 (0 = all examples)");
  // Context parallel: every rank runs the same steps on its part of the positions; rank 0
  // reports and saves (the others print nothing).
  const auto parallel = ContextParallelGroups(args.context_parallel, /*data_parallel=*/true);
  const bool writer = parallel.writer();
  if (!writer && std::freopen("/dev/null", "w", stdout) == nullptr) throw Error(ErrorCode::kInternal, "stdout");
  auto objective = MakeObjective(args.objective, args.objective_options);
  const auto sequences = ReadExamples(args.data, args.objective);
  if (sequences.empty()) throw InvalidArgument(args.data + ": no examples");
  const auto examples = Examples(sequences);

  CausalLM model = LoadOrInitModel(args.model);
  const std::string source = args.model.describe();
  // Refuse bad data before building anything else.
  ValidateSequences(sequences, model->config().vocab_size);

  TrainerOptions options;
  options.optimizer.name = args.optimizer;
  options.optimizer.lr = args.lr;
  options.optimizer.weight_decay = args.weight_decay;
  options.schedule.type = args.schedule;
  options.schedule.warmup_steps = args.warmup;
  options.schedule.total_steps = args.steps;
  options.max_grad_norm = args.max_grad_norm;
  options.engine = {ParseEngine(args.engine), args.flags.chunk, args.flags.logits_chunk, false, args.flags.key_chunk};
  options.engine.keep_attention = args.flags.keep_attention;
  options.engine.context_exchange = ParseContextExchange(args.flags.context_exchange);
  options.layout = ParseLayout(args.layout);
  options.micro_batch_tokens = args.micro_batch_tokens;
  options.seed = args.model.seed;
  // A reference model only when the data needs one (it costs a second copy of the weights).
  options.reference.use_reference_model = objective->needs_reference(sequences);
  std::shared_ptr<LoraAdapter> adapter;
  const auto adapter_dtype = ParseDtype(args.model.dtype) == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  if (!args.adapter.empty()) {
    if (args.lora_rank > 0) throw InvalidArgument("give --adapter (start from an adapter) or --lora-rank, not both");
    adapter = LoraAdapter::Load(args.adapter, model->config(), adapter_dtype, torch::Device(args.model.device));
  } else if (args.lora_rank > 0) {
    LoraConfig lora;
    lora.r = args.lora_rank;
    lora.alpha = args.lora_alpha > 0 ? args.lora_alpha : 2.0 * static_cast<double>(args.lora_rank);
    if (!args.lora_targets.empty()) lora.target_modules = args.lora_targets;
    lora.modules_to_save = args.lora_modules_to_save;
    lora.use_rslora = args.use_rslora;
    lora.seed = args.model.seed;
    lora.base_model_name_or_path = args.model.dir;
    adapter = LoraAdapter::Create(model->config(), lora, adapter_dtype, torch::Device(args.model.device), model.get());
  }
  if (!adapter && (!args.save_adapter.empty() || !args.save_merged.empty())) {
    throw InvalidArgument("--save-adapter and --save-merged need an adapter (--lora-rank R or --adapter DIR)");
  }
  auto trainer = Trainer::Create(std::move(model), options, adapter);
  if (parallel.groups.data) trainer->set_communicator(parallel.groups.data);
  if (parallel.groups.context) trainer->set_context_parallel(parallel.groups.context);
  if (adapter) {
    std::printf("adapter: LoRA r %lld, alpha %g%s, %lld trainable parameters on %s (base frozen)\n",
                (long long)adapter->config().r, adapter->config().alpha, adapter->config().use_rslora ? " (rsLoRA)" : "",
                (long long)adapter->num_parameters(), [&] {
                  std::string t;
                  for (const auto& m : adapter->config().target_modules) t += (t.empty() ? "" : ",") + m;
                  return t;
                }().c_str());
  }

  const int64_t per_step = args.batch_size > 0 ? std::min<int64_t>(args.batch_size, examples.size())
                                               : static_cast<int64_t>(examples.size());
  std::printf("model:   %s, %s\n", source.c_str(), args.model.dtype.c_str());
  std::printf("data:    %s: %zu examples (%zu sequences), %lld per step; objective %s\n", args.data.c_str(),
              examples.size(), sequences.size(), (long long)per_step, args.objective.c_str());
  std::printf("trainer: %s lr %.3g, %s schedule (warmup %lld), max grad norm %g, %s engine, %s layout%s\n",
              args.optimizer.c_str(), args.lr, args.schedule.c_str(), (long long)args.warmup,
              args.max_grad_norm, args.engine.c_str(), args.layout.c_str(),
              options.reference.use_reference_model ? ", reference model" : "");
  std::printf("runtime: %s\n", GetRuntimeInfo().describe().c_str());
  std::fflush(stdout);

  double first_loss = 0, last_loss = 0;
  size_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < args.steps; ++step) {
    std::vector<Sequence> batch;
    for (int64_t k = 0; k < per_step; ++k) {
      const auto& example = examples[next];
      batch.insert(batch.end(), example.begin(), example.end());
      next = (next + 1) % examples.size();
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = trainer->train_step(batch, *objective);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step == 0) first_loss = r.forward.loss;
    last_loss = r.forward.loss;
    std::printf("step %lld/%lld  loss %.6f  tok/s %.0f  grad_norm %.4g  lr %.3e%s%s\n", (long long)(step + 1),
                (long long)args.steps, r.forward.loss, r.forward.tokens / std::max(secs, 1e-9),
                r.optim.grad_norm, r.optim.lr,
                r.optim.skipped ? ("  skipped: " + r.optim.reason).c_str() : "",
                FormatMetrics(r.forward.metrics).c_str());
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double fall = first_loss != 0 ? 100.0 * (first_loss - last_loss) / std::abs(first_loss) : 0.0;
  std::printf("summary: %lld steps in %.2f s, first loss %.6f, last loss %.6f, fell by %.1f%%\n",
              (long long)args.steps, total, first_loss, last_loss, fall);
  if (const auto& cp = parallel.groups.context) {
    std::printf("context parallel: %d ranks, each holding 1/%d of every sequence's positions\n", cp->world_size(),
                cp->world_size());
  }
  if (const auto& dp = parallel.groups.data) {
    std::printf("data parallel: %d ranks, each computing its share of every step's sequences\n", dp->world_size());
  }
  // Every rank takes part in the checkpoint (with ZeRO it gathers the ranks' optimizer
  // shards); rank 0 writes it.
  if (!args.save.empty()) trainer->save_checkpoint(args.save);
  if (!writer) return 0;
  if (!args.save_adapter.empty()) {
    adapter->save(args.save_adapter);
    std::printf("saved the PEFT adapter to %s\n", args.save_adapter.c_str());
  }
  if (!args.save_merged.empty()) {
    auto merged = LoadOrInitModel(args.model);
    merged->load_hf_tensors(trainer->model()->merged_hf_tensors());
    SaveModel(merged, args.save_merged);
    std::printf("saved the merged model (base + adapter) to %s\n", args.save_merged.c_str());
  }
  if (!args.save.empty()) {
    std::printf("saved checkpoint (step %lld, policy version %lld) to %s\n", (long long)trainer->step(),
                (long long)trainer->policy_version(), args.save.c_str());
  }
  return 0;
}

}  // namespace streambp::tools
