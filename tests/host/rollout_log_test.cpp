// The rollout log under crashes and full disks: an acknowledged group is never lost or
// trained twice (docs/architecture.md: Errors, admission and durability).
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "host.h"
#include "record_log.h"
#include "rollout_queue.h"
#include "streambp/error.h"
#include "test_util/fixtures.h"
#include "test_util/small_disk.h"

namespace streambp::server {
namespace {

namespace fs = std::filesystem;

RolloutGroup Group(const std::string& id, int64_t first_token, size_t completion_tokens = 2) {
  RolloutGroup g;
  g.prompt = {first_token, first_token + 1};
  RolloutCompletion a, b;
  for (size_t i = 0; i < completion_tokens; ++i) a.tokens.push_back(static_cast<int64_t>(3 + i % 200));
  a.reward = 1.0;
  b.tokens = {7};
  b.reward = 0.0;
  g.completions = {a, b};
  g.group_id = id;
  return g;
}

std::vector<RolloutAck> Push(RolloutQueue& q, std::vector<RolloutGroup> groups, int64_t version = 0) {
  std::vector<int> indices;
  for (size_t i = 0; i < groups.size(); ++i) indices.push_back(static_cast<int>(i));
  return q.push(std::move(groups), indices, version);
}

void AppendRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::app) << bytes;
}

TEST(RecordLog, ATornTailIsCutOffAndAppendsContinueAfterTheLastGoodRecord) {
  const auto path = testing::TempDir("record-log") + "/log";
  {
    std::vector<std::string> records;
    auto log = RecordLog::Open(path, &records);
    log->append({"one", "two"});
    log->append({"three"});
  }
  const auto good = fs::file_size(path);
  // A crash mid-append: a header that promises 100 bytes, then 10 of them.
  std::string torn("\x64\x00\x00\x00\x01\x02\x03\x04", 8);
  torn.append(10, 'x');
  AppendRaw(path, torn);
  {
    std::vector<std::string> records;
    int64_t dropped = 0;
    auto log = RecordLog::Open(path, &records, &dropped);
    EXPECT_EQ(records, (std::vector<std::string>{"one", "two", "three"}));
    EXPECT_EQ(dropped, 18);
    EXPECT_EQ(fs::file_size(path), good);
    log->append({"four"});
  }
  std::vector<std::string> records;
  RecordLog::Open(path, &records);
  EXPECT_EQ(records, (std::vector<std::string>{"one", "two", "three", "four"}));
}

TEST(RecordLog, DamageInTheMiddleIsRefusedNotHidden) {
  const auto path = testing::TempDir("record-log-damage") + "/log";
  {
    std::vector<std::string> records;
    RecordLog::Open(path, &records)->append({"first record", "second record"});
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8 + 2);  // inside the first payload
    f.put('#');
  }
  std::vector<std::string> records;
  try {
    RecordLog::Open(path, &records);
    FAIL() << "a damaged log was opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt at byte 0"), std::string::npos) << e.what();
  }
}

TEST(RecordLog, DiskFullMidAppendLeavesNoTornRecord) {
  std::string why;
  auto disk = testing::SmallDisk::Create(64 << 10, &why);
  if (!disk) GTEST_SKIP() << why;
  const auto path = disk->path() + "/log";
  std::vector<std::string> records;
  auto log = RecordLog::Open(path, &records);
  log->append({"before"});
  const auto size = fs::file_size(path);
  disk->fill(4096);  // one page left: the next record is written in part, then ENOSPC
  try {
    log->append({std::string(20000, 'z')});
    FAIL() << "an append to a full disk succeeded";
  } catch (const ResourceExhausted& e) {
    EXPECT_NE(std::string(e.what()).find("no space left on the device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fs::file_size(path), size);
  disk->unfill();
  log->append({"after"});
  log.reset();
  records.clear();
  RecordLog::Open(path, &records);
  EXPECT_EQ(records, (std::vector<std::string>{"before", "after"}));
}

TEST(RolloutQueue, DiskFullAnswersRetryAndTheNextAcknowledgedGroupSurvivesARestart) {
  std::string why;
  auto disk = testing::SmallDisk::Create(64 << 10, &why);
  if (!disk) GTEST_SKIP() << why;
  RolloutOptions o;
  o.log_path = disk->path() + "/rollouts";
  o.groups_per_step = 100;
  {
    RolloutQueue q(o, 0);
    EXPECT_EQ(Push(q, {Group("a", 1)})[0].status, RolloutStatus::kAccepted);
    disk->fill(4096);
    auto acks = Push(q, {Group("big", 10, 8000)});
    EXPECT_EQ(acks[0].status, RolloutStatus::kRetry);
    EXPECT_NE(acks[0].message.find("no space left"), std::string::npos) << acks[0].message;
    EXPECT_EQ(q.stats().queue_depth, 1);
    disk->unfill();
    EXPECT_EQ(Push(q, {Group("b", 20)})[0].status, RolloutStatus::kAccepted);
    // "big" was never acknowledged: pushing it again is not a duplicate.
    EXPECT_EQ(Push(q, {Group("big", 10, 8000)})[0].status, RolloutStatus::kAccepted);
  }
  RolloutQueue restarted(o, 0);
  EXPECT_EQ(restarted.stats().queue_depth, 3);  // a, b, big: each once, none glued to a torn record
  EXPECT_EQ(restarted.stats().accepted, 3);
}

TEST(RolloutQueue, ServerIdsAreUniqueAcrossRestartsAndClientsCannotUseThem) {
  RolloutOptions o;
  o.log_path = testing::TempDir("server-ids") + "/rollouts";
  o.groups_per_step = 100;
  std::set<std::string> ids;
  {
    RolloutQueue q(o, 0);
    for (const auto& a : Push(q, {Group("", 1), Group("", 3)})) {
      ASSERT_EQ(a.status, RolloutStatus::kAccepted);
      ids.insert(a.group_id);
    }
  }
  RolloutQueue q(o, 0);
  for (const auto& a : Push(q, {Group("", 5), Group("", 7)})) {
    EXPECT_EQ(a.status, RolloutStatus::kAccepted) << a.message;  // not mistaken for an old id
    EXPECT_TRUE(ids.insert(a.group_id).second) << a.group_id;
  }
  EXPECT_EQ(q.stats().queue_depth, 4);
  auto mine = Push(q, {Group(*ids.begin(), 9)});
  EXPECT_EQ(mine[0].status, RolloutStatus::kInvalid);
  EXPECT_NE(mine[0].message.find("may not start with 'srv:'"), std::string::npos) << mine[0].message;
  auto long_id = Push(q, {Group(std::string(200, 'g'), 9)});
  EXPECT_EQ(long_id[0].status, RolloutStatus::kInvalid);
}

// A group's routing replay (mixture of experts) is part of its record: a restart queues it
// again with every id, and the groups without one stay without.
TEST(RolloutQueue, RoutedExpertsSurviveARestart) {
  RolloutOptions o;
  o.log_path = testing::TempDir("routed") + "/rollouts";
  o.groups_per_step = 2;
  auto routed = Group("r", 1);
  routed.completions[0].routed_experts = {0, 3, -1, -1, 5, 1, 2, 7, 4, 6, -1, -1};
  {
    RolloutQueue q(o, 0);
    Push(q, {routed, Group("plain", 3)});
  }
  RolloutQueue q(o, 0);
  int64_t dropped = 0;
  const auto taken = q.take(0, &dropped);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].group.completions[0].routed_experts, routed.completions[0].routed_experts);
  EXPECT_TRUE(taken[0].group.completions[1].routed_experts.empty());
  EXPECT_TRUE(taken[1].group.completions[0].routed_experts.empty());
}

TEST(RolloutQueue, ConsumedGroupsAreNotQueuedAgainUnlessTheirStepWasLost) {
  RolloutOptions o;
  o.log_path = testing::TempDir("consumed") + "/rollouts";
  o.groups_per_step = 2;
  {
    RolloutQueue q(o, 0);
    Push(q, {Group("a", 1), Group("b", 3), Group("c", 5), Group("d", 7)});
    int64_t dropped = 0;
    q.commit(q.take(0, &dropped), 1);  // produced version 1
    q.commit(q.take(1, &dropped), 2);  // produced version 2
  }
  // Opening compacts the log, so each restart gets its own copy.
  auto resumed_at = [&](int64_t version) {
    RolloutOptions copy = o;
    copy.log_path = o.log_path + "." + std::to_string(version);
    fs::copy_file(o.log_path, copy.log_path);
    return RolloutQueue(copy, version).stats().queue_depth;
  };
  EXPECT_EQ(resumed_at(2), 0);  // resumed with both steps
  EXPECT_EQ(resumed_at(1), 2);  // the second step's weights were lost: its groups again
  EXPECT_EQ(resumed_at(0), 4);
}

// Host: the step and its "consumed" record commit together.
template <class T>
Outcome<T> Wait(std::function<void(Done<T>)> call) {
  std::promise<Outcome<T>> p;
  call([&p](const Outcome<T>& o) { p.set_value(o); });
  return p.get_future().get();
}

TEST(HostRollouts, AStepWhoseConsumedRecordCannotBeWrittenIsNotApplied) {
  std::string why;
  auto disk = testing::SmallDisk::Create(256 << 10, &why);
  if (!disk) GTEST_SKIP() << why;
  // tmpfs allocates whole pages: the "consumed" record must need a new one to fail, so it
  // names many long ids (> 4 KiB).
  constexpr int kGroups = 40;
  auto id = [](int i) {  // 100 letters, '-', i (a stream: GCC 12 warns falsely on string + string here)
    std::ostringstream o;
    o << std::setfill(static_cast<char>('a' + i % 26)) << std::setw(100) << "" << '-' << i;
    return o.str();
  };
  ServerConfig c;
  c.model.dtype = "float64";
  c.rollouts.groups_per_step = kGroups;
  c.rollouts.log = disk->path() + "/rollouts";
  auto host = TrainingHost::Create(c);
  auto push = [&](std::vector<RolloutGroup> groups) {
    std::vector<PushItem> items;
    for (size_t i = 0; i < groups.size(); ++i) items.push_back(PushItem{static_cast<int>(i), "", groups[i], ""});
    CallContext ctx;
    ctx.method = "PushRollouts";
    return Wait<std::vector<RolloutAck>>([&](auto done) { host->push_rollouts(ctx, items, done); });
  };
  host->worker().pause();
  std::vector<RolloutGroup> groups;
  for (int i = 0; i < kGroups; ++i) groups.push_back(Group(id(i), 1 + i));
  auto acks = push(groups);
  ASSERT_TRUE(acks.ok());
  for (const auto& a : *acks.value) ASSERT_EQ(a.status, RolloutStatus::kAccepted) << a.message;
  disk->fill(0);
  host->worker().resume();
  ASSERT_TRUE(host->worker().wait_idle(std::chrono::seconds(30)));
  EXPECT_EQ(host->policy_version(), 0);  // not applied
  EXPECT_EQ(host->rollout_stats().queue_depth, kGroups);
  EXPECT_EQ(host->rollout_stats().consumed, 0);
  EXPECT_EQ(host->info().pending_micro_batches, 0);  // its gradients were dropped
  disk->unfill();
  acks = push({Group("one-more", 99)});
  ASSERT_TRUE(acks.ok());
  for (int i = 0; i < 500 && host->policy_version() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(host->worker().wait_idle(std::chrono::seconds(30)));
  EXPECT_EQ(host->policy_version(), 1);  // trained once
  EXPECT_EQ(host->rollout_stats().consumed, kGroups);
  EXPECT_EQ(host->rollout_stats().queue_depth, 1);
}

}  // namespace
}  // namespace streambp::server
