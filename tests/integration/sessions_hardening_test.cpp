// Sessions held to the hardening bar (issue 30): retried CreateSession / DeleteSession get
// their first answers; a session created again under a deleted one's name starts empty (no
// cached answers, no checkpoints of the old one); DeleteSession racing pushes and stats
// readers never takes the server down; /metrics serves per-session series; values that make
// a session's numbers NaN are refused at creation; concurrent clients of several sessions
// (pushes, steps, exports, create/delete, eviction) get every acknowledged group trained once.
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "streambp/lora.h"
#include "streambp/model.h"
#include "streambp/safetensors.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

server::ServerConfig Config(const std::string& dir) {
  auto c = testing::TestConfig();
  c.checkpoint_dir = dir;
  c.sessions.enabled = true;
  c.sessions.idle_seconds = 0;
  c.rollouts.groups_per_step = 2;
  return c;
}

struct Stub {
  std::unique_ptr<v1::Trainer::Stub> stub;
  explicit Stub(const std::string& target)
      : stub(v1::Trainer::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}
  static std::unique_ptr<grpc::ClientContext> ctx(int seconds = 60) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    return c;
  }
  static v1::CreateSessionRequest Lora(const std::string& name, const std::string& request_id = "") {
    v1::CreateSessionRequest r;
    r.set_name(name);
    r.set_request_id(request_id);
    r.mutable_lora()->set_r(2);
    r.mutable_training()->mutable_optimizer()->set_lr(1e-2);
    return r;
  }
  grpc::Status create(const v1::CreateSessionRequest& r, v1::SessionInfo* info = nullptr) const {
    v1::SessionInfo scratch;
    return stub->CreateSession(ctx().get(), r, info ? info : &scratch);
  }
  grpc::Status remove(const std::string& name, const std::string& request_id = "") const {
    v1::DeleteSessionRequest r;
    r.set_name(name);
    r.set_request_id(request_id);
    v1::DeleteSessionResponse out;
    return stub->DeleteSession(ctx().get(), r, &out);
  }
  grpc::Status train(const std::string& session, const std::string& request_id, v1::TrainStepResponse* out) const {
    v1::TrainStepRequest req;
    req.set_session(session);
    req.set_request_id(request_id);
    auto* ex = req.mutable_batch()->mutable_sft()->add_examples();
    for (int t = 0; t < 16; ++t) ex->add_tokens((t * 7 + 3) % 256);
    return stub->TrainStep(ctx().get(), req, out);
  }
  /// A push of one small group (4 prompt tokens, 2 completions of 4 tokens varying with k).
  static v1::PushRolloutsRequest Push(const std::string& session, int k, const std::string& group_id = "") {
    v1::PushRolloutsRequest req;
    req.set_session(session);
    auto* g = req.add_groups();
    g->set_group_id(group_id);
    for (int p = 0; p < 4; ++p) g->add_prompt(p + 1);
    for (int c = 0; c < 2; ++c) {
      auto* comp = g->add_completions();
      for (int q = 0; q < 4; ++q) comp->add_tokens((k + c + q) % 200 + 1);
      comp->set_reward(c);
    }
    return req;
  }
  int64_t version(const std::string& session) const {
    v1::GetSessionRequest r;
    r.set_name(session);
    v1::SessionInfo info;
    const auto st = stub->GetSession(ctx().get(), r, &info);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return info.policy_version();
  }
};

TEST(SessionsHardening, RetriedCreateAndDeleteGetTheirFirstAnswers) {
  auto s = testing::StartServer(Config(testing::TempDir("sh-retry")));
  Stub w(s.target);
  v1::SessionInfo first, again;
  ASSERT_TRUE(w.create(Stub::Lora("a", "create-1"), &first).ok());
  const auto retry = w.create(Stub::Lora("a", "create-1"), &again);
  ASSERT_TRUE(retry.ok()) << "a retried CreateSession: " << retry.error_message();
  EXPECT_EQ(again.name(), "a");
  EXPECT_EQ(again.trainable_parameters(), first.trainable_parameters());
  // The same name without the id (or with another id) is another request: ALREADY_EXISTS.
  EXPECT_EQ(w.create(Stub::Lora("a")).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  // The same id with another body is refused.
  auto other = Stub::Lora("a", "create-1");
  other.mutable_lora()->set_r(4);
  EXPECT_EQ(w.create(other).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(w.remove("a", "delete-1").ok());
  const auto deleted_again = w.remove("a", "delete-1");
  EXPECT_TRUE(deleted_again.ok()) << "a retried DeleteSession: " << deleted_again.error_message();
  EXPECT_EQ(w.remove("a").error_code(), grpc::StatusCode::NOT_FOUND);
  s.server->Shutdown();
}

TEST(SessionsHardening, ASessionCreatedAgainUnderADeletedNameStartsEmpty) {
  auto s = testing::StartServer(Config(testing::TempDir("sh-reincarnate")));
  Stub w(s.target);
  ASSERT_TRUE(w.create(Stub::Lora("t")).ok());
  v1::TrainStepResponse out;
  ASSERT_TRUE(w.train("t", "step-1", &out).ok());
  ASSERT_EQ(w.version("t"), 1);
  {
    v1::SaveCheckpointRequest r;
    r.set_session("t");
    r.set_name("mine");
    v1::SaveCheckpointResponse resp;
    ASSERT_TRUE(w.stub->SaveCheckpoint(Stub::ctx().get(), r, &resp).ok());
  }
  ASSERT_TRUE(w.remove("t").ok());
  ASSERT_TRUE(w.create(Stub::Lora("t")).ok());
  // The old session's cached answer must not reach the new one: the step trains.
  ASSERT_TRUE(w.train("t", "step-1", &out).ok());
  EXPECT_EQ(w.version("t"), 1) << "the step was answered from the deleted session's cache";
  // Nor do its checkpoints.
  v1::LoadCheckpointRequest load;
  load.set_session("t");
  v1::LoadCheckpointResponse loaded;
  const auto st = w.stub->LoadCheckpoint(Stub::ctx().get(), load, &loaded);
  EXPECT_FALSE(st.ok()) << "the new session loaded the deleted one's checkpoint " << loaded.name();
  s.server->Shutdown();
}

TEST(SessionsHardening, DeleteRacingPushesAndStatsReadersKeepsTheServerUp) {
  auto s = testing::StartServer(Config(testing::TempDir("sh-race")));
  Stub w(s.target);
  ASSERT_TRUE(w.create(Stub::Lora("steady")).ok());
  std::atomic<int64_t> steady_accepted{0};
  for (int cycle = 0; cycle < 4; ++cycle) {
    ASSERT_TRUE(w.create(Stub::Lora("doomed")).ok()) << "cycle " << cycle;
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        Stub own(s.target);
        for (int k = 0; !stop; ++k) {
          const auto req = Stub::Push(t == 0 ? "doomed" : "steady", k);
          v1::PushRolloutsResponse resp;
          const auto st = own.stub->PushRollouts(Stub::ctx().get(), req, &resp);
          if (t == 1 && st.ok() && resp.acks(0).status() == "accepted") ++steady_accepted;
        }
      });
    }
    threads.emplace_back([&] {
      Stub own(s.target);
      while (!stop) {
        v1::GetRolloutStatsRequest req;
        req.set_session("doomed");
        v1::RolloutStats stats;
        own.stub->GetRolloutStats(Stub::ctx().get(), req, &stats);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + 100 * cycle));
    ASSERT_TRUE(w.remove("doomed").ok()) << "cycle " << cycle;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop = true;
    for (auto& t : threads) t.join();
  }
  // The server is up, and the other session's groups were all trained (none lost or taken by
  // the deleted one).
  ASSERT_GT(steady_accepted.load(), 0);
  v1::GetRolloutStatsRequest req;
  req.set_session("steady");
  v1::RolloutStats stats;
  for (int k = 0; k < 600; ++k) {
    ASSERT_TRUE(w.stub->GetRolloutStats(Stub::ctx().get(), req, &stats).ok());
    if (stats.queue_depth() < 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // No acknowledged group of the steady session is trained twice or taken by the deleted one
  // (the rest are dropped as stale: the pushes claim policy version 0 while it moves on).
  EXPECT_EQ(stats.accepted(), steady_accepted.load());
  EXPECT_LE(stats.consumed() + stats.queue_depth(), steady_accepted.load()) << "a group was trained twice";
  EXPECT_GT(stats.consumed(), 0);
  s.server->Shutdown();
}

// Several clients for a bounded time: pushes with their own group ids to two steady sessions,
// SFT steps on one, adapter exports of the other, stats readers, and a third session created
// and deleted over and over — with one session resident at a time, so every switch writes a
// session out and reads one back. Afterwards the server is up, and for each steady session
// the counters account for every acknowledgement exactly once: what was acked "accepted" was
// counted accepted, and every accepted group was trained or is still queued (nothing stale:
// max_staleness is larger than the run's steps), none twice; the deleted session's groups
// never appear in theirs.
TEST(SessionsHardening, ConcurrentClientsTrainEveryAcknowledgedGroupExactlyOnce) {
  auto config = Config(testing::TempDir("sh-concurrency"));
  config.sessions.max_resident_sessions = 1;
  config.rollouts.max_staleness = 1000000;
  auto s = testing::StartServer(config);
  Stub w(s.target);
  const std::vector<std::string> steady = {"left", "right"};
  for (const auto& name : steady) ASSERT_TRUE(w.create(Stub::Lora(name)).ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> trained{0}, exported{0}, cycles{0};
  std::vector<std::atomic<int64_t>> acked(2);
  std::atomic<int64_t> other_acks{0};  // retry/duplicate/stale/invalid acks of the steady sessions
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {  // pushers: left, right, doomed
    threads.emplace_back([&, t] {
      Stub own(s.target);
      const std::string session = t < 2 ? steady[static_cast<size_t>(t)] : "doomed";
      for (int k = 0; !stop && k < 40; ++k) {  // a bounded backlog: the queue drains in seconds
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const auto req = Stub::Push(session, k, session + "-" + std::to_string(k));
        v1::PushRolloutsResponse resp;
        const auto st = own.stub->PushRollouts(Stub::ctx().get(), req, &resp);
        if (t == 2 || !st.ok()) continue;
        (resp.acks(0).status() == "accepted" ? acked[static_cast<size_t>(t)] : other_acks)++;
      }
    });
  }
  threads.emplace_back([&] {  // SFT steps on the left session
    Stub own(s.target);
    for (int k = 0; !stop; ++k) {
      v1::TrainStepResponse out;
      if (own.train("left", "", &out).ok()) ++trained;
    }
  });
  threads.emplace_back([&] {  // adapter exports of the right session, read to the end
    Stub own(s.target);
    while (!stop) {
      v1::ExportWeightsRequest req;
      req.set_session("right");
      auto ctx = Stub::ctx();
      auto reader = own.stub->ExportWeights(ctx.get(), req);
      v1::WeightsChunk chunk;
      while (reader->Read(&chunk)) {
      }
      if (reader->Finish().ok()) ++exported;
    }
  });
  threads.emplace_back([&] {  // the doomed session, created and deleted; stats of all three
    Stub own(s.target);
    while (!stop) {
      if (own.create(Stub::Lora("doomed")).ok()) ++cycles;
      for (const char* name : {"doomed", "left", "right"}) {
        v1::GetRolloutStatsRequest req;
        req.set_session(name);
        v1::RolloutStats stats;
        own.stub->GetRolloutStats(Stub::ctx().get(), req, &stats);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      own.remove("doomed");
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(4));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_GT(trained.load(), 0);
  EXPECT_GT(exported.load(), 0);
  EXPECT_GT(cycles.load(), 0);
  EXPECT_EQ(other_acks.load(), 0) << "a steady session's push was not accepted";
  for (size_t i = 0; i < steady.size(); ++i) {
    ASSERT_GT(acked[i].load(), 0) << steady[i];
    v1::GetRolloutStatsRequest req;
    req.set_session(steady[i]);
    v1::RolloutStats stats;
    for (int k = 0; k < 600; ++k) {  // the queue drains to less than one step's groups
      ASSERT_TRUE(w.stub->GetRolloutStats(Stub::ctx().get(), req, &stats).ok());
      // Every accepted group is consumed, queued or in the running step — at any moment.
      EXPECT_EQ(stats.consumed() + stats.queue_depth() + stats.in_step(), stats.accepted())
          << steady[i] << ": a group lost or trained twice";
      if (stats.queue_depth() < stats.groups_per_step() && stats.in_step() == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(stats.accepted(), acked[i].load()) << steady[i];
    EXPECT_EQ(stats.dropped_stale(), 0) << steady[i];
    EXPECT_EQ(stats.duplicates(), 0) << steady[i];
    EXPECT_EQ(stats.in_step(), 0) << steady[i];
    EXPECT_LT(stats.queue_depth(), stats.groups_per_step()) << steady[i];
  }
  s.server->Shutdown();
}

TEST(SessionsHardening, MetricsServeEverySessionWithItsLabel) {
  auto config = Config(testing::TempDir("sh-metrics"));
  config.metrics.listen = "127.0.0.1:0";
  auto s = testing::StartServer(config);
  Stub w(s.target);
  auto before = testing::HttpGet(s.server->metrics_port(), "/metrics");
  EXPECT_EQ(before.status, 200) << before.body.substr(0, 300);
  ASSERT_TRUE(w.create(Stub::Lora("red")).ok());
  ASSERT_TRUE(w.create(Stub::Lora("blue")).ok());
  v1::TrainStepResponse out;
  ASSERT_TRUE(w.train("red", "", &out).ok());
  auto r = testing::HttpGet(s.server->metrics_port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("streambp_policy_version{session=\"red\"} 1"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("streambp_policy_version{session=\"blue\"} 0"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("streambp_rollouts_accepted_total{session=\"blue\"} 0"), std::string::npos);
  EXPECT_NE(r.body.find("streambp_sessions{state=\"resident\"} 2"), std::string::npos) << r.body;
  s.server->Shutdown();
}

TEST(SessionsHardening, ValuesThatMakeASessionNaNAreRefused) {
  auto s = testing::StartServer(Config(testing::TempDir("sh-nan")));
  Stub w(s.target);
  auto eps = Stub::Lora("eps");
  eps.mutable_training()->mutable_optimizer()->set_name("adamw");
  eps.mutable_training()->mutable_optimizer()->set_eps(0);
  auto st = w.create(eps);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("optimizer.eps"), std::string::npos) << st.error_message();

  auto alpha = Stub::Lora("alpha");
  alpha.mutable_lora()->set_alpha(1e308);
  st = w.create(alpha);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("lora_alpha"), std::string::npos) << st.error_message();

  // An uploaded adapter with a NaN in it.
  LoraConfig lc;
  lc.r = 2;
  lc.target_modules = {"q_proj"};
  auto adapter = LoraAdapter::Create(PresetConfig("tiny"), lc, torch::kFloat64, torch::kCPU);
  TensorMap tensors;
  for (const auto& [name, p] : adapter->named_parameters()) tensors[LoraAdapter::PeftName(name)] = p.detach().clone();
  tensors.begin()->second.view({-1})[0] = std::nan("");
  v1::CreateSessionRequest up;
  up.set_name("uploaded");
  up.mutable_adapter()->set_adapter_config_json(lc.ToPeftJson().dump());
  up.mutable_adapter()->set_adapter_model_safetensors(SerializeSafetensors(tensors));
  st = w.create(up);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("non-finite"), std::string::npos) << st.error_message();
  v1::ListSessionsRequest list;
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(w.stub->ListSessions(Stub::ctx().get(), list, &sessions).ok());
  EXPECT_EQ(sessions.sessions_size(), 0) << "a refused session was left behind";
  s.server->Shutdown();
}

}  // namespace
}  // namespace streambp
