// The TrainingHost without gRPC: this executable links no gRPC and no generated code, so it
// also proves the host layer does not use them (a use would not link).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "admission.h"
#include "command.h"
#include "executor.h"
#include "host.h"
#include "replica.h"
#include "streambp/dist.h"
#include "streambp/error.h"
#include "streambp/estimate.h"
#include "streambp/objective.h"
#include "streambp/safetensors.h"
#include "test_util/fixtures.h"
#include "test_util/top_k.h"
#include "host_fixtures.h"

namespace streambp::server {
namespace {


TEST(Host, TrainStepEqualsTheTrainerInProcess) {
  auto host = TrainingHost::Create(HostConfig());
  auto step = SftStep({{1, 5, 9, 13, 17}, {2, 4, 6, 8}});
  auto o = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep"), step, done); });
  ASSERT_TRUE(o.ok()) << ErrorOf(o.error);
  EXPECT_EQ(o.value->optim.policy_version, 1);
  EXPECT_EQ(host->policy_version(), 1);

  // The same step on a Trainer made by hand.
  RegisterBuiltinObjectives();
  auto config = HostConfig();
  auto trainer = Trainer::Create(LoadOrInitModel(config.model_source()), config.trainer);
  auto objective = CreateObjective("sft", nlohmann::json::object());
  EngineOptions engine = config.trainer.engine;
  const auto r = trainer->train_step(step.sequences, *objective, &engine);
  EXPECT_EQ(r.forward.loss, o.value->forward.result.loss);
  ExpectSame(Weights(*host), trainer->model()->hf_tensors());
}

// model.family serves the embedded preset as another architecture: its weights carry that
// family's tensors (Gemma3's pre/post-feedforward norms), a step trains, and an unknown family
// is refused by name before anything is built.
TEST(Host, EmbeddedPresetInAnotherFamily) {
  auto config = HostConfig();
  config.model.family = "gemma3";
  config.Validate();
  EXPECT_NE(config.model_source().describe().find("as gemma3"), std::string::npos);
  auto host = TrainingHost::Create(config);
  const auto before = Weights(*host);
  EXPECT_EQ(before.count("model.layers.0.pre_feedforward_layernorm.weight"), 1u);
  EXPECT_EQ(before.count("lm_head.weight"), 0u);  // tied, as Gemma3 is
  auto o = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep"), SftStep({{1, 5, 9, 13, 17}}), done); });
  ASSERT_TRUE(o.ok()) << ErrorOf(o.error);
  EXPECT_FALSE(torch::equal(Weights(*host).at("model.layers.0.mlp.up_proj.weight"),
                            before.at("model.layers.0.mlp.up_proj.weight")));
  config.model.family = "gpt2";
  try {
    config.Validate();
    ADD_FAILURE() << "an unknown family was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.family must be"), std::string::npos) << e.what();
  }
  auto round = ServerConfig::FromJson(config.ToJson(), false);
  EXPECT_EQ(round.model.family, "gpt2");
}

// parallel.context_parallel: parsed, written back, bounded; a layout the ranks cannot form is
// refused at start with what to change (tests/cli/cp_serve_test.sh runs the real 2-rank server).
// Admission walks the step once: it validates the sequences (bad ids refused before anything
// is queued) and returns the plan the step then runs with (docs/architecture.md: One walk per
// step). Its budget counts a batch's 2-D targets: [rows, T, K] ids and weights.
TEST(Host, AdmissionPlansTheStepOnceAndCountsTopKTargets) {
  auto config = HostConfig();
  config.limits.auto_chunks = false;
  config.trainer.micro_batch_tokens = 12;
  config.trainer.layout = Layout::kRightPad;
  const auto model = PresetConfig("tiny");
  auto step = SftStep({std::vector<int64_t>(10, 5), {1, 2, 3}, {4, 5}, std::vector<int64_t>(7, 9)});
  {
    Admission admission(config, model, torch::kFloat64);
    auto engine = admission.resolve_engine(EngineRequest{});
    const auto plan = admission.admit_step(step.sequences, false, &engine);
    EXPECT_EQ(plan.sequences, 4u);
    EXPECT_EQ(plan.tokens, 22);
    EXPECT_EQ(plan.longest, 10);
    EXPECT_EQ(plan.micro_batches, SplitMicroBatches(step.sequences, Layout::kRightPad, 12));
    EXPECT_GT(plan.micro_batches.size(), 1u);
    auto bad = step;
    bad.sequences[2].tokens[1] = model.vocab_size;
    try {
      admission.admit_step(bad.sequences, false, &engine);
      ADD_FAILURE() << "an id outside the vocabulary was admitted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("sequence 2: tokens[1] = " + std::to_string(model.vocab_size) +
                                           " is outside the vocabulary"),
                std::string::npos)
          << e.what();
    }
  }
  // One 64-token sequence; with K = 16 candidates per token the step needs 64 x 16 x 32
  // bytes more than without: admitted at a budget that counts them, refused 1 byte below.
  const int64_t T = 64, K = 16;
  config.trainer.micro_batch_tokens = 0;
  auto plain = SftStep({std::vector<int64_t>(T, 3)});
  auto distill = plain;
  testing::AddTopK(distill.sequences, model.vocab_size, K);
  const auto base = Admission(config, model, torch::kFloat64).estimate(1, T, EngineRequest{}).estimate.total();
  auto admit = [&](int64_t budget, const StepRequest& r) {
    config.limits.memory_budget_bytes = budget;
    Admission a(config, model, torch::kFloat64);
    auto e = a.resolve_engine(EngineRequest{});
    try {
      a.admit_step(r.sequences, false, &e);
    } catch (const ResourceExhausted& error) {
      return std::string(error.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(admit(base, plain), "(accepted)");
  EXPECT_NE(admit(base, distill).find("the step is estimated at"), std::string::npos);
  EXPECT_EQ(admit(base + T * K * 32, distill), "(accepted)");
  EXPECT_NE(admit(base + T * K * 32 - 1, distill).find("but the memory budget is"), std::string::npos);
}

// return_logprobs runs a forward pass over the whole batch before the step: admitted on its
// own estimate. Under a budget the step fits but that pass does not, the call is refused
// before anything runs (nothing changes); the same step without return_logprobs runs.
TEST(Host, TheForwardPassOfReturnLogprobsIsAdmittedOnItsOwnEstimate) {
  auto config = HostConfig();
  config.trainer.engine.logits_chunk = -1;  // the forward pass's logits over the whole batch
  config.trainer.micro_batch_tokens = 1024;  // the step: one sequence at a time
  const auto model = PresetConfig("tiny");
  auto step = SftStep(std::vector<std::vector<int64_t>>(8, std::vector<int64_t>(1024, 7)));
  // The smallest budget each admits (both refusals are monotone in the budget).
  auto smallest = [&](const std::function<void(const Admission&)>& admit) {
    int64_t lo = 1, hi = int64_t{1} << 40;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      config.limits.memory_budget_bytes = mid;
      try {
        admit(Admission(config, model, torch::kFloat64));
        hi = mid;
      } catch (const ResourceExhausted&) {
        lo = mid + 1;
      }
    }
    return lo;
  };
  const int64_t forward = smallest([&](const Admission& a) { a.admit_forward(step.sequences, "forward", ""); });
  const int64_t whole_step = smallest([&](const Admission& a) {
    auto e = a.resolve_engine(EngineRequest{});
    a.admit_step(step.sequences, false, &e);
  });
  ASSERT_LT(whole_step, forward) << "the test needs a step that fits where the forward pass does not";
  config.limits.memory_budget_bytes = forward - 1;
  auto host = TrainingHost::Create(config);
  const auto before = Weights(*host);
  auto with = step;
  with.return_logprobs = true;
  auto refused = Wait<StepStats>([&](auto done) { host->forward_backward(Ctx("ForwardBackward"), with, done); });
  ASSERT_FALSE(refused.ok());
  ErrorCode code{};
  const auto message = ErrorOf(refused.error, &code);
  EXPECT_EQ(code, ErrorCode::kResourceExhausted) << message;
  EXPECT_NE(message.find("the forward pass of return_logprobs is estimated at"), std::string::npos) << message;
  EXPECT_NE(message.find("leave return_logprobs off"), std::string::npos) << message;
  ExpectSame(Weights(*host), before);
  EXPECT_EQ(host->info().pending_micro_batches, 0);
  auto ran = Wait<StepStats>([&](auto done) { host->forward_backward(Ctx("ForwardBackward"), step, done); });
  ASSERT_TRUE(ran.ok()) << ErrorOf(ran.error);
}

// A full fine-tuning session holds its own copy of the weights and a frozen reference copy
// while the shared base stays on the device: its own requests count the base and the
// reference beside their estimate, and every other session's count its resident bytes,
// reference included.
TEST(Host, AFullSessionCountsTheSharedBaseAndItsReference) {
  auto config = HostConfig();
  config.checkpoint_dir = testing::TempDir("host-full-session");
  config.sessions.enabled = true;
  config.sessions.allow_full_finetuning = true;
  config.trainer.reference.use_reference_model = true;
  auto host = TrainingHost::Create(config);
  for (const bool full : {true, false}) {
    SessionRequest r;
    r.spec.name = full ? "full" : "lora";
    r.spec.full = full;
    r.spec.lora.r = 4;
    auto created = Wait<SessionReport>([&](auto done) { host->create_session(Ctx("CreateSession"), r, done); });
    ASSERT_TRUE(created.ok()) << ErrorOf(created.error);
  }
  auto ctx = Ctx("TrainStep");
  ctx.session = "full";
  auto trained = Wait<TrainStats>([&](auto done) { host->train_step(ctx, SftStep({{1, 2, 3, 4, 5}}), done); });
  ASSERT_TRUE(trained.ok()) << ErrorOf(trained.error);

  const Admission alone(config, PresetConfig("tiny"), torch::kFloat64);
  const int64_t W = alone.weights_bytes();
  // The full session: its estimate (its own copy, gradients, optimizer) + the base + its
  // reference + the LoRA session's adapter and optimizer state.
  const int64_t lora_bytes = host->session_report("lora").device_bytes;
  EXPECT_GT(lora_bytes, 0);
  const auto full = host->estimate("full", 1, 32, EngineRequest{}).estimate;
  EXPECT_EQ(full.weights_bytes, alone.estimate(1, 32, EngineRequest{}).estimate.weights_bytes + 2 * W + lora_bytes);
  // Resident, it holds its weights, AdamW's two moments and its reference: 4 copies' worth.
  const auto report = host->session_report("full");
  EXPECT_TRUE(report.resident);
  EXPECT_GE(report.device_bytes, 4 * W);
  // The LoRA session beside it counts all of that.
  LoraConfig lora;
  lora.r = 4;
  const auto beside = host->estimate("lora", 1, 32, EngineRequest{}).estimate;
  EXPECT_EQ(beside.weights_bytes,
            alone.estimate(1, 32, EngineRequest{}, &lora).estimate.weights_bytes + report.device_bytes);
}

TEST(Host, RequestIdReplaysTheFirstAnswerAndRefusesAnotherBody) {
  auto host = TrainingHost::Create(HostConfig());
  auto step = SftStep({{1, 2, 3, 4, 5}});
  auto first = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep", "id-1", "digest-a"), step, done); });
  auto again = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep", "id-1", "digest-a"), step, done); });
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(host->policy_version(), 1);  // applied once
  EXPECT_EQ(again.value->forward.result.loss, first.value->forward.result.loss);
  auto other = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep", "id-1", "digest-b"), step, done); });
  ASSERT_FALSE(other.ok());
  ErrorCode code{};
  EXPECT_NE(ErrorOf(other.error, &code).find("different request"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(host->policy_version(), 1);
  // Ids have a length limit.
  auto long_id = Wait<TrainStats>(
      [&](auto done) { host->train_step(Ctx("TrainStep", std::string(129, 'x'), "d"), step, done); });
  ASSERT_FALSE(long_id.ok());
  EXPECT_NE(ErrorOf(long_id.error).find("request_id is 129 bytes"), std::string::npos);
}

TEST(Host, BudgetRefusesBeforeAnythingRuns) {
  auto config = HostConfig();
  config.limits.memory_budget_bytes = 4 << 20;
  config.trainer.engine.kind = EngineKind::kFull;
  auto host = TrainingHost::Create(config);
  const auto before = Weights(*host);
  std::vector<int64_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i % 256);
  auto o = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep"), SftStep({tokens}), done); });
  ASSERT_FALSE(o.ok());
  ErrorCode code{};
  EXPECT_NE(ErrorOf(o.error, &code).find("memory budget"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kResourceExhausted);
  ExpectSame(Weights(*host), before);
}

TEST(Host, ChunkFloorsAreRefused) {
  auto host = TrainingHost::Create(HostConfig());
  auto step = SftStep({{1, 2, 3, 4, 5}});
  step.engine.chunk = 1;
  auto o = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep"), step, done); });
  ASSERT_FALSE(o.ok());
  EXPECT_NE(ErrorOf(o.error).find("engine.chunk = 1 is below the server's floor 16"), std::string::npos);
}

TEST(Host, RolloutStepTrainsQueuedGroups) {
  auto config = HostConfig();
  config.rollouts.groups_per_step = 2;
  auto host = TrainingHost::Create(config);
  std::vector<PushItem> items;
  for (int g = 0; g < 2; ++g) {
    RolloutGroup group;
    group.prompt = {1, 2, 3};
    group.completions = {{{4, 5}, 1.0, {}, {}}, {{6}, 0.0, {}, {}}};
    items.push_back(PushItem{g, "", group, ""});
  }
  auto acks = Wait<std::vector<RolloutAck>>([&](auto done) { host->push_rollouts(Ctx("PushRollouts"), items, done); });
  ASSERT_TRUE(acks.ok()) << ErrorOf(acks.error);
  for (const auto& a : *acks.value) EXPECT_EQ(a.status, RolloutStatus::kAccepted) << a.message;
  for (int i = 0; i < 500 && host->policy_version() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(host->policy_version(), 1);
  EXPECT_EQ(host->rollout_stats().consumed, 2);
}

TEST(Host, ShutdownAnswersWaitingJobsUnavailableAndRefusesNewOnes) {
  auto host = TrainingHost::Create(HostConfig());
  host->worker().pause();
  std::vector<std::future<Outcome<TrainStats>>> answers;
  std::vector<std::shared_ptr<std::promise<Outcome<TrainStats>>>> promises;
  for (int i = 0; i < 3; ++i) {
    auto p = std::make_shared<std::promise<Outcome<TrainStats>>>();
    answers.push_back(p->get_future());
    host->train_step(Ctx("TrainStep"), SftStep({{1, 2, 3, 4}}), [p](const Outcome<TrainStats>& o) { p->set_value(o); });
    promises.push_back(p);
  }
  host->shutdown();
  for (auto& a : answers) {
    auto o = a.get();
    ASSERT_FALSE(o.ok());
    ErrorCode code{};
    ErrorOf(o.error, &code);
    EXPECT_EQ(code, ErrorCode::kUnavailable);
  }
  EXPECT_EQ(host->policy_version(), 0);
  auto late = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep"), SftStep({{1, 2}}), done); });
  ASSERT_FALSE(late.ok());
  EXPECT_NE(ErrorOf(late.error).find("shutting down"), std::string::npos);
}

// A step reaches the other ranks with every side input of its sequences, the routing replay
// of a mixture of experts (a rank without it would route by itself) and 2-D targets included.
TEST(Host, StepCommandsCarryEverySequenceField) {
  Sequence s;
  s.tokens = {4, 5, 6};
  s.loss_mask = {0, 1, 1};
  s.token_weights = {0.0, 0.5, -1.0};
  s.sampler_logprobs = {0.0, -1.5, -2.5};
  s.routed_experts = {0, 1, -1, -1, 2, 3};
  s.top_k = 2;
  s.top_k_targets = {0, 0, 7, 9, 1, 3};
  s.top_k_weights = {0.0, 0.0, 0.25, 0.75, 0.1 + 0.2, -3.5};  // 0.1 + 0.2: round-trips bit for bit
  StepCommand step;
  step.kind = StepKind::kTrainStep;
  step.sequences = {s};
  step.adam.emplace();  // a train_step's own Adam parameters ride in the same command
  step.adam->lr = 2e-3;
  step.adam->beta2 = 0.9;
  step.adam->grad_clip_norm = 0.25;
  const auto decoded = std::get<StepCommand>(DecodeCommand(EncodeCommand(step)));
  EXPECT_EQ(decoded.kind, StepKind::kTrainStep);
  ASSERT_TRUE(decoded.adam.has_value());
  EXPECT_EQ(decoded.adam->ToJson(), step.adam->ToJson());
  ASSERT_EQ(decoded.sequences.size(), 1u);
  const auto& d = decoded.sequences[0];
  EXPECT_EQ(d.tokens, s.tokens);
  EXPECT_EQ(d.loss_mask, s.loss_mask);
  EXPECT_EQ(d.token_weights, s.token_weights);
  EXPECT_EQ(d.sampler_logprobs, s.sampler_logprobs);
  EXPECT_EQ(d.routed_experts, s.routed_experts);
  EXPECT_EQ(d.top_k, s.top_k);
  EXPECT_EQ(d.top_k_targets, s.top_k_targets);
  EXPECT_EQ(d.top_k_weights, s.top_k_weights);
}

TEST(Host, AFollowerFedTheRecordedCommandsEndsBitIdentical) {
  std::vector<std::string> recorded;
  std::mutex m;
  TrainingHost::Hooks hooks;
  hooks.on_command = [&](const std::string& bytes) {
    std::lock_guard<std::mutex> lock(m);
    recorded.push_back(bytes);
  };
  auto config = HostConfig();
  config.checkpoint_dir = testing::TempDir("host-recorded");
  auto host = TrainingHost::Create(config, hooks);
  for (int i = 0; i < 3; ++i) {
    auto step = SftStep({{1, 5, 9, 13, 17 + i}, {2, 4, 6, 8}});
    auto fb = Wait<StepStats>([&](auto done) { host->forward_backward(Ctx("ForwardBackward"), step, done); });
    ASSERT_TRUE(fb.ok()) << ErrorOf(fb.error);
    // The second step carries its own Adam parameters, which the follower must receive too.
    std::optional<AdamStepParams> adam;
    if (i == 1) {
      adam.emplace();
      adam->lr = 3e-3;
      adam->beta1 = 0.8;
      adam->weight_decay = 0.1;
      adam->grad_clip_norm = 0.5;
    }
    auto o = Wait<OptimStats>([&](auto done) { host->optim_step(Ctx("OptimStep"), adam, done); });
    ASSERT_TRUE(o.ok()) << ErrorOf(o.error);
    if (adam) {
      EXPECT_EQ(o.value->optim.lr, 3e-3);
    }
  }
  auto saved = Wait<CheckpointReply>([&](auto done) { host->save_checkpoint(Ctx("SaveCheckpoint"), "c", done); });
  ASSERT_TRUE(saved.ok()) << ErrorOf(saved.error);
  // A TrainStep is one command for the ranks, its Adam parameters in it.
  const size_t before_train_step = recorded.size();
  auto step = SftStep({{7, 8, 9, 10}});
  step.adam.emplace();
  step.adam->lr = 5e-3;
  step.adam->eps = 1e-6;
  auto t = Wait<TrainStats>([&](auto done) { host->train_step(Ctx("TrainStep"), step, done); });
  ASSERT_TRUE(t.ok()) << ErrorOf(t.error);
  EXPECT_EQ(t.value->optim.optim.lr, 5e-3);
  EXPECT_EQ(t.value->forward.policy_version, 3);  // the version its gradients were computed at
  EXPECT_EQ(t.value->optim.policy_version, 4);
  ASSERT_EQ(recorded.size(), before_train_step + 1);
  const auto sent = DecodeCommand(recorded.back());
  ASSERT_TRUE(std::holds_alternative<StepCommand>(sent));
  EXPECT_EQ(std::get<StepCommand>(sent).kind, StepKind::kTrainStep);
  ASSERT_TRUE(std::get<StepCommand>(sent).adam.has_value());
  EXPECT_EQ(std::get<StepCommand>(sent).adam->lr, 5e-3);
  const auto expected = Weights(*host);

  // A fresh replica (what a follower builds) applies the same commands, decoded.
  auto replica = Replica::Create(config, torch::kCPU, nullptr);
  ASSERT_GE(recorded.size(), 8u);
  for (const auto& bytes : recorded) Apply(*replica, DecodeCommand(bytes));
  ExpectSame(replica->trainer().model()->hf_tensors(), expected);
  EXPECT_EQ(replica->trainer().policy_version(), 4);
  EXPECT_THROW(DecodeCommand("not cbor"), InvalidArgument);
}

// The ranks of a data- or context-parallel server each load a checkpoint from their own
// storage. One that cannot read it makes every rank fail, with its error (rank 0: naming the
// rank and what to change); nothing changes on any rank and the group still works: the
// same load then succeeds on both and they hold the checkpoint's weights.
TEST(Replica, ARankThatCannotReadACheckpointFailsEveryRankAndTheGroupHolds) {
  RegisterBuiltinObjectives();
  for (const int context_parallel : {1, 2}) {
    auto config = HostConfig();
    config.parallel.context_parallel = context_parallel;
    const std::string root = testing::TempDir("replica-agree-" + std::to_string(context_parallel));
    const std::string ckpt = root + "/ckpt";
    {
      auto solo = Replica::Create(config, torch::kCPU, nullptr);
      auto sft = CreateObjective("sft", nlohmann::json::object());
      solo->trainer().train_step(SftStep({{1, 5, 9, 13, 17}}).sequences, *sft);
      solo->trainer().save_checkpoint(ckpt);
    }
    const auto saved = Trainer::LoadCheckpoint(ckpt)->model()->hf_tensors();
    const int port = FreeLoopbackPort();
    std::vector<std::string> errors(2);
    std::vector<ErrorCode> codes(2, ErrorCode::kInternal);
    std::vector<char> threw(2, 0);
    std::vector<char> unchanged(2, 0);
    std::vector<TensorMap> loaded(2);
    std::vector<std::exception_ptr> failures(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
       try {
        DistOptions d;
        d.rank = rank;
        d.world_size = 2;
        d.master_port = port;
        d.timeout_seconds = 60;
        auto replica = Replica::Create(config, torch::kCPU, Communicator::Create(d));
        const auto before = replica->trainer().model()->hf_tensors();
        try {
          replica->load("", rank == 0 ? ckpt : root + "/not-on-this-rank");
        } catch (const std::exception& e) {
          threw[rank] = true;
          errors[rank] = e.what();
          if (const auto* error = dynamic_cast<const Error*>(&e)) codes[rank] = error->code();
        }
        bool same = true;
        for (const auto& [name, t] : replica->trainer().model()->hf_tensors()) same = same && torch::equal(t, before.at(name));
        unchanged[rank] = same;
        replica->load("", ckpt);  // the group is intact
        loaded[rank] = replica->trainer().model()->hf_tensors();
       } catch (...) {
        failures[rank] = std::current_exception();  // the test fails below, not the binary
       }
      });
    }
    for (auto& t : ranks) t.join();
    for (auto& f : failures) {
      if (f) std::rethrow_exception(f);
    }
    const std::string where = "context_parallel " + std::to_string(context_parallel);
    EXPECT_EQ(codes[0], ErrorCode::kFailedPrecondition) << where;
    EXPECT_TRUE(threw[1]) << where;
    // (rank 0 names the folder it was asked for; the message after it is rank 1's own)
    EXPECT_NE(errors[0].find("rank 1 could not load the checkpoint " + ckpt + ": "), std::string::npos)
        << where << ": " << errors[0];
    EXPECT_NE(errors[0].find("not-on-this-rank"), std::string::npos) << where << ": " << errors[0];
    EXPECT_NE(errors[0].find("give the ranks a shared checkpoint_dir"), std::string::npos) << errors[0];
    EXPECT_NE(errors[1].find("not-on-this-rank"), std::string::npos) << where << ": " << errors[1];
    EXPECT_TRUE(unchanged[0]) << where;
    EXPECT_TRUE(unchanged[1]) << where;
    for (int rank = 0; rank < 2; ++rank) ExpectSame(loaded[rank], saved);
  }
}

}  // namespace
}  // namespace streambp::server
