// OptimStep's and TrainStep's adam_params over the wire (issue 28): a step with them equals a
// step of a server configured with those Adam options; unset fields are Tinker's defaults; bad
// values are refused with the field named and change nothing (OptimStep: the gradients stay;
// TrainStep: refused before the forward pass, so no gradients are left behind).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return c;
}

v1::Batch TwoExamples() {
  v1::Batch batch;
  for (const auto& tokens : std::vector<std::vector<int>>{{1, 5, 9, 13, 17, 21}, {2, 4, 8, 16, 32, 64, 128}}) {
    batch.mutable_sft()->add_examples()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  }
  return batch;
}

void ForwardBackward(v1::Trainer::Stub& stub) {
  v1::ForwardBackwardRequest fb;
  *fb.mutable_batch() = TwoExamples();
  v1::ForwardBackwardResponse r;
  const grpc::Status status = stub.ForwardBackward(Ctx().get(), fb, &r);
  ASSERT_TRUE(status.ok()) << status.error_message();
}

TEST(AdamParamsRpc, AStepWithAdamParamsEqualsAServerConfiguredWithThem) {
  // Server A: AdamW lr 1e-3 (betas 0.9/0.999, eps 1e-8), a linear schedule with warmup and
  // clipping at 1; this step overrides all of it. Server B: configured as the step asks.
  auto a_config = testing::TestConfig();
  a_config.trainer.schedule.type = "linear";
  a_config.trainer.schedule.warmup_steps = 5;
  a_config.trainer.schedule.total_steps = 50;
  a_config.trainer.max_grad_norm = 1.0;
  auto b_config = testing::TestConfig();
  b_config.trainer.optimizer.lr = 2e-3;
  b_config.trainer.optimizer.betas = {0.9, 0.95};  // Tinker's beta2, the field left unset below
  b_config.trainer.optimizer.eps = 1e-12;
  b_config.trainer.optimizer.weight_decay = 0.05;
  b_config.trainer.max_grad_norm = 0;
  auto a = testing::StartServer(a_config);
  auto b = testing::StartServer(b_config);
  auto stub_a = v1::Trainer::NewStub(grpc::CreateChannel(a.target, grpc::InsecureChannelCredentials()));
  auto stub_b = v1::Trainer::NewStub(grpc::CreateChannel(b.target, grpc::InsecureChannelCredentials()));
  ASSERT_NO_FATAL_FAILURE(ForwardBackward(*stub_a));
  ASSERT_NO_FATAL_FAILURE(ForwardBackward(*stub_b));

  v1::OptimStepRequest with;
  with.mutable_adam_params()->set_learning_rate(2e-3);
  with.mutable_adam_params()->set_weight_decay(0.05);
  with.mutable_adam_params()->set_grad_clip_norm(0);
  v1::OptimStepResponse ra, rb;
  const grpc::Status status = stub_a->OptimStep(Ctx().get(), with, &ra);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(stub_b->OptimStep(Ctx().get(), {}, &rb).ok());
  EXPECT_FALSE(ra.skipped());
  EXPECT_EQ(ra.learning_rate(), 2e-3);
  EXPECT_EQ(rb.learning_rate(), 2e-3);
  EXPECT_EQ(ra.policy_version(), 1);
  const TensorMap wa = testing::ExportedTensors(*a.client), wb = testing::ExportedTensors(*b.client);
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, t] : wa) EXPECT_TRUE(torch::equal(t, wb.at(name))) << name;

  // The next step without adam_params is the configuration's again: warmup's lr at step 1.
  ASSERT_NO_FATAL_FAILURE(ForwardBackward(*stub_a));
  ASSERT_TRUE(stub_a->OptimStep(Ctx().get(), {}, &ra).ok());
  EXPECT_DOUBLE_EQ(ra.learning_rate(), 1e-3 * 1 / 5);
}

TEST(AdamParamsRpc, BadAdamParamsAreRefusedNamingTheFieldAndChangeNothing) {
  auto s = testing::StartServer(testing::TestConfig());
  auto stub = v1::Trainer::NewStub(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
  // No gradients yet: the usual precondition.
  v1::OptimStepRequest with;
  with.mutable_adam_params()->set_learning_rate(1e-4);
  v1::OptimStepResponse r;
  grpc::Status status = stub->OptimStep(Ctx().get(), with, &r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("no accumulated gradients"), std::string::npos) << status.error_message();

  ASSERT_NO_FATAL_FAILURE(ForwardBackward(*stub));
  const TensorMap before = testing::ExportedTensors(*s.client);
  with.mutable_adam_params()->set_beta1(1.0);
  status = stub->OptimStep(Ctx().get(), with, &r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "adam_params.beta1 must be in [0, 1), got 1");
  with.mutable_adam_params()->set_beta1(0.9);
  with.mutable_adam_params()->set_eps(-1);
  status = stub->OptimStep(Ctx().get(), with, &r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "adam_params.eps must be a finite number > 0, got -1");
  const TensorMap after = testing::ExportedTensors(*s.client);
  for (const auto& [name, t] : before) EXPECT_TRUE(torch::equal(t, after.at(name))) << name;
  // The gradients are still pending: a plain OptimStep applies them.
  ASSERT_TRUE(stub->OptimStep(Ctx().get(), {}, &r).ok());
  EXPECT_EQ(r.policy_version(), 1);

  // An SGD server has no moments: FAILED_PRECONDITION saying so.
  auto sgd_config = testing::TestConfig();
  sgd_config.trainer.optimizer.name = "sgd";
  auto sgd = testing::StartServer(sgd_config);
  auto sgd_stub = v1::Trainer::NewStub(grpc::CreateChannel(sgd.target, grpc::InsecureChannelCredentials()));
  ASSERT_NO_FATAL_FAILURE(ForwardBackward(*sgd_stub));
  v1::OptimStepRequest defaults;
  defaults.mutable_adam_params();
  status = sgd_stub->OptimStep(Ctx().get(), defaults, &r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("the optimizer is sgd, not adamw"), std::string::npos) << status.error_message();
}

TEST(AdamParamsRpc, TrainStepTakesThemAsForwardBackwardAndOptimStepDo) {
  auto a = testing::StartServer(testing::TestConfig());
  auto b = testing::StartServer(testing::TestConfig());
  auto stub_a = v1::Trainer::NewStub(grpc::CreateChannel(a.target, grpc::InsecureChannelCredentials()));
  auto stub_b = v1::Trainer::NewStub(grpc::CreateChannel(b.target, grpc::InsecureChannelCredentials()));
  v1::AdamParams params;
  params.set_learning_rate(4e-3);
  params.set_beta1(0.85);
  params.set_grad_clip_norm(0.5);
  v1::TrainStepRequest train;
  *train.mutable_batch() = TwoExamples();
  *train.mutable_adam_params() = params;
  v1::TrainStepResponse trained;
  grpc::Status status = stub_a->TrainStep(Ctx().get(), train, &trained);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(trained.optim().learning_rate(), 4e-3);
  ASSERT_NO_FATAL_FAILURE(ForwardBackward(*stub_b));
  v1::OptimStepRequest optim;
  *optim.mutable_adam_params() = params;
  v1::OptimStepResponse optimized;
  ASSERT_TRUE(stub_b->OptimStep(Ctx().get(), optim, &optimized).ok());
  EXPECT_EQ(trained.optim().grad_norm(), optimized.grad_norm());
  const TensorMap wa = testing::ExportedTensors(*a.client), wb = testing::ExportedTensors(*b.client);
  for (const auto& [name, t] : wa) EXPECT_TRUE(torch::equal(t, wb.at(name))) << name;

  // Bad values: refused before the forward pass; nothing pending afterwards, nothing applied.
  train.mutable_adam_params()->set_weight_decay(-0.1);
  status = stub_a->TrainStep(Ctx().get(), train, &trained);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "adam_params.weight_decay must be a finite number >= 0, got -0.1");
  v1::OptimStepResponse r;
  status = stub_a->OptimStep(Ctx().get(), {}, &r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "gradients were left pending";
  const TensorMap after = testing::ExportedTensors(*a.client);
  for (const auto& [name, t] : wa) EXPECT_TRUE(torch::equal(t, after.at(name))) << name;

  // An SGD server: FAILED_PRECONDITION before the forward pass, nothing pending.
  auto sgd_config = testing::TestConfig();
  sgd_config.trainer.optimizer.name = "sgd";
  auto sgd = testing::StartServer(sgd_config);
  auto sgd_stub = v1::Trainer::NewStub(grpc::CreateChannel(sgd.target, grpc::InsecureChannelCredentials()));
  train.mutable_adam_params()->clear_weight_decay();
  status = sgd_stub->TrainStep(Ctx().get(), train, &trained);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("not adamw"), std::string::npos) << status.error_message();
  status = sgd_stub->OptimStep(Ctx().get(), {}, &r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "gradients were left pending";
}

}  // namespace
}  // namespace streambp
