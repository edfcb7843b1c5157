// What an adversarial client and an unlucky operator found (issue 12), each over the real
// wire: every request's cost is bounded before it is admitted, bad input is refused with
// the field named and changes nothing, and the server never shares its port.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "device_worker.h"
#include "host.h"
#include "integration/server_fixture.h"
#include "streambp/error.h"
#include "streambp/model.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"
#include "test_util/small_disk.h"

namespace streambp {
namespace {

using testing::StartServer;
using testing::TestConfig;

std::unique_ptr<grpc::ClientContext> Ctx(int seconds = 60) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return c;
}

struct Raw {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Trainer::Stub> stub;
  explicit Raw(const std::string& target)
      : channel(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())), stub(v1::Trainer::NewStub(channel)) {}

  // A unary call with raw bytes (a body that is not the method's message).
  grpc::Status Bytes(const std::string& method, const std::string& body, std::string* response = nullptr) {
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Slice slice(body);
    grpc::ByteBuffer request(&slice, 1), reply;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &reply,
                      [&done](grpc::Status s) { done.set_value(s); });
    auto status = done.get_future().get();
    if (response && status.ok()) {
      std::vector<grpc::Slice> slices;
      reply.Dump(&slices);
      response->clear();
      for (const auto& s : slices) response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return status;
  }
};

v1::TrainStepRequest SftStep(std::vector<int> tokens = {1, 2, 3, 4, 5, 6}) {
  v1::TrainStepRequest r;
  r.mutable_batch()->mutable_sft()->add_examples()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  return r;
}

template <class Client>
auto Save(const Client& c, const std::string& name) {
  v1::SaveCheckpointRequest r;
  r.set_name(name);
  return c->SaveCheckpoint(r);
}
template <class Client>
auto Load(const Client& c, const std::string& name) {
  v1::LoadCheckpointRequest r;
  r.set_name(name);
  return c->LoadCheckpoint(r);
}

void ExpectCode(const grpc::Status& st, grpc::StatusCode code, const std::string& fragment) {
  EXPECT_EQ(st.error_code(), code) << st.error_message();
  EXPECT_NE(st.error_message().find(fragment), std::string::npos) << st.error_message();
}

TEST(Hardening, OneSampleRequestCannotExhaustMemory) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  const auto before = testing::ExportedTensors(*s.client);
  // The request that got the server OOM-killed: 4096 prompts x n=256 x 64 tokens (28 KB).
  v1::SampleRequest huge;
  for (int i = 0; i < 4096; ++i) huge.add_prompts()->add_tokens(1 + i % 200);
  huge.set_n(256);
  huge.set_max_tokens(64);
  v1::SampleResponse out;
  ExpectCode(raw.stub->Sample(Ctx().get(), huge, &out), grpc::StatusCode::RESOURCE_EXHAUSTED, "max_sample_rows");
  // Under the row limit but over the sampled tokens.
  v1::SampleRequest tokens;
  for (int i = 0; i < 8; ++i) tokens.add_prompts()->add_tokens(1 + i);
  tokens.set_n(128);
  tokens.set_max_tokens(512);
  ExpectCode(raw.stub->Sample(Ctx().get(), tokens, &out), grpc::StatusCode::RESOURCE_EXHAUSTED,
             "max_sampled_tokens");
  // Under both, over the K/V-cache bytes.
  auto config = TestConfig();
  config.limits.max_kv_cache_bytes = 64 << 10;
  auto small = StartServer(config);
  Raw raw_small(small.target);
  v1::SampleRequest kv;
  for (int i = 0; i < 4; ++i) kv.add_prompts()->add_tokens(1 + i);
  kv.set_n(8);
  kv.set_max_tokens(200);
  ExpectCode(raw_small.stub->Sample(Ctx().get(), kv, &out), grpc::StatusCode::RESOURCE_EXHAUSTED,
             "limits.max_kv_cache_bytes");
  // Still serving, nothing changed.
  testing::ExpectSameTensors(testing::ExportedTensors(*s.client), before);
  v1::SampleRequest ok;
  ok.add_prompts()->add_tokens(1);
  ok.set_max_tokens(4);
  EXPECT_TRUE(raw.stub->Sample(Ctx().get(), ok, &out).ok());
}

TEST(Hardening, AnObjectiveMustTrainOnItsKindOfBatch) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  const auto before = testing::ExportedTensors(*s.client);
  v1::TrainStepRequest r;
  auto* g = r.mutable_batch()->mutable_grpo()->add_groups();
  g->add_prompt(1);
  g->add_completions()->add_tokens(2);
  g->add_completions()->add_tokens(3);
  r.set_objective("sft");
  v1::TrainStepResponse out;
  ExpectCode(raw.stub->TrainStep(Ctx().get(), r, &out), grpc::StatusCode::INVALID_ARGUMENT,
             "objective 'sft' trains on sft batches, but batch.grpo was given");
  testing::ExpectSameTensors(testing::ExportedTensors(*s.client), before);
}

TEST(Hardening, ShortOrEmptyBearerTokensAreRefusedAtLoad) {
  for (const std::string token : {"", "short"}) {
    auto config = TestConfig();
    config.auth.tokens = {token};
    try {
      config.Validate();
      FAIL() << "token '" << token << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("auth.tokens[0]"), std::string::npos) << e.what();
    }
  }
}

TEST(Hardening, ASecondServerOnTheSamePortFailsToStart) {
  auto first = StartServer(TestConfig());
  auto config = TestConfig();
  config.listen = "127.0.0.1:" + std::to_string(first.server->port());
  try {
    auto second = server::Server::Create(config);
    FAIL() << "a second server started on port " << first.server->port();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(first.client->GetInfo().ok());
}

TEST(Hardening, RequestIdsAreBoundedAndAReusedIdNeedsTheSameBody) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  v1::TrainStepResponse out;
  auto a = SftStep();
  a.set_request_id(std::string(2 << 20, 'i'));  // 2 MiB
  ExpectCode(raw.stub->TrainStep(Ctx().get(), a, &out), grpc::StatusCode::INVALID_ARGUMENT, "request_id is 2097152 bytes");
  a.set_request_id("step-1");
  ASSERT_TRUE(raw.stub->TrainStep(Ctx().get(), a, &out).ok());
  const auto loss = out.stats().loss();
  ASSERT_TRUE(raw.stub->TrainStep(Ctx().get(), a, &out).ok());  // a retry: the first answer
  EXPECT_EQ(out.stats().loss(), loss);
  EXPECT_EQ(s.server->policy_version(), 1);
  auto b = SftStep({9, 8, 7, 6});
  b.set_request_id("step-1");
  ExpectCode(raw.stub->TrainStep(Ctx().get(), b, &out), grpc::StatusCode::INVALID_ARGUMENT,
             "used before for a different request");
  EXPECT_EQ(s.server->policy_version(), 1);
}

TEST(Hardening, ExportsShareASnapshotAreBoundedAndHaveAChunkFloor) {
  // A model of ~30 MB (a large vocabulary), so that an export that is not read cannot
  // finish into the transport's buffers and keeps its slot.
  auto model_config = PresetConfig("tiny");
  model_config.vocab_size = 30000;
  const auto dir = testing::TempDir("export-model");
  SaveModel(InitModel(model_config, 0, torch::kFloat64), dir);
  auto config = TestConfig();
  config.model.dir = dir;
  config.trainer.reference.use_reference_model = false;
  config.limits.max_concurrent_exports = 2;
  auto s = StartServer(config);
  Raw raw(s.target);
  v1::ExportWeightsRequest tiny;
  tiny.set_max_chunk_bytes(1);
  {
    auto ctx = Ctx(10);
    auto reader = raw.stub->ExportWeights(ctx.get(), tiny);
    v1::WeightsChunk c;
    while (reader->Read(&c)) {
    }
    ExpectCode(reader->Finish(), grpc::StatusCode::INVALID_ARGUMENT, "max_chunk_bytes must be 0");
  }
  // Two exports that are not read hold their slots; a third is refused until one ends.
  v1::ExportWeightsRequest small;
  small.set_max_chunk_bytes(65536);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::WeightsChunk>>> readers;
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(Ctx(60));
    readers.push_back(raw.stub->ExportWeights(contexts.back().get(), small));
    v1::WeightsChunk first;
    ASSERT_TRUE(readers.back()->Read(&first));
  }
  {
    auto ctx = Ctx(10);
    auto third = raw.stub->ExportWeights(ctx.get(), small);
    v1::WeightsChunk c;
    EXPECT_FALSE(third->Read(&c));
    ExpectCode(third->Finish(), grpc::StatusCode::RESOURCE_EXHAUSTED, "limits.max_concurrent_exports");
  }
  std::string sha[2];
  for (int i = 0; i < 2; ++i) {
    v1::WeightsChunk c;
    while (readers[i]->Read(&c)) {
      if (c.last()) sha[i] = c.sha256();
    }
    EXPECT_TRUE(readers[i]->Finish().ok());
  }
  EXPECT_FALSE(sha[0].empty());
  EXPECT_EQ(sha[0], sha[1]);
  EXPECT_TRUE(s.client->ExportWeights().ok());  // the slots are free again

  // One snapshot per version, shared by every export of it.
  auto& host = s.server->host();
  std::promise<std::shared_ptr<const server::WeightsSnapshot>> p1, p2;
  server::CallContext c;
  c.method = "ExportWeights";
  host.export_weights(c, 0, false, [&](const server::Outcome<server::ExportReply>& o) { p1.set_value(o.value->snapshot); });
  host.export_weights(c, 0, false, [&](const server::Outcome<server::ExportReply>& o) { p2.set_value(o.value->snapshot); });
  EXPECT_EQ(p1.get_future().get().get(), p2.get_future().get().get());
}

TEST(Hardening, ChunkFloorsAndACancelledStepIsAbandonedAtAChunkBoundary) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  v1::TrainStepResponse out;
  for (const char* field : {"chunk", "key_chunk", "logits_chunk"}) {
    auto r = SftStep();
    if (std::string(field) == "chunk") r.mutable_engine()->set_chunk(1);
    if (std::string(field) == "key_chunk") r.mutable_engine()->set_key_chunk(1);
    if (std::string(field) == "logits_chunk") r.mutable_engine()->set_logits_chunk(1);
    ExpectCode(raw.stub->TrainStep(Ctx().get(), r, &out), grpc::StatusCode::INVALID_ARGUMENT,
               std::string("engine.") + field + " = 1 is below the server's floor 16");
  }
  // A step that runs for seconds, whose client gives up after 300 ms.
  const auto before = testing::ExportedTensors(*s.client);
  std::vector<int> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i % 256);
  auto long_step = SftStep(tokens);
  long_step.mutable_engine()->set_chunk(16);
  long_step.mutable_engine()->set_key_chunk(16);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  const auto st = raw.stub->TrainStep(&ctx, long_step, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(s.server->worker().wait_idle(std::chrono::seconds(60)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 3.0) << "the abandoned step held the device for " << seconds << " s";
  EXPECT_EQ(s.server->policy_version(), 0);
  testing::ExpectSameTensors(testing::ExportedTensors(*s.client), before);
  EXPECT_EQ(s.client->GetInfo()->pending_micro_batches(), 0);
}

TEST(Hardening, ABodyThatDoesNotParseIsInvalidArgument) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  for (const char* method : {"/streambp.v1.Trainer/TrainStep", "/streambp.v1.Trainer/GetInfo",
                             "/streambp.v1.Trainer/Sample", "/streambp.v1.Trainer/PushRollouts"}) {
    ExpectCode(raw.Bytes(method, std::string("\xff\xff\xff\xff\x0f", 5)), grpc::StatusCode::INVALID_ARGUMENT,
               "is not a valid streambp.v1.");
  }
}

TEST(Hardening, MessagesNameTheRightFields) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  v1::SampleRequest sample;
  sample.add_prompts()->add_tokens(1);
  sample.add_prompts()->add_tokens(9999);
  sample.set_max_tokens(2);
  v1::SampleResponse sampled;
  ExpectCode(raw.stub->Sample(Ctx().get(), sample, &sampled), grpc::StatusCode::INVALID_ARGUMENT,
             "prompts[1].tokens[0] = 9999");
  v1::PushRolloutsRequest push;
  for (int i = 0; i < 3; ++i) {
    auto* g = push.add_groups();
    g->add_prompt(1);
    auto* c = g->add_completions();
    c->add_tokens(2);
    c->set_reward(i == 2 ? std::nan("") : 1.0);
    g->add_completions()->add_tokens(3);
  }
  push.mutable_groups(1)->mutable_completions(0)->add_logprobs(0.5f);  // a positive log-prob
  v1::PushRolloutsResponse acks;
  ASSERT_TRUE(raw.stub->PushRollouts(Ctx().get(), push, &acks).ok());
  ASSERT_EQ(acks.acks_size(), 3);
  EXPECT_EQ(acks.acks(1).status(), "invalid");
  EXPECT_NE(acks.acks(1).message().find("groups[1].completions[0].logprobs[0]"), std::string::npos)
      << acks.acks(1).message();
  EXPECT_NE(acks.acks(1).message().find("positive"), std::string::npos) << acks.acks(1).message();
  EXPECT_NE(acks.acks(2).message().find("groups[2].completions[0].reward is not finite"), std::string::npos)
      << acks.acks(2).message();
}

// A GRPO group in a TrainStep batch and a pushed rollout group go through one conversion
// (docs/architecture.md: One walk per step): each bad group gets the same message from both,
// under its own field prefix, and changes nothing.
TEST(Hardening, AGrpoGroupIsCheckedAlikeInAStepAndInAPush) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  const auto before = testing::ExportedTensors(*s.client);
  // Two completions of prompt [1, 4]; each case spoils one thing.
  using Spoil = std::function<void(v1::GrpoCompletion*, v1::GrpoCompletion*)>;
  const std::vector<std::pair<std::string, Spoil>> cases = {
      {"is positive", [](auto* a, auto*) { a->set_logprobs(1, 0.25f); }},
      {"entries but the completion has", [](auto*, auto* b) { b->add_logprobs(-1.0f); }},
      {"is not finite", [](auto*, auto* b) { b->set_advantages(0, std::nanf("")); }},
      {"is outside the vocabulary", [](auto* a, auto*) { a->set_tokens(1, 9999); }},
      {"reward is not finite", [](auto*, auto* b) { b->set_reward(INFINITY); }},
      {"tokens is empty", [](auto* a, auto*) { a->clear_tokens(); a->clear_logprobs(); }},
  };
  for (const auto& [fragment, spoil] : cases) {
    auto fill = [&](auto* group) {
      group->add_prompt(1);
      group->add_prompt(4);
      for (int k = 0; k < 2; ++k) {
        auto* c = group->add_completions();
        for (int t : {2 + k, 3, 5}) c->add_tokens(t);
        for (float lp : {-1.5f, -0.5f, -2.0f}) c->add_logprobs(lp);
        for (float a : {0.5f, -0.5f, 1.0f}) c->add_advantages(a * (k ? -1.0f : 1.0f));
        c->set_reward(k);
      }
      spoil(group->mutable_completions(0), group->mutable_completions(1));
    };
    v1::TrainStepRequest step;
    fill(step.mutable_batch()->mutable_grpo()->add_groups());
    v1::TrainStepResponse trained;
    const auto st = raw.stub->TrainStep(Ctx().get(), step, &trained);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << fragment << ": " << st.error_message();
    v1::PushRolloutsRequest push;
    fill(push.add_groups());
    v1::PushRolloutsResponse acks;
    ASSERT_TRUE(raw.stub->PushRollouts(Ctx().get(), push, &acks).ok());
    ASSERT_EQ(acks.acks_size(), 1);
    EXPECT_EQ(acks.acks(0).status(), "invalid") << fragment;
    const std::string in_step = st.error_message(), in_push = acks.acks(0).message();
    EXPECT_NE(in_step.find(fragment), std::string::npos) << in_step;
    ASSERT_EQ(in_step.rfind("batch.grpo.groups[0]", 0), 0u) << in_step;
    ASSERT_NE(in_push.find("groups[0]"), std::string::npos) << in_push;
    EXPECT_EQ(in_step.substr(std::string("batch.grpo.groups[0]").size()),
              in_push.substr(in_push.find("groups[0]") + std::string("groups[0]").size()))
        << fragment;
  }
  testing::ExpectSameTensors(before, testing::ExportedTensors(*s.client));
  EXPECT_EQ(s.client->GetInfo()->policy_version(), 0);
}

TEST(Hardening, RangesAreValidatedWithoutOverflow) {
  auto s = StartServer(TestConfig());
  Raw raw(s.target);
  v1::ComputeLogprobsRequest lp;
  auto* seq = lp.add_sequences();
  for (int t : {1, 2, 3}) seq->add_tokens(t);
  lp.set_temperature(1e-300);
  v1::ComputeLogprobsResponse lp_out;
  ExpectCode(raw.stub->ComputeLogprobs(Ctx().get(), lp, &lp_out), grpc::StatusCode::INVALID_ARGUMENT,
             "temperature must be in");
  v1::EstimateMemoryRequest est;
  est.set_seq_len(int64_t{1} << 62);
  v1::EstimateMemoryResponse est_out;
  ExpectCode(raw.stub->EstimateMemory(Ctx().get(), est, &est_out), grpc::StatusCode::INVALID_ARGUMENT,
             "exceeds the maximum sequence length");
  est.set_seq_len(16);
  est.set_batch(int64_t{1} << 60);
  ExpectCode(raw.stub->EstimateMemory(Ctx().get(), est, &est_out), grpc::StatusCode::INVALID_ARGUMENT,
             "max_tokens_per_request");
  // Near the limits the estimate is large, finite and refused by a budget.
  auto config = TestConfig();
  config.limits.memory_budget_bytes = 1 << 30;
  auto b = StartServer(config);
  Raw raw_b(b.target);
  est.set_seq_len(32768);
  est.set_batch(32);
  est.mutable_engine()->set_engine("full");
  ASSERT_TRUE(raw_b.stub->EstimateMemory(Ctx().get(), est, &est_out).ok());
  EXPECT_GT(est_out.total_bytes(), int64_t{1} << 30);
  EXPECT_FALSE(est_out.fits());
}

TEST(Hardening, CheckpointTempsLiveInAHiddenFolderCleanedAtStart) {
  auto config = TestConfig();
  config.checkpoint_dir = testing::TempDir("staging");
  namespace fs = std::filesystem;
  // What an interrupted save left, and a user's checkpoint whose name looks like a temp.
  fs::create_directories(fs::path(config.checkpoint_dir) / ".staging" / "x.tmp-12345");
  auto s = StartServer(config);
  EXPECT_FALSE(fs::exists(fs::path(config.checkpoint_dir) / ".staging"));
  ASSERT_TRUE(Save(s.client, "x.tmp-12345").ok());
  ASSERT_TRUE(s.client->TrainStep(SftStep()).ok());
  ASSERT_TRUE(Save(s.client, "x").ok());
  EXPECT_TRUE(fs::exists(fs::path(config.checkpoint_dir) / "x.tmp-12345" / "manifest.json"));
  EXPECT_TRUE(fs::exists(fs::path(config.checkpoint_dir) / "x" / "manifest.json"));
  EXPECT_EQ(Save(s.client, ".hidden").code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(Hardening, ErrorsNameTheCheckpointNotTheServersPaths) {
  auto config = TestConfig();
  config.checkpoint_dir = testing::TempDir("no-paths");
  auto s = StartServer(config);
  ASSERT_TRUE(Save(s.client, "good").ok());
  std::ofstream(std::filesystem::path(config.checkpoint_dir) / "good" / "model.safetensors", std::ios::app) << "x";
  auto st = Load(s.client, "good").status();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().find(config.checkpoint_dir), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("model.safetensors"), std::string::npos) << st.error_message();
}

TEST(Hardening, DiskFullOnSaveIsResourceExhaustedAndKeepsTheOldCheckpoint) {
  std::string why;
  auto disk = testing::SmallDisk::Create(4 << 20, &why);
  if (!disk) GTEST_SKIP() << why;
  auto config = TestConfig();
  config.checkpoint_dir = disk->path() + "/ckpt";
  auto s = StartServer(config);
  ASSERT_TRUE(Save(s.client, "c").ok());
  ASSERT_TRUE(s.client->TrainStep(SftStep()).ok());
  disk->fill(64 << 10);
  auto st = Save(s.client, "c").status();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("no space left"), std::string::npos) << st.error_message();
  disk->unfill();
  auto loaded = Load(s.client, "c");
  ASSERT_TRUE(loaded.ok()) << loaded.status().error_message();
  EXPECT_EQ(loaded->step(), 0);  // the old one, intact
}

TEST(Hardening, ReflectionNeedsATokenWhenAuthIsOn) {
  const std::string list_services("\x3a\x00", 2);  // ServerReflectionRequest{list_services: ""}
  const char* method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  {
    auto s = StartServer(TestConfig());
    std::string reply;
    ASSERT_TRUE(Raw(s.target).Bytes(method, list_services, &reply).ok());
    EXPECT_NE(reply.find("streambp.v1.Trainer"), std::string::npos);
  }
  auto config = TestConfig();
  config.auth.tokens = {"a-long-enough-token-0001"};
  {
    auto s = StartServer(config);
    EXPECT_EQ(Raw(s.target).Bytes(method, list_services).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  config.auth.reflection_without_token = true;
  auto s = StartServer(config);
  EXPECT_TRUE(Raw(s.target).Bytes(method, list_services).ok());
}

}  // namespace
}  // namespace streambp
