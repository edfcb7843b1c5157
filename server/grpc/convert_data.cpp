// Data batches at the gRPC edge (docs/architecture.md: Objectives, "losses as data"): Tinker's
// Datums, 1-D or 2-D (top-k) targets, checked against the inputs their loss declares.
#include <algorithm>
#include <cmath>

#include "converter.h"
#include "streambp/objective.h"

namespace streambp::server {
namespace {

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// A per-token tensor of a datum: one dimension (or shape [N]) of N entries.
void CheckShape(const v1::TensorData& t, int64_t size, int64_t n, const std::string& field) {
  if (t.shape_size() > 1) {
    throw InvalidArgument(field + ".shape has " + std::to_string(t.shape_size()) +
                          " dimensions; this loss takes one value per input token (shape [" + std::to_string(n) +
                          "])");
  }
  if (t.shape_size() == 1 && t.shape(0) != size) {
    throw InvalidArgument(field + ".shape [" + std::to_string(t.shape(0)) + "] does not match its " +
                          std::to_string(size) + " values");
  }
  if (size != n) {
    throw InvalidArgument(field + " has " + std::to_string(size) + " values but model_input has " + std::to_string(n) +
                          " tokens (one per input token: entry t is about the token position t predicts; a text "
                          "model_input's tokens are what Tokenize with the batch shows)");
  }
}

// A datum with 2-D target_tokens [N, K]: K candidate tokens per position (a teacher's top-k,
// for distillation) with [N, K] weights, for a loss whose weights input declares top_k. The
// sequence is the input plus one more token (the last position's first candidate: it is read
// by no position that predicts), so that each of the N positions predicts.
void ConvertTopK(const v1::Datum& datum, const std::vector<ObjectiveInput>& declared, const std::string& objective,
                 const std::string& f, Converter& c, Sequence& s) {
  const std::string ft = f + ".loss_fn_inputs[target_tokens]";
  const auto& targets = datum.loss_fn_inputs().at("target_tokens");
  const int64_t n = s.tokens.size();
  const ObjectiveInput* weights = nullptr;
  for (const auto& d : declared) {
    if (d.top_k) weights = &d;
  }
  if (weights == nullptr) {
    throw InvalidArgument(ft + ".shape has 2 dimensions, but objective '" + objective + "' takes one target per "
                          "position (shape [" + std::to_string(n) + "]); 2-D targets (a teacher's top-k) are for "
                          "cross_entropy");
  }
  const int64_t rows = targets.shape(0), k = targets.shape(1);
  if (rows != n || k < 1) {
    throw InvalidArgument(ft + ".shape [" + std::to_string(rows) + ", " + std::to_string(k) + "] needs " +
                          std::to_string(n) + " rows (one per input token) of K >= 1 candidates");
  }
  if (k > c.vocab_size()) {
    throw InvalidArgument(ft + ".shape: K = " + std::to_string(k) + " candidates exceed the vocabulary of " +
                          std::to_string(c.vocab_size()));
  }
  if (targets.int_data_size() != n * k) {
    throw InvalidArgument(ft + " has " + std::to_string(targets.int_data_size()) + " values for shape [" +
                          std::to_string(n) + ", " + std::to_string(k) + "]");
  }
  // Every candidate is counted as a token against limits.max_tokens_per_request (it costs as
  // much to carry and to score).
  c.Charge(n * k, ft);
  for (const auto& d : declared) {
    if (&d != weights && d.required) {
      throw InvalidArgument(ft + " is 2-D, but objective '" + objective + "' also needs '" + d.name +
                            "', which has no 2-D form");
    }
  }
  const std::string fw = f + ".loss_fn_inputs[" + weights->name + "]";
  const auto it = datum.loss_fn_inputs().find(weights->name);
  if (it == datum.loss_fn_inputs().end()) {
    throw InvalidArgument(fw + " is missing (shape [" + std::to_string(n) + ", " + std::to_string(k) +
                          "], the weight of each candidate)");
  }
  const auto& w = it->second;
  if (w.int_data_size() > 0) throw InvalidArgument(fw + " holds numbers: give them as float_data");
  if (w.shape_size() != 2 || w.shape(0) != n || w.shape(1) != k || w.float_data_size() != n * k) {
    std::string shape;
    for (int d = 0; d < w.shape_size(); ++d) shape += (d ? ", " : "") + std::to_string(w.shape(d));
    throw InvalidArgument(fw + " has shape [" + shape + "] and " + std::to_string(w.float_data_size()) +
                          " values; with 2-D target_tokens it needs shape [" + std::to_string(n) + ", " +
                          std::to_string(k) + "] (the weight of each candidate)");
  }
  s.top_k = k;
  s.top_k_targets.assign(k, 0);  // token 0's: unused
  s.top_k_weights.assign(k, 0.0);
  for (int64_t e = 0; e < n * k; ++e) {
    std::string at = "[";  // built up: GCC 12 warns on "literal" + to_string() at -O3
    at += std::to_string(e / k) + "][" + std::to_string(e % k) + "]";
    const int64_t id = targets.int_data(e);
    if (id < 0 || id >= c.vocab_size()) {
      throw InvalidArgument(ft + at + " = " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size()) + ")");
    }
    const double v = w.float_data(e);
    if (!std::isfinite(v)) throw InvalidArgument(fw + at + " is not finite");
    s.top_k_targets.push_back(id);
    s.top_k_weights.push_back(v);
  }
  s.tokens.push_back(targets.int_data((n - 1) * k));
}

// A data batch (Tinker's Datum): the sequence is the input plus the last target, every
// per-token input lands in the Sequence field its objective declared, aligned as the typed
// batches align them (entry t + 1 = the value of target_tokens[t]; entry 0 unused).
}  // namespace

void ConvertData(const v1::DatumBatch& batch, const std::string& objective, Converter& c, StepRequest* in) {
  const auto declared = ObjectiveInputs(objective);
  if (declared.empty()) {
    throw InvalidArgument("objective '" + objective + "' takes no data batch (it declares no loss_fn_inputs); use "
                          "batch." + ObjectiveBatchKind(objective));
  }
  std::vector<std::string> known{"target_tokens"};
  for (const auto& d : declared) known.push_back(d.name);
  if (batch.data().empty()) throw InvalidArgument("batch.data.data is empty");
  for (int i = 0; i < batch.data_size(); ++i) {
    const auto& datum = batch.data(i);
    const std::string f = Index("batch.data.data", i);
    const int64_t n = datum.model_input().tokens_size();
    if (n == 0) throw InvalidArgument(f + ".model_input.tokens is empty");
    for (const auto& [name, tensor] : datum.loss_fn_inputs()) {
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        throw InvalidArgument(f + ".loss_fn_inputs: unknown input '" + name + "' for objective '" + objective +
                              "' (it takes " + Join(known) + ")");
      }
    }
    const std::string ft = f + ".loss_fn_inputs[target_tokens]";
    const auto target_it = datum.loss_fn_inputs().find("target_tokens");
    if (target_it == datum.loss_fn_inputs().end()) throw InvalidArgument(ft + " is missing (int_data, one per token)");
    const auto& targets = target_it->second;
    if (targets.float_data_size() > 0) throw InvalidArgument(ft + " holds token ids: give them as int_data");
    Sequence s;
    s.tokens = c.Tokens(datum.model_input().tokens(), f + ".model_input.tokens");
    const auto& mask = datum.model_input().loss_mask();
    if (!mask.empty()) {
      // Sequence::loss_mask is per token of input + last target: entry t + 1 selects target t.
      if (mask.size() != n) {
        throw InvalidArgument(f + ".model_input.loss_mask has " + std::to_string(mask.size()) + " entries but "
                              "model_input has " + std::to_string(n) + " tokens (one per input token: entry t "
                              "selects the target position t predicts)");
      }
      s.loss_mask.assign(1, 0);
      for (int t = 0; t < mask.size(); ++t) {
        if (mask[t] != 0 && mask[t] != 1) {
          throw InvalidArgument(f + ".model_input.loss_mask[" + std::to_string(t) + "] = " + std::to_string(mask[t]) +
                                " must be 0 or 1");
        }
        s.loss_mask.push_back(static_cast<uint8_t>(mask[t]));
      }
    }
    if (targets.shape_size() == 2) {
      ConvertTopK(datum, declared, objective, f, c, s);
      c.Count(s, f);
      in->sequences.push_back(std::move(s));
      continue;
    }
    CheckShape(targets, targets.int_data_size(), n, ft);
    for (int64_t t = 0; t + 1 < n; ++t) {
      if (targets.int_data(t) != s.tokens[t + 1]) {
        throw InvalidArgument(ft + "[" + std::to_string(t) + "] = " + std::to_string(targets.int_data(t)) +
                              " is not the next input token " + std::to_string(s.tokens[t + 1]) +
                              ": the targets are the input shifted by one (target_tokens[t] = "
                              "model_input.tokens[t+1])");
      }
    }
    const int64_t last = targets.int_data(n - 1);
    if (last < 0 || last >= c.vocab_size()) {
      throw InvalidArgument(ft + "[" + std::to_string(n - 1) + "] = " + std::to_string(last) +
                            " is outside the vocabulary [0, " + std::to_string(c.vocab_size()) + ")");
    }
    s.tokens.push_back(last);
    for (const auto& d : declared) {
      const std::string fi = f + ".loss_fn_inputs[" + d.name + "]";
      const auto it = datum.loss_fn_inputs().find(d.name);
      if (it == datum.loss_fn_inputs().end()) {
        if (d.required) throw InvalidArgument(fi + " is missing (objective '" + objective + "' needs it)");
        // Optional weights left out: every target weighs 1 (the loss mask still selects).
        if (d.target == ObjectiveInput::Target::kTokenWeights) {
          s.token_weights.assign(n + 1, 1.0);
          s.token_weights[0] = 0.0;  // token 0: unused, as every per-token input's
        }
        continue;
      }
      const auto& tensor = it->second;
      if (tensor.int_data_size() > 0) throw InvalidArgument(fi + " holds numbers: give them as float_data");
      CheckShape(tensor, tensor.float_data_size(), n, fi);
      std::vector<double> values;
      values.reserve(n + 1);
      values.push_back(0.0);
      for (int64_t t = 0; t < n; ++t) {
        const double v = tensor.float_data(t);
        if (!std::isfinite(v)) throw InvalidArgument(fi + "[" + std::to_string(t) + "] is not finite");
        if (d.target == ObjectiveInput::Target::kSamplerLogprobs && v > 0) {
          throw InvalidArgument(fi + "[" + std::to_string(t) + "] = " + std::to_string(v) +
                                " is positive: a log-probability is <= 0");
        }
        values.push_back(v);
      }
      using Target = ObjectiveInput::Target;
      switch (d.target) {
        case Target::kTokenWeights: s.token_weights = std::move(values); break;
        case Target::kSamplerLogprobs: s.sampler_logprobs = std::move(values); break;
        case Target::kAdvantages: s.advantages = std::move(values); break;
        case Target::kRefLogprobs: s.ref_logprobs = std::move(values); break;
        case Target::kNamed: s.inputs[d.name] = std::move(values); break;
      }
    }
    c.Count(s, f);
    in->sequences.push_back(std::move(s));
  }
}

}  // namespace streambp::server
