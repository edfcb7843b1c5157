// The training history (issue 29): every optimizer step's record equals what the step's
// RPC answered, on the wire (GetHistory, paged), in metrics.jsonl and across restarts; a
// torn last line or a full disk loses nothing that was kept and fails no step; sessions
// keep their own histories. TensorBoard files are read back independently in
// tests/python/history_test.py.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "history.h"
#include "streambp/history_line.h"
#include "integration/server_fixture.h"
#include "integration/wire.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;
using testing::Wire;

v1::TrainStepRequest Sft(int seed, const std::string& session = "") {
  v1::TrainStepRequest req;
  req.set_session(session);
  for (int e = 0; e < 2; ++e) {
    auto* ex = req.mutable_batch()->mutable_sft()->add_examples();
    for (int t = 0; t < 6 + e + seed % 3; ++t) ex->add_tokens(1 + (seed * 7 + e * 13 + t * 5) % 200);
  }
  return req;
}

v1::TrainStepRequest Grpo() {
  v1::TrainStepRequest req;
  req.set_objective("grpo");
  auto* g = req.mutable_batch()->mutable_grpo()->add_groups();
  for (int t : {3, 9, 27}) g->add_prompt(t);
  const std::vector<double> rewards = {1.0, 0.0, 0.5};
  for (size_t c = 0; c < rewards.size(); ++c) {
    auto* comp = g->add_completions();
    for (int t = 0; t < 3 + static_cast<int>(c); ++t) comp->add_tokens(40 + static_cast<int>(c) * 11 + t);
    comp->set_reward(rewards[c]);
  }
  return req;
}

v1::GetHistoryResponse History(const Wire& w, int64_t after = 0, int max = 0, const std::string& session = "") {
  v1::GetHistoryRequest req;
  req.set_session(session);
  req.set_after_index(after);
  req.set_max_records(max);
  v1::GetHistoryResponse r;
  const grpc::Status status = w.stub->GetHistory(Wire::ctx().get(), req, &r);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return r;
}

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// What one step answered, as its history record must say it.
struct Expected {
  std::string source;
  double loss = 0;
  int64_t tokens = 0, forward_backwards = 1, peak = 0;
  std::map<std::string, double> metrics;
  v1::OptimStepResponse optim;
};

Expected FromTrain(const v1::TrainStepResponse& r) {
  Expected e{"train", r.stats().loss(), r.stats().tokens(), 1, r.stats().peak_memory_bytes(),
             {r.stats().metrics().begin(), r.stats().metrics().end()}, r.optim()};
  return e;
}

void ExpectRecord(const v1::HistoryRecord& got, const Expected& want, int64_t index) {
  SCOPED_TRACE("record " + std::to_string(index));
  EXPECT_EQ(got.index(), index);
  EXPECT_EQ(got.source(), want.source);
  EXPECT_EQ(got.step(), want.optim.step());
  EXPECT_EQ(got.policy_version(), want.optim.policy_version());
  EXPECT_EQ(got.loss(), want.loss);
  EXPECT_EQ(got.tokens(), want.tokens);
  EXPECT_EQ(got.forward_backwards(), want.forward_backwards);
  EXPECT_EQ(got.peak_memory_bytes(), want.peak);
  EXPECT_EQ(got.grad_norm(), want.optim.grad_norm());
  EXPECT_EQ(got.learning_rate(), want.optim.learning_rate());
  EXPECT_EQ(got.skipped(), want.optim.skipped());
  EXPECT_GT(got.seconds(), 0);
  EXPECT_NEAR(got.tokens_per_second(), static_cast<double>(want.tokens) / got.seconds(), 1e-9 * got.tokens_per_second());
  EXPECT_GT(got.time(), 1.7e9);
  std::map<std::string, double> metrics(got.metrics().begin(), got.metrics().end());
  EXPECT_EQ(metrics, want.metrics);
}

TEST(History, EveryStepsRecordIsWhatItsRpcAnsweredOnTheWireAndInMetricsJsonl) {
  auto config = testing::TestConfig();
  config.checkpoint_dir = testing::TempDir("history_wire");
  config.trainer.optimizer.name = "adamw";
  auto s = testing::StartServer(config);
  Wire w(s.target);
  EXPECT_EQ(History(w).records_size(), 0);
  EXPECT_EQ(History(w).last_index(), 0);

  std::vector<Expected> want;
  for (int i = 0; i < 3; ++i) {
    v1::TrainStepResponse r;
    const auto status = w.stub->TrainStep(Wire::ctx().get(), Sft(i), &r);
    ASSERT_TRUE(status.ok()) << status.error_message();
    want.push_back(FromTrain(r));
  }
  // Two forward-backwards accumulated into one OptimStep: their mean loss, summed tokens.
  {
    v1::ForwardBackwardResponse a, b;
    v1::ForwardBackwardRequest fa, fb;
    *fa.mutable_batch() = Sft(5).batch();
    *fb.mutable_batch() = Sft(6).batch();
    ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), fa, &a).ok());
    ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), fb, &b).ok());
    v1::OptimStepResponse o;
    ASSERT_TRUE(w.stub->OptimStep(Wire::ctx().get(), {}, &o).ok());
    Expected e{"optim_step", (a.stats().loss() + b.stats().loss()) / 2, a.stats().tokens() + b.stats().tokens(), 2,
               std::max(a.stats().peak_memory_bytes(), b.stats().peak_memory_bytes()), {}, o};
    for (const auto& [name, value] : a.stats().metrics()) e.metrics[name] = (value + b.stats().metrics().at(name)) / 2;
    want.push_back(e);
  }
  {
    v1::TrainStepResponse r;
    const auto status = w.stub->TrainStep(Wire::ctx().get(), Grpo(), &r);
    ASSERT_TRUE(status.ok()) << status.error_message();
    want.push_back(FromTrain(r));
    ASSERT_TRUE(want.back().metrics.count("reward_mean"));
    EXPECT_DOUBLE_EQ(want.back().metrics.at("reward_mean"), 0.5);
  }
  // Gradients thrown away (LoadCheckpoint drops pending ones) take their forward-backward
  // out of the next record.
  {
    v1::SaveCheckpointRequest save;
    save.set_name("five");
    v1::SaveCheckpointResponse sr;
    ASSERT_TRUE(w.stub->SaveCheckpoint(Wire::ctx().get(), save, &sr).ok());
    v1::ForwardBackwardRequest f;
    *f.mutable_batch() = Sft(8).batch();
    v1::ForwardBackwardResponse fr;
    ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), f, &fr).ok());
    v1::LoadCheckpointRequest load;
    load.set_name("five");
    v1::LoadCheckpointResponse lr;
    ASSERT_TRUE(w.stub->LoadCheckpoint(Wire::ctx().get(), load, &lr).ok());
    v1::TrainStepResponse r;
    ASSERT_TRUE(w.stub->TrainStep(Wire::ctx().get(), Sft(9), &r).ok());
    want.push_back(FromTrain(r));
  }
  const auto all = History(w);
  ASSERT_EQ(all.records_size(), 6);
  EXPECT_EQ(all.first_index(), 1);
  EXPECT_EQ(all.last_index(), 6);
  EXPECT_EQ(all.file(), config.checkpoint_dir + "/metrics.jsonl");
  for (int i = 0; i < 6; ++i) ExpectRecord(all.records(i), want[i], i + 1);

  // Paging.
  const auto page = History(w, 2, 2);
  ASSERT_EQ(page.records_size(), 2);
  EXPECT_EQ(page.records(0).index(), 3);
  EXPECT_EQ(page.records(1).index(), 4);
  EXPECT_EQ(History(w, 6).records_size(), 0);

  // metrics.jsonl: the same values, line for line (JSON doubles round-trip exactly).
  const auto lines = Lines(all.file());
  ASSERT_EQ(lines.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const auto& r = all.records(i);
    EXPECT_EQ(lines[i]["index"].get<int64_t>(), r.index());
    EXPECT_EQ(lines[i]["step"].get<int64_t>(), r.step());
    EXPECT_EQ(lines[i]["source"].get<std::string>(), r.source());
    EXPECT_EQ(lines[i]["loss"].get<double>(), r.loss());
    EXPECT_EQ(lines[i]["grad_norm"].get<double>(), r.grad_norm());
    EXPECT_EQ(lines[i]["learning_rate"].get<double>(), r.learning_rate());
    EXPECT_EQ(lines[i]["tokens"].get<int64_t>(), r.tokens());
    EXPECT_EQ(lines[i]["time"].get<double>(), r.time());
    for (const auto& [name, value] : r.metrics()) EXPECT_EQ(lines[i][name].get<double>(), value) << name;
  }

  // Refusals name the field and change nothing.
  {
    v1::GetHistoryRequest bad;
    bad.set_after_index(-1);
    v1::GetHistoryResponse r;
    const auto status = w.stub->GetHistory(Wire::ctx().get(), bad, &r);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("after_index"), std::string::npos) << status.error_message();
    for (const std::string name : {"metrics.jsonl", "tensorboard", "metrics-1700000000.jsonl"}) {
      v1::SaveCheckpointRequest save;
      save.set_name(name);
      v1::SaveCheckpointResponse sr;
      const auto st = w.stub->SaveCheckpoint(Wire::ctx().get(), save, &sr);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
      EXPECT_NE(st.error_message().find("reserved for the training history"), std::string::npos) << st.error_message();
    }
  }
  EXPECT_EQ(Lines(all.file()).size(), 6u);
  EXPECT_EQ(History(w).last_index(), 6);
}

TEST(History, ARestartWithResumeContinuesItAndAFreshStartMovesTheOldOneAside) {
  auto config = testing::TestConfig();
  config.checkpoint_dir = testing::TempDir("history_restart");
  const std::string file = config.checkpoint_dir + "/metrics.jsonl";
  std::vector<double> losses;
  {
    auto s = testing::StartServer(config);
    Wire w(s.target);
    for (int i = 0; i < 3; ++i) {
      v1::TrainStepResponse r;
      ASSERT_TRUE(w.stub->TrainStep(Wire::ctx().get(), Sft(i), &r).ok());
      losses.push_back(r.stats().loss());
      if (i == 1) {
        v1::SaveCheckpointRequest save;
        save.set_name("two");
        v1::SaveCheckpointResponse sr;
        ASSERT_TRUE(w.stub->SaveCheckpoint(Wire::ctx().get(), save, &sr).ok());
      }
    }
  }
  // A crash in the middle of an append leaves a torn last line.
  { std::ofstream(file, std::ios::app) << R"({"index": 4, "step": 4, "loss": 0.12)"; }

  config.resume = true;
  {
    auto s = testing::StartServer(config);
    Wire w(s.target);
    const auto h = History(w);
    ASSERT_EQ(h.records_size(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.records(i).loss(), losses[i]);
    v1::TrainStepResponse r;
    ASSERT_TRUE(w.stub->TrainStep(Wire::ctx().get(), Sft(7), &r).ok());
    EXPECT_EQ(r.optim().step(), 3);  // resumed from "two"
    const auto after = History(w, 3);
    ASSERT_EQ(after.records_size(), 1);
    EXPECT_EQ(after.records(0).index(), 4);
    EXPECT_EQ(after.records(0).step(), 3);
    EXPECT_EQ(after.records(0).loss(), r.stats().loss());
    // The new line starts on its own line: it parses, after the torn one.
    std::ifstream in(file);
    std::string line, last;
    int count = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      ++count;
      last = line;
    }
    EXPECT_EQ(count, 5);
    EXPECT_EQ(nlohmann::json::parse(last)["index"].get<int64_t>(), 4);
  }

  // Without resume the model starts over, and so does its history: the old file is kept.
  config.resume = false;
  auto s = testing::StartServer(config);
  Wire w(s.target);
  EXPECT_EQ(History(w).records_size(), 0);
  EXPECT_EQ(History(w).last_index(), 0);
  int aside = 0;
  for (const auto& e : fs::directory_iterator(config.checkpoint_dir)) {
    const auto name = e.path().filename().string();
    if (name.rfind("metrics-", 0) == 0) {
      ++aside;
      std::ifstream in(e.path());
      std::string first;
      std::getline(in, first);
      EXPECT_EQ(nlohmann::json::parse(first)["loss"].get<double>(), losses[0]);
    }
  }
  EXPECT_EQ(aside, 1);
  EXPECT_FALSE(fs::exists(file));
  v1::TrainStepResponse r;
  ASSERT_TRUE(w.stub->TrainStep(Wire::ctx().get(), Sft(0), &r).ok());
  EXPECT_EQ(History(w).records(0).index(), 1);
  EXPECT_EQ(Lines(file).size(), 1u);
}

TEST(History, AFullDiskIsLoggedKeepsTheRecordInMemoryAndTheNextLineStartsClean) {
  const std::string dir = testing::TempDir("history_full");
  server::HistoryOptions options;
  options.dir = dir;
  options.max_records = 2;
  server::History history(options);
  // metrics.jsonl is /dev/full: every write fails with ENOSPC.
  ASSERT_EQ(::symlink("/dev/full", (dir + "/metrics.jsonl").c_str()), 0);
  server::HistoryRecord r;
  r.step = 1;
  r.loss = 2.5;
  r.source = "train";
  history.append(r);
  EXPECT_EQ(history.write_errors(), 1);
  ASSERT_EQ(history.read(0, 0).size(), 1u);
  EXPECT_EQ(history.read(0, 0)[0].loss, 2.5);
  // Space again: the next record lands; the ring keeps max_records.
  fs::remove(dir + "/metrics.jsonl");
  for (int i = 0; i < 2; ++i) history.append(r);
  EXPECT_EQ(history.read(0, 0).size(), 2u);
  EXPECT_EQ(history.first_index(), 2);
  EXPECT_EQ(history.last_index(), 3);
  const auto lines = Lines(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["index"].get<int64_t>(), 3);

  // Non-finite values survive the file as null -> NaN; a metric named like a field keeps
  // its value under objective/<name>.
  server::HistoryRecord odd;
  odd.step = 4;
  odd.loss = std::numeric_limits<double>::infinity();
  odd.skipped = true;
  odd.skip_reason = "non-finite loss";
  odd.metrics = {{"loss", 0.25}, {"kl", 0.5}};
  const auto back = server::HistoryRecord::FromJson(nlohmann::json::parse(odd.ToJson().dump()));
  EXPECT_TRUE(std::isnan(back.loss));
  EXPECT_TRUE(back.skipped);
  EXPECT_EQ(back.skip_reason, "non-finite loss");
  EXPECT_EQ(back.metrics, odd.metrics);
}

// The CLI writes `history --jsonl` lines from the wire's records by the proto's field names,
// the server from its own struct: both name the fields of streambp/history_line.h, so those
// must be the proto's, in its order, and a record and its line must carry the same keys.
TEST(History, TheLineFieldsAreTheProtosAndTheServersLineHasEachOnce) {
  const auto* d = v1::HistoryRecord::descriptor();
  std::vector<std::string> proto;
  for (int i = 0; i < d->field_count(); ++i) {
    if (!d->field(i)->is_repeated()) proto.push_back(d->field(i)->name());
  }
  ASSERT_EQ(proto.size(), kHistoryFields.size());
  for (size_t i = 0; i < proto.size(); ++i) EXPECT_EQ(proto[i], kHistoryFields[i]) << i;
  server::HistoryRecord r;
  r.metrics = {{"kl", 0.5}, {"step", 2.0}, {"objective/x", 1.0}};
  const auto line = r.ToJson();
  for (auto f : kHistoryFields) EXPECT_TRUE(line.contains(std::string(f))) << f;
  EXPECT_EQ(line.size(), kHistoryFields.size() + 3);
  EXPECT_EQ(line["kl"], 0.5);
  EXPECT_EQ(line["objective/step"], 2.0);
  EXPECT_EQ(line["objective/objective/x"], 1.0);
  EXPECT_EQ(HistoryMetricKey("reward_mean"), "reward_mean");
  EXPECT_TRUE(HistoryNumber(std::nan("")).is_null());
}

TEST(History, SessionsKeepTheirOwnHistoriesWhichGoWithTheSession) {
  auto config = testing::TestConfig();
  config.checkpoint_dir = testing::TempDir("history_sessions");
  config.sessions.enabled = true;
  config.rollouts.groups_per_step = 1;
  auto s = testing::StartServer(config);
  Wire w(s.target);
  for (const std::string name : {"a", "b"}) {
    v1::CreateSessionRequest req;
    req.set_name(name);
    req.mutable_lora()->set_r(2);
    v1::SessionInfo info;
    ASSERT_TRUE(w.stub->CreateSession(Wire::ctx().get(), req, &info).ok());
  }
  for (int i = 0; i < 2; ++i) {
    v1::TrainStepResponse r;
    ASSERT_TRUE(w.stub->TrainStep(Wire::ctx().get(), Sft(i, "a"), &r).ok());
  }
  // A rollout step run by the server in session b.
  v1::PushRolloutsRequest push;
  push.set_session("b");
  auto* g = push.add_groups();
  *g->mutable_prompt() = Grpo().batch().grpo().groups(0).prompt();
  *g->mutable_completions() = Grpo().batch().grpo().groups(0).completions();
  v1::PushRolloutsResponse acks;
  ASSERT_TRUE(w.stub->PushRollouts(Wire::ctx().get(), push, &acks).ok());
  ASSERT_EQ(acks.acks(0).status(), "accepted");
  v1::GetHistoryResponse b;
  for (int i = 0; i < 600 && b.records_size() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b = History(w, 0, 0, "b");
  }
  ASSERT_EQ(b.records_size(), 1);
  EXPECT_EQ(b.records(0).source(), "rollouts");
  EXPECT_EQ(b.records(0).groups_consumed(), 1);
  EXPECT_DOUBLE_EQ(b.records(0).metrics().at("reward_mean"), 0.5);
  EXPECT_EQ(b.records(0).policy_version(), 1);

  const auto a = History(w, 0, 0, "a");
  ASSERT_EQ(a.records_size(), 2);
  EXPECT_EQ(a.file(), config.checkpoint_dir + "/a/metrics.jsonl");
  EXPECT_EQ(Lines(a.file()).size(), 2u);
  EXPECT_EQ(Lines(b.file()).size(), 1u);

  v1::GetHistoryRequest unknown;
  unknown.set_session("c");
  v1::GetHistoryResponse r;
  EXPECT_EQ(w.stub->GetHistory(Wire::ctx().get(), unknown, &r).error_code(), grpc::StatusCode::NOT_FOUND);

  // Deleted with the session; a session created later under the name starts empty.
  v1::DeleteSessionRequest del;
  del.set_name("a");
  v1::DeleteSessionResponse dr;
  ASSERT_TRUE(w.stub->DeleteSession(Wire::ctx().get(), del, &dr).ok());
  EXPECT_FALSE(fs::exists(a.file()));
  v1::CreateSessionRequest again;
  again.set_name("a");
  again.mutable_lora()->set_r(2);
  v1::SessionInfo info;
  ASSERT_TRUE(w.stub->CreateSession(Wire::ctx().get(), again, &info).ok());
  EXPECT_EQ(History(w, 0, 0, "a").records_size(), 0);
  EXPECT_EQ(History(w, 0, 0, "b").records_size(), 1);
}

}  // namespace
}  // namespace streambp
