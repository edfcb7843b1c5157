// The TrainingHost's bounded resources: the device bytes resident sessions hold (what
// admission adds to a request's estimate), the CPU pool that processes requests' text, and
// the leases of streams and exports.
#include <atomic>

#include "admission.h"
#include "cpu_pool.h"
#include "host.h"
#include "host_session.h"
#include "streambp/error.h"

namespace streambp::server {

// --- Device bytes ------------------------------------------------------------------------------

int64_t TrainingHost::resident_bytes(const std::string& except) const {
  if (!config_.sessions.enabled) return 0;
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  int64_t bytes = 0;
  for (const auto& [name, s] : sessions_) {
    if (name != except && s->resident) bytes += s->device_bytes;
  }
  // A full session's own estimate counts its copy of the weights; the shared base stays on
  // the device beside it, and so does its frozen reference copy (Trainer: reference model).
  if (const auto it = sessions_.find(except); it != sessions_.end() && it->second->spec.full) {
    bytes += admission_->weights_bytes() * (config_.trainer.reference.use_reference_model ? 2 : 1);
  }
  return bytes;
}

EstimateReply TrainingHost::estimate(const std::string& session, int64_t rows, int64_t seq_len,
                                     const EngineRequest& engine) const {
  auto s = find(session);
  const LoraConfig* lora = config_.sessions.enabled && !s->spec.full ? &s->spec.lora : nullptr;
  return admission_->estimate(rows, seq_len, engine, lora, resident_bytes(session));
}

// --- CPU work ------------------------------------------------------------------------------------

void TrainingHost::run_cpu(const CallContext& ctx, int64_t bytes, std::function<void()> work,
                           std::function<void(std::exception_ptr)> fail) {
  if (draining_) throw Unavailable("the server is shutting down; retry against its replacement");
  CpuPool::Job job;
  job.deadline = ctx.deadline;
  job.cancelled = ctx.cancelled;
  job.bytes = bytes;
  job.run = std::move(work);
  job.fail = std::move(fail);
  switch (cpu_->submit(std::move(job))) {
    case CpuPool::Submit::kAccepted: return;
    case CpuPool::Submit::kFull:
      throw ResourceExhausted("the server is busy with " + std::to_string(cpu_->capacity()) +
                              " requests' text waiting to be processed (limits.text_queue); retry with backoff");
    case CpuPool::Submit::kTooLarge:
      throw ResourceExhausted("processing the request's text may take " + std::to_string(bytes >> 20) +
                              " MiB, more than limits.text_memory_bytes (" + std::to_string(cpu_->budget() >> 20) +
                              " MiB); split it into several calls");
    case CpuPool::Submit::kStopped: break;
  }
  throw Unavailable("the server is shutting down; retry against its replacement");
}

// --- Leases ------------------------------------------------------------------------------------

namespace {

TrainingHost::Lease Acquire(std::atomic<int64_t>& counter, int64_t limit, const std::string& what) {
  if (counter.fetch_add(1) >= limit) {
    --counter;
    throw ResourceExhausted(what + ": " + std::to_string(limit) + " are running; retry later");
  }
  return TrainingHost::Lease(nullptr, [&counter](void*) { --counter; });
}

}  // namespace

TrainingHost::Lease TrainingHost::acquire_stream() {
  return Acquire(streams_, config_.limits.max_streams, "too many open streams (limits.max_streams)");
}

TrainingHost::Lease TrainingHost::acquire_export() {
  return Acquire(exports_, config_.limits.max_concurrent_exports,
                 "too many weight exports at once (limits.max_concurrent_exports)");
}

}  // namespace streambp::server
