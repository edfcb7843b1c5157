#include "test_util/trainer_fixtures.h"

#include "streambp/gradients.h"

namespace streambp::testing {

std::vector<std::vector<Sequence>> SplitIntoParts(const std::vector<Sequence>& sequences, size_t parts) {
  // Units: runs of one group (or single ungrouped sequences).
  std::vector<std::vector<Sequence>> units;
  for (const auto& s : sequences) {
    if (units.empty() || s.group < 0 || units.back().back().group != s.group) units.emplace_back();
    units.back().push_back(s);
  }
  std::vector<std::vector<Sequence>> out(std::min(parts, units.size()));
  for (size_t u = 0; u < units.size(); ++u) {
    auto& part = out[u * out.size() / units.size()];
    part.insert(part.end(), units[u].begin(), units[u].end());
  }
  return out;
}

TensorMap AccumulatedGradients(Trainer& trainer, const std::vector<std::vector<Sequence>>& parts,
                               const std::function<std::unique_ptr<Objective>()>& make_objective,
                               double* loss) {
  trainer.zero_gradients();
  double total = 0;
  for (const auto& part : parts) {
    auto objective = make_objective();
    total += trainer.forward_backward(part, *objective).loss;
  }
  auto grads = CollectGradients(*trainer.model());
  trainer.zero_gradients();
  if (loss) *loss = total;
  return grads;
}

TrainerOptions ExactTrainerOptions() {
  TrainerOptions o;
  o.optimizer.name = "sgd";
  o.optimizer.lr = 1.0;
  o.max_grad_norm = 0;
  o.engine = {EngineKind::kStream, 3, 5};
  o.reference.use_reference_model = false;
  return o;
}

}  // namespace streambp::testing
