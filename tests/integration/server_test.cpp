// The real server on a loopback port, driven through the client library: every RPC, every
// objective, equality with the in-process Trainer, and the bad-input matrix.
#include <thread>

#include <gtest/gtest.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "grpc/health/v1/health.grpc.pb.h"
#include "integration/server_fixture.h"
#include "streambp/data.h"
#include "streambp/engine.h"
#include "streambp/estimate.h"
#include "streambp/model.h"
#include "streambp/objective.h"
#include "test_util/fixtures.h"
#include "device_worker.h"

namespace streambp {
namespace {

using testing::ExportedTensors;
using testing::StartServer;
using testing::TestConfig;

// The in-process reference: a Trainer with the server's options on the same model.
std::unique_ptr<Trainer> LocalTrainer(const server::ServerConfig& c) {
  TrainerOptions o = c.trainer;
  o.max_sequence_length = c.limits.max_sequence_length;
  return Trainer::Create(InitModel(PresetConfig(c.model.preset), c.model.seed, ParseDtype(c.model.dtype)), o);
}

// Sequences as the server sees them: the wire carries sampler log-probs as float32.
std::vector<Sequence> LocalSequences(const std::string& path, const std::string& kind) {
  auto seqs = ReadExamples(path, kind);
  for (auto& s : seqs) {
    for (auto& v : s.sampler_logprobs) v = static_cast<float>(v);
  }
  return seqs;
}

v1::TrainStepRequest StepRequest(const v1::Batch& batch) {
  v1::TrainStepRequest r;
  *r.mutable_batch() = batch;
  return r;
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

TEST(Server, GetInfoDescribesTheModel) {
  auto s = StartServer(TestConfig());
  auto info = s.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status().error_message();
  EXPECT_EQ(info->architecture(), "Qwen3ForCausalLM");
  EXPECT_EQ(info->num_layers(), 2);
  EXPECT_EQ(info->hidden_size(), 64);
  EXPECT_EQ(info->vocab_size(), 256);
  EXPECT_EQ(info->dtype(), "float64");
  EXPECT_EQ(info->device(), "cpu");
  EXPECT_EQ(info->engine(), "stream");
  EXPECT_EQ(info->policy_version(), 0);
  EXPECT_EQ(info->world_size(), 1);
  EXPECT_GT(info->num_parameters(), 100000);
  EXPECT_NE(info->runtime().find("BLAS"), std::string::npos);
}

// N TrainSteps over the wire == N steps of the in-process Trainer, for every objective:
// losses to 1e-12 relative and the final weights bit for bit (float64, same data, seed).
TEST(Server, TrainStepsEqualInProcessTrainerForEveryObjective) {
  const std::pair<std::string, std::string> cases[] = {
      {"sft", testing::SftJsonl()}, {"dpo", testing::DpoJsonl()}, {"grpo", testing::GrpoJsonl()}};
  for (const auto& [kind, text] : cases) {
    auto config = TestConfig();
    auto s = StartServer(config);
    auto local = LocalTrainer(config);
    const auto path = testing::WriteFile(kind + ".jsonl", text);
    auto batch = client::ReadBatchJsonl(path, kind);
    auto seqs = LocalSequences(path, kind);
    for (int step = 0; step < 3; ++step) {
      auto remote = s.client->TrainStep(StepRequest(batch));
      ASSERT_TRUE(remote.ok()) << kind << ": " << remote.status().error_message();
      auto objective = CreateObjective(kind, nlohmann::json::object());
      auto mine = local->train_step(seqs, *objective);
      EXPECT_LE(Relative(remote->stats().loss(), mine.forward.loss), 1e-12) << kind << " step " << step;
      EXPECT_EQ(remote->optim().policy_version(), step + 1);
      EXPECT_FALSE(remote->optim().skipped());
      EXPECT_EQ(remote->stats().engine(), "stream");
      EXPECT_GT(remote->stats().peak_memory_bytes(), 0);
      for (const auto& [k, v] : mine.forward.metrics) {
        ASSERT_TRUE(remote->stats().metrics().count(k)) << kind << " metric " << k;
        EXPECT_NEAR(remote->stats().metrics().at(k), v, 1e-9 * std::max(1.0, std::abs(v))) << k;
      }
    }
    testing::ExpectSameTensors(ExportedTensors(*s.client), local->model()->hf_tensors());
  }
}

TEST(Server, ForwardBackwardThenOptimStepEqualsTrainStep) {
  auto config = TestConfig();
  auto a = StartServer(config);
  auto b = StartServer(config);
  auto batch = client::ReadBatchJsonl(testing::WriteFile("sft.jsonl", testing::SftJsonl()), "sft");
  ASSERT_TRUE(a.client->TrainStep(StepRequest(batch)).ok());
  v1::ForwardBackwardRequest fb;
  *fb.mutable_batch() = batch;
  auto f = b.client->ForwardBackward(fb);
  ASSERT_TRUE(f.ok()) << f.status().error_message();
  EXPECT_EQ(f->policy_version(), 0);
  auto info = b.client->GetInfo();
  EXPECT_EQ(info->pending_micro_batches(), 1);
  auto o = b.client->OptimStep();
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->policy_version(), 1);
  testing::ExpectSameTensors(ExportedTensors(*a.client), ExportedTensors(*b.client));
  // Nothing pending now: OptimStep is refused.
  auto again = b.client->OptimStep();
  EXPECT_EQ(again.code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(Server, ComputeLogprobsEqualsInProcess) {
  auto config = TestConfig();
  auto s = StartServer(config);
  auto local = LocalTrainer(config);
  v1::ComputeLogprobsRequest req;
  const std::vector<std::vector<int>> seqs = {{1, 2, 3, 4, 5, 6}, {7, 8, 9}};
  for (const auto& tokens : seqs) req.add_sequences()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  req.set_temperature(0.8);
  auto r = s.client->ComputeLogprobs(req);
  ASSERT_TRUE(r.ok()) << r.status().error_message();
  ASSERT_EQ(r->sequences_size(), 2);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence seq;
    seq.tokens.assign(seqs[i].begin(), seqs[i].end());
    auto logp = TokenLogprobs(local->model(), MakeBatch({seq}, Layout::kRightPad), 64, 0.8);
    ASSERT_EQ(r->sequences(i).logprobs_size(), static_cast<int>(seqs[i].size()) - 1);
    for (int t = 0; t < r->sequences(i).logprobs_size(); ++t) {
      EXPECT_NEAR(r->sequences(i).logprobs(t), logp[0][t].item<double>(), 1e-6);
    }
  }
  req.set_reference(true);
  EXPECT_TRUE(s.client->ComputeLogprobs(req).ok());
}

TEST(Server, ExportWeightsIsBitExactInSmallChunks) {
  auto s = StartServer(TestConfig());
  v1::ExportWeightsRequest req;
  req.set_max_chunk_bytes(100000);  // the tiny model is ~0.9 MB in float64: ~9 messages
  auto w = s.client->ExportWeights(req);
  ASSERT_TRUE(w.ok()) << w.status().error_message();
  auto tensors = ParseSafetensors(w->data, "export").tensors;
  auto local = InitModel(PresetConfig("tiny"), 0, torch::kFloat64);
  testing::ExpectSameTensors(tensors, local->hf_tensors());
  EXPECT_EQ(ModelConfig::FromJson(nlohmann::json::parse(w->config_json)).ToJson()["hidden_size"], 64);
}

TEST(Server, CheckpointsSaveAndLoad) {
  auto config = TestConfig();
  config.checkpoint_dir = testing::TempDir("server-ckpt");
  auto s = StartServer(config);
  auto batch = client::ReadBatchJsonl(testing::WriteFile("sft.jsonl", testing::SftJsonl()), "sft");
  ASSERT_TRUE(s.client->TrainStep(StepRequest(batch)).ok());
  v1::SaveCheckpointRequest save;
  save.set_name("after-one");
  auto saved = s.client->SaveCheckpoint(save);
  ASSERT_TRUE(saved.ok()) << saved.status().error_message();
  EXPECT_EQ(saved->step(), 1);
  EXPECT_GT(saved->bytes(), 0);
  const auto at_save = ExportedTensors(*s.client);
  ASSERT_TRUE(s.client->TrainStep(StepRequest(batch)).ok());
  auto loaded = s.client->LoadCheckpoint();  // empty name: the newest complete one
  ASSERT_TRUE(loaded.ok()) << loaded.status().error_message();
  EXPECT_EQ(loaded->name(), "after-one");
  EXPECT_EQ(loaded->policy_version(), 1);
  testing::ExpectSameTensors(ExportedTensors(*s.client), at_save);
  // The saved folder is a model folder too.
  auto model = LoadModel(config.checkpoint_dir + "/after-one", torch::kFloat64);
  testing::ExpectSameTensors(model->hf_tensors(), at_save);
  // Names are names, never paths.
  v1::SaveCheckpointRequest bad;
  bad.set_name("../escape");
  EXPECT_EQ(s.client->SaveCheckpoint(bad).code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::LoadCheckpointRequest missing;
  missing.set_name("nope");
  EXPECT_EQ(s.client->LoadCheckpoint(missing).code(), grpc::StatusCode::NOT_FOUND);
}

TEST(Server, EstimateMemoryOrdersTheEngines) {
  auto s = StartServer(TestConfig());
  int64_t totals[3];
  const char* engines[] = {"full", "checkpoint", "stream"};
  for (int i = 0; i < 3; ++i) {
    v1::EstimateMemoryRequest req;
    req.set_seq_len(4096);
    req.mutable_engine()->set_engine(engines[i]);
    auto r = s.client->EstimateMemory(req);
    ASSERT_TRUE(r.ok()) << r.status().error_message();
    EXPECT_TRUE(r->fits());
    EXPECT_EQ(r->engine(), engines[i]);
    totals[i] = r->total_bytes();
  }
  EXPECT_GT(totals[0], totals[1]);
  EXPECT_GT(totals[1], totals[2]);
}

TEST(Server, HealthServesWithoutCredentials) {
  auto config = TestConfig();
  config.auth.tokens = {"secret-token-0123456789"};
  auto s = StartServer(config);
  auto channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "streambp.v1.Trainer"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    auto st = health->Check(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  s.server->Shutdown();
}

// Each bad input: the status code, a message naming the problem, and weights unchanged.
TEST(Server, BadInputsAreRefusedAndChangeNothing) {
  auto config = TestConfig();
  config.limits.max_sequence_length = 64;
  config.limits.max_message_bytes = 1 << 20;
  auto s = StartServer(config);
  const auto before = ExportedTensors(*s.client);
  struct Case {
    std::string name;
    std::function<void(v1::TrainStepRequest&)> edit;
    grpc::StatusCode code;
    std::string message;
  };
  auto sft = [](v1::TrainStepRequest& r) -> v1::SftExample* {
    auto* e = r.mutable_batch()->mutable_sft()->add_examples();
    for (int t : {1, 2, 3, 4}) e->add_tokens(t);
    return e;
  };
  const std::vector<Case> cases = {
      {"token outside the vocabulary", [&](auto& r) { sft(r)->set_tokens(2, 256); }, grpc::StatusCode::INVALID_ARGUMENT,
       "batch.sft.examples[0].tokens[2] = 256 is outside the vocabulary [0, 256)"},
      {"negative token", [&](auto& r) { sft(r)->set_tokens(0, -1); }, grpc::StatusCode::INVALID_ARGUMENT, "= -1"},
      {"mask length", [&](auto& r) { sft(r)->add_loss_mask(1); }, grpc::StatusCode::INVALID_ARGUMENT,
       "loss_mask has 1 entries but tokens has 4"},
      {"empty batch", [](auto& r) { r.mutable_batch(); }, grpc::StatusCode::INVALID_ARGUMENT, "batch is empty"},
      {"empty examples", [](auto& r) { r.mutable_batch()->mutable_sft(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "batch.sft.examples is empty"},
      {"empty sequence", [](auto& r) { r.mutable_batch()->mutable_sft()->add_examples(); },
       grpc::StatusCode::INVALID_ARGUMENT, "is empty"},
      {"too long", [&](auto& r) { auto* e = sft(r); for (int i = 0; i < 70; ++i) e->add_tokens(5); },
       grpc::StatusCode::INVALID_ARGUMENT, "exceed the maximum sequence length 64"},
      {"unknown objective", [&](auto& r) { sft(r); r.set_objective("ppo-magic"); }, grpc::StatusCode::INVALID_ARGUMENT,
       "unknown objective 'ppo-magic'"},
      {"options of another objective", [&](auto& r) { sft(r); r.mutable_dpo()->set_beta(0.1); },
       grpc::StatusCode::INVALID_ARGUMENT, "options.dpo given for a sft batch"},
      {"bad option value", [](auto& r) {
         auto* g = r.mutable_batch()->mutable_grpo()->add_groups();
         g->add_prompt(1);
         for (int k = 0; k < 2; ++k) { auto* c = g->add_completions(); c->add_tokens(2 + k); c->set_reward(k); }
         r.mutable_grpo()->set_loss_type("ppo");
       }, grpc::StatusCode::INVALID_ARGUMENT, "unknown loss_type 'ppo'"},
      {"non-finite reward", [](auto& r) {
         auto* g = r.mutable_batch()->mutable_grpo()->add_groups();
         g->add_prompt(1);
         for (int k = 0; k < 2; ++k) { auto* c = g->add_completions(); c->add_tokens(2); c->set_reward(k ? NAN : 1.0); }
       }, grpc::StatusCode::INVALID_ARGUMENT, "batch.grpo.groups[0].completions[1].reward is not finite"},
      {"logprobs length", [](auto& r) {
         auto* g = r.mutable_batch()->mutable_grpo()->add_groups();
         g->add_prompt(1);
         for (int k = 0; k < 2; ++k) { auto* c = g->add_completions(); c->add_tokens(2); c->add_tokens(3); c->add_logprobs(-1); }
       }, grpc::StatusCode::INVALID_ARGUMENT, "logprobs has 1 entries but the completion has 2 tokens"},
      {"group of one", [](auto& r) {
         auto* g = r.mutable_batch()->mutable_grpo()->add_groups();
         g->add_prompt(1);
         auto* c = g->add_completions(); c->add_tokens(2); c->set_reward(1);
       }, grpc::StatusCode::INVALID_ARGUMENT, "alone in its group"},
      {"dpo pair with empty chosen", [](auto& r) {
         auto* p = r.mutable_batch()->mutable_dpo()->add_pairs();
         p->add_prompt(1); p->add_rejected(2);
       }, grpc::StatusCode::INVALID_ARGUMENT, "batch.dpo.pairs[0].chosen is empty"},
      {"oversize message", [&](auto& r) { auto* e = sft(r); for (int i = 0; i < 600000; ++i) e->add_tokens(200); },
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
  };
  for (const auto& c : cases) {
    v1::TrainStepRequest req;
    c.edit(req);
    auto r = s.client->TrainStep(req);
    EXPECT_EQ(r.code(), c.code) << c.name << ": " << r.status().error_message();
    EXPECT_NE(r.status().error_message().find(c.message), std::string::npos) << c.name << ": " << r.status().error_message();
  }
  v1::EstimateMemoryRequest est;
  EXPECT_EQ(s.client->EstimateMemory(est).code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ComputeLogprobsRequest lp;
  lp.add_sequences()->add_tokens(999);
  EXPECT_EQ(s.client->ComputeLogprobs(lp).code(), grpc::StatusCode::INVALID_ARGUMENT);
  testing::ExpectSameTensors(ExportedTensors(*s.client), before);
  EXPECT_EQ(s.client->GetInfo()->policy_version(), 0);
  EXPECT_EQ(s.client->GetInfo()->pending_micro_batches(), 0);
}

TEST(Server, MemoryBudgetRefusesAStepThatCannotFit) {
  auto config = TestConfig();
  config.limits.memory_budget_bytes = 4 << 20;  // the float64 tiny model alone needs ~0.9 MB x 4
  config.trainer.engine.kind = EngineKind::kFull;
  auto s = StartServer(config);
  const auto before = ExportedTensors(*s.client);
  v1::TrainStepRequest req;
  auto* e = req.mutable_batch()->mutable_sft()->add_examples();
  for (int i = 0; i < 2048; ++i) e->add_tokens(i % 256);
  auto r = s.client->TrainStep(req);
  EXPECT_EQ(r.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(r.status().error_message().find("memory budget"), std::string::npos) << r.status().error_message();
  testing::ExpectSameTensors(ExportedTensors(*s.client), before);
}

// A server with a reference model holds a frozen copy of the weights for its whole life: a
// step that fits the budget beside the policy alone is refused beside the copy, naming it.
TEST(Server, MemoryBudgetCountsTheReferenceModelsCopy) {
  auto config = TestConfig();
  config.trainer.engine.kind = EngineKind::kFull;
  const auto tiny = PresetConfig("tiny");
  constexpr int64_t kLength = 64;
  const int64_t step =
      EstimateStepMemory(tiny, torch::kFloat64, 1, kLength, config.trainer.engine, config.trainer.optimizer.name)
          .total();
  const int64_t copy = EstimateForwardMemory(tiny, torch::kFloat64, 1, 1).weights_bytes;
  config.limits.memory_budget_bytes = step + copy / 2;
  config.trainer.reference.use_reference_model = false;
  v1::TrainStepRequest req;
  auto* e = req.mutable_batch()->mutable_sft()->add_examples();
  for (int i = 0; i < kLength; ++i) e->add_tokens(i % 256);
  {
    auto without = StartServer(config);
    const auto r = without.client->TrainStep(req);
    ASSERT_TRUE(r.ok()) << r.status().error_message();
  }
  config.trainer.reference.use_reference_model = true;
  auto with = StartServer(config);
  const auto before = ExportedTensors(*with.client);
  const auto r = with.client->TrainStep(req);
  EXPECT_EQ(r.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(r.status().error_message().find("the reference model "), std::string::npos) << r.status().error_message();
  testing::ExpectSameTensors(ExportedTensors(*with.client), before);
  config.limits.memory_budget_bytes = step + copy;  // room for both: admitted
  auto roomy = StartServer(config);
  const auto fits = roomy.client->TrainStep(req);
  EXPECT_TRUE(fits.ok()) << fits.status().error_message();
}

// limits.auto_chunks: a stream step that sets no chunk sizes gets the defaults, halved until
// their estimate fits the budget (smaller than the defaults when the budget is tight).
TEST(Server, AutoChunksFitTheMemoryBudget) {
  auto config = TestConfig();
  config.model.dtype = "float32";
  const auto tiny = PresetConfig("tiny");
  const auto defaults = DefaultChunks(tiny, torch::kFloat32, 4096);
  // One byte less than the defaults need at T=4096.
  const int64_t budget =
      EstimateStepMemory(tiny, torch::kFloat32, 1, 4096, EngineOptions{}, config.trainer.optimizer.name).total() - 1;
  config.limits.memory_budget_bytes = budget;
  config.limits.auto_chunks = true;
  auto s = StartServer(config);
  v1::TrainStepRequest req;
  auto* e = req.mutable_batch()->mutable_sft()->add_examples();
  for (int i = 0; i < 4096; ++i) e->add_tokens(i % 256);
  auto r = s.client->TrainStep(req);
  ASSERT_TRUE(r.ok()) << r.status().error_message();
  const auto chosen = ChooseChunks(tiny, torch::kFloat32, 1, 4096, budget, config.trainer.optimizer.name);
  EXPECT_EQ(r->stats().chunk(), chosen.chunk);
  EXPECT_EQ(r->stats().key_chunk(), chosen.key_chunk);
  EXPECT_EQ(r->stats().logits_chunk(), chosen.logits_chunk);
  EXPECT_LT(r->stats().chunk(), defaults.chunk);
  EXPECT_LE(r->stats().peak_memory_bytes(), budget);
}

TEST(Server, RequestIdRetryIsAppliedOnce) {
  auto s = StartServer(TestConfig());
  auto batch = client::ReadBatchJsonl(testing::WriteFile("sft.jsonl", testing::SftJsonl()), "sft");
  auto req = StepRequest(batch);
  req.set_request_id("retry-1");
  auto first = s.client->TrainStep(req);
  auto second = s.client->TrainStep(req);
  ASSERT_TRUE(first.ok() && second.ok());
  // The same answer (map fields serialize in no fixed order: compare as messages).
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*first, *second));
  EXPECT_EQ(s.client->GetInfo()->step(), 1);
  req.set_request_id("retry-2");
  ASSERT_TRUE(s.client->TrainStep(req).ok());
  EXPECT_EQ(s.client->GetInfo()->step(), 2);
}

TEST(Server, FullQueueAnswersResourceExhausted) {
  auto config = TestConfig();
  config.limits.queue_depth = 2;
  auto s = StartServer(config);
  auto batch = client::ReadBatchJsonl(testing::WriteFile("sft.jsonl", testing::SftJsonl()), "sft");
  s.server->worker().pause();
  std::vector<std::thread> threads;
  std::vector<grpc::StatusCode> codes(2);
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { codes[i] = s.client->TrainStep(StepRequest(batch)).code(); });
  }
  while (s.server->worker().depth() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto third = s.client->TrainStep(StepRequest(batch));
  EXPECT_EQ(third.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(third.status().error_message().find("queue is full"), std::string::npos);
  s.server->worker().resume();
  for (auto& t : threads) t.join();
  EXPECT_EQ(codes[0], grpc::StatusCode::OK);
  EXPECT_EQ(codes[1], grpc::StatusCode::OK);
  EXPECT_EQ(s.client->GetInfo()->step(), 2);
}

TEST(Server, DeadlineBeforeStartIsDroppedAndNotApplied) {
  auto s = StartServer(TestConfig());
  auto batch = client::ReadBatchJsonl(testing::WriteFile("sft.jsonl", testing::SftJsonl()), "sft");
  s.server->worker().pause();
  client::CallOptions call;
  call.timeout = std::chrono::milliseconds(300);
  auto r = s.client->TrainStep(StepRequest(batch), call);
  EXPECT_EQ(r.code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server's deadline is the client's as the request arrived (a little later on a
  // loaded machine): let it pass too before the job's turn comes.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  s.server->worker().resume();
  ASSERT_TRUE(s.server->worker().wait_idle(std::chrono::seconds(10)));
  EXPECT_EQ(s.client->GetInfo()->step(), 0);
}

TEST(Server, ConcurrentClientsEveryStepAppliedOnce) {
  auto config = TestConfig();
  config.model.dtype = "float32";
  config.trainer.optimizer.name = "sgd";
  auto s = StartServer(config);
  v1::Batch batch;
  auto* e = batch.mutable_sft()->add_examples();
  for (int t : {1, 2, 3, 4, 5}) e->add_tokens(t);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&] {
      client::ClientOptions o;
      o.target = s.target;
      auto cl = client::Client::Create(o);
      for (int i = 0; i < 50; ++i) ok += cl->TrainStep(StepRequest(batch)).ok();
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 400);
  EXPECT_EQ(s.client->GetInfo()->step(), 400);
  EXPECT_EQ(s.client->GetInfo()->policy_version(), 400);
}

TEST(Server, AuthTokens) {
  auto config = TestConfig();
  config.auth.tokens = {"full-access-token-0001"};
  config.auth.read_only_tokens = {"look-only-token-00001"};
  auto s = StartServer(config);
  auto batch = client::ReadBatchJsonl(testing::WriteFile("sft.jsonl", testing::SftJsonl()), "sft");
  auto with = [&](const std::string& token) {
    client::ClientOptions o;
    o.target = s.target;
    o.token = token;
    return client::Client::Create(o);
  };
  auto none = s.client->GetInfo();
  EXPECT_EQ(none.code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(none.status().error_message().find("Bearer"), std::string::npos);
  EXPECT_EQ(with("wrong")->GetInfo().code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(with("look-only-token-00001")->GetInfo().ok());
  EXPECT_EQ(with("look-only-token-00001")->TrainStep(StepRequest(batch)).code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(with("full-access-token-0001")->TrainStep(StepRequest(batch)).ok());
  EXPECT_EQ(with("full-access-token-0001")->GetInfo()->step(), 1);
}

}  // namespace
}  // namespace streambp
