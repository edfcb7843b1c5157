// streambp-bench --sample-prompts P: what sampling costs next to training. One Sample of P
// prompts x n completions (KV cache, batched decode) timed end to end, its generated tokens/s
// and peak tracked bytes, next to the forward-backward (stream engine, SFT) of the same
// prompt + completion sequences: how much step time a rollout of that size displaces.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bench.h"
#include "streambp/engine.h"
#include "streambp/gradients.h"
#include "streambp/memory.h"
#include "streambp/objective.h"
#include "streambp/sampler.h"

namespace streambp::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

nlohmann::json RunSampleBench(const SampleBenchPlan& plan) {
  auto& model = *plan.model;
  const int64_t vocab = model->config().vocab_size;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(plan.seed);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t p = 0; p < plan.prompts; ++p) {
    auto ids = at::randint(0, vocab, {plan.prompt_len}, gen, torch::kInt64);
    prompts.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + plan.prompt_len);
  }
  SampleOptions options;
  options.n = plan.n;
  options.max_tokens = plan.max_tokens;
  options.temperature = 1.0;
  options.seed = plan.seed;  // no stop tokens: every completion runs to max_tokens
  const int64_t rows = plan.prompts * plan.n;
  std::printf("sample: %lld prompts x n=%lld (%lld rows), prompt %lld tokens, %lld new tokens each\n",
              (long long)plan.prompts, (long long)plan.n, (long long)rows, (long long)plan.prompt_len,
              (long long)plan.max_tokens);

  memory::ResetPeak();
  const int64_t before = memory::LiveBytes();
  torch::NoGradGuard no_grad;
  auto t0 = Clock::now();
  const auto completions = SampleCompletions(model, prompts, options);
  const double sample_s = Since(t0);
  const int64_t sample_peak = memory::PeakBytes() - before;
  int64_t generated = 0;
  for (const auto& c : completions) generated += static_cast<int64_t>(c.tokens.size());
  std::printf("  Sample: %.2f s, %lld tokens generated (%.1f tokens/s), %.1f MiB peak above the model\n", sample_s,
              (long long)generated, generated / sample_s, sample_peak / (1024.0 * 1024.0));

  // The training step the rollout feeds: the same sequences, one forward-backward.
  std::vector<Sequence> sequences;
  for (const auto& c : completions) {
    Sequence s;
    s.tokens = prompts[static_cast<size_t>(c.prompt_index)];
    s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
    sequences.push_back(std::move(s));
  }
  auto batch = MakeBatch(sequences, Layout::kRightPad);
  auto objective = CreateObjective("sft", nlohmann::json::object());
  EngineOptions engine;
  engine.kind = EngineKind::kStream;
  double step_s = 0;
  {
    torch::AutoGradMode grad(true);
    t0 = Clock::now();
    ForwardBackward(model, batch, *objective, engine);
    objective->finish();
    step_s = Since(t0);
    ZeroGradients(*model);
  }
  const int64_t tokens = batch.rows() * batch.length();
  std::printf("  forward-backward of the same %lld sequences (%lld tokens, stream): %.2f s; the Sample costs "
              "%.2fx the step it feeds\n",
              (long long)rows, (long long)tokens, step_s, sample_s / step_s);
  return {{"prompts", plan.prompts},
          {"n", plan.n},
          {"prompt_len", plan.prompt_len},
          {"max_tokens", plan.max_tokens},
          {"sample_seconds", sample_s},
          {"generated_tokens", generated},
          {"tokens_per_second", generated / sample_s},
          {"sample_peak_bytes", sample_peak},
          {"step_seconds", step_s},
          {"step_tokens", tokens},
          {"sample_over_step", sample_s / step_s}};
}

}  // namespace streambp::bench
