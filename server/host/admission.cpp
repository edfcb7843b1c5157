#include "admission.h"

#include <algorithm>
#include <cmath>

#include "streambp/error.h"
#include "streambp/estimate.h"

namespace streambp::server {
namespace {

std::string MiB(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

int64_t Longest(const std::vector<Sequence>& sequences) {
  int64_t longest = 1;
  for (const auto& s : sequences) longest = std::max<int64_t>(longest, s.tokens.size());
  return longest;
}

// Context parallel with a reference model: its log-probs run before the step, split over the
// ranks too (ContextParallelTokenLogprobs); that forward may be a rank's larger peak.
void AddReferenceForward(MemoryEstimate& estimate, const ServerConfig& config, const ModelConfig& model,
                         torch::Dtype dtype, int64_t rows, int64_t seq_len, int64_t logits_chunk) {
  if (config.parallel.context_parallel <= 1 || !config.trainer.reference.use_reference_model) return;
  const auto reference = EstimateForwardMemory(model, dtype, rows, seq_len, logits_chunk, config.trainer.engine.device,
                                               config.parallel.context_parallel);
  estimate.activation_bytes = std::max(estimate.activation_bytes, reference.activation_bytes);
}

}  // namespace

Admission::Admission(const ServerConfig& config, const ModelConfig& model, torch::Dtype dtype)
    : config_(config), plan_options_(config.trainer), model_(model), dtype_(dtype) {
  plan_options_.max_sequence_length = config.limits.max_sequence_length;  // as Replica sets it
  // Sessions use the base with the adapter off as their reference (no copy); a server without
  // them keeps a frozen copy of the weights (Trainer: reference model) for its whole life.
  weights_bytes_ = EstimateForwardMemory(model, dtype, 1, 1, 1, config.trainer.engine.device).weights_bytes;
  if (config.trainer.reference.use_reference_model && !config.sessions.enabled) reference_bytes_ = weights_bytes_;
}

EngineOptions Admission::resolve_engine(const EngineRequest& r) const {
  EngineOptions o = config_.trainer.engine;
  if (!r.engine.empty()) {
    try {
      o.kind = ParseEngine(r.engine);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("engine.engine: ") + e.what());
    }
  }
  auto size = [](int64_t value, int64_t floor, const char* field, const char* limit) {
    if (value < 0) throw InvalidArgument(std::string("engine.") + field + " must be >= 0 (0 = the server's default)");
    if (value > 0 && value < floor) {
      throw InvalidArgument(std::string("engine.") + field + " = " + std::to_string(value) +
                            " is below the server's floor " + std::to_string(floor) + " (limits." + limit +
                            "); use 0 for the server's default");
    }
  };
  size(r.chunk, config_.limits.min_chunk, "chunk", "min_chunk");
  size(r.logits_chunk, config_.limits.min_logits_chunk, "logits_chunk", "min_logits_chunk");
  size(r.key_chunk, config_.limits.min_key_chunk, "key_chunk", "min_key_chunk");
  if (r.chunk > 0) o.chunk = r.chunk;
  if (r.logits_chunk > 0) o.logits_chunk = r.logits_chunk;
  if (r.key_chunk > 0) o.key_chunk = r.key_chunk;
  // trainer.engine.keep_attention is the stream engine's; a request for another engine runs
  // that engine as it is.
  if (o.kind != EngineKind::kStream) o.keep_attention = false;
  if (config_.parallel.context_parallel > 1 && o.kind != EngineKind::kStream) {
    throw InvalidArgument("engine.engine: this server is context parallel (parallel.context_parallel " +
                          std::to_string(config_.parallel.context_parallel) +
                          "), which runs the stream engine only; leave engine.engine empty or name stream");
  }
  if (r.router_aux_loss_coef) {
    const double coef = *r.router_aux_loss_coef;
    if (!(std::isfinite(coef) && coef >= 0)) {
      throw InvalidArgument("engine.router_aux_loss_coef must be a finite number >= 0 (0 = off), got " +
                            std::to_string(coef));
    }
    o.router_aux_loss_coef = coef;
  }
  return o;
}

int64_t Admission::rows_of(int64_t longest, int64_t tokens) const {
  longest = std::max<int64_t>(longest, 1);
  const int64_t mb = config_.trainer.micro_batch_tokens > 0 ? config_.trainer.micro_batch_tokens : tokens;
  return std::max<int64_t>(1, (std::min(mb, tokens) + longest - 1) / longest);
}

void Admission::check_budget(const MemoryEstimate& est, int64_t resident_bytes, const std::string& what,
                             const std::string& advice) const {
  const int64_t budget = config_.limits.memory_budget_bytes;
  const int64_t total = est.total() + resident_bytes + reference_bytes_;
  if (budget <= 0 || total <= budget) return;
  if (on_refusal) on_refusal("estimate");
  throw ResourceExhausted(what + " is estimated at " + std::to_string(total) + " bytes (" + MiB(total) +
                          "; activations " + MiB(est.activation_bytes) +
                          (resident_bytes > 0 ? "; resident beside it (other sessions; for a full session, the shared base and its "
                                                    "reference) " + MiB(resident_bytes)
                                                  : std::string()) +
                          (reference_bytes_ > 0 ? "; the reference model " + MiB(reference_bytes_) : std::string()) +
                          ") but the memory budget is " + std::to_string(budget) +
                          " bytes (limits.memory_budget_bytes); " + advice);
}

StepPlan Admission::admit_step(const std::vector<Sequence>& sequences, bool chunks_given, EngineOptions* engine,
                               const LoraConfig* lora, int64_t resident_bytes) const {
  auto plan = PlanStep(sequences, model_.vocab_size, plan_options_);
  const int64_t longest = plan.longest;
  const int64_t rows = rows_of(longest, plan.tokens);
  const int64_t P = config_.parallel.context_parallel;
  if (P > 1) {
    // Each micro-batch is split over the ranks and must have at least P positions: refused
    // here rather than by every rank partway through the step (which would throw away the
    // gradients accumulated before it). A micro-batch's length is at least its longest
    // sequence's.
    for (const auto& part : plan.micro_batches) {
      int64_t part_longest = 0;
      for (size_t i : part) part_longest = std::max<int64_t>(part_longest, sequences[i].tokens.size());
      if (part_longest < P) {
        throw InvalidArgument("context parallel over " + std::to_string(P) + " ranks needs every micro-batch to have "
                              "at least " + std::to_string(P) + " positions; sequence " + std::to_string(part.front()) +
                              (part.size() > 1 ? " and the others of its micro-batch have " : " has ") +
                              std::to_string(part_longest) + " tokens at most: send longer sequences or batch them with "
                              "longer ones (trainer.micro_batch_tokens)");
      }
    }
  }
  // 2-D (top-k) targets: the batch's [rows, longest, K] candidate ids and weights (8 bytes
  // each, K the batch's largest), and as much again for their gathered log-probs and
  // gradients. Held for the whole step, beside the engine's activations.
  const int64_t top_k_bytes = rows * longest * plan.top_k * 8 * 4;
  if (config_.limits.auto_chunks && engine->kind == EngineKind::kStream && !chunks_given) {
    // The largest chunks whose estimated peak fits the memory budget.
    auto chosen = ChooseChunks(model_, dtype_, rows, longest,
                               config_.limits.memory_budget_bytes - resident_bytes - reference_bytes_ - top_k_bytes,
                               config_.trainer.optimizer.name, lora, *engine, P);
    engine->chunk = chosen.chunk;
    engine->logits_chunk = chosen.logits_chunk;
    engine->key_chunk = chosen.key_chunk;
    engine->keep_attention = chosen.keep_attention;  // dropped where it cannot fit
  }
  auto estimate = EstimateStepMemory(model_, dtype_, rows, longest, *engine, config_.trainer.optimizer.name, lora, P);
  AddReferenceForward(estimate, config_, model_, dtype_, rows, longest, engine->logits_chunk);
  estimate.activation_bytes += top_k_bytes;
  check_budget(estimate, resident_bytes,
               P > 1 ? "the step (per rank, context parallel over " + std::to_string(P) + ")" : "the step",
               "use the stream engine, smaller chunks, smaller micro-batches (trainer.micro_batch_tokens) or shorter "
               "sequences");
  return plan;
}

void Admission::admit_sample(const SampleRequest& r, int64_t resident_bytes) const {
  const auto& l = config_.limits;
  const int64_t prompts = static_cast<int64_t>(r.prompts.size());
  const int64_t rows = prompts * r.options.n;
  if (rows > l.max_sample_rows) {
    throw ResourceExhausted("prompts x n = " + std::to_string(prompts) + " x " + std::to_string(r.options.n) + " = " +
                            std::to_string(rows) + " completions exceed limits.max_sample_rows " +
                            std::to_string(l.max_sample_rows) + "; split the request");
  }
  const double sampled = static_cast<double>(rows) * static_cast<double>(r.options.max_tokens);
  if (sampled > static_cast<double>(l.max_sampled_tokens)) {
    throw ResourceExhausted("prompts x n x max_tokens = " + std::to_string(static_cast<int64_t>(sampled)) +
                            " sampled tokens exceed limits.max_sampled_tokens " + std::to_string(l.max_sampled_tokens) +
                            "; lower n or max_tokens, or split the request");
  }
  int64_t longest = 1;
  for (const auto& p : r.prompts) longest = std::max<int64_t>(longest, p.size());
  const auto est = EstimateSampleMemory(model_, dtype_, prompts, longest, r.options.n, r.options.max_tokens);
  if (est.activation_bytes > l.max_kv_cache_bytes) {
    throw ResourceExhausted("the K/V cache and logits of this Sample are estimated at " + MiB(est.activation_bytes) +
                            ", over limits.max_kv_cache_bytes (" + MiB(l.max_kv_cache_bytes) +
                            "); lower n, max_tokens or the number of prompts");
  }
  check_budget(est, resident_bytes, "the Sample", "lower n, max_tokens or the number of prompts");
}

void Admission::admit_logprobs(const LogprobsRequest& r, int64_t resident_bytes) const {
  admit_forward(r.sequences, "ComputeLogprobs", "send fewer or shorter sequences per call", resident_bytes);
}

void Admission::admit_forward(const std::vector<Sequence>& sequences, const std::string& what,
                              const std::string& advice, int64_t resident_bytes) const {
  int64_t tokens = 0, top_k = 0;
  for (const auto& s : sequences) {
    tokens += static_cast<int64_t>(s.tokens.size());
    top_k = std::max(top_k, s.top_k);
  }
  const int64_t longest = std::max<int64_t>(Longest(sequences), 1);
  const int64_t rows = std::max<int64_t>(1, (tokens + longest - 1) / longest);
  auto estimate = EstimateForwardMemory(model_, dtype_, rows, longest, config_.trainer.engine.logits_chunk,
                                        config_.trainer.engine.device);
  estimate.activation_bytes += rows * longest * top_k * 8 * 3;  // 2-D targets: ids, weights, log-probs
  check_budget(estimate, resident_bytes, what, advice);
}

EstimateReply Admission::estimate(int64_t rows, int64_t seq_len, const EngineRequest& engine, const LoraConfig* lora,
                                  int64_t resident_bytes) const {
  const auto& l = config_.limits;
  if (seq_len <= 0) throw InvalidArgument("seq_len must be > 0");
  if (seq_len > l.max_sequence_length) {
    throw InvalidArgument("seq_len " + std::to_string(seq_len) + " exceeds the maximum sequence length " +
                          std::to_string(l.max_sequence_length) + " (limits.max_sequence_length)");
  }
  if (rows < 0) throw InvalidArgument("batch must be >= 0 (0 = 1 row)");
  rows = std::max<int64_t>(1, rows);
  if (rows > l.max_tokens_per_request / seq_len) {
    throw InvalidArgument("batch x seq_len = " + std::to_string(rows) + " x " + std::to_string(seq_len) +
                          " exceeds limits.max_tokens_per_request " + std::to_string(l.max_tokens_per_request));
  }
  if (config_.parallel.context_parallel > 1 && seq_len < config_.parallel.context_parallel) {
    throw InvalidArgument("seq_len " + std::to_string(seq_len) + " is shorter than the " +
                          std::to_string(config_.parallel.context_parallel) +
                          " ranks each sequence is split over (parallel.context_parallel)");
  }
  EstimateReply r;
  const auto options = resolve_engine(engine);
  r.engine = options.kind;
  // Context parallel: one rank's peak (each rank holds the weights, gradients and state).
  r.estimate = EstimateStepMemory(model_, dtype_, rows, seq_len, options, config_.trainer.optimizer.name, lora,
                                  config_.parallel.context_parallel);
  AddReferenceForward(r.estimate, config_, model_, dtype_, rows, seq_len, options.logits_chunk);
  // The other resident sessions are held too, and the reference model's copy.
  r.estimate.weights_bytes += resident_bytes + reference_bytes_;
  r.budget_bytes = l.memory_budget_bytes;
  r.fits = l.memory_budget_bytes <= 0 || r.estimate.total() <= l.memory_budget_bytes;
  return r;
}

}  // namespace streambp::server
