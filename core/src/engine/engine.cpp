// Engine dispatch and the parts the engines share: validation, the chunked lm_head + loss.
#include <algorithm>
#include <cmath>
#include <functional>

#include <ATen/record_function.h>

#include "../model/softmax_rows.h"
#include "../model/weight_gradients.h"
#include "engine_common.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/memory.h"
#include "streambp/top_logprobs.h"

namespace streambp {

EngineKind ParseEngine(const std::string& name) {
  if (name == "full") return EngineKind::kFull;
  if (name == "checkpoint") return EngineKind::kCheckpoint;
  if (name == "stream") return EngineKind::kStream;
  throw InvalidArgument("unknown engine '" + name + "' (known: full, checkpoint, stream)");
}

std::string EngineName(EngineKind kind) {
  switch (kind) {
    case EngineKind::kFull: return "full";
    case EngineKind::kCheckpoint: return "checkpoint";
    case EngineKind::kStream: return "stream";
  }
  return "?";
}

const char* PhaseName(EngineProgress::Phase phase) {
  switch (phase) {
    case EngineProgress::Phase::kForward: return "forward";
    case EngineProgress::Phase::kHead: return "head";
    case EngineProgress::Phase::kBackward: return "backward";
  }
  return "?";
}

namespace {

// The model's compute dtype (its weights') and device type.
torch::Dtype Dtype(const CausalLMImpl& model) { return model.embed_tokens->weight.scalar_type(); }
c10::DeviceType DeviceOf(const CausalLMImpl& model) { return model.embed_tokens->weight.device().type(); }

}  // namespace

namespace {

// LibTorch's autograd engine keeps the buffers of a backward that threw (an out-of-memory
// error halfway through the graph) in the calling thread's ready queue until that thread
// runs its next backward. Run a trivial one now, with the budget lifted for its 4 bytes,
// so that a failed step gives all its memory back at once.
void ReleaseFailedBackward() noexcept {
  try {
    memory::ScopedBudget unlimited(0);
    torch::AutoGradMode grad_mode(true);
    auto t = torch::zeros({1}, torch::TensorOptions().requires_grad(true));
    t.sum().backward();
  } catch (...) {
  }
}

// The batch on the model's device. Batches are built on the CPU (and validated there); the
// engines combine their tensors with the parameters', so they move once, here.
Batch OnModelDevice(const CausalLMImpl& model, const Batch& batch) {
  const auto device = model.embed_tokens->weight.device();
  return batch.input_ids.device() == device ? batch : batch.to(device);
}

StepResult RunEngine(CausalLMImpl& model, const Batch& batch, Objective& objective, const EngineOptions& options,
                     const ResolvedChunks& chunks, const engine::SequenceShard* shard) {
  switch (options.kind) {
    case EngineKind::kFull:
      return engine::FullForwardBackward(model, batch, objective, options.on_grads_ready, options.on_progress);
    case EngineKind::kCheckpoint:
      return engine::CheckpointForwardBackward(model, batch, objective, chunks, options.tiled_attention,
                                               options.on_grads_ready, options.on_progress);
    case EngineKind::kStream:
      return engine::StreamForwardBackward(model, batch, objective, chunks, options, options.on_grads_ready,
                                           options.on_progress, shard);
  }
  throw InvalidArgument("unknown engine");
}

}  // namespace

double RouterAuxCoefficient(const EngineOptions& options, const ModelConfig& c) {
  const double coef = options.router_aux_loss_coef;
  if (!(coef == -1 || (std::isfinite(coef) && coef >= 0))) {
    throw InvalidArgument("router_aux_loss_coef must be -1 (the model's) or a finite number >= 0, got " +
                          std::to_string(coef));
  }
  if (c.sparse_layers() == 0) return 0.0;
  return coef >= 0 ? coef : c.output_router_logits ? c.router_aux_loss_coef : 0.0;
}

namespace {

// What a step's block cache may keep: its estimated activation (docs/architecture.md:
// Measuring; the whole batch's, an upper bound for a context-parallel shard); unbounded (the
// cache's limit) where the estimate refuses the options (it models the engines' own options
// only; the step itself says what is wrong with options it cannot run).
int64_t CacheBound(const CausalLMImpl& model, const Batch& batch, const EngineOptions& options) {
  if (DeviceOf(model) != c10::DeviceType::CPU) return -1;  // the cache is the CPU allocator's
  try {
    return EstimateStepMemory(model.config(), Dtype(model), batch.rows(), batch.length(), options, "none")
        .activation_bytes;
  } catch (const InvalidArgument&) {
    return -1;
  }
}

}  // namespace

StepResult ForwardBackward(CausalLM& model, const Batch& batch, Objective& objective,
                           const EngineOptions& options) {
  return engine::ForwardBackwardShard(model, batch, objective, options, nullptr);
}

StepResult engine::ForwardBackwardShard(CausalLM& model, const Batch& batch, Objective& objective,
                                        const EngineOptions& options, const SequenceShard* shard) {
  engine::ValidateBatch(*model, batch);
  EngineOptions on_device = options;
  on_device.device = DeviceOf(*model);
  // A shard's chunks are of its own positions, the same on every rank of its group.
  const auto chunks = ResolveChunks(on_device, shard ? std::max(shard->longest, shard->length()) : batch.length(),
                                    model->config(), Dtype(*model));
  if (options.offload_layer_inputs && options.kind != EngineKind::kStream) {
    throw InvalidArgument("offload_layer_inputs needs the stream engine (engine " + EngineName(options.kind) + ")");
  }
  if (options.keep_attention && options.kind != EngineKind::kStream) {
    throw InvalidArgument("keep_attention needs the stream engine (engine " + EngineName(options.kind) + ")");
  }
  const auto& config = model->config();
  const double aux_coef = RouterAuxCoefficient(options, config);
  const int64_t tokens = aux_coef > 0 ? (batch.sequence_ids >= 0).sum().item<int64_t>() : 0;
  if (options.aux_loss_step_tokens != 0 && options.aux_loss_step_tokens < tokens) {
    throw InvalidArgument("aux_loss_step_tokens (" + std::to_string(options.aux_loss_step_tokens) +
                          ") must be 0 or at least the batch's " + std::to_string(tokens) + " tokens");
  }
  try {
    // The step's freed blocks are reused within it, then freed; it keeps no more than its
    // estimated activation (all a step can reuse; blocks of sizes that do not come back, e.g.
    // a growing key prefix's, would otherwise stay until the limit).
    memory::ScopedCache cache(CacheBound(*model, batch, on_device));
    const Batch on_model = OnModelDevice(*model, batch);
    RoutingReplay replay{on_model.routed_experts};
    // The load-balancing loss: its statistics come from the engine's first forward, which
    // ends where the head (or the backward) begins.
    RouterAuxLoss aux;
    const double L = static_cast<double>(config.sparse_layers()), E = static_cast<double>(config.num_experts);
    const double N = static_cast<double>(tokens);
    const double step_tokens = options.aux_loss_step_tokens > 0 ? static_cast<double>(options.aux_loss_step_tokens) : N;
    if (aux_coef > 0) {
      const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(on_model.input_ids.device());
      aux.valid = on_model.sequence_ids.ge(0);
      aux.scale = aux_coef * E / (L * L * N * step_tokens);
      aux.counts = torch::zeros({config.num_experts}, f64);
      aux.probs = torch::zeros({config.num_experts}, f64);
      on_device.on_progress = [&aux, user = options.on_progress](const EngineProgress& p) {
        if (p.phase != EngineProgress::Phase::kForward) aux.collecting = false;
        if (user) user(p);
      };
    }
    ScopedRoutingReplay routing(*model, &replay, aux_coef > 0 ? &aux : nullptr);
    auto result = RunEngine(*model, on_model, objective, on_device, chunks, shard);
    result.routing_decisions = replay.decisions();
    result.routing_mismatches = replay.mismatches();
    if (aux_coef > 0) {
      // A context-parallel step's statistics are the whole step's on every rank (the engine
      // sums them after its forward): the first shard's loss carries the term.
      result.router_aux_loss = E * (aux.counts * aux.probs).sum().item<double>() / (L * L * N * step_tokens);
      if (shard == nullptr || shard->begin == 0) result.loss += aux_coef * result.router_aux_loss;
    }
    return result;
  } catch (...) {
    ReleaseFailedBackward();
    throw;
  }
}

namespace {

// Final hidden states of the batch without a graph, computed the StreamBP way (K/V once
// per layer, queries chunk by chunk) so no T x T scores exist.
torch::Tensor HiddenStates(CausalLMImpl& m, const Batch& batch) {
  torch::NoGradGuard no_grad;
  const auto chunks = DefaultChunks(m.config(), Dtype(m), batch.length(), DeviceOf(m));
  auto x = m.embed(batch.input_ids);
  auto rope = m.rope_tables(batch.position_ids, x);
  for (size_t i = 0; i < m.layer_list.size(); ++i) {
    x = engine::StreamLayerForward(*m.layer_list[i], x, rope, batch, chunks.chunk, chunks.key_chunk,
                                   m.config().window(static_cast<int64_t>(i)));
  }
  return x;
}

}  // namespace

StepResult ForwardOnly(CausalLM& model, const Batch& cpu_batch, Objective& objective, int64_t logits_chunk) {
  engine::ValidateBatch(*model, cpu_batch);
  const Batch batch = OnModelDevice(*model, cpu_batch);
  RoutingReplay replay{batch.routed_experts};
  ScopedRoutingReplay routing(*model, &replay);
  torch::NoGradGuard no_grad;
  objective.begin(batch);
  auto h = HiddenStates(*model, batch);
  const int64_t chunk =
      logits_chunk > 0 ? logits_chunk
                       : DefaultChunks(model->config(), Dtype(*model), batch.length(), DeviceOf(*model)).logits_chunk;
  auto head = engine::HeadForwardBackward(*model, h, batch, objective, std::clamp<int64_t>(chunk, 1, batch.length()),
                                          false);
  return engine::MakeResult(objective, batch, head.loss);
}

std::vector<std::vector<int32_t>> RecordRouting(CausalLM& model, const Batch& cpu_batch) {
  engine::ValidateBatch(*model, cpu_batch);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(cpu_batch.num_sequences));
  const auto& c = model->config();
  const int64_t width = c.sparse_layers() * c.num_experts_per_tok;
  if (width == 0) return out;
  Batch batch = OnModelDevice(*model, cpu_batch);
  batch.routed_experts = torch::Tensor();  // the routers' own choices, not a replay
  RoutingReplay recording{torch::full({batch.rows(), batch.length(), width}, -1,
                                      torch::TensorOptions().dtype(torch::kInt64).device(batch.input_ids.device())),
                          /*record=*/true};
  {
    ScopedRoutingReplay routing(*model, &recording);
    HiddenStates(*model, batch);
  }
  const auto experts_cpu = recording.experts.cpu();
  const auto experts = experts_cpu.accessor<int64_t, 3>();
  const auto seq = cpu_batch.sequence_ids.accessor<int64_t, 2>();
  const auto pos = cpu_batch.position_ids.accessor<int64_t, 2>();
  for (size_t i = 0; i < out.size(); ++i) out[i].resize(static_cast<size_t>(cpu_batch.lengths[i] * width));
  for (int64_t r = 0; r < cpu_batch.rows(); ++r) {
    for (int64_t t = 0; t < cpu_batch.length(); ++t) {
      if (seq[r][t] < 0) continue;
      auto& dest = out[static_cast<size_t>(seq[r][t])];
      for (int64_t w = 0; w < width; ++w) {
        dest[static_cast<size_t>(pos[r][t] * width + w)] = static_cast<int32_t>(experts[r][t][w]);
      }
    }
  }
  return out;
}

namespace {

// The logits of every chunk of positions (no gradients, divided by `temperature`), handed to
// fn(start, end, logits [B, end - start, V]).
void ForEachLogitsChunk(CausalLM& model, const Batch& batch, int64_t logits_chunk, double temperature,
                        const std::function<void(int64_t, int64_t, const torch::Tensor&)>& fn) {
  if (!(temperature > 0)) throw InvalidArgument("temperature must be > 0");
  RoutingReplay replay{batch.routed_experts};
  ScopedRoutingReplay routing(*model, &replay);
  torch::NoGradGuard no_grad;
  auto h = HiddenStates(*model, batch);
  const int64_t T = batch.length();
  const int64_t chunk = std::clamp<int64_t>(
      logits_chunk > 0 ? logits_chunk : DefaultChunks(model->config(), Dtype(*model), T, DeviceOf(*model)).logits_chunk,
      1, T);
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    auto logits = model->logits(h.slice(1, s, e));
    if (temperature != 1.0) logits = logits / temperature;
    fn(s, e, logits);
  }
}

// Position t has a next token of its own sequence: t + 1 in the same sequence. [B, T] bool.
torch::Tensor HasNextToken(const Batch& batch) {
  const int64_t T = batch.length();
  auto seq = batch.sequence_ids.cpu();
  auto valid = torch::zeros({batch.rows(), T}, torch::kBool);
  if (T > 1) {
    valid.slice(1, 0, T - 1).copy_((seq.slice(1, 0, T - 1) == seq.slice(1, 1, T)) & (seq.slice(1, 0, T - 1) >= 0));
  }
  return valid;
}

}  // namespace

torch::Tensor TokenLogprobs(CausalLM& model, const Batch& cpu_batch, int64_t logits_chunk, double temperature) {
  engine::ValidateBatch(*model, cpu_batch);
  const Batch batch = OnModelDevice(*model, cpu_batch);
  auto out = torch::zeros({batch.rows(), batch.length()}, torch::kFloat64);
  ForEachLogitsChunk(model, batch, logits_chunk, temperature, [&](int64_t s, int64_t e, const torch::Tensor& logits) {
    auto logp = TargetLogprobs(logits, batch.targets.slice(1, s, e));
    out.slice(1, s, e).copy_(logp.to(torch::kFloat64).cpu());
  });
  return out.masked_fill_(HasNextToken(batch).logical_not(), 0.0);
}

TopLogprobs TopKLogprobs(CausalLM& model, const Batch& cpu_batch, int64_t k, int64_t logits_chunk,
                         double temperature) {
  engine::ValidateBatch(*model, cpu_batch);
  const int64_t vocab = model->config().vocab_size;
  if (k < 1 || k > vocab) throw InvalidArgument("top_k must be in [1, " + std::to_string(vocab) + "]");
  const Batch batch = OnModelDevice(*model, cpu_batch);
  TopLogprobs out;
  out.ids = torch::zeros({batch.rows(), batch.length(), k}, torch::kInt64);
  out.logprobs = torch::zeros({batch.rows(), batch.length(), k}, torch::kFloat64);
  ForEachLogitsChunk(model, batch, logits_chunk, temperature, [&](int64_t s, int64_t e, const torch::Tensor& logits) {
    const auto logp = logits.to(torch::kFloat64).log_softmax(-1);
    const auto [values, ids] = logp.topk(k, -1, /*largest=*/true, /*sorted=*/true);
    out.ids.slice(1, s, e).copy_(ids.cpu());
    out.logprobs.slice(1, s, e).copy_(values.cpu());
  });
  const auto none = HasNextToken(batch).logical_not().unsqueeze(-1);
  out.ids.masked_fill_(none, -1);
  out.logprobs.masked_fill_(none, 0.0);
  return out;
}

torch::Tensor TopKTargetLogprobs(CausalLM& model, const Batch& cpu_batch, int64_t logits_chunk, double temperature) {
  engine::ValidateBatch(*model, cpu_batch);
  if (!cpu_batch.top_k_targets.defined()) throw InvalidArgument("the batch has no 2-D (top-k) targets");
  const Batch batch = OnModelDevice(*model, cpu_batch);
  auto out = torch::zeros(batch.top_k_targets.sizes(), torch::kFloat64);
  ForEachLogitsChunk(model, batch, logits_chunk, temperature, [&](int64_t s, int64_t e, const torch::Tensor& logits) {
    auto logp = logits.gather(-1, batch.top_k_targets.slice(1, s, e)) - logits.logsumexp(-1, /*keepdim=*/true);
    out.slice(1, s, e).copy_(logp.to(torch::kFloat64).cpu());
  });
  return out.masked_fill_(HasNextToken(batch).logical_not().unsqueeze(-1), 0.0);
}

namespace engine {

torch::Tensor ShardTokenLogprobs(CausalLM& model, const Batch& cpu_batch, int64_t logits_chunk, double temperature,
                                 const SequenceShard& shard) {
  if (!(temperature > 0)) throw InvalidArgument("temperature must be > 0");
  ValidateBatch(*model, cpu_batch);
  const Batch batch = OnModelDevice(*model, cpu_batch);
  RoutingReplay replay{batch.routed_experts};  // read at the rows' own positions (the layers know them)
  ScopedRoutingReplay routing(*model, &replay);
  torch::NoGradGuard no_grad;
  const int64_t begin = shard.begin, T = shard.length();
  const auto chunks =
      DefaultChunks(model->config(), Dtype(*model), std::max(shard.longest, T), DeviceOf(*model));
  const auto ids = batch.input_ids.slice(1, begin, begin + T);
  auto x = model->embed(ids);
  const auto rope = model->rope_tables(batch.position_ids.slice(1, begin, begin + T), x);
  for (size_t i = 0; i < model->layer_list.size(); ++i) {
    x = StreamLayerForward(*model->layer_list[i], x, rope, batch, chunks.chunk, chunks.key_chunk,
                           model->config().window(static_cast<int64_t>(i)), &shard);
  }
  auto out = torch::zeros({batch.rows(), batch.length()}, torch::kFloat64);
  const int64_t chunk = std::clamp<int64_t>(logits_chunk > 0 ? logits_chunk : chunks.logits_chunk, 1, T);
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t e = std::min(T, s + chunk);
    auto logits = model->logits(x.slice(1, s, e));
    if (temperature != 1.0) logits = logits / temperature;
    auto logp = TargetLogprobs(logits, batch.targets.slice(1, begin + s, begin + e));
    out.slice(1, begin + s, begin + e).copy_(logp.to(torch::kFloat64).cpu());
  }
  return out.masked_fill_(HasNextToken(batch).logical_not(), 0.0);
}

void ValidateBatch(const CausalLMImpl& model, const Batch& batch) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2 || batch.input_ids.numel() == 0) {
    throw InvalidArgument("batch is empty: input_ids must be a non-empty [rows, length] tensor");
  }
  const auto sizes = batch.input_ids.sizes();
  for (const auto* t : {&batch.position_ids, &batch.sequence_ids, &batch.targets, &batch.target_mask}) {
    if (!t->defined() || t->sizes() != sizes) {
      throw InvalidArgument("batch: position_ids, sequence_ids, targets and target_mask must all "
                            "have the shape of input_ids");
    }
  }
  const int64_t vocab = model.config().vocab_size;
  const int64_t lo = batch.input_ids.min().item<int64_t>();
  const int64_t hi = batch.input_ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    throw InvalidArgument("batch: token id " + std::to_string(lo < 0 ? lo : hi) +
                          " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  ValidateRouting(model.config(), batch);
}

void ValidateRouting(const ModelConfig& c, const Batch& batch) {
  const auto& r = batch.routed_experts;
  if (!r.defined()) return;
  const int64_t k = c.num_experts_per_tok, layers = c.sparse_layers();
  if (layers == 0) {
    throw InvalidArgument("routed_experts: given, but this model has no mixture-of-experts layers to route");
  }
  if (r.dim() != 3 || r.size(0) != batch.rows() || r.size(1) != batch.length() || r.size(2) != layers * k) {
    throw InvalidArgument("routed_experts: " + std::to_string(r.dim() == 3 ? r.size(2) : -1) +
                          " entries per token, but this model routes each token to " + std::to_string(k) +
                          " experts (num_experts_per_tok) in each of " + std::to_string(layers) +
                          " sparse layers: give tokens x " + std::to_string(layers * k) + " ids");
  }
  const auto ids = r.view({r.size(0), r.size(1), layers, k});
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < -1 || hi >= c.num_experts) {
    throw InvalidArgument("routed_experts: expert id " + std::to_string(lo < -1 ? lo : hi) + " is outside [0, " +
                          std::to_string(c.num_experts) + ") (num_experts)");
  }
  const auto none = ids.lt(0);
  if ((none.any(-1) & none.all(-1).logical_not()).any().item<bool>()) {
    throw InvalidArgument("routed_experts: a token's " + std::to_string(k) +
                          " experts in a layer are either all given or all -1 (the router's choice)");
  }
  const auto sorted = std::get<0>(ids.sort(-1));
  if (k > 1 && (sorted.slice(-1, 1, k).eq(sorted.slice(-1, 0, k - 1)) & sorted.slice(-1, 1, k).ge(0)).any().item<bool>()) {
    throw InvalidArgument("routed_experts: a token names the same expert twice in one layer's top-" +
                          std::to_string(k));
  }
}

StepResult MakeResult(const Objective& objective, const Batch& batch, double chunk_loss_sum) {
  StepResult r;
  r.loss = objective.batch_loss().value_or(chunk_loss_sum);
  r.targets = batch.num_targets();
  r.tokens = (batch.sequence_ids >= 0).sum().item<int64_t>();
  return r;
}

LogitsChunk MakeChunk(const Batch& batch, torch::Tensor logits, int64_t s, int64_t e) {
  LogitsChunk c;
  c.logits = std::move(logits);
  c.start = s;
  c.end = e;
  c.targets = batch.targets.slice(1, s, e);
  c.target_mask = batch.target_mask.slice(1, s, e);
  c.sequence_ids = batch.sequence_ids.slice(1, s, e);
  return c;
}

HeadResult HeadForwardBackward(CausalLMImpl& model, const torch::Tensor& h_last, const Batch& batch,
                               Objective& objective, int64_t chunk, bool want_grad, const Progress& progress) {
  auto store = LayerStore::OnDevice(1);
  store->put(0, h_last);
  return HeadForwardBackward(model, *store, 0, batch, objective, chunk, want_grad, progress, {});
}

HeadResult HeadForwardBackward(CausalLMImpl& model, LayerStore& store, int64_t slot, const Batch& batch,
                               Objective& objective, int64_t chunk, bool want_grad, const Progress& progress,
                               ChunkReader::Next then, const SequenceShard* shard) {
  RECORD_USER_SCOPE("streambp::head");
  // Rows of the store are positions offset + t of the batch.
  const int64_t offset = shard ? shard->begin : 0;
  const int64_t T = shard ? shard->length() : batch.length();
  const int64_t chunks = (T + chunk - 1) / chunk;
  const int64_t layers = static_cast<int64_t>(model.layer_list.size());
  ChunkReader reader(store, slot, T, chunk, objective.needs_sequence_pass() ? 2 : 1, then);
  int64_t s = 0, e = 0;
  if (objective.needs_sequence_pass()) {
    torch::NoGradGuard no_grad;
    for (int64_t c = 0; c < chunks; ++c) {
      auto h = reader.next(&s, &e);
      objective.observe(MakeChunk(batch, model.logits(h), offset + s, offset + e));
    }
    if (shard) {  // every rank's chunks: the sums are the whole step's on every rank
      auto sums = objective.sequence_pass_sums();
      if (sums.empty()) {  // the same objective on every rank: all refuse here, none waits
        throw InvalidArgument("objective '" + objective.name() +
                              "' has a sequence pass but does not give its sums (Objective::sequence_pass_sums): "
                              "it cannot run context parallel");
      }
      shard->all_reduce(sums);
    }
    objective.end_sequence_pass();
  }
  HeadResult result;
  HeadSteps steps(model, batch, objective, want_grad);
  // On the device, dL/dh_last takes h_last's place chunk by chunk: a chunk's rows are not
  // read again once its gradient is known (the sequence pass is over by then).
  if (want_grad && store.on_device()) result.grad_h = store.read(slot, 0, T);
  for (int64_t c = 0; c < chunks; ++c) {
    auto rows = reader.next(&s, &e);
    Report(progress, EngineProgress::Phase::kHead, layers, layers, c, chunks);
    auto grad = steps.step(rows, offset + s, offset + e);
    if (!want_grad) continue;
    if (!result.grad_h.defined()) result.grad_h = torch::empty({rows.size(0), T, rows.size(2)}, rows.options());
    result.grad_h.slice(1, s, e).copy_(grad);
  }
  result.loss = steps.loss();
  return result;
}

HeadSteps::HeadSteps(CausalLMImpl& model, const Batch& batch, Objective& objective, bool want_grad)
    : model_(model), batch_(batch), objective_(objective), want_grad_(want_grad) {
  // lm_head's weight gradient is added in place chunk by chunk (autograd would make a fresh
  // [V, d] tensor for every chunk: 1 GiB for a 128k vocabulary at d=4096 in bfloat16).
  head_trains_ = want_grad && model.lm_head_weight().requires_grad();
  if (head_trains_) head_grad_ = GradientOf(model.lm_head_weight());
}

torch::Tensor HeadSteps::step(const torch::Tensor& rows, int64_t s, int64_t e) {
  RECORD_USER_SCOPE("streambp::head");
  if (!want_grad_) {
    torch::NoGradGuard no_grad;
    add_loss(objective_.chunk_loss(MakeChunk(batch_, model_.logits(rows), s, e)));
    return {};
  }
  auto h = rows.detach().requires_grad_(true);
  torch::Tensor loss, normed, projected_grad;
  {
    torch::AutoGradMode grad(true);
    torch::Tensor projected;
    auto logits = head_trains_ ? model_.logits_outside_head(h, &normed, &projected) : model_.logits(h);
    // The product's gradient as autograd passes it on (retain_grad would keep a copy: one
    // more B x c x V tensor at the head's peak); the logits themselves are freed once the
    // loss's backward has read them, since nothing here holds them.
    if (head_trains_) projected.register_hook([&projected_grad](const torch::Tensor& g) { projected_grad = g; });
    loss = objective_.chunk_loss(MakeChunk(batch_, logits, s, e));
  }
  add_loss(loss);
  loss.backward();
  loss = torch::Tensor();
  if (head_trains_) {  // W.grad += dP^T N: no [V, d] gradient of the chunk exists on its own
    const int64_t V = projected_grad.size(-1), d = normed.size(-1);
    head_grad_.addmm_(projected_grad.reshape({-1, V}).t(), normed.detach().reshape({-1, d}));
  }
  return h.grad();  // the chunk's graph (which saved its rows) is gone: they may be overwritten
}

void HeadSteps::add_loss(const torch::Tensor& loss) {
  // The chunks' losses summed in float64 where they are, read once at the end: a read per
  // chunk would make the host wait for the device at every chunk.
  auto l = loss.detach().to(torch::kFloat64);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l;
}

double HeadSteps::loss() const { return loss_sum_.defined() ? loss_sum_.item<double>() : 0.0; }

}  // namespace engine
}  // namespace streambp
