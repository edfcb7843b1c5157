// The RL loop over the wire: Sample, PushRollouts (unary and stream), server-side steps,
// staleness, idempotent group ids, bad pushes, WatchPolicy.
#include <thread>

#include <gtest/gtest.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>

#include "integration/server_fixture.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "device_worker.h"

namespace streambp {
namespace {

using testing::StartServer;
using testing::TestConfig;

struct Rpc {
  std::unique_ptr<v1::Trainer::Stub> stub;
  explicit Rpc(const std::string& target)
      : stub(v1::Trainer::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}
  static std::unique_ptr<grpc::ClientContext> Ctx(int seconds = 60) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    return c;
  }
  v1::SampleResponse Sample(const v1::SampleRequest& r) {
    v1::SampleResponse out;
    auto st = stub->Sample(Ctx().get(), r, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return out;
  }
  v1::PushRolloutsResponse Push(const v1::PushRolloutsRequest& r) {
    v1::PushRolloutsResponse out;
    auto st = stub->PushRollouts(Ctx().get(), r, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return out;
  }
  v1::RolloutStats Stats() {
    v1::RolloutStats out;
    EXPECT_TRUE(stub->GetRolloutStats(Ctx().get(), v1::GetRolloutStatsRequest(), &out).ok());
    return out;
  }
};

v1::SampleRequest SampleReq(int n, int max_tokens, uint64_t seed) {
  v1::SampleRequest r;
  for (auto prompt : {std::vector<int>{1, 2, 3}, std::vector<int>{4, 5, 6, 7, 8}}) {
    r.add_prompts()->mutable_tokens()->Add(prompt.begin(), prompt.end());
  }
  r.set_n(n);
  r.set_max_tokens(max_tokens);
  r.set_seed(seed);
  r.set_ignore_eos(true);  // the preset's eos id (2) would end some completions early
  return r;
}

// A group from sampled completions with rewards from the completion itself.
v1::RolloutGroup GroupFrom(const v1::SampleResponse& s, int prompt_index, const std::vector<int>& prompt) {
  v1::RolloutGroup g;
  g.mutable_prompt()->Add(prompt.begin(), prompt.end());
  g.set_policy_version(s.policy_version());
  for (const auto& c : s.completions()) {
    if (c.prompt_index() != prompt_index) continue;
    auto* out = g.add_completions();
    *out->mutable_tokens() = c.tokens();
    *out->mutable_logprobs() = c.logprobs();
    double even = 0;
    for (int t : c.tokens()) even += t % 2 == 0;
    out->set_reward(even / c.tokens_size());
  }
  return g;
}

TEST(Rl, SampleLogprobsEqualComputeLogprobsAndSeedsRepeat) {
  auto config = TestConfig();
  config.model.dtype = "float32";
  auto s = StartServer(config);
  Rpc rpc(s.target);
  auto a = rpc.Sample(SampleReq(3, 12, 42));
  auto b = rpc.Sample(SampleReq(3, 12, 42));
  auto c = rpc.Sample(SampleReq(3, 12, 43));
  ASSERT_EQ(a.completions_size(), 6);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(a, b));
  EXPECT_FALSE(google::protobuf::util::MessageDifferencer::Equals(a, c));
  v1::ComputeLogprobsRequest lp;
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8}};
  for (const auto& comp : a.completions()) {
    EXPECT_EQ(comp.tokens_size(), 12);
    EXPECT_EQ(comp.finish_reason(), "length");
    for (int t : comp.tokens()) EXPECT_TRUE(t >= 0 && t < 256);
    auto* seq = lp.add_sequences();
    const auto& p = prompts[comp.prompt_index()];
    seq->mutable_tokens()->Add(p.begin(), p.end());
    seq->mutable_tokens()->MergeFrom(comp.tokens());
  }
  auto logprobs = s.client->ComputeLogprobs(lp);
  ASSERT_TRUE(logprobs.ok());
  for (int i = 0; i < a.completions_size(); ++i) {
    const auto& comp = a.completions(i);
    const int plen = static_cast<int>(prompts[comp.prompt_index()].size());
    for (int t = 0; t < comp.tokens_size(); ++t) {
      EXPECT_NEAR(comp.logprobs(t), logprobs->sequences(i).logprobs(plen - 1 + t), 1e-5) << i << " " << t;
    }
  }
  // Stop tokens end a completion after producing one.
  auto greedy = SampleReq(1, 20, 1);
  greedy.set_temperature(0);
  auto g = rpc.Sample(greedy);
  auto stop = greedy;
  stop.add_stop_tokens(g.completions(0).tokens(2));
  auto stopped = rpc.Sample(stop);
  EXPECT_EQ(stopped.completions(0).finish_reason(), "stop");
  EXPECT_LE(stopped.completions(0).tokens_size(), 3);
}

TEST(Rl, PushedGroupsTrainExactlyWhenAStepIsFull) {
  auto config = TestConfig();
  config.model.dtype = "float32";
  config.rollouts.groups_per_step = 3;
  config.rollouts.max_staleness = 0;
  auto s = StartServer(config);
  Rpc rpc(s.target);
  auto sample = rpc.Sample(SampleReq(4, 6, 7));
  auto group = GroupFrom(sample, 0, {1, 2, 3});
  v1::PushRolloutsRequest push;
  for (int i = 0; i < 2; ++i) {
    auto g = group;
    g.set_group_id("g" + std::to_string(i));
    *push.add_groups() = g;
  }
  auto acks = rpc.Push(push);
  ASSERT_EQ(acks.acks_size(), 2);
  EXPECT_EQ(acks.acks(0).status(), "accepted");
  EXPECT_EQ(rpc.Stats().steps_run(), 0);  // 2 of 3: no step yet
  // A repeated id is acknowledged as a duplicate and never trained twice.
  v1::PushRolloutsRequest again;
  *again.add_groups() = push.groups(0);
  EXPECT_EQ(rpc.Push(again).acks(0).status(), "duplicate");
  EXPECT_EQ(rpc.Stats().queue_depth(), 2);
  // Bad groups get a per-group error; the good one in the same request is accepted.
  v1::PushRolloutsRequest mixed;
  auto nan_reward = group;
  nan_reward.set_group_id("nan");
  nan_reward.mutable_completions(0)->set_reward(NAN);
  auto short_logprobs = group;
  short_logprobs.set_group_id("short");
  short_logprobs.mutable_completions(1)->mutable_logprobs()->RemoveLast();
  auto future = group;
  future.set_group_id("future");
  future.set_policy_version(99);
  v1::RolloutGroup empty;
  empty.add_prompt(1);
  auto good = group;
  good.set_group_id("g2");
  for (const auto& g : {nan_reward, short_logprobs, future, empty, good}) *mixed.add_groups() = g;
  auto mixed_acks = rpc.Push(mixed);
  ASSERT_EQ(mixed_acks.acks_size(), 5);
  EXPECT_EQ(mixed_acks.acks(0).status(), "invalid");
  EXPECT_NE(mixed_acks.acks(0).message().find("reward is not finite"), std::string::npos) << mixed_acks.acks(0).message();
  EXPECT_NE(mixed_acks.acks(1).message().find("logprobs has"), std::string::npos) << mixed_acks.acks(1).message();
  EXPECT_NE(mixed_acks.acks(2).message().find("from the future"), std::string::npos) << mixed_acks.acks(2).message();
  EXPECT_NE(mixed_acks.acks(3).message().find("completions is empty"), std::string::npos) << mixed_acks.acks(3).message();
  EXPECT_EQ(mixed_acks.acks(4).status(), "accepted");
  // The third good group completes a step.
  ASSERT_TRUE(s.server->worker().wait_idle(std::chrono::seconds(30)));
  auto stats = rpc.Stats();
  EXPECT_EQ(stats.steps_run(), 1);
  EXPECT_EQ(stats.consumed(), 3);
  EXPECT_EQ(stats.invalid(), 4);
  EXPECT_EQ(stats.policy_version(), 1);
  // A group sampled by version 0 is now stale (max_staleness 0) and is dropped.
  auto stale = group;
  stale.set_group_id("late");
  v1::PushRolloutsRequest late;
  *late.add_groups() = stale;
  auto late_ack = rpc.Push(late);
  EXPECT_EQ(late_ack.acks(0).status(), "stale");
  EXPECT_EQ(rpc.Stats().dropped_stale(), 1);
}

TEST(Rl, StreamPushAndWatchPolicy) {
  auto config = TestConfig();
  config.model.dtype = "float32";
  config.rollouts.groups_per_step = 2;
  auto s = StartServer(config);
  Rpc rpc(s.target);
  // A watcher from version 0 sees the start and then every new version.
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::WatchPolicyRequest wreq;
  auto reader = rpc.stub->WatchPolicy(&watch_ctx, wreq);
  v1::PolicyUpdate first;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_EQ(first.policy_version(), 0);
  auto sample = rpc.Sample(SampleReq(4, 6, 3));
  grpc::ClientContext push_ctx;
  push_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = rpc.stub->PushRolloutsStream(&push_ctx);
  for (int i = 0; i < 4; ++i) {
    auto g = GroupFrom(sample, i % 2, i % 2 ? std::vector<int>{4, 5, 6, 7, 8} : std::vector<int>{1, 2, 3});
    g.set_group_id("s" + std::to_string(i));
    ASSERT_TRUE(stream->Write(g));
    v1::RolloutAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    EXPECT_EQ(ack.index(), i);
    EXPECT_EQ(ack.status(), "accepted") << ack.message();
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  for (int v = 1; v <= 2; ++v) {
    v1::PolicyUpdate u;
    ASSERT_TRUE(reader->Read(&u));
    EXPECT_EQ(u.policy_version(), v);
    EXPECT_EQ(u.source(), "rollouts");
    EXPECT_EQ(u.groups_consumed(), 2);
    EXPECT_GT(u.tokens(), 0);
    EXPECT_TRUE(u.metrics().count("reward_mean"));
  }
  watch_ctx.TryCancel();
  // ExportWeights says when the asked version is not the one served.
  v1::ExportWeightsRequest old;
  old.set_version(1);
  grpc::ClientContext ectx;
  auto chunks = rpc.stub->ExportWeights(&ectx, old);
  v1::WeightsChunk chunk;
  ASSERT_TRUE(chunks->Read(&chunk));
  EXPECT_NE(chunk.note().find("version 1 is not available"), std::string::npos) << chunk.note();
  EXPECT_EQ(chunk.policy_version(), 2);
  while (chunks->Read(&chunk)) {
  }
}

}  // namespace
}  // namespace streambp
