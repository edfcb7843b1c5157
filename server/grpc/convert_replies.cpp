// Replies on the wire: the host's answers (step and optimizer stats, info, estimates,
// log-probs, samples, rollout acks and stats, policy updates) -> their response messages.
#include "convert.h"

#include "streambp/runtime.h"

namespace streambp::server {
namespace {

// Routed expert ids packed as little-endian bytes: one per id up to 127 experts, else two.
void EncodeRoutedExperts(const std::vector<int32_t>& ids, int64_t num_experts, int64_t sparse_layers,
                         int64_t experts_per_token, v1::RoutedExperts* out) {
  const int width = num_experts <= 127 ? 1 : 2;
  std::string bytes(ids.size() * static_cast<size_t>(width), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto v = static_cast<uint16_t>(static_cast<int16_t>(ids[i]));
    bytes[width * i] = static_cast<char>(v & 0xff);
    if (width == 2) bytes[2 * i + 1] = static_cast<char>(v >> 8);
  }
  out->set_ids(std::move(bytes));
  out->set_bytes_per_id(width);
  out->set_sparse_layers(static_cast<int32_t>(sparse_layers));
  out->set_experts_per_token(static_cast<int32_t>(experts_per_token));
}

}  // namespace

void ToProto(const StepStats& s, v1::StepStats* out) {
  out->set_loss(s.result.loss);
  for (const auto& [k, v] : s.result.metrics) (*out->mutable_metrics())[k] = v;
  out->set_tokens(s.result.tokens);
  out->set_targets(s.result.targets);
  out->set_sequences(s.sequences);
  out->set_micro_batches(s.micro_batches);
  out->set_engine(EngineName(s.engine));
  out->set_chunk(s.chunks.chunk);
  out->set_logits_chunk(s.chunks.logits_chunk);
  out->set_key_chunk(s.engine == EngineKind::kStream ? s.chunks.key_chunk : 0);
  out->set_peak_memory_bytes(s.peak_memory_bytes);
  out->set_seconds(s.seconds);
  out->set_queue_seconds(s.queue_seconds);
  out->set_offloaded_bytes(s.result.offloaded_bytes);
}

void ToProto(const StepStats& s, v1::ForwardBackwardResponse* out) {
  ToProto(s, out->mutable_stats());
  out->set_policy_version(s.policy_version);
  for (const auto& sequence : s.logprobs) {
    auto* lp = out->add_logprobs();
    for (const double v : sequence) {
      lp->add_logprobs(static_cast<float>(v));
      lp->add_logprobs_fp64(v);
    }
  }
}

void ToProto(const OptimStats& o, v1::OptimStepResponse* out) {
  out->set_policy_version(o.policy_version);
  out->set_step(o.step);
  out->set_learning_rate(o.optim.lr);
  out->set_grad_norm(o.optim.grad_norm);
  out->set_skipped(o.optim.skipped);
  out->set_skip_reason(o.optim.reason);
}

void ToProto(const HostInfo& i, v1::GetInfoResponse* out) {
  const auto& mc = i.model;
  out->set_architecture(mc.architecture);
  out->set_num_layers(mc.num_hidden_layers);
  out->set_hidden_size(mc.hidden_size);
  out->set_num_heads(mc.num_attention_heads);
  out->set_num_kv_heads(mc.num_key_value_heads);
  out->set_head_dim(mc.head_dim);
  out->set_vocab_size(mc.vocab_size);
  out->set_num_parameters(i.num_parameters);
  out->set_dtype(i.dtype);
  out->set_device(i.device);
  out->set_engine(EngineName(i.engine.kind));
  // The defaults as they resolve for the longest sequence the server admits (0 = the whole
  // sequence at once); a step's own come from its length (docs/architecture.md: Chunk sizes).
  constexpr int64_t kLong = int64_t{1} << 40;
  const auto defaults = ResolveChunks(i.engine, i.max_sequence_length > 0 ? i.max_sequence_length : kLong, mc,
                                      ParseDtype(i.dtype));
  const bool stream = i.engine.kind == EngineKind::kStream;
  out->set_chunk(stream ? defaults.chunk : 0);
  const bool chunked_head = i.engine.kind == EngineKind::kStream || i.engine.tiled_attention;
  const bool materialized = i.engine.logits_chunk == 0 || (!chunked_head && i.engine.logits_chunk < 0);
  out->set_logits_chunk(materialized ? 0 : defaults.logits_chunk);
  out->set_key_chunk(stream ? defaults.key_chunk : 0);
  out->set_world_size(i.world_size);
  out->set_context_parallel(i.context_parallel);
  out->set_optimizer(i.optimizer);
  out->set_learning_rate(i.learning_rate);
  out->set_max_sequence_length(i.max_sequence_length);
  out->set_max_tokens_per_request(i.max_tokens_per_request);
  out->set_reference_model(i.reference_model);
  out->set_runtime(GetRuntimeInfo().describe());
  out->set_policy_version(i.policy_version);
  out->set_step(i.step);
  out->set_pending_micro_batches(i.pending_micro_batches);
  out->set_sessions(i.sessions);
  auto* t = out->mutable_tokenizer();
  t->set_available(i.tokenizer.available);
  t->set_type(i.tokenizer.type);
  t->set_vocab_size(i.tokenizer.vocab_size);
  t->set_chat_format(i.tokenizer.chat_format);
  for (int64_t id : i.eos_token_ids) t->add_eos_token_ids(static_cast<int32_t>(id));
  t->set_bos_token(i.tokenizer.bos_token);
  t->set_eos_token(i.tokenizer.eos_token);
  out->set_offload_layer_inputs(i.engine.offload_layer_inputs);
  for (const auto& name : ObjectiveNames()) {
    auto* o = out->add_objectives();
    o->set_name(name);
    o->set_batch_kind(ObjectiveBatchKind(name));
    for (const auto& option : ObjectiveOptionSchema(name)) o->add_options(option.key);
    for (const auto& input : ObjectiveInputs(name)) {
      (input.required ? o->add_inputs() : o->add_optional_inputs())->assign(input.name);
    }
  }
}

void ToProto(const EstimateReply& e, v1::EstimateMemoryResponse* out) {
  out->set_weights_bytes(e.estimate.weights_bytes);
  out->set_gradient_bytes(e.estimate.gradient_bytes);
  out->set_optimizer_bytes(e.estimate.optimizer_bytes);
  out->set_activation_bytes(e.estimate.activation_bytes);
  out->set_total_bytes(e.estimate.total());
  out->set_budget_bytes(e.budget_bytes);
  out->set_fits(e.fits);
  out->set_engine(EngineName(e.engine));
  out->set_chunk(e.estimate.chunk);
  out->set_logits_chunk(e.estimate.logits_chunk);
  out->set_key_chunk(e.engine == EngineKind::kStream ? e.estimate.key_chunk : 0);
  out->set_offloaded_bytes(e.estimate.offloaded_bytes);
}

void ToProto(const LogprobsReply& r, v1::ComputeLogprobsResponse* out) {
  for (const auto& seq : r.logprobs) {
    auto* s = out->add_sequences();
    auto* o = s->mutable_logprobs();
    o->Reserve(static_cast<int>(seq.size()));
    for (double v : seq) o->Add(static_cast<float>(v));
    if (r.fp64) s->mutable_logprobs_fp64()->Add(seq.begin(), seq.end());
  }
  for (size_t i = 0; i < r.top_ids.size(); ++i) {
    auto* s = out->mutable_sequences(static_cast<int>(i));
    s->mutable_top_ids()->Add(r.top_ids[i].begin(), r.top_ids[i].end());
    s->mutable_top_logprobs()->Add(r.top_logprobs[i].begin(), r.top_logprobs[i].end());
  }
  out->set_policy_version(r.policy_version);
}

void ToProto(const SampleReply& r, v1::SampleResponse* out) {
  for (const auto& c : r.completions) {
    auto* o = out->add_completions();
    o->set_prompt_index(static_cast<int32_t>(c.prompt_index));
    o->mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
    for (double lp : c.logprobs) o->add_logprobs(static_cast<float>(lp));
    o->set_finish_reason(c.finish_reason);
    if (!c.routed_experts.empty()) {
      EncodeRoutedExperts(c.routed_experts, r.num_experts, r.sparse_layers, r.experts_per_token,
                          o->mutable_routed_experts());
    }
  }
  for (size_t i = 0; i < r.texts.size() && i < static_cast<size_t>(out->completions_size()); ++i) {
    out->mutable_completions(static_cast<int>(i))->set_text(r.texts[i]);
  }
  out->set_policy_version(r.policy_version);
}

void ToProto(const RolloutAck& a, v1::RolloutAck* out) {
  out->set_index(a.index);
  out->set_group_id(a.group_id);
  out->set_status(RolloutStatusName(a.status));
  out->set_message(a.message);
  out->set_queue_depth(a.queue_depth);
  out->set_policy_version(a.policy_version);
}

void ToProto(const RolloutStats& s, v1::RolloutStats* out) {
  out->set_queue_depth(s.queue_depth);
  out->set_accepted(s.accepted);
  out->set_consumed(s.consumed);
  out->set_dropped_stale(s.dropped_stale);
  out->set_duplicates(s.duplicates);
  out->set_invalid(s.invalid);
  out->set_in_step(s.in_step);
  out->set_steps_run(s.steps_run);
  out->set_last_step_seconds(s.last_step_seconds);
  out->set_groups_per_step(s.groups_per_step);
  out->set_max_staleness(s.max_staleness);
  out->set_policy_version(s.policy_version);
}

void ToProto(const PolicyUpdate& u, v1::PolicyUpdate* out) {
  out->set_policy_version(u.policy_version);
  out->set_step(u.step);
  out->set_source(u.source);
  out->set_loss(u.loss);
  out->set_reward_mean(u.reward_mean);
  out->set_kl(u.kl);
  out->set_clip_fraction(u.clip_fraction);
  out->set_tokens(u.tokens);
  out->set_groups_consumed(u.groups_consumed);
  out->set_groups_dropped(u.groups_dropped);
  for (const auto& [k, v] : u.metrics) (*out->mutable_metrics())[k] = v;
}

}  // namespace streambp::server
