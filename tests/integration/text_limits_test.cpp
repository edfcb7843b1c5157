// Text within bounds (issue 30): a request's text is counted over the whole request (each
// chat message at a cost of its own) before any of it is processed; Detokenize's output is
// bounded before decoding; text work runs off the gRPC threads, within a memory budget, and
// stops at the client's deadline; Health answers meanwhile; streamed rollout groups are
// tokenized on the pool and acknowledged in order. The model is the tiny preset
// around the real Qwen3 tokenizer (tests/text/reference/setup.sh).
#include <sys/resource.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "integration/server_fixture.h"
#include "integration/text_model.h"
#include "streambp/tokenizer.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::QwenModelDir;

server::ServerConfig LimitsConfig() {
  auto c = testing::TestConfig();
  c.model.dir = QwenModelDir();
  c.model.dtype = "float32";
  return c;
}

std::unique_ptr<grpc::ClientContext> Ctx(double seconds = 120) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() +
                  std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
  return c;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

class TextLimits : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_REFERENCE(); }
};

TEST_F(TextLimits, ManyTinyMessagesCostTheirCountAndAreRefusedBeforeAnyWork) {
  auto s = testing::StartServer(LimitsConfig());
  auto stub = v1::Trainer::NewStub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  v1::TokenizeRequest req;
  auto* messages = req.add_inputs()->mutable_messages();
  for (int i = 0; i < 300000; ++i) messages->Add()->set_role("user");  // 300k empty messages: 19 MB of charge
  v1::TokenizeResponse out;
  const double cpu = CpuSeconds();
  const auto st = stub->Tokenize(Ctx().get(), req, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("each chat message counts"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("limits.max_text_bytes"), std::string::npos) << st.error_message();
  // Counting stops at the limit: far less work than rendering 300k messages (which took
  // seconds and gigabytes before the bound).
  EXPECT_LT(CpuSeconds() - cpu, 2.0);
  s.server->Shutdown();
}

TEST_F(TextLimits, TheTextBoundIsPerRequestNotPerField) {
  auto config = LimitsConfig();
  config.limits.max_text_bytes = 1000;
  auto s = testing::StartServer(config);
  auto stub = v1::Trainer::NewStub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  // Two inputs of 600 bytes each: each under the limit, the request over it.
  v1::TokenizeRequest req;
  req.add_inputs()->set_text(std::string(600, 'a'));
  req.add_inputs()->set_text(std::string(600, 'b'));
  v1::TokenizeResponse out;
  auto st = stub->Tokenize(Ctx().get(), req, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  // The same for rollout groups of one PushRollouts.
  v1::PushRolloutsRequest push;
  for (int g = 0; g < 2; ++g) {
    auto* group = push.add_groups();
    group->mutable_prompt_text()->set_text(std::string(600, 'c'));
    group->add_completions()->set_text("x");
    group->add_completions()->set_text("y");
  }
  v1::PushRolloutsResponse acks;
  st = stub->PushRollouts(Ctx().get(), push, &acks);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  // Under the limit it works.
  v1::TokenizeRequest small;
  small.add_inputs()->set_text(std::string(400, 'a'));
  small.add_inputs()->set_text(std::string(400, 'b'));
  st = stub->Tokenize(Ctx().get(), small, &out);
  EXPECT_TRUE(st.ok()) << st.error_message();
  s.server->Shutdown();
}

TEST_F(TextLimits, DetokenizeOutputIsBoundedBeforeDecoding) {
  auto config = LimitsConfig();
  config.limits.max_text_bytes = 4096;
  auto s = testing::StartServer(config);
  auto stub = v1::Trainer::NewStub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  auto tokenizer = Tokenizer::FromDir(QwenModelDir());
  // A token of 8 to 64 bytes: 1000 of them decode to more than the 4096 bytes allowed.
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < tokenizer->vocab_size() && ids.empty(); ++id) {
    try {
      const auto n = tokenizer->token_bytes(id).size();
      if (n >= 8 && n <= 64) ids.push_back(id);
    } catch (const std::exception&) {
    }
  }
  ASSERT_EQ(ids.size(), 1u);
  v1::DetokenizeRequest req;
  for (int i = 0; i < 1000; ++i) req.add_sequences()->add_tokens(static_cast<int32_t>(ids[0]));
  v1::DetokenizeResponse out;
  auto st = stub->Detokenize(Ctx().get(), req, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("limits.max_text_bytes"), std::string::npos) << st.error_message();
  v1::DetokenizeRequest fits;
  for (int i = 0; i < 10; ++i) fits.add_sequences()->add_tokens(static_cast<int32_t>(ids[0]));
  st = stub->Detokenize(Ctx().get(), fits, &out);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(out.texts_size(), 10);
  s.server->Shutdown();
}

TEST_F(TextLimits, TextWorkIsRefusedWhenItsMemoryEstimateIsOverTheBudget) {
  auto config = LimitsConfig();
  config.limits.text_memory_bytes = 1 << 20;
  auto s = testing::StartServer(config);
  auto stub = v1::Trainer::NewStub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  v1::TokenizeRequest req;
  req.add_inputs()->set_text(std::string(64 << 10, 'a'));  // 64 KiB x 48 bytes per byte: 3 MiB
  v1::TokenizeResponse out;
  auto st = stub->Tokenize(Ctx().get(), req, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("limits.text_memory_bytes"), std::string::npos) << st.error_message();
  v1::TokenizeRequest small;
  small.add_inputs()->set_text(std::string(8 << 10, 'a'));
  st = stub->Tokenize(Ctx().get(), small, &out);
  EXPECT_TRUE(st.ok()) << st.error_message();
  s.server->Shutdown();
}

TEST_F(TextLimits, HealthAnswersWhileTextIsTokenizedAndADeadlineStopsTheWork) {
  auto s = testing::StartServer(LimitsConfig());
  auto channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  auto stub = v1::Trainer::NewStub(channel);
  // Text that takes the tokenizer well over the deadline: 12 MiB of short words (within
  // max_text_bytes; its memory estimate lets one such call run at a time, the rest wait).
  std::string text;
  text.reserve(12 << 20);
  for (int i = 0; text.size() < (12u << 20); ++i) text += "w" + std::to_string(i % 9973) + " ";
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      v1::TokenizeRequest req;
      req.add_inputs()->set_text(text);
      v1::TokenizeResponse out;
      return stub->Tokenize(Ctx(0.5).get(), req, &out);
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (int k = 0; k < 3; ++k) {
    grpc::health::v1::HealthCheckRequest hreq;
    grpc::health::v1::HealthCheckResponse hresp;
    const auto st = health->Check(Ctx(1.0).get(), hreq, &hresp);
    EXPECT_TRUE(st.ok()) << "Health while text is tokenized: " << st.error_message();
    v1::GetInfoResponse info;
    const auto gi = stub->GetInfo(Ctx(1.0).get(), v1::GetInfoRequest(), &info);
    EXPECT_TRUE(gi.ok()) << "GetInfo while text is tokenized: " << gi.error_message();
  }
  for (auto& c : calls) EXPECT_EQ(c.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The work stopped with the deadlines: the process is idle again within a second.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const double before = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_LT(CpuSeconds() - before, 0.5) << "text work went on after every client had given up";
  s.server->Shutdown();
}

// PushRolloutsStream tokenizes a group's text on the host's CPU pool, not on the stream's
// reactor: groups with text, with tokens only and a malformed one (empty text), interleaved,
// are acknowledged in the order they were sent, each with its own status; the text groups'
// ids are what the tokenizer gives, so the queue holds what a unary push would have queued.
TEST_F(TextLimits, StreamedGroupsWithTextAreTokenizedOffTheReactorAndAckedInOrder) {
  auto config = LimitsConfig();
  config.rollouts.groups_per_step = 1000;  // nothing is trained: the queue is read back
  auto s = testing::StartServer(config);
  auto stub = v1::Trainer::NewStub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  auto ctx = Ctx();
  auto stream = stub->PushRolloutsStream(ctx.get());
  const int kGroups = 12;
  for (int i = 0; i < kGroups; ++i) {
    v1::RolloutGroup g;
    g.set_group_id("g" + std::to_string(i));
    if (i % 3 == 0) {
      g.mutable_prompt_text()->set_text("Question " + std::to_string(i) + ": " + std::string(2000, 'x'));
      for (int c = 0; c < 2; ++c) g.add_completions()->set_text("answer " + std::to_string(c));
    } else if (i % 3 == 1) {
      for (int t = 0; t < 4; ++t) g.add_prompt(100 + t);
      for (int c = 0; c < 2; ++c) g.add_completions()->add_tokens(200 + c);
    } else {
      g.mutable_prompt_text()->set_text("");  // empty: invalid, named
      g.add_completions()->set_text("a");
    }
    for (int c = 0; c < g.completions_size(); ++c) g.mutable_completions(c)->set_reward(c);
    ASSERT_TRUE(stream->Write(g)) << i;
  }
  stream->WritesDone();
  std::vector<v1::RolloutAck> acks;
  v1::RolloutAck ack;
  while (stream->Read(&ack)) acks.push_back(ack);
  const auto status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(static_cast<int>(acks.size()), kGroups);
  for (int i = 0; i < kGroups; ++i) {
    EXPECT_EQ(acks[static_cast<size_t>(i)].index(), i);
    if (i % 3 == 2) {
      EXPECT_EQ(acks[static_cast<size_t>(i)].status(), "invalid") << i;
      EXPECT_NE(acks[static_cast<size_t>(i)].message().find("prompt_text"), std::string::npos)
          << acks[static_cast<size_t>(i)].message();
    } else {
      EXPECT_EQ(acks[static_cast<size_t>(i)].status(), "accepted") << i << " " << acks[static_cast<size_t>(i)].message();
      EXPECT_EQ(acks[static_cast<size_t>(i)].group_id(), "g" + std::to_string(i));
    }
  }
  v1::GetRolloutStatsRequest req;
  v1::RolloutStats stats;
  ASSERT_TRUE(stub->GetRolloutStats(Ctx().get(), req, &stats).ok());
  EXPECT_EQ(stats.accepted(), 8);
  EXPECT_EQ(stats.queue_depth(), 8);
  s.server->Shutdown();
}

}  // namespace
}  // namespace streambp
