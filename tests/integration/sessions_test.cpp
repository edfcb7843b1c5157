// Sessions over the wire (issue 15): many tenants, each with its own adapter, on one frozen
// base. Isolation (concurrent == alone, bit for bit), fairness, eviction to disk and back
// (bit-exact, across a restart), scoped tokens, PEFT export.
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "device_worker.h"
#include "host.h"
#include "integration/server_fixture.h"
#include "streambp/model.h"
#include "streambp/safetensors.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::TestConfig;

server::ServerConfig SessionConfig(const std::string& dir, int64_t max_resident = 8) {
  auto c = TestConfig();
  c.checkpoint_dir = dir;
  c.sessions.enabled = true;
  c.sessions.max_resident_sessions = max_resident;
  c.sessions.idle_seconds = 0;
  return c;
}

struct Wire {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Trainer::Stub> stub;
  std::string token;
  explicit Wire(const std::string& target, std::string t = "")
      : channel(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        stub(v1::Trainer::NewStub(channel)),
        token(std::move(t)) {}
  std::unique_ptr<grpc::ClientContext> ctx(int seconds = 120) const {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    return c;
  }
  grpc::Status create(const std::string& name, int r, uint64_t seed, double lr = 1e-2) const {
    v1::CreateSessionRequest req;
    req.set_name(name);
    req.mutable_lora()->set_r(r);
    req.mutable_lora()->set_seed(seed);
    req.mutable_training()->mutable_optimizer()->set_lr(lr);
    v1::SessionInfo info;
    return stub->CreateSession(ctx().get(), req, &info);
  }
  v1::TrainStepResponse train(const std::string& session, int seed, grpc::Status* status = nullptr) const {
    v1::TrainStepRequest req;
    req.set_session(session);
    auto* ex = req.mutable_batch()->mutable_sft()->add_examples();
    for (int t = 0; t < 24; ++t) ex->add_tokens((seed * 31 + t * 7) % 256);
    v1::TrainStepResponse out;
    auto st = stub->TrainStep(ctx().get(), req, &out);
    if (status) *status = st;
    EXPECT_TRUE(st.ok() || status) << session << ": " << st.error_message();
    return out;
  }
  // The exported file of a session: {format, bytes}.
  std::pair<std::string, std::string> export_weights(const std::string& session, bool merged = false,
                                                     grpc::Status* status = nullptr) const {
    v1::ExportWeightsRequest req;
    req.set_session(session);
    req.set_merged(merged);
    auto c = ctx();
    auto reader = stub->ExportWeights(c.get(), req);
    v1::WeightsChunk chunk;
    std::string bytes, format;
    while (reader->Read(&chunk)) {
      if (chunk.offset() == 0) format = chunk.format();
      bytes += chunk.data();
    }
    auto st = reader->Finish();
    if (status) *status = st;
    EXPECT_TRUE(st.ok() || status) << st.error_message();
    return {format, bytes};
  }
};

TensorMap Tensors(const std::string& bytes) { return ParseSafetensors(bytes, "export").tensors; }

void ExpectSame(const TensorMap& a, const TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
}

TEST(Sessions, ThreeConcurrentSessionsEndAsEachTrainedAlone) {
  const std::vector<std::string> names = {"alpha", "beta", "gamma"};
  auto s = testing::StartServer(SessionConfig(testing::TempDir("sessions-iso")));
  Wire wire(s.target);
  for (size_t i = 0; i < names.size(); ++i) ASSERT_TRUE(wire.create(names[i], 4, 10 + i).ok());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < names.size(); ++i) {
    clients.emplace_back([&, i] {
      Wire own(s.target);
      for (int step = 0; step < 20; ++step) own.train(names[i], static_cast<int>(100 * i + step));
    });
  }
  for (auto& c : clients) c.join();
  std::vector<TensorMap> together;
  for (const auto& n : names) {
    auto [format, bytes] = wire.export_weights(n);
    EXPECT_EQ(format, "peft_adapter");
    together.push_back(Tensors(bytes));
    EXPECT_TRUE(together.back().count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  }
  // The base is untouched: a fresh adapter (B = 0) merged is the base, bit for bit.
  ASSERT_TRUE(wire.create("probe", 1, 0).ok());
  auto [merged_format, merged] = wire.export_weights("probe", /*merged=*/true);
  EXPECT_EQ(merged_format, "model");
  ExpectSame(Tensors(merged), InitModel(PresetConfig("tiny"), 0, torch::kFloat64)->hf_tensors());

  for (size_t i = 0; i < names.size(); ++i) {
    auto alone = testing::StartServer(SessionConfig(testing::TempDir("sessions-alone-" + names[i])));
    Wire w(alone.target);
    ASSERT_TRUE(w.create(names[i], 4, 10 + i).ok());
    for (int step = 0; step < 20; ++step) w.train(names[i], static_cast<int>(100 * i + step));
    ExpectSame(Tensors(w.export_weights(names[i]).second), together[i]);
  }
}

TEST(Sessions, AFloodedSessionDoesNotStarveAnother) {
  auto s = testing::StartServer(SessionConfig(testing::TempDir("sessions-fair")));
  Wire wire(s.target);
  ASSERT_TRUE(wire.create("flood", 4, 1).ok());
  ASSERT_TRUE(wire.create("quiet", 4, 2).ok());
  std::atomic<bool> stop{false};
  std::vector<double> flood_seconds;
  std::mutex m;
  std::vector<std::thread> flooders;
  for (int t = 0; t < 8; ++t) {  // 8 of its steps wait at any time: FIFO would make the quiet one wait 8
    flooders.emplace_back([&, t] {
      Wire own(s.target);
      while (!stop) {
        grpc::Status st;
        auto r = own.train("flood", t, &st);
        if (st.ok()) {
          std::lock_guard<std::mutex> lock(m);
          flood_seconds.push_back(r.stats().seconds());
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the flood's queue fills
  std::vector<double> waits;
  for (int i = 0; i < 12; ++i) waits.push_back(wire.train("quiet", i).stats().queue_seconds());
  stop = true;
  for (auto& f : flooders) f.join();
  std::sort(waits.begin(), waits.end());
  std::sort(flood_seconds.begin(), flood_seconds.end());
  ASSERT_FALSE(flood_seconds.empty());
  const double flood_step = flood_seconds[flood_seconds.size() / 2];
  const double worst_wait = waits.back();
  std::printf("quiet session: worst queue wait %.4f s over %zu steps; the flooding session's median step %.4f s "
              "(%.2f steps)\n",
              worst_wait, waits.size(), flood_step, worst_wait / flood_step);
  // Round-robin: about one of the flood's steps (it may have just started), never its queue.
  EXPECT_LE(worst_wait, 3 * flood_step + 0.05);
}

TEST(Sessions, EvictedSessionsComeBackBitExactAndSurviveARestart) {
  const std::vector<std::string> names = {"s0", "s1", "s2", "s3"};
  auto run = [&](int64_t max_resident, const std::string& dir) {
    auto s = testing::StartServer(SessionConfig(dir, max_resident));
    Wire wire(s.target);
    for (size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(wire.create(names[i], 2, i).ok());
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < names.size(); ++i) wire.train(names[i], round * 10 + static_cast<int>(i));
    }
    std::vector<TensorMap> out;
    for (const auto& n : names) out.push_back(Tensors(wire.export_weights(n).second));
    v1::ListSessionsResponse list;
    EXPECT_TRUE(wire.stub->ListSessions(wire.ctx().get(), v1::ListSessionsRequest(), &list).ok());
    int resident = 0;
    for (const auto& info : list.sessions()) resident += info.resident();
    EXPECT_LE(resident, max_resident);
    return out;
  };
  const auto dir = testing::TempDir("sessions-evict");
  const auto two = run(2, dir);
  const auto four = run(4, testing::TempDir("sessions-resident"));
  for (size_t i = 0; i < names.size(); ++i) ExpectSame(two[i], four[i]);

  // A restart finds every session on disk, as it was.
  auto s = testing::StartServer(SessionConfig(dir, 2));
  Wire wire(s.target);
  v1::ListSessionsResponse list;
  ASSERT_TRUE(wire.stub->ListSessions(wire.ctx().get(), v1::ListSessionsRequest(), &list).ok());
  ASSERT_EQ(list.sessions_size(), 4);
  for (size_t i = 0; i < names.size(); ++i) {
    ExpectSame(Tensors(wire.export_weights(names[i]).second), two[i]);
    v1::GetSessionRequest get;
    get.set_name(names[i]);
    v1::SessionInfo info;
    ASSERT_TRUE(wire.stub->GetSession(wire.ctx().get(), get, &info).ok());
    EXPECT_EQ(info.step(), 3);
  }
  EXPECT_EQ(wire.train("s1", 99).optim().step(), 4);
}

TEST(Sessions, AScopedTokenCannotTouchAnotherTenantsSession) {
  auto config = SessionConfig(testing::TempDir("sessions-auth"));
  const std::string admin = "admin-token-0123456789", alice = "alice-token-0123456789";
  config.auth.tokens = {admin};
  server::ScopedToken scoped;
  scoped.token = alice;
  scoped.sessions = {"alice-*"};
  scoped.create = true;
  config.auth.scoped_tokens = {scoped};
  auto s = testing::StartServer(config);
  Wire root(s.target, admin), a(s.target, alice);
  ASSERT_TRUE(root.create("bob-main", 2, 1).ok());
  ASSERT_TRUE(a.create("alice-main", 2, 2).ok());
  EXPECT_EQ(a.create("bob-two", 2, 3).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  root.train("bob-main", 1);
  const auto bob_before = Tensors(root.export_weights("bob-main").second);

  std::vector<std::pair<std::string, grpc::StatusCode>> results;
  grpc::Status st;
  a.train("bob-main", 1, &st);
  results.emplace_back("TrainStep", st.error_code());
  a.export_weights("bob-main", false, &st);
  results.emplace_back("ExportWeights", st.error_code());
  {
    v1::SampleRequest r;
    r.set_session("bob-main");
    r.add_prompts()->add_tokens(1);
    r.set_max_tokens(2);
    v1::SampleResponse out;
    results.emplace_back("Sample", a.stub->Sample(a.ctx().get(), r, &out).error_code());
  }
  {
    v1::ComputeLogprobsRequest r;
    r.set_session("bob-main");
    auto* seq = r.add_sequences();
    for (int t : {1, 2, 3}) seq->add_tokens(t);
    v1::ComputeLogprobsResponse out;
    results.emplace_back("ComputeLogprobs", a.stub->ComputeLogprobs(a.ctx().get(), r, &out).error_code());
  }
  {
    v1::SaveCheckpointRequest r;
    r.set_session("bob-main");
    v1::SaveCheckpointResponse out;
    results.emplace_back("SaveCheckpoint", a.stub->SaveCheckpoint(a.ctx().get(), r, &out).error_code());
  }
  {
    v1::GetSessionRequest r;
    r.set_name("bob-main");
    v1::SessionInfo out;
    results.emplace_back("GetSession", a.stub->GetSession(a.ctx().get(), r, &out).error_code());
  }
  {
    v1::DeleteSessionRequest r;
    r.set_name("bob-main");
    v1::DeleteSessionResponse out;
    results.emplace_back("DeleteSession", a.stub->DeleteSession(a.ctx().get(), r, &out).error_code());
  }
  {
    v1::PushRolloutsRequest r;
    r.set_session("bob-main");
    auto* g = r.add_groups();
    g->add_prompt(1);
    g->add_completions()->add_tokens(2);
    v1::PushRolloutsResponse out;
    results.emplace_back("PushRollouts", a.stub->PushRollouts(a.ctx().get(), r, &out).error_code());
  }
  {
    v1::WatchPolicyRequest r;
    r.set_session("bob-main");
    auto c = a.ctx(5);
    auto reader = a.stub->WatchPolicy(c.get(), r);
    v1::PolicyUpdate u;
    EXPECT_FALSE(reader->Read(&u));
    results.emplace_back("WatchPolicy", reader->Finish().error_code());
  }
  for (const auto& [method, code] : results) EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND) << method;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(a.stub->ListSessions(a.ctx().get(), v1::ListSessionsRequest(), &list).ok());
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).name(), "alice-main");
  ExpectSame(Tensors(root.export_weights("bob-main").second), bob_before);
  EXPECT_EQ(a.train("alice-main", 1).optim().step(), 1);
}

TEST(Sessions, PerSessionDeviceBytesAndLimits) {
  auto config = SessionConfig(testing::TempDir("sessions-bytes"), 16);
  config.sessions.max_sessions = 17;
  config.sessions.max_lora_rank = 16;
  auto s = testing::StartServer(config);
  Wire wire(s.target);
  int64_t one = 0, sixteen = 0;
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(wire.create("r16-" + std::to_string(i), 16, i).ok());
    wire.train("r16-" + std::to_string(i), i);  // gradients and optimizer state exist
    v1::ListSessionsResponse list;
    ASSERT_TRUE(wire.stub->ListSessions(wire.ctx().get(), v1::ListSessionsRequest(), &list).ok());
    int64_t total = 0;
    for (const auto& info : list.sessions()) total += info.device_bytes();
    if (i == 0) one = total;
    if (i == 15) sixteen = total;
  }
  std::printf("LoRA r16 sessions on the tiny preset (float64): 1 resident = %lld bytes, 16 resident = %lld bytes "
              "(%.1f KiB per session)\n",
              (long long)one, (long long)sixteen, sixteen / 16.0 / 1024);
  EXPECT_EQ(sixteen, 16 * one);
  EXPECT_EQ(wire.create("too-large", 32, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(wire.create("last", 1, 0).ok());
  EXPECT_EQ(wire.create("one-too-many", 1, 0).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(wire.create("last", 1, 0).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(wire.create("../etc", 1, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A call without a session on a server of sessions names the problem.
  grpc::Status st;
  wire.train("", 0, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("name one"), std::string::npos) << st.error_message();
  v1::DeleteSessionRequest del;
  del.set_name("last");
  v1::DeleteSessionResponse deleted;
  ASSERT_TRUE(wire.stub->DeleteSession(wire.ctx().get(), del, &deleted).ok());
  wire.train("last", 0, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace streambp
