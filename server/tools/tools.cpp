#include "tools.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "streambp/context_parallel.h"
#include "streambp/data.h"
#include "streambp/dist.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/gradients.h"
#include "streambp/lora.h"
#include "streambp/memory.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "streambp/runtime.h"
#include "streambp/terminal_progress.h"
#include "streambp/tokenizer.h"
#include "streambp/trainer.h"

namespace streambp::tools {
namespace {

struct LoadedModel {
  CausalLM model{nullptr};
  std::shared_ptr<LoraAdapter> adapter;  // attached; the base frozen
  std::string description;

  // The gradients the run produces: the adapter's under its PEFT names (as in
  // adapter_model.safetensors), or every parameter's under its HF name.
  TensorMap gradients() const {
    if (!adapter) return CollectGradients(*model);
    TensorMap out;
    for (auto& [name, g] : CollectGradients(adapter->named_parameters())) out[LoraAdapter::PeftName(name)] = g;
    return out;
  }
  void zero_gradients() {
    ZeroGradients(*model);
    if (adapter) ZeroGradients(adapter->named_parameters());
  }
  // The tensors whose gradients the run produces (the adapter's, or the model's).
  std::vector<torch::Tensor> trained() const {
    if (!adapter) return model->parameters();
    std::vector<torch::Tensor> out;
    for (auto& [name, t] : adapter->named_parameters()) out.push_back(t);
    return out;
  }
};


LoadedModel Load(const ModelSource& src, const std::string& adapter_dir = "") {
  LoadedModel m;
  m.model = LoadOrInitModel(src);
  m.description = src.describe();
  if (!adapter_dir.empty()) {
    const auto dtype = ParseDtype(src.dtype);
    m.adapter = LoraAdapter::Load(adapter_dir, m.model->config(), dtype == torch::kFloat64 ? dtype : torch::kFloat32,
                                  torch::Device(src.device));
    for (auto& p : m.model->parameters()) p.requires_grad_(false);
    for (auto& [name, t] : m.adapter->named_parameters()) t.requires_grad_(true);
    m.model->set_adapter(m.adapter);
    m.description += " + LoRA adapter " + adapter_dir + " (r " + std::to_string(m.adapter->config().r) + ", " +
                     std::to_string(m.adapter->num_parameters()) + " parameters)";
  }
  return m;
}

std::string Describe(const LoadedModel& m, const std::string& dtype) {
  const auto& c = m.model->config();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s from %s: %lld layers, hidden %lld, heads %lld/%lld, head_dim %lld, vocab %lld%s, %s",
                c.architecture.c_str(), m.description.c_str(), (long long)c.num_hidden_layers,
                (long long)c.hidden_size, (long long)c.num_attention_heads,
                (long long)c.num_key_value_heads, (long long)c.head_dim, (long long)c.vocab_size,
                c.tie_word_embeddings ? ", tied embeddings" : "", dtype.c_str());
  return buf;
}

std::string FormatMetrics(const Metrics& metrics) {
  std::string out;
  char buf[128];
  for (const auto& [k, v] : metrics) {
    std::snprintf(buf, sizeof buf, "%s%s=%.6g", out.empty() ? "" : " ", k.c_str(), v);
    out += buf;
  }
  return out;
}

// A reproducible batch: `count` sequences of random tokens, the longest `seq_len`, the
// others shorter, each with a prompt part that is not trained on.
std::vector<Sequence> SyntheticSequences(const std::string& objective, int64_t count, int64_t seq_len,
                                         int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto random_tokens = [&](int64_t n) {
    auto ids = at::randint(0, vocab, {n}, gen, torch::kInt64);
    return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
  };
  std::vector<Sequence> out;
  if (IsPolicyLoss(objective) || objective == "cross_entropy" || objective == "weighted_logprobs") {
    // sft's sequences with per-token side inputs: sampler log-probs near the policy's (a
    // random model's are about -log V) and advantages of both signs; or weights.
    auto seqs = SyntheticSequences("sft", count, seq_len, vocab, seed);
    auto values = at::rand({static_cast<int64_t>(2 * seq_len)}, gen, torch::kFloat64);
    const double* u = values.data_ptr<double>();
    const double typical = -std::log(static_cast<double>(vocab));
    for (auto& s : seqs) {
      const size_t n = s.tokens.size();
      for (size_t t = 0; t < n; ++t) {
        const double a = u[t % static_cast<size_t>(seq_len)], b = u[seq_len + t % static_cast<size_t>(seq_len)];
        if (IsPolicyLoss(objective)) {
          s.sampler_logprobs.push_back(t == 0 ? 0.0 : typical + 0.6 * (a - 0.5));
          s.advantages.push_back(t == 0 ? 0.0 : 2.0 * b - 1.0);
        } else {
          s.token_weights.push_back(t == 0 ? 0.0 : 2.0 * b - 1.0);
        }
      }
    }
    return seqs;
  }
  if (objective == "sft") {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t n = std::max<int64_t>(2, seq_len - i * seq_len / (2 * std::max<int64_t>(count, 1)));
      Sequence s;
      s.tokens = random_tokens(n);
      s.loss_mask.assign(n, 1);
      for (int64_t t = 0; t < n / 4; ++t) s.loss_mask[t] = 0;
      out.push_back(std::move(s));
    }
    return out;
  }
  // dpo: `count` pairs; grpo: one group of max(count, 2) completions with spread rewards.
  // Prompts take a quarter of the length, completions vary.
  const int64_t prompt_len = std::max<int64_t>(1, seq_len / 4);
  const int64_t units = objective == "dpo" ? count : 1;
  const int64_t per_unit = objective == "dpo" ? 2 : std::max<int64_t>(count, 2);
  for (int64_t u = 0; u < units; ++u) {
    const auto prompt = random_tokens(prompt_len);
    for (int64_t k = 0; k < per_unit; ++k) {
      const int64_t n = std::max<int64_t>(1, seq_len - prompt_len - k * (seq_len - prompt_len) / (2 * per_unit));
      Sequence s;
      s.tokens = prompt;
      const auto completion = random_tokens(n);
      s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.resize(s.tokens.size(), 1);
      s.group = u;
      s.role = objective == "dpo" ? static_cast<int>(k) : 0;
      s.reward = static_cast<double>(k) / per_unit;
      out.push_back(std::move(s));
    }
  }
  return out;
}

// Objectives that compare with a reference (DPO; GRPO with beta > 0) get reference
// log-probs from the model itself, as it is before any training step.
// With an adapter the reference is the base with the adapter off.
// With a context-parallel `group`, split over its ranks as a step's reference pass is.
void FillReferenceFromModel(CausalLM& model, Objective& objective, std::vector<Sequence>& sequences,
                            Communicator* group = nullptr) {
  if (!objective.needs_reference(sequences)) return;
  auto batch = MakeBatch(sequences, Layout::kRightPad);
  ScopedAdapter base(*model, nullptr);
  const double temperature = objective.reference_temperature();
  auto logp = group ? ContextParallelTokenLogprobs(model, batch, 0, temperature, *group)
                    : TokenLogprobs(model, batch, 0, temperature);
  for (size_t i = 0; i < sequences.size(); ++i) {
    auto where = (batch.sequence_ids == static_cast<int64_t>(i)).nonzero();
    const int64_t row = where[0][0].item<int64_t>(), start = where[0][1].item<int64_t>();
    auto& s = sequences[i];
    s.ref_logprobs.assign(s.tokens.size(), 0.0);
    for (size_t t = 1; t < s.tokens.size(); ++t) s.ref_logprobs[t] = logp[row][start + t - 1].item<double>();
  }
  std::printf("reference log-probs: computed with the model itself (its weights before any step)\n");
}

}  // namespace

bool ToolGroups::writer() const { return world == nullptr || world->rank() == 0; }

ToolGroups ContextParallelGroups(int ranks, bool data_parallel) {
  if (ranks < 1) throw InvalidArgument("--context-parallel must be >= 1, got " + std::to_string(ranks));
  if (ranks == 1) return {};  // one process, whatever WORLD_SIZE an enclosing job exported
  const auto dist = DistOptions::FromEnv();
  const std::string p = std::to_string(ranks);
  if (dist.world_size % ranks != 0 || (!data_parallel && dist.world_size != ranks)) {
    throw InvalidArgument("--context-parallel " + p + " runs as " +
                          (data_parallel ? "D x " + p + " processes (D data-parallel groups of " + p + ")"
                                         : p + " processes") +
                          " with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; WORLD_SIZE is " +
                          std::to_string(dist.world_size));
  }
  ToolGroups g;
  if (!dist.enabled()) return g;
  g.world = Communicator::Create(dist);
  g.groups = SplitParallelGroups(g.world, ranks);
  return g;
}

std::unique_ptr<Objective> MakeObjective(const std::string& name, const std::string& options_json) {
  RegisterBuiltinObjectives();
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(options_json);
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidArgument("--objective-options is not valid JSON: " + std::string(e.what()));
  }
  if (!options.is_object()) throw InvalidArgument("--objective-options must be a JSON object");
  return CreateObjective(name, options);
}

int InitModel(const InitModelArgs& args) {
  auto config = PresetConfig(args.preset, args.family);
  std::vector<std::pair<std::string, std::string>> side_files;
  std::string around;
  if (!args.tokenizer.empty()) {
    // A model around a real tokenizer: its vocabulary (padded to a multiple of 64, as model
    // vocabularies usually are) and end tokens; its files travel into the model folder.
    const auto tokenizer = Tokenizer::FromDir(args.tokenizer);
    config.vocab_size = (tokenizer->vocab_size() + 63) / 64 * 64;
    config.bos_token_id = tokenizer->bos_token_id();
    const auto eos = tokenizer->eos_token_ids();
    config.eos_token_id = eos.empty() ? std::nullopt : std::optional<int64_t>(eos.front());
    config.eos_token_ids = eos;
    side_files = ReadModelSideFiles(args.tokenizer);
    around = ", tokenizer of " + args.tokenizer + " (" + std::to_string(tokenizer->vocab_size()) + " tokens)";
  }
  auto model = streambp::InitModel(config, args.seed, ParseDtype(args.dtype));
  SaveModel(model, args.out);
  WriteModelSideFiles(side_files, args.out);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  std::printf("wrote %s %s model (seed %llu, %lld parameters, %s%s) to %s\n", args.preset.c_str(),
              config.architecture.c_str(), (unsigned long long)args.seed, (long long)params, args.dtype.c_str(), around.c_str(), args.out.c_str());
  return 0;
}

int Grad(const GradArgs& args) {
  const auto parallel = ContextParallelGroups(args.context_parallel, /*data_parallel=*/true);
  Communicator* group = parallel.groups.context.get();
  const bool writer = parallel.writer();
  auto m = Load(args.model, args.adapter);
  auto objective = MakeObjective(args.objective, args.objective_options);
  auto sequences = ReadExamples(args.data, args.objective);
  ValidateSequences(sequences, m.model->config().vocab_size);
  FillReferenceFromModel(m.model, *objective, sequences, group);
  auto batch = MakeBatch(sequences, ParseLayout(args.layout));
  EngineOptions options{ParseEngine(args.engine), args.flags.chunk, args.flags.logits_chunk, false,
                        args.flags.key_chunk};
  options.keep_attention = args.flags.keep_attention;
  options.context_exchange = ParseContextExchange(args.flags.context_exchange);
  TerminalProgress line(args.engine);
  if (writer) options = line.wrap(options);
  auto t0 = std::chrono::steady_clock::now();
  ContextParallelStats cp;
  StepResult result;
  if (parallel.groups.data) {
    // Data parallel too: the Trainer gives each data rank its share of the sequences
    // (normalized as the whole step) and splits it over the rank's context group; the
    // gradients summed over both groups are the one-process gradient.
    TrainerOptions o;
    o.engine = options;
    o.layout = ParseLayout(args.layout);
    auto trainer = Trainer::Create(m.model, o, m.adapter);
    trainer->set_communicator(parallel.groups.data);
    if (group) trainer->set_context_parallel(parallel.groups.context);
    result = trainer->forward_backward(sequences, *objective);
    SumGradients(m.trained(), *parallel.groups.data);
    if (group) SumGradients(m.trained(), *group);
  } else if (group) {
    result = ContextParallelForwardBackward(m.model, batch, *objective, options, *group, &cp);
    SumGradients(m.trained(), *group);
    result.metrics = objective->finish_merged(MergeMetricsOver(*group));
  } else {
    result = ForwardBackward(m.model, batch, *objective, options);
    result.metrics = objective->finish();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!writer) return 0;
  auto grads = m.gradients();
  char loss[64];
  std::snprintf(loss, sizeof loss, "%.17g", result.loss);
  Metadata meta{{"loss", loss},
                {"targets", std::to_string(result.targets)},
                {"tokens", std::to_string(result.tokens)},
                {"objective", args.objective},
                {"engine", args.engine},
                {"dtype", args.model.dtype}};
  WriteSafetensors(args.out, grads, meta);
  // The sizes the step ran with: chunk / logits chunk / key tile, the unset ones from the model
  // and the sequence (docs/architecture.md: Chunk sizes), a context-parallel rank's for its
  // share of T. Data parallel: each rank resolves them for its own sequences, not said here.
  char sizes[96] = "";
  if (!parallel.groups.data) {
    const int64_t T = batch.length();
    const auto chunks = ResolveChunks(options, group ? ContextShardRange(T, 0, group->world_size()).second : T,
                                      m.model->config(), ParseDtype(args.model.dtype));
    std::snprintf(sizes, sizeof sizes, "chunks %lld/%lld/%lld, ", (long long)chunks.chunk,
                  (long long)chunks.logits_chunk, (long long)chunks.key_chunk);
  }
  std::printf("%s: loss %.10g over %lld target tokens (%s engine, %s%.3f s); %zu gradients written to %s\n",
              args.objective.c_str(), result.loss, (long long)result.targets, args.engine.c_str(), sizes, secs,
              grads.size(), args.out.c_str());
  if (!result.metrics.empty()) std::printf("metrics: %s\n", FormatMetrics(result.metrics).c_str());
  if (parallel.groups.data) {
    std::printf("data x context parallel: %d x %d ranks (each data rank's sequences split over its context ranks)\n",
                parallel.groups.data->world_size(), group ? group->world_size() : 1);
  } else if (group) {
    const auto [begin, end] = ContextShardRange(batch.length(), 0, group->world_size());
    const bool heads = ContextExchangesHeads(m.model->config(), group->world_size(), options.context_exchange);
    std::printf("context parallel: %d ranks (rank 0 holds positions [%lld, %lld) of %lld), %s; rank 0 sent per "
                "layer K/V %.3f MiB, dK/dV %.3f MiB, queries and outputs %.3f MiB; %.3f s in collectives on rank 0\n",
                group->world_size(), (long long)begin, (long long)end, (long long)batch.length(),
                heads ? "heads exchanged" : "K/V gathered",
                static_cast<double>(cp.kv_bytes) / static_cast<double>(cp.layers) / (1 << 20),
                static_cast<double>(cp.grad_kv_bytes) / static_cast<double>(cp.layers) / (1 << 20),
                static_cast<double>(cp.head_bytes) / static_cast<double>(cp.layers) / (1 << 20), cp.seconds);
  }
  return 0;
}

int Verify(const VerifyArgs& args) {
  const auto parallel = ContextParallelGroups(args.context_parallel, /*data_parallel=*/false);
  Communicator* group = parallel.groups.context.get();
  if (!parallel.writer() && std::freopen("/dev/null", "w", stdout) == nullptr) {
    throw Error(ErrorCode::kInternal, "stdout");
  }
  auto m = Load(args.model, args.adapter);
  const auto dtype = ParseDtype(args.model.dtype);
  const auto& config = m.model->config();
  std::vector<Sequence> sequences =
      args.data.empty()
          ? SyntheticSequences(args.objective, args.batch, args.seq_len, config.vocab_size, args.data_seed)
                        : ReadExamples(args.data, args.objective);
  ValidateSequences(sequences, config.vocab_size);
  FillReferenceFromModel(m.model, *MakeObjective(args.objective, args.objective_options), sequences);
  auto batch = MakeBatch(sequences, ParseLayout(args.layout));
  const int64_t T = batch.length();
  const double tolerance = args.tolerance > 0 ? args.tolerance : GradientTolerance(dtype);
  // Default stream chunks: several per sequence and not dividing it, so that chunking is
  // exercised (the defaults of training are larger).
  EngineFlags stream = args.flags;
  if (stream.chunk == 0) stream.chunk = std::max<int64_t>(1, (T + 3) / 4);
  if (stream.logits_chunk < 0) stream.logits_chunk = std::max<int64_t>(1, (T + 2) / 3);
  if (stream.key_chunk == 0) stream.key_chunk = std::max<int64_t>(1, (T + 4) / 5);

  std::printf("model:   %s\n", Describe(m, args.model.dtype).c_str());
  std::printf("batch:   %lld rows x %lld positions, %s layout, %lld tokens, %lld targets; objective %s\n",
              (long long)batch.rows(), (long long)T, args.layout.c_str(),
              (long long)(batch.sequence_ids >= 0).sum().item<int64_t>(), (long long)batch.num_targets(),
              args.objective.c_str());
  std::printf("runtime: %s\n\n", GetRuntimeInfo().describe().c_str());
  std::printf("%-11s %6s %7s %6s %22s %12s %12s %10s %9s\n", "engine", "chunk", "logits", "keys", "loss",
              "max|dg|", "max rel dg", "peak MiB", "time s");
  std::fflush(stdout);

  TensorMap reference;
  double reference_loss = 0;
  bool ok = true;
  // The rows: full (the reference), checkpoint, stream, and with --context-parallel P the
  // stream engine over P processes (every rank runs every row; the last one together).
  std::vector<EngineKind> rows{EngineKind::kFull, EngineKind::kCheckpoint, EngineKind::kStream};
  if (group) rows.push_back(EngineKind::kStream);
  for (size_t row = 0; row < rows.size(); ++row) {
    const auto kind = rows[row];
    const bool split = group && row == 3;
    EngineOptions options{kind, 0, -1};
    if (kind == EngineKind::kStream) options = {kind, stream.chunk, stream.logits_chunk, false, stream.key_chunk};
    // --keep-attention: the one-process stream row (context parallel refuses it).
    options.keep_attention = kind == EngineKind::kStream && !split && stream.keep_attention;
    options.context_exchange = ParseContextExchange(stream.context_exchange);
    // Split: each rank's engine resolves its chunks for its share of the positions.
    const auto chunks = ResolveChunks(options, split ? ContextShardRange(T, 0, group->world_size()).second : T,
                                      config, dtype);
    auto objective = MakeObjective(args.objective, args.objective_options);
    m.zero_gradients();
    memory::ResetPeak();
    const int64_t live_before = memory::LiveBytes();
    double secs = 0;
    StepResult result;
    {
      TerminalProgress line(EngineName(kind));
      auto t0 = std::chrono::steady_clock::now();
      if (split) {
        result = ContextParallelForwardBackward(m.model, batch, *objective, line.wrap(options), *group);
        SumGradients(m.trained(), *group);
      } else {
        result = ForwardBackward(m.model, batch, *objective, line.wrap(options));
      }
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    result.metrics = split ? objective->finish_merged(MergeMetricsOver(*group)) : objective->finish();
    const double peak_mib = (memory::PeakBytes() - live_before) / (1024.0 * 1024.0);
    auto grads = m.gradients();
    GradientDiff diff;
    if (kind == EngineKind::kFull) {
      reference = grads;
      reference_loss = result.loss;
    } else {
      diff = CompareGradients(reference, grads);
      const double loss_rel = std::abs(result.loss - reference_loss) / std::max(std::abs(reference_loss), 1e-300);
      if (!(diff.max_relative <= tolerance) || !(loss_rel <= tolerance)) ok = false;
    }
    char name[32];
    if (split) {
      std::snprintf(name, sizeof name, "stream cp%d", group->world_size());
    } else {
      std::snprintf(name, sizeof name, "%s%s", EngineName(kind).c_str(), options.keep_attention ? ":keep" : "");
    }
    std::printf("%-11s %6lld %7lld %6lld %22.15g %12.3e %12.3e %10.2f %9.3f\n", name,
                (long long)chunks.chunk, (long long)chunks.logits_chunk, (long long)chunks.key_chunk, result.loss,
                diff.max_abs,
                diff.max_relative, peak_mib, secs);
    if (kind != EngineKind::kFull && !(diff.max_relative <= tolerance)) {
      std::printf("            worst tensor: %s\n", diff.worst.c_str());
    }
    std::fflush(stdout);
  }
  m.zero_gradients();
  std::printf("\ntolerance (%s): %.1e relative to full -> %s\n", args.model.dtype.c_str(), tolerance,
              ok ? "PASS: all engines give the same loss and gradients" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace streambp::tools
