#pragma once
// What the host tells an observer about the work it runs (the Prometheus exporter is one).
// Called on the device thread; implementations must be cheap and thread-safe.
#include <string>

#include "types.h"

namespace streambp::server {

class HostTelemetry {
 public:
  virtual ~HostTelemetry() = default;
  /// A forward-backward of `session` ran (alone, or as the first half of a TrainStep or rollout step).
  virtual void on_forward_backward(const std::string& session, const StepStats& stats) = 0;
  /// An optimizer step was applied or skipped.
  virtual void on_optim_step(const std::string& session, const OptimStats& stats, double seconds) = 0;
  /// A whole step (TrainStep, or a server-run rollout step) finished.
  virtual void on_train_step(const std::string& session, const TrainStats& stats, const std::string& source,
                             double seconds) = 0;
  /// A request was refused for memory: "estimate" (before it ran) or "out_of_memory".
  virtual void on_memory_refusal(const std::string& reason) = 0;
};

}  // namespace streambp::server
