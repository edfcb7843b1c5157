#include "test_util/objective_steps.h"

#include <nlohmann/json.hpp>

#include "streambp/memory.h"
#include "streambp/objective.h"
#include "test_util/fixtures.h"

namespace streambp::testing {

StepOutput RunObjectiveStep(CausalLM& model, const Batch& batch, const std::string& objective_name,
                            const EngineOptions& options) {
  ZeroGradients(*model);
  auto objective = CreateObjective(objective_name, nlohmann::json::object());
  auto result = ForwardBackward(model, batch, *objective, options);
  objective->finish();
  StepOutput out{result, CollectGradients(*model)};
  ZeroGradients(*model);
  return out;
}

int64_t TrackedSftPeak(CausalLM& model, const Batch& batch, const EngineOptions& options) {
  ZeroGradients(*model);
  memory::ResetPeak();
  const int64_t before = memory::LiveBytes();
  auto objective = MakeSftObjective({});
  ForwardBackward(model, batch, *objective, options);
  const int64_t peak = memory::PeakBytes() - before;
  ZeroGradients(*model);
  return peak;
}

int64_t TrackedObjectivePeak(CausalLM& model, const Batch& batch, const std::string& objective_name,
                             const EngineOptions& options) {
  ZeroGradients(*model);
  auto objective = CreateObjective(objective_name, nlohmann::json::object());
  memory::ResetPeak();
  const int64_t before = memory::LiveBytes();
  ForwardBackward(model, batch, *objective, options);
  const int64_t peak = memory::PeakBytes() - before;
  objective->finish();
  ZeroGradients(*model);
  return peak;
}

std::vector<Sequence> ObjectiveSequences(const std::string& objective, int64_t vocab) {
  auto seqs = RandomSequences({13, 9, 11, 6}, vocab, 3);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (objective == "dpo") {
      seqs[i].group = static_cast<int64_t>(i / 2);
      seqs[i].role = static_cast<int>(i % 2);
      seqs[i].ref_logp = -3.0 - static_cast<double>(i);
    } else if (objective == "grpo") {
      seqs[i].group = 0;
      seqs[i].reward = 0.25 * static_cast<double>(i);
    }
  }
  return seqs;
}

}  // namespace streambp::testing
