// Custom losses from the client (issue 19): weights computed outside the server equal the
// built-in objectives (Tinker's ppo included), and stale weights are refused; and the
// progress of a step (issue 18).
#include <cmath>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "device_worker.h"
#include "host.h"
#include "integration/server_fixture.h"
#include "integration/wire.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::TestConfig;
using testing::Wire;

// --- Custom losses: weights computed by the client ----------------------------------------------------

server::ServerConfig SgdF64() {
  auto c = TestConfig();
  c.trainer.optimizer.name = "sgd";
  c.trainer.optimizer.lr = 0.5;
  return c;
}

std::vector<std::vector<int32_t>> Sequences() {
  std::vector<std::vector<int32_t>> out;
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> t;
    for (int i = 0; i < 9 + 3 * s; ++i) t.push_back((37 * s + 11 * i + 5) % 256);
    out.push_back(t);
  }
  return out;
}

// log-probs of the sequences at the current policy, double precision.
v1::ComputeLogprobsResponse Logprobs(Wire& w, const std::vector<std::vector<int32_t>>& seqs) {
  v1::ComputeLogprobsRequest req;
  req.set_fp64(true);
  for (const auto& s : seqs) req.add_sequences()->mutable_tokens()->Add(s.begin(), s.end());
  v1::ComputeLogprobsResponse out;
  EXPECT_TRUE(w.stub->ComputeLogprobs(Wire::ctx().get(), req, &out).ok());
  return out;
}

double MaxRelativeDifference(const TensorMap& a, const TensorMap& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    const auto d = (t - b.at(name)).abs().max().item<double>();
    worst = std::max(worst, d / std::max(1e-30, t.abs().max().item<double>()));
  }
  return worst;
}

TEST(CustomLoss, HandWrittenDpoEqualsTheBuiltInObjective) {
  const auto seqs = Sequences();
  const int prompt = 4;
  const double beta = 0.3, ref_c = -31.5, ref_r = -29.25;
  // Built-in: DPO with given reference log-probs, one SGD step.
  auto a = testing::StartServer(SgdF64());
  {
    v1::TrainStepRequest r;
    auto* p = r.mutable_batch()->mutable_dpo()->add_pairs();
    p->mutable_prompt()->Add(seqs[0].begin(), seqs[0].begin() + prompt);
    p->mutable_chosen()->Add(seqs[0].begin() + prompt, seqs[0].end());
    std::vector<int32_t> rejected(seqs[1].begin() + prompt, seqs[1].end());
    p->mutable_rejected()->Add(rejected.begin(), rejected.end());
    p->set_ref_chosen_logp(ref_c);
    p->set_ref_rejected_logp(ref_r);
    r.mutable_dpo()->set_beta(beta);
    ASSERT_TRUE(a.client->TrainStep(r).ok());
  }
  // Hand-written: the same loss, L = -log sigmoid(beta z), differentiated here.
  auto b = testing::StartServer(SgdF64());
  Wire w(b.target);
  std::vector<int32_t> chosen = seqs[0];
  std::vector<int32_t> rejected(seqs[0].begin(), seqs[0].begin() + prompt);
  rejected.insert(rejected.end(), seqs[1].begin() + prompt, seqs[1].end());
  const auto lp = Logprobs(w, {chosen, rejected});
  double S[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const auto& l = lp.sequences(k).logprobs_fp64();
    for (int i = prompt - 1; i < l.size(); ++i) S[k] += l[i];
  }
  const double z = (S[0] - S[1]) - (ref_c - ref_r);
  const double dL_dz = -beta / (1 + std::exp(beta * z));  // d/dz of -log sigmoid(beta z)
  v1::ForwardBackwardRequest fb;
  auto* weighted = fb.mutable_batch()->mutable_weighted();
  weighted->set_policy_version(lp.policy_version());
  for (int k = 0; k < 2; ++k) {
    auto* s = weighted->add_sequences();
    const auto& tokens = k == 0 ? chosen : rejected;
    s->mutable_tokens()->Add(tokens.begin(), tokens.end());
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      s->add_weights(static_cast<int>(i) >= prompt - 1 ? (k == 0 ? dL_dz : -dL_dz) : 0.0);
    }
  }
  fb.set_objective("weighted_logprobs");
  ASSERT_TRUE(b.client->ForwardBackward(fb).ok());
  ASSERT_TRUE(b.client->OptimStep().ok());
  const auto built_in = testing::ExportedTensors(*a.client);
  const auto custom = testing::ExportedTensors(*b.client);
  const auto base = InitModel(PresetConfig("tiny"), 0, torch::kFloat64)->hf_tensors();
  // Compare the updates (new - old), which SGD makes proportional to the gradients.
  TensorMap ua, ub;
  for (const auto& [name, t] : base) {
    ua[name] = built_in.at(name) - t;
    ub[name] = custom.at(name) - t;
  }
  EXPECT_LE(MaxRelativeDifference(ua, ub), 1e-10);
  EXPECT_GT(ua.at("model.layers.0.mlp.up_proj.weight").abs().max().item<double>(), 0);
}

TEST(CustomLoss, WeightsFromAnOldPolicyAreRefusedAndChangeNothing) {
  auto s = testing::StartServer(SgdF64());
  Wire w(s.target);
  const auto seqs = Sequences();
  const auto lp = Logprobs(w, {seqs[0]});
  ASSERT_TRUE(s.client->TrainStep([&] {
                v1::TrainStepRequest r;
                r.mutable_batch()->mutable_sft()->add_examples()->mutable_tokens()->Add(seqs[1].begin(), seqs[1].end());
                return r;
              }())
                  .ok());
  const auto before = testing::ExportedTensors(*s.client);
  v1::ForwardBackwardRequest fb;
  fb.set_objective("weighted_logprobs");
  auto* weighted = fb.mutable_batch()->mutable_weighted();
  weighted->set_policy_version(lp.policy_version());  // the version before the TrainStep
  auto* seq = weighted->add_sequences();
  seq->mutable_tokens()->Add(seqs[0].begin(), seqs[0].end());
  for (size_t i = 0; i + 1 < seqs[0].size(); ++i) seq->add_weights(-0.1);
  v1::ForwardBackwardResponse out;
  auto st = w.stub->ForwardBackward(Wire::ctx().get(), fb, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("computed at policy version 0"), std::string::npos) << st.error_message();
  v1::GetInfoResponse info;
  ASSERT_TRUE(w.stub->GetInfo(Wire::ctx().get(), {}, &info).ok());
  EXPECT_EQ(info.pending_micro_batches(), 0);
  testing::ExpectSameTensors(before, testing::ExportedTensors(*s.client));
  // A weight count that does not match the tokens: INVALID_ARGUMENT naming the field.
  weighted->clear_policy_version();
  seq->add_weights(1.0);
  st = w.stub->ForwardBackward(Wire::ctx().get(), fb, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("batch.weighted.sequences[0].weights has"), std::string::npos) << st.error_message();
}

// Tinker's losses over the wire (issue 28 item 2): TrainStep with objective "ppo" on a GRPO
// batch whose completions carry the sampler's log-probs and advantages gives the loss and
// the update of PPO written out here, by hand, from the server's float64 log-probs and
// trained through weighted_logprobs (w = dL/dlogp) on a second server.
TEST(PolicyLossWire, PpoOnAGrpoBatchIsPpoWrittenOutByHand) {
  const std::vector<int32_t> prompt = {5, 17, 33, 2};
  const std::vector<std::vector<int32_t>> completions = {{40, 41, 7, 99, 12}, {8, 250, 3}, {61, 62, 63, 64}};
  auto a = testing::StartServer(SgdF64());
  Wire wa(a.target);
  // The policy's own log-probs of the completions (float64), to place the sampler's around.
  v1::ComputeLogprobsRequest lr;
  lr.set_fp64(true);
  for (const auto& c : completions) {
    auto* s = lr.add_sequences();
    s->mutable_tokens()->Add(prompt.begin(), prompt.end());
    s->mutable_tokens()->Add(c.begin(), c.end());
  }
  v1::ComputeLogprobsResponse lp;
  ASSERT_TRUE(wa.stub->ComputeLogprobs(Wire::ctx().get(), lr, &lp).ok());
  // Sampler log-probs off the policy's by -0.4 .. +0.4 (ratios inside and outside [0.8, 1.2]),
  // advantages of both signs; the PPO loss and dL/dlogp per completion token, by hand.
  const double lo = 0.8, hi = 1.2;
  double loss = 0;
  std::vector<std::vector<double>> q(completions.size()), adv(completions.size()), dlp(completions.size());
  int clipped = 0, tokens = 0;
  for (size_t k = 0; k < completions.size(); ++k) {
    for (size_t t = 0; t < completions[k].size(); ++t) {
      const double logp = lp.sequences(static_cast<int>(k)).logprobs_fp64(static_cast<int>(prompt.size() + t - 1));
      const double shift = -0.4 + 0.8 * static_cast<double>((3 * k + 5 * t) % 7) / 6.0;
      const double A = (k + t) % 2 == 0 ? 0.75 : -1.25;
      // The wire carries the sampler's log-probs as float: the hand computation uses the
      // value the server receives.
      const double sampler = static_cast<float>(logp - shift);
      q[k].push_back(sampler);
      adv[k].push_back(A);
      const double r = std::exp(logp - sampler);
      const double clip = std::min(std::max(r, lo), hi);
      loss -= std::min(r * A, clip * A);
      // d/dlogp of -min(rA, clip(r)A): -rA where the unclipped term is the smaller (or equal), else 0.
      dlp[k].push_back(r * A <= clip * A ? -r * A : 0.0);
      clipped += r < lo || r > hi;
      ++tokens;
    }
  }
  ASSERT_GT(clipped, 0);
  ASSERT_LT(clipped, tokens);

  v1::TrainStepRequest step;
  step.set_objective("ppo");
  auto* group = step.mutable_batch()->mutable_grpo()->add_groups();
  group->mutable_prompt()->Add(prompt.begin(), prompt.end());
  for (size_t k = 0; k < completions.size(); ++k) {
    auto* c = group->add_completions();
    c->mutable_tokens()->Add(completions[k].begin(), completions[k].end());
    c->mutable_logprobs()->Add(q[k].begin(), q[k].end());
    c->mutable_advantages()->Add(adv[k].begin(), adv[k].end());
  }
  const auto trained = a.client->TrainStep(step);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  EXPECT_NEAR(trained->stats().loss(), loss, 1e-12 * std::abs(loss));
  const auto& metrics = trained->stats().metrics();
  ASSERT_TRUE(metrics.count("clip_fraction"));
  EXPECT_NEAR(metrics.at("clip_fraction"), static_cast<double>(clipped) / tokens, 1e-12);

  // The same update through weighted_logprobs on a fresh server.
  auto b = testing::StartServer(SgdF64());
  v1::ForwardBackwardRequest fb;
  fb.set_objective("weighted_logprobs");
  for (size_t k = 0; k < completions.size(); ++k) {
    auto* s = fb.mutable_batch()->mutable_weighted()->add_sequences();
    s->mutable_tokens()->Add(prompt.begin(), prompt.end());
    s->mutable_tokens()->Add(completions[k].begin(), completions[k].end());
    for (size_t i = 0; i + 1 < prompt.size(); ++i) s->add_weights(0.0);
    // weighted_logprobs trains L = sum w logp: w = dL/dlogp.
    s->mutable_weights()->Add(dlp[k].begin(), dlp[k].end());
  }
  ASSERT_TRUE(b.client->ForwardBackward(fb).ok());
  ASSERT_TRUE(b.client->OptimStep().ok());
  const auto by_hand = testing::ExportedTensors(*b.client);
  const auto ppo = testing::ExportedTensors(*a.client);
  const auto base = InitModel(PresetConfig("tiny"), 0, torch::kFloat64)->hf_tensors();
  double worst = 0, largest = 0;
  for (const auto& [name, t] : base) {
    const auto ua = ppo.at(name) - t, ub = by_hand.at(name) - t;
    largest = std::max(largest, ua.abs().max().item<double>());
    worst = std::max(worst, (ua - ub).abs().max().item<double>());
  }
  EXPECT_GT(largest, 0);
  EXPECT_LE(worst, 1e-10 * largest);

  // Options of another objective's message are refused with the keys ppo knows.
  v1::TrainStepRequest bad = step;
  bad.mutable_grpo()->set_beta(0.1);
  const auto refused = a.client->TrainStep(bad);
  EXPECT_EQ(refused.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status().error_message().find("clip_low_threshold"), std::string::npos)
      << refused.status().error_message();
  // A completion without the sampler's log-probs: refused, nothing trained.
  v1::TrainStepRequest missing = step;
  missing.mutable_batch()->mutable_grpo()->mutable_groups(0)->mutable_completions(1)->clear_logprobs();
  const auto before = testing::ExportedTensors(*a.client);
  const auto refused2 = a.client->TrainStep(missing);
  EXPECT_EQ(refused2.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused2.status().error_message().find("sampler log-probs"), std::string::npos)
      << refused2.status().error_message();
  testing::ExpectSameTensors(before, testing::ExportedTensors(*a.client));
}


// --- Progress of a step -------------------------------------------------------------------------------

TEST(StepProgress, AStepReportsQueuedStartedEveryLayerAndDone) {
  auto s = testing::StartServer(TestConfig());
  Wire w(s.target);
  auto& worker = s.server->host().worker();
  worker.pause();
  // A step ahead of ours, so ours is queued behind it.
  std::thread first([&] {
    v1::TrainStepRequest r;
    auto* tokens = r.mutable_batch()->mutable_sft()->add_examples()->mutable_tokens();
    for (int t = 1; t <= 6; ++t) tokens->Add(t);
    EXPECT_TRUE(s.client->TrainStep(r).ok());
  });
  while (worker.depth() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  v1::TrainStepRequest r;
  auto* e = r.mutable_batch()->mutable_sft()->add_examples();
  for (int t = 0; t < 40; ++t) e->add_tokens((t * 13) % 256);
  auto ctx = Wire::ctx();
  auto reader = w.stub->TrainStepProgress(ctx.get(), r);
  std::vector<v1::StepProgress> seen;
  v1::StepProgress p;
  ASSERT_TRUE(reader->Read(&p));  // queued, behind the first step
  seen.push_back(p);
  worker.resume();
  while (reader->Read(&p)) seen.push_back(p);
  ASSERT_TRUE(reader->Finish().ok());
  first.join();
  EXPECT_EQ(seen.front().state(), "queued");
  EXPECT_EQ(seen.front().queue_position(), 1);
  std::vector<std::string> states;
  std::set<int> forward_layers, backward_layers;
  for (const auto& m : seen) {
    if (states.empty() || states.back() != m.state()) states.push_back(m.state());
    if (m.state() == "forward") forward_layers.insert(m.layer());
    if (m.state() == "backward") backward_layers.insert(m.layer());
    if (m.state() == "forward" || m.state() == "backward") {
      EXPECT_EQ(m.num_layers(), 2);
    }
  }
  ASSERT_GE(states.size(), 5u);
  EXPECT_EQ(states.back(), "done");
  EXPECT_NE(std::find(states.begin(), states.end(), "started"), states.end());
  EXPECT_NE(std::find(states.begin(), states.end(), "optimizer"), states.end());
  // A slow reader may see only the latest of consecutive same-state events (they coalesce):
  // the last layer of the forward always arrives. SFT on the stream engine: the forward stops
  // below the top layer, whose forward runs inside its backward with the head (no "head"
  // state of its own; docs/architecture.md: Engines).
  ASSERT_FALSE(forward_layers.empty());
  EXPECT_EQ(*forward_layers.rbegin(), 0);
  EXPECT_EQ(std::find(states.begin(), states.end(), "head"), states.end());
  EXPECT_FALSE(backward_layers.empty());
  const auto& done = seen.back();
  EXPECT_TRUE(done.has_train_step());
  EXPECT_EQ(done.train_step().optim().step(), 2);
  EXPECT_GT(done.train_step().stats().tokens(), 0);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].elapsed_seconds(), seen[i - 1].elapsed_seconds());
}

TEST(StepProgress, AnErrorEndsTheStreamWithTheUnaryStatus) {
  auto s = testing::StartServer(TestConfig());
  Wire w(s.target);
  v1::TrainStepRequest r;
  r.mutable_batch()->mutable_sft()->add_examples()->add_tokens(999);  // outside the vocabulary
  auto ctx = Wire::ctx();
  auto reader = w.stub->TrainStepProgress(ctx.get(), r);
  v1::StepProgress p;
  EXPECT_FALSE(reader->Read(&p));
  auto st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("batch.sft.examples[0].tokens[0] = 999"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace streambp
