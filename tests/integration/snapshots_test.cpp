// Sampler snapshots over the wire (issue 28 item 3): SaveWeightsForSampler freezes a session's
// adapter; Sample, ComputeLogprobs and ExportWeights target it while the session trains on.
// A snapshot samples the same before and after its session trains, equals a fresh server
// started from its exported adapter, survives a restart, and every bad request is refused
// with nothing changed.
#include <filesystem>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "integration/wire.h"
#include "streambp/safetensors.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;
using testing::Wire;

server::ServerConfig SnapshotConfig(const std::string& dir) {
  auto c = testing::TestConfig();
  c.checkpoint_dir = dir;
  c.sessions.enabled = true;
  c.sessions.idle_seconds = 0;
  c.sessions.max_resident_sessions = 1;  // snapshots and sessions take turns in memory
  return c;
}

grpc::Status Create(const Wire& w, const std::string& name, uint64_t seed) {
  v1::CreateSessionRequest req;
  req.set_name(name);
  req.mutable_lora()->set_r(4);
  req.mutable_lora()->set_seed(seed);
  req.mutable_training()->mutable_optimizer()->set_lr(0.05);
  v1::SessionInfo info;
  return w.stub->CreateSession(Wire::ctx().get(), req, &info);
}

void Train(const Wire& w, const std::string& session, int seed) {
  v1::TrainStepRequest req;
  req.set_session(session);
  auto* ex = req.mutable_batch()->mutable_sft()->add_examples();
  for (int t = 0; t < 20; ++t) ex->add_tokens((seed * 37 + t * 11) % 256);
  v1::TrainStepResponse out;
  auto st = w.stub->TrainStep(Wire::ctx().get(), req, &out);
  ASSERT_TRUE(st.ok()) << st.error_message();
}

grpc::Status Save(const Wire& w, const std::string& session, const std::string& name, v1::SnapshotInfo* info = nullptr,
                  double ttl = 0, bool replace_oldest = false) {
  v1::SaveWeightsForSamplerRequest req;
  req.set_session(session);
  req.set_name(name);
  req.set_ttl_seconds(ttl);
  req.set_replace_oldest(replace_oldest);
  v1::SnapshotInfo ignored;
  return w.stub->SaveWeightsForSampler(Wire::ctx().get(), req, info ? info : &ignored);
}

grpc::Status Delete(const Wire& w, const std::string& session, const std::string& name) {
  v1::DeleteSnapshotRequest req;
  req.set_session(session);
  req.set_name(name);
  v1::DeleteSnapshotResponse out;
  return w.stub->DeleteSnapshot(Wire::ctx().get(), req, &out);
}

std::vector<std::string> Listed(const Wire& w, const std::string& session) {
  v1::ListSnapshotsRequest req;
  req.set_session(session);
  v1::ListSnapshotsResponse out;
  auto st = w.stub->ListSnapshots(Wire::ctx().get(), req, &out);
  EXPECT_TRUE(st.ok()) << st.error_message();
  std::vector<std::string> names;
  for (const auto& s : out.snapshots()) names.push_back(s.name());
  return names;
}

// Three completions of two prompts at a fixed seed: {tokens, log-probs} of each, and the version.
struct Samples {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  int64_t policy_version = -1;
};

grpc::Status Sample(const Wire& w, const std::string& session, const std::string& snapshot, Samples* out) {
  v1::SampleRequest req;
  req.set_session(session);
  req.set_snapshot(snapshot);
  for (const auto& p : {std::vector<int>{5, 6, 7}, std::vector<int>{40, 41}}) {
    auto* seq = req.add_prompts();
    for (int t : p) seq->add_tokens(t);
  }
  req.set_n(3);
  req.set_max_tokens(6);
  req.set_seed(7);
  req.set_ignore_eos(true);
  v1::SampleResponse r;
  auto st = w.stub->Sample(Wire::ctx().get(), req, &r);
  if (!st.ok()) return st;
  for (const auto& c : r.completions()) {
    out->tokens.emplace_back(c.tokens().begin(), c.tokens().end());
    out->logprobs.emplace_back(c.logprobs().begin(), c.logprobs().end());
  }
  out->policy_version = r.policy_version();
  return st;
}

Samples MustSample(const Wire& w, const std::string& session, const std::string& snapshot) {
  Samples s;
  auto st = Sample(w, session, snapshot, &s);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return s;
}

std::vector<double> Logprobs(const Wire& w, const std::string& session, const std::string& snapshot) {
  v1::ComputeLogprobsRequest req;
  req.set_session(session);
  req.set_snapshot(snapshot);
  req.set_fp64(true);
  auto* sequence = req.add_sequences();
  for (int t : {3, 9, 27, 81, 243, 217}) sequence->add_tokens(t);
  v1::ComputeLogprobsResponse r;
  auto st = w.stub->ComputeLogprobs(Wire::ctx().get(), req, &r);
  EXPECT_TRUE(st.ok()) << st.error_message();
  if (!st.ok()) return {};
  return {r.sequences(0).logprobs_fp64().begin(), r.sequences(0).logprobs_fp64().end()};
}

// ExportWeights of a session or one of its snapshots: {adapter_config.json, adapter file}.
std::pair<std::string, std::string> Export(const Wire& w, const std::string& session, const std::string& snapshot,
                                           grpc::Status* status = nullptr) {
  v1::ExportWeightsRequest req;
  req.set_session(session);
  req.set_snapshot(snapshot);
  auto c = Wire::ctx();
  auto reader = w.stub->ExportWeights(c.get(), req);
  v1::WeightsChunk chunk;
  std::string config, bytes;
  while (reader->Read(&chunk)) {
    if (chunk.offset() == 0 && chunk.file().empty()) config = chunk.config_json();
    if (chunk.file().empty()) bytes += chunk.data();
  }
  auto st = reader->Finish();
  if (status) *status = st;
  EXPECT_TRUE(st.ok() || status) << st.error_message();
  return {config, bytes};
}

void ExpectSameSamples(const Samples& a, const Samples& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.logprobs, b.logprobs) << what;
}

size_t Folders(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_directory() && e.path().filename().string()[0] != '.';
  return n;
}

TEST(Snapshots, FrozenWhileTheSessionTrainsEqualToAFreshServerAndKeptAcrossARestart) {
  const auto dir = testing::TempDir("snapshots-frozen");
  Samples first;
  std::vector<double> first_lp;
  std::pair<std::string, std::string> adapter;
  {
    auto s = testing::StartServer(SnapshotConfig(dir));
    Wire w(s.target);
    ASSERT_TRUE(Create(w, "alice", 1).ok());
    for (int step = 0; step < 2; ++step) Train(w, "alice", step);
    v1::SnapshotInfo info;
    auto st = Save(w, "alice", "v2", &info);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(info.session(), "alice");
    EXPECT_EQ(info.name(), "v2");
    EXPECT_EQ(info.step(), 2);
    EXPECT_EQ(info.policy_version(), 2);
    EXPECT_GT(info.bytes(), 0);
    EXPECT_EQ(info.expires_unix(), 0);
    EXPECT_TRUE(fs::exists(fs::path(dir) / ".sessions" / "alice" / "snapshots" / "v2" / "snapshot.json"));

    first = MustSample(w, "alice", "v2");
    first_lp = Logprobs(w, "alice", "v2");
    ASSERT_EQ(first.tokens.size(), 6u);
    EXPECT_EQ(first.policy_version, 2);
    ExpectSameSamples(MustSample(w, "alice", ""), first, "the snapshot samples as its session did when saved");

    for (int step = 2; step < 5; ++step) Train(w, "alice", step);
    const auto again = MustSample(w, "alice", "v2");
    ExpectSameSamples(again, first, "frozen: the same after the session trained 3 more steps");
    EXPECT_EQ(again.policy_version, 2);
    EXPECT_EQ(Logprobs(w, "alice", "v2"), first_lp);
    EXPECT_NE(Logprobs(w, "alice", ""), first_lp) << "the session moved on";
    EXPECT_EQ(MustSample(w, "alice", "").policy_version, 5);

    adapter = Export(w, "alice", "v2");
    EXPECT_NE(Export(w, "alice", "").second, adapter.second) << "the session's adapter moved on";
    EXPECT_EQ(Listed(w, "alice"), std::vector<std::string>{"v2"});
    v1::ListSessionsResponse sessions;
    ASSERT_TRUE(w.stub->ListSessions(Wire::ctx().get(), v1::ListSessionsRequest(), &sessions).ok());
    EXPECT_EQ(sessions.sessions_size(), 1) << "a snapshot is not a session";
  }
  {
    // A fresh server started from the exported adapter samples and scores the same.
    auto fresh = testing::StartServer(SnapshotConfig(testing::TempDir("snapshots-fresh")));
    Wire w(fresh.target);
    v1::CreateSessionRequest req;
    req.set_name("from-adapter");
    req.mutable_adapter()->set_adapter_config_json(adapter.first);
    req.mutable_adapter()->set_adapter_model_safetensors(adapter.second);
    v1::SessionInfo info;
    auto st = w.stub->CreateSession(Wire::ctx().get(), req, &info);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ExpectSameSamples(MustSample(w, "from-adapter", ""), first, "a fresh server from the exported adapter");
    const auto lp = Logprobs(w, "from-adapter", "");
    ASSERT_EQ(lp.size(), first_lp.size());
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], first_lp[i], 1e-12) << i;
  }
  // A restart finds the snapshot on disk, as it was.
  auto s = testing::StartServer(SnapshotConfig(dir));
  Wire w(s.target);
  EXPECT_EQ(Listed(w, "alice"), std::vector<std::string>{"v2"});
  ExpectSameSamples(MustSample(w, "alice", "v2"), first, "after a restart");
  EXPECT_EQ(Logprobs(w, "alice", "v2"), first_lp);
}

TEST(Snapshots, BadRequestsAreRefusedWithNothingChanged) {
  const auto dir = testing::TempDir("snapshots-bad");
  auto config = SnapshotConfig(dir);
  config.sessions.max_snapshots = 2;
  auto s = testing::StartServer(config);
  Wire w(s.target);
  ASSERT_TRUE(Create(w, "bob", 2).ok());
  Train(w, "bob", 1);
  ASSERT_TRUE(Save(w, "bob", "a").ok());
  Train(w, "bob", 2);
  ASSERT_TRUE(Save(w, "bob", "b").ok());
  const auto snapshots = fs::path(dir) / ".sessions" / "bob" / "snapshots";
  const auto weights = Export(w, "bob", "").second;
  const auto a = MustSample(w, "bob", "a");

  auto expect = [&](grpc::Status st, grpc::StatusCode code, const std::string& words, const std::string& what) {
    EXPECT_EQ(st.error_code(), code) << what << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(words), std::string::npos) << what << ": " << st.error_message();
    EXPECT_EQ(Listed(w, "bob"), (std::vector<std::string>{"a", "b"})) << what;
    EXPECT_EQ(Folders(snapshots), 2u) << what;
  };
  for (const std::string& name : std::vector<std::string>{"../x", "a/b", "", ".hidden", std::string(65, 'n')}) {
    expect(Save(w, "bob", name), grpc::StatusCode::INVALID_ARGUMENT, "snapshot name", "name '" + name + "'");
  }
  expect(Save(w, "bob", "c", nullptr, -1), grpc::StatusCode::INVALID_ARGUMENT, "ttl_seconds", "a negative TTL");
  expect(Save(w, "nobody", "c"), grpc::StatusCode::NOT_FOUND, "nobody", "an unknown session");
  expect(Save(w, "bob", "a"), grpc::StatusCode::ALREADY_EXISTS, "'a'", "a taken name");
  expect(Save(w, "bob", "c"), grpc::StatusCode::RESOURCE_EXHAUSTED, "sessions.max_snapshots (2)", "over the count");
  expect(Save(w, "bob@a", "c"), grpc::StatusCode::NOT_FOUND, "Sample, ComputeLogprobs", "a snapshot of a snapshot");
  Samples none;
  expect(Sample(w, "bob", "nope", &none), grpc::StatusCode::NOT_FOUND, "no snapshot named 'nope'", "unknown");
  expect(Sample(w, "bob", "../a", &none), grpc::StatusCode::INVALID_ARGUMENT, "snapshot name", "a path");
  // A snapshot is read-only: training it is not found.
  v1::TrainStepRequest train;
  train.set_session("bob@a");
  train.mutable_batch()->mutable_sft()->add_examples()->add_tokens(1);
  train.mutable_batch()->mutable_sft()->mutable_examples(0)->add_tokens(2);
  v1::TrainStepResponse ignored;
  expect(w.stub->TrainStep(Wire::ctx().get(), train, &ignored), grpc::StatusCode::NOT_FOUND, "is for Sample",
         "training a snapshot");
  v1::DeleteSnapshotRequest del;
  del.set_session("bob");
  del.set_name("zzz");
  v1::DeleteSnapshotResponse deleted;
  expect(w.stub->DeleteSnapshot(Wire::ctx().get(), del, &deleted), grpc::StatusCode::NOT_FOUND, "'zzz'",
         "deleting an unknown one");
  EXPECT_EQ(Export(w, "bob", "").second, weights) << "the session is unchanged";
  ExpectSameSamples(MustSample(w, "bob", "a"), a, "snapshot a is unchanged");

  // replace_oldest: a rolling window at the bound.
  ASSERT_TRUE(Save(w, "bob", "c", nullptr, 0, /*replace_oldest=*/true).ok());
  EXPECT_EQ(Listed(w, "bob"), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(Folders(snapshots), 2u);
  EXPECT_EQ(Sample(w, "bob", "a", &none).error_code(), grpc::StatusCode::NOT_FOUND);

  // DeleteSnapshot removes it from memory and disk.
  del.set_name("b");
  ASSERT_TRUE(w.stub->DeleteSnapshot(Wire::ctx().get(), del, &deleted).ok());
  EXPECT_EQ(deleted.name(), "b");
  EXPECT_EQ(Listed(w, "bob"), std::vector<std::string>{"c"});
  EXPECT_FALSE(fs::exists(snapshots / "b"));

  // A TTL: refused and unlisted from the moment it expires, its folder removed by the next save.
  v1::SnapshotInfo info;
  ASSERT_TRUE(Save(w, "bob", "brief", &info, 0.3).ok());
  EXPECT_NEAR(info.expires_unix() - info.created_unix(), 0.3, 1e-6);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto expired = Sample(w, "bob", "brief", &none);
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(expired.error_message().find("expired"), std::string::npos) << expired.error_message();
  EXPECT_EQ(Listed(w, "bob"), std::vector<std::string>{"c"});
  ASSERT_TRUE(Save(w, "bob", "d").ok());
  EXPECT_FALSE(fs::exists(snapshots / "brief"));

  // The bytes bound: one snapshot is larger than it allows; refused, nothing kept.
  auto small = SnapshotConfig(testing::TempDir("snapshots-bytes"));
  small.sessions.max_snapshot_bytes = 1000;
  auto t = testing::StartServer(small);
  Wire v(t.target);
  ASSERT_TRUE(Create(v, "carol", 3).ok());
  const auto st = Save(v, "carol", "big");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("sessions.max_snapshot_bytes (1000)"), std::string::npos) << st.error_message();
  EXPECT_TRUE(Listed(v, "carol").empty());
  EXPECT_EQ(Folders(fs::path(small.checkpoint_dir) / ".sessions" / "carol" / "snapshots"), 0u);

  // replace_oldest under the byte bound: room for two snapshots of this size, not three.
  const auto roll_dir = testing::TempDir("snapshots-roll");
  int64_t size = 0;
  {
    auto u = testing::StartServer(SnapshotConfig(roll_dir));
    Wire x(u.target);
    ASSERT_TRUE(Create(x, "erin", 4).ok());
    v1::SnapshotInfo one;
    ASSERT_TRUE(Save(x, "erin", "probe", &one).ok());
    ASSERT_TRUE(Delete(x, "erin", "probe").ok());
    size = one.bytes();
  }
  auto roomy = SnapshotConfig(roll_dir);
  roomy.sessions.max_snapshot_bytes = 2 * size + size / 2;
  auto u = testing::StartServer(roomy);
  Wire y(u.target);
  ASSERT_TRUE(Save(y, "erin", "r1").ok());
  ASSERT_TRUE(Save(y, "erin", "r2").ok());
  const auto over = Save(y, "erin", "r3");
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  EXPECT_NE(over.error_message().find("sessions.max_snapshot_bytes"), std::string::npos) << over.error_message();
  EXPECT_EQ(Listed(y, "erin"), (std::vector<std::string>{"r1", "r2"}));
  ASSERT_TRUE(Save(y, "erin", "r3", nullptr, 0, /*replace_oldest=*/true).ok());
  EXPECT_EQ(Listed(y, "erin"), (std::vector<std::string>{"r2", "r3"}));

  // Deleting the session takes its snapshots with it.
  v1::DeleteSessionRequest gone;
  gone.set_name("bob");
  v1::DeleteSessionResponse gone_reply;
  ASSERT_TRUE(w.stub->DeleteSession(Wire::ctx().get(), gone, &gone_reply).ok());
  EXPECT_FALSE(fs::exists(snapshots));
  EXPECT_EQ(Sample(w, "bob", "c", &none).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(Snapshots, AServerWithoutSessionsSaysSo) {
  auto s = testing::StartServer(testing::TestConfig());
  Wire w(s.target);
  const auto st = Save(w, "", "v1");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("sessions.enabled"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace streambp
