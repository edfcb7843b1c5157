// --lora-rank: LoRA vs full fine-tuning on the same base (issue 14). What a frozen base buys:
// no weight gradients and no optimizer state for the base, so more of a memory budget is
// left for activations, and StreamBP turns it into longer sequences.
#include <cstdio>

#include "bench.h"
#include "streambp/memory.h"

namespace streambp::bench {

nlohmann::json RunLoraComparison(Context& ctx, const LoraPlan& plan) {
  nlohmann::json modes = nlohmann::json::array();
  std::printf("== LoRA r %lld (alpha %g, %zu target modules) vs full fine-tuning: %s, stream (chunk %lld, logits %lld, "
              "key %lld); %s optimizer; total budget %s\n",
              (long long)plan.lora.r, plan.lora.alpha, plan.lora.target_modules.size(),
              ctx.workload.objective.c_str(), (long long)plan.stream.options.chunk,
              (long long)plan.stream.options.logits_chunk, (long long)plan.stream.options.key_chunk,
              ctx.optimizer.c_str(), HumanBytes(plan.total_budget).c_str());
  std::printf("%-10s %10s %10s %10s %10s %10s | %8s %12s %12s %9s\n", "mode", "weights", "adapter", "grads",
              "optimizer", "statics", "T", "activation", "predicted", "step s");
  const auto adapter = LoraAdapter::Create(
      ctx.config, plan.lora, ctx.dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32, ctx.memory.device);
  int64_t max_len[2] = {0, 0};
  for (int mode = plan.lora_only ? 1 : 0; mode < 2; ++mode) {
    ctx.adapter = mode == 1 ? adapter : nullptr;
    PrepareStatics(ctx);
    const int64_t adapter_bytes = ctx.adapter ? ctx.adapter->num_parameters() * (ctx.dtype == torch::kFloat64 ? 8 : 4) : 0;
    const int64_t statics = ctx.statics.weights + ctx.statics.grads + ctx.statics.optimizer;
    const std::string name = mode == 1 ? "lora r" + std::to_string(plan.lora.r) : "full";
    nlohmann::json runs = nlohmann::json::array();
    for (int64_t T : plan.seq_lens) {
      const auto r = MeasurePoint(ctx, plan.stream, T, plan.warmup, plan.repeat, 0);
      std::printf("%-10s %10s %10s %10s %10s %10s | %8lld %12s %12s %9.3f%s\n", name.c_str(),
                  HumanBytes(ctx.statics.weights - adapter_bytes).c_str(), HumanBytes(adapter_bytes).c_str(),
                  HumanBytes(ctx.statics.grads).c_str(), HumanBytes(ctx.statics.optimizer).c_str(),
                  HumanBytes(statics).c_str(), (long long)T, r.oom ? "OOM" : HumanBytes(r.activation_bytes).c_str(),
                  HumanBytes(r.predicted_activation_bytes).c_str(), r.step_seconds, r.oom ? " (refused)" : "");
      std::fflush(stdout);
      runs.push_back(RunJson(r));
    }
    nlohmann::json search = nullptr;
    if (plan.total_budget > 0) {
      const int64_t activation_budget = plan.total_budget - statics;
      if (activation_budget <= 0) {
        std::printf("%-10s the statics alone (%s) exceed the total budget %s\n", name.c_str(),
                    HumanBytes(statics).c_str(), HumanBytes(plan.total_budget).c_str());
      } else {
        const auto s = SearchMaxLength(ctx, plan.stream, activation_budget, plan.search_start, plan.search_max,
                                       plan.search_tol, plan.auto_chunks, plan.search_align);
        max_len[mode] = s.max_seq_len;
        std::printf("%-10s max T = %lld under %s in all (%s for activations; first OOM at %lld; %lld probes, %.0f s)%s; "
                    "the estimate predicts %lld\n",
                    name.c_str(), (long long)s.max_seq_len, HumanBytes(plan.total_budget).c_str(),
                    HumanBytes(activation_budget).c_str(), (long long)s.first_oom, (long long)s.probes, s.seconds,
                    s.capped ? " (search cap reached)" : "", (long long)s.predicted_max_seq_len);
        std::fflush(stdout);
        search = {{"total_budget_bytes", plan.total_budget},
                  {"activation_budget_bytes", activation_budget},
                  {"max_seq_len", s.max_seq_len},
                  {"first_oom_seq_len", s.first_oom},
                  {"predicted_max_seq_len", s.predicted_max_seq_len},
                  {"capped", s.capped},
                  {"probes", s.probes},
                  {"to_peak", ctx.stop_after_peak},
                  {"growth", ctx.search_growth},
                  {"runs", ProbesJson(s)},
                  {"seconds", s.seconds},
                  {"chunk", s.chunk},
                  {"logits_chunk", s.logits_chunk},
                  {"key_chunk", s.key_chunk}};
      }
    }
    modes.push_back({{"mode", name},
                     {"weights_bytes", ctx.statics.weights - adapter_bytes},
                     {"adapter_bytes", adapter_bytes},
                     {"gradient_bytes", ctx.statics.grads},
                     {"optimizer_bytes", ctx.statics.optimizer},
                     {"statics_bytes", statics},
                     {"runs", runs},
                     {"search", search}});
  }
  ctx.adapter = nullptr;
  ctx.model->set_adapter(nullptr);
  if (max_len[0] > 0 && max_len[1] > 0) {
    std::printf("max length LoRA / full fine-tuning: %.2fx\n", static_cast<double>(max_len[1]) / max_len[0]);
  }
  return {{"lora", plan.lora.ToJson()}, {"modes", modes}};
}

}  // namespace streambp::bench
