// cross_entropy with 2-D targets over a real gRPC server (issue 28: Tinker's top-k targets, for
// distillation): a datum whose target_tokens are [N, K] candidates (here the model's own top-k
// from ComputeLogprobs, as a teacher's would come) with [N, K] weights trains on
// -sum_t sum_j w_tj log p(candidate_tj); its loss equals that sum written out from the served
// top-k log-probs, and its update equals one weighted_logprobs sequence per candidate (the
// prefix and the candidate) on a second server; return_logprobs gives the candidates'
// log-probs. Bad 2-D data is refused naming the field, with nothing changed.
#include <cmath>
#include <functional>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "integration/server_fixture.h"
#include "integration/wire.h"
#include "streambp/model.h"
#include "streambp/v1/trainer.grpc.pb.h"

namespace streambp {
namespace {

using testing::Wire;

constexpr int kTopK = 3;

server::ServerConfig SgdF64() {
  auto c = testing::TestConfig();
  c.trainer.optimizer.name = "sgd";
  c.trainer.optimizer.lr = 0.5;
  return c;
}

std::vector<std::vector<int32_t>> Sequences() {
  std::vector<std::vector<int32_t>> out;
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> t;
    for (int i = 0; i < 6 + 4 * s; ++i) t.push_back((31 * s + 17 * i + 5) % 256);
    out.push_back(t);
  }
  return out;
}

// What a teacher gives: per position of the input, its top-k next tokens and their log-probs.
struct TopK {
  std::vector<int32_t> ids;
  std::vector<double> logprobs;
};

// The server's own top-k over `input` plus one token, so that each of the N input positions
// has its k candidates (position t's: the tokens most likely after input[..t]).
std::vector<TopK> ServedTopK(Wire& w, const std::vector<std::vector<int32_t>>& inputs) {
  v1::ComputeLogprobsRequest req;
  req.set_fp64(true);
  req.set_top_k(kTopK);
  for (const auto& in : inputs) {
    auto* s = req.add_sequences();
    s->mutable_tokens()->Add(in.begin(), in.end());
    s->add_tokens(0);
  }
  v1::ComputeLogprobsResponse out;
  const auto status = w.stub->ComputeLogprobs(Wire::ctx().get(), req, &out);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<TopK> top;
  for (const auto& s : out.sequences()) top.push_back({{s.top_ids().begin(), s.top_ids().end()}, {s.top_logprobs().begin(), s.top_logprobs().end()}});
  return top;
}

v1::TensorData Table(const std::vector<double>& v, int64_t rows) {
  v1::TensorData t;
  t.mutable_float_data()->Add(v.begin(), v.end());
  t.add_shape(rows);
  t.add_shape(static_cast<int64_t>(v.size()) / rows);
  return t;
}

v1::Datum TopKDatum(const std::vector<int32_t>& input, const std::vector<int32_t>& ids, const std::vector<double>& w) {
  v1::Datum d;
  d.mutable_model_input()->mutable_tokens()->Add(input.begin(), input.end());
  auto& targets = (*d.mutable_loss_fn_inputs())["target_tokens"];
  targets.mutable_int_data()->Add(ids.begin(), ids.end());
  targets.add_shape(static_cast<int64_t>(input.size()));
  targets.add_shape(kTopK);
  (*d.mutable_loss_fn_inputs())["weights"] = Table(w, static_cast<int64_t>(input.size()));
  return d;
}

TensorMap Update(const client::Client& c) {
  const auto base = InitModel(PresetConfig("tiny"), 0, torch::kFloat64)->hf_tensors();
  auto now = testing::ExportedTensors(c);
  for (auto& [name, t] : now) t = t - base.at(name);
  return now;
}

TEST(Distillation, TopKCrossEntropyIsTheSumOverItsCandidatesAndEqualsOneSequencePerCandidate) {
  auto seqs = Sequences();
  auto a = testing::StartServer(SgdF64());
  Wire wa(a.target);
  const auto top = ServedTopK(wa, seqs);
  ASSERT_EQ(top.size(), seqs.size());

  // Weights: the teacher's probabilities, scaled per position with both signs (the loss is
  // linear in them, so any values test the same thing).
  v1::TrainStepRequest step;
  step.set_objective("cross_entropy");
  v1::ForwardBackwardRequest expanded;  // one weighted_logprobs sequence per candidate
  expanded.set_objective("weighted_logprobs");
  double loss = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    const size_t n = seqs[k].size();
    ASSERT_EQ(top[k].ids.size(), n * kTopK);
    std::vector<double> w(n * kTopK);
    for (size_t e = 0; e < w.size(); ++e) {
      w[e] = std::exp(top[k].logprobs[e]) * (e % 5 == 4 ? -0.5 : 1.0 + 0.1 * static_cast<double>(k));
      loss -= w[e] * top[k].logprobs[e];
      auto* s = expanded.mutable_batch()->mutable_weighted()->add_sequences();
      const size_t t = e / kTopK;
      s->mutable_tokens()->Add(seqs[k].begin(), seqs[k].begin() + static_cast<std::ptrdiff_t>(t) + 1);
      s->add_tokens(top[k].ids[e]);
      for (size_t i = 0; i < t; ++i) s->add_weights(0.0);
      s->add_weights(-w[e]);  // weighted_logprobs is +sum w lp; cross_entropy -sum w lp
    }
    *step.mutable_batch()->mutable_data()->add_data() = TopKDatum(seqs[k], top[k].ids, w);
  }
  const auto trained = a.client->TrainStep(step);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  EXPECT_NEAR(trained->stats().loss(), loss, 1e-12 * std::abs(loss));

  auto b = testing::StartServer(SgdF64());
  const auto fb = b.client->ForwardBackward(expanded);
  ASSERT_TRUE(fb.ok()) << fb.status().error_message();
  EXPECT_NEAR(fb->stats().loss(), loss, 1e-12 * std::abs(loss));  // sum (-w) lp: the same value
  ASSERT_TRUE(b.client->OptimStep().ok());
  const auto ua = Update(*a.client), ub = Update(*b.client);
  double worst = 0, largest = 0;
  for (const auto& [name, t] : ua) {
    largest = std::max(largest, t.abs().max().item<double>());
    worst = std::max(worst, (t - ub.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(largest, 0);
  EXPECT_LE(worst, 1e-10 * largest);

  // Per-datum outputs (return_logprobs): the candidates' log-probs, N x K row-major, which are
  // the served top-k's at these weights.
  auto c = testing::StartServer(SgdF64());
  v1::ForwardBackwardRequest with_outputs;
  with_outputs.set_objective("cross_entropy");
  with_outputs.set_return_logprobs(true);
  *with_outputs.mutable_batch() = step.batch();
  const auto outputs = c.client->ForwardBackward(with_outputs);
  ASSERT_TRUE(outputs.ok()) << outputs.status().error_message();
  ASSERT_EQ(outputs->logprobs_size(), static_cast<int>(seqs.size()));
  for (size_t k = 0; k < seqs.size(); ++k) {
    const auto& got = outputs->logprobs(static_cast<int>(k)).logprobs_fp64();
    ASSERT_EQ(got.size(), static_cast<int>(top[k].logprobs.size())) << "datum " << k << ": N x K";
    for (int e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], top[k].logprobs[e], 1e-12) << k << " " << e;
  }
  EXPECT_NEAR(outputs->stats().loss(), loss, 1e-12 * std::abs(loss));
}

TEST(Distillation, BadTopKDataIsRefusedNamingTheFieldAndChangesNothing) {
  auto config = SgdF64();
  config.limits.max_tokens_per_request = 40;
  auto s = testing::StartServer(config);
  Wire w(s.target);
  const std::vector<int32_t> input = {4, 9, 16, 25, 36, 49};
  std::vector<int32_t> ids;
  std::vector<double> weights;
  for (int e = 0; e < 6 * kTopK; ++e) {
    ids.push_back((7 * e + 3) % 256);
    weights.push_back(0.25 * (e % 4));
  }
  v1::TrainStepRequest good;
  good.set_objective("cross_entropy");
  *good.mutable_batch()->mutable_data()->add_data() = TopKDatum(input, ids, weights);
  auto datum = [](auto& r) { return r.mutable_batch()->mutable_data()->mutable_data(0); };
  auto tensor = [&](v1::TrainStepRequest& r, const std::string& name) {
    return &(*datum(r)->mutable_loss_fn_inputs())[name];
  };
  const auto before = testing::ExportedTensors(*s.client);

  struct Case {
    std::string what;
    std::function<void(v1::TrainStepRequest&)> edit;
    grpc::StatusCode code;
    std::string message;
  };
  const auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  const std::string f = "batch.data.data[0].loss_fn_inputs";
  const std::vector<Case> cases = {
      {"a loss without 2-D targets", [](auto& r) { r.set_objective("weighted_logprobs"); }, kInvalid,
       f + "[target_tokens].shape has 2 dimensions, but objective 'weighted_logprobs' takes one target per position"},
      {"policy loss", [](auto& r) { r.set_objective("ppo"); }, kInvalid, "unknown input 'weights' for objective 'ppo'"},
      {"1-D weights", [&](auto& r) { tensor(r, "weights")->mutable_shape()->RemoveLast(); }, kInvalid,
       f + "[weights] has shape [6] and 18 values; with 2-D target_tokens it needs shape [6, 3]"},
      {"weights missing", [&](auto& r) { datum(r)->mutable_loss_fn_inputs()->erase("weights"); }, kInvalid,
       f + "[weights] is missing (shape [6, 3]"},
      {"weights as ints", [&](auto& r) { tensor(r, "weights")->add_int_data(1); }, kInvalid, "give them as float_data"},
      {"rows", [&](auto& r) { tensor(r, "target_tokens")->set_shape(0, 5); }, kInvalid,
       f + "[target_tokens].shape [5, 3] needs 6 rows (one per input token) of K >= 1 candidates"},
      {"values for the shape", [&](auto& r) { tensor(r, "target_tokens")->mutable_int_data()->RemoveLast(); }, kInvalid,
       f + "[target_tokens] has 17 values for shape [6, 3]"},
      {"candidate outside the vocabulary", [&](auto& r) { tensor(r, "target_tokens")->set_int_data(7, 100000); },
       kInvalid, f + "[target_tokens][2][1] = 100000 is outside the vocabulary"},
      {"negative candidate", [&](auto& r) { tensor(r, "target_tokens")->set_int_data(0, -1); }, kInvalid,
       f + "[target_tokens][0][0] = -1 is outside the vocabulary"},
      {"non-finite weight", [&](auto& r) { tensor(r, "weights")->set_float_data(5, std::nan("")); }, kInvalid,
       f + "[weights][1][2] is not finite"},
      {"K over the vocabulary", [&](auto& r) { tensor(r, "target_tokens")->set_shape(1, 100000); }, kInvalid,
       f + "[target_tokens].shape: K = 100000 candidates exceed the vocabulary of 256"},
      {"over the request's token limit", [&](auto& r) {
         *r.mutable_batch()->mutable_data()->add_data() = TopKDatum(input, ids, weights);
         *r.mutable_batch()->mutable_data()->add_data() = TopKDatum(input, ids, weights);
       }, grpc::StatusCode::RESOURCE_EXHAUSTED, "tokens and top-k candidates (limits.max_tokens_per_request)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = good;
    c.edit(r);
    const auto refused = s.client->TrainStep(r);
    EXPECT_EQ(refused.code(), c.code);
    EXPECT_NE(refused.status().error_message().find(c.message), std::string::npos) << refused.status().error_message();
  }
  testing::ExpectSameTensors(before, testing::ExportedTensors(*s.client));
  const auto trained = s.client->TrainStep(good);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  EXPECT_NE(trained->stats().loss(), 0.0);
}

}  // namespace
}  // namespace streambp
