// The training history on the wire: HistoryReply -> GetHistoryResponse.
#include "convert.h"

namespace streambp::server {

void ToProto(const HistoryRecord& r, v1::HistoryRecord* out) {
  out->set_index(r.index);
  out->set_step(r.step);
  out->set_policy_version(r.policy_version);
  out->set_source(r.source);
  out->set_time(r.time);
  out->set_loss(r.loss);
  out->set_tokens(r.tokens);
  out->set_forward_backwards(r.forward_backwards);
  out->set_tokens_per_second(r.tokens_per_second);
  out->set_seconds(r.seconds);
  out->set_peak_memory_bytes(r.peak_memory_bytes);
  out->set_grad_norm(r.grad_norm);
  out->set_learning_rate(r.learning_rate);
  out->set_skipped(r.skipped);
  out->set_skip_reason(r.skip_reason);
  out->set_groups_consumed(r.groups_consumed);
  for (const auto& [name, value] : r.metrics) (*out->mutable_metrics())[name] = value;
}

void ToProto(const HistoryReply& h, v1::GetHistoryResponse* out) {
  for (const auto& r : h.records) ToProto(r, out->add_records());
  out->set_first_index(h.first_index);
  out->set_last_index(h.last_index);
  out->set_file(h.file);
}

}  // namespace streambp::server
