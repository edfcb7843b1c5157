// The client against a fake Trainer service on a loopback port (gRPC's retries need a real
// channel: in-process channels have none): metadata, request ids kept by the channel's
// retries, deadlines, error codes, and ExportWeights reassembly and verification. The real
// server is tested in tests/integration.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include "streambp/client/client.h"
#include "streambp/client/sha256.h"

namespace streambp::client {
namespace {

class FakeTrainer final : public v1::Trainer::Service {
 public:
  std::mutex mu;
  int unavailable_left = 0;                           // answer UNAVAILABLE this many times first
  grpc::Status fail = grpc::Status::OK;               // then this status (OK = answer)
  std::chrono::milliseconds delay{0};                 // before answering
  std::vector<std::string> request_ids;               // of every mutating attempt
  std::vector<std::string> authorization;             // of every attempt
  std::vector<v1::WeightsChunk> chunks;               // ExportWeights answer
  std::atomic<int> export_streams{0};
  bool break_after_first_chunk = false;               // ExportWeights: UNAVAILABLE after one message
  size_t largest_request = 0;                         // bytes of the largest TrainStep request seen

  grpc::Status GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest*, v1::GetInfoResponse* r) override {
    if (auto s = Attempt(ctx, ""); !s.ok()) return s;
    r->set_architecture("FakeForCausalLM");
    r->set_policy_version(3);
    return grpc::Status::OK;
  }
  grpc::Status TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* req, v1::TrainStepResponse* r) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      largest_request = std::max(largest_request, req->ByteSizeLong());
    }
    if (auto s = Attempt(ctx, req->request_id()); !s.ok()) return s;
    r->mutable_stats()->set_loss(1.5);
    r->mutable_stats()->set_tokens(req->batch().sft().examples_size());
    r->mutable_optim()->set_policy_version(4);
    return grpc::Status::OK;
  }
  grpc::Status OptimStep(grpc::ServerContext* ctx, const v1::OptimStepRequest* req, v1::OptimStepResponse* r) override {
    if (auto s = Attempt(ctx, req->request_id()); !s.ok()) return s;
    r->set_step(1);
    return grpc::Status::OK;
  }
  grpc::Status SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* req,
                              v1::SaveCheckpointResponse* r) override {
    if (auto s = Attempt(ctx, req->request_id()); !s.ok()) return s;
    r->set_name(req->name());
    return grpc::Status::OK;
  }
  grpc::Status ExportWeights(grpc::ServerContext* ctx, const v1::ExportWeightsRequest*,
                             grpc::ServerWriter<v1::WeightsChunk>* writer) override {
    ++export_streams;
    if (auto s = Attempt(ctx, ""); !s.ok()) return s;
    std::vector<v1::WeightsChunk> copy;
    {
      std::lock_guard<std::mutex> lock(mu);
      copy = chunks;
    }
    for (const auto& c : copy) {
      if (ctx->IsCancelled() || !writer->Write(c)) break;
      if (break_after_first_chunk) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server going away");
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Attempt(grpc::ServerContext* ctx, const std::string& request_id) {
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mu);
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    authorization.push_back(it == md.end() ? "" : std::string(it->second.data(), it->second.size()));
    request_ids.push_back(request_id);
    if (unavailable_left > 0) {
      --unavailable_left;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "try again");
    }
    return fail;
  }
};

// The chunks of a file as the server sends them: totals first, sha256 + config last.
std::vector<v1::WeightsChunk> Chunks(const std::string& file, size_t piece) {
  std::vector<v1::WeightsChunk> out;
  for (size_t offset = 0; offset < file.size(); offset += piece) {
    v1::WeightsChunk c;
    if (offset == 0) c.set_total_bytes(static_cast<int64_t>(file.size()));
    c.set_policy_version(7);
    c.set_offset(static_cast<int64_t>(offset));
    c.set_data(file.substr(offset, piece));
    out.push_back(c);
  }
  out.back().set_last(true);
  out.back().set_sha256(Sha256Hex(file));
  out.back().set_config_json("{\"architectures\":[\"LlamaForCausalLM\"]}");
  return out;
}

class ClientRpc : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_);
    ASSERT_GT(port_, 0);
    options_.target = "127.0.0.1:" + std::to_string(port_);
    options_.token = "sekret";
    options_.retry.initial_backoff_s = 0.001;
    options_.retry.max_backoff_s = 0.01;
    for (int i = 0; i < 10000; ++i) file_ += static_cast<char>((i * 131 + i / 7) & 0xff);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> Make() { return Client::Create(options_); }
  size_t Attempts() {
    std::lock_guard<std::mutex> lock(fake_.mu);
    return fake_.authorization.size();
  }

  FakeTrainer fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  ClientOptions options_;
  std::string file_;
};

TEST_F(ClientRpc, BearerTokenOnEveryCall) {
  auto client = Make();
  auto info = client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status().error_message();
  EXPECT_EQ(info->architecture(), "FakeForCausalLM");
  ASSERT_EQ(fake_.authorization.size(), 1u);
  EXPECT_EQ(fake_.authorization[0], "Bearer sekret");
}

TEST_F(ClientRpc, RetriesReuseOneRequestId) {
  fake_.unavailable_left = 2;
  auto client = Make();
  v1::TrainStepRequest request;
  request.mutable_batch()->mutable_sft()->add_examples()->add_tokens(1);
  auto r = client->TrainStep(request);
  ASSERT_TRUE(r.ok()) << r.status().error_message();
  EXPECT_EQ(r->stats().loss(), 1.5);
  ASSERT_EQ(fake_.request_ids.size(), 3u);
  EXPECT_EQ(fake_.request_ids[0].size(), 32u);
  EXPECT_EQ(fake_.request_ids[1], fake_.request_ids[0]);
  EXPECT_EQ(fake_.request_ids[2], fake_.request_ids[0]);
  for (const auto& a : fake_.authorization) EXPECT_EQ(a, "Bearer sekret");

  // A new logical call gets a new id; a caller's id is kept.
  ASSERT_TRUE(client->OptimStep().ok());
  EXPECT_NE(fake_.request_ids.back(), fake_.request_ids[0]);
  fake_.unavailable_left = 1;
  v1::SaveCheckpointRequest save;
  save.set_request_id("mine");
  save.set_name("ckpt");
  auto s = client->SaveCheckpoint(save);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name(), "ckpt");
  EXPECT_EQ(fake_.request_ids[fake_.request_ids.size() - 2], "mine");
  EXPECT_EQ(fake_.request_ids.back(), "mine");
}

TEST_F(ClientRpc, GivesUpAfterMaxAttempts) {
  fake_.unavailable_left = 100;
  options_.retry.max_attempts = 3;
  auto r = Make()->GetInfo();
  EXPECT_EQ(r.code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.status().error_message(), "try again (retried up to 3 attempts)");
  EXPECT_EQ(Attempts(), 3u);
  try {
    r.value();
    FAIL() << "value() of a failed result must throw";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::UNAVAILABLE);
  }
}

TEST_F(ClientRpc, OtherCodesAreFinal) {
  fake_.fail = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "batch.sft.examples[0].tokens[0] = 9 is outside");
  auto r = Make()->TrainStep({});
  EXPECT_EQ(r.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Attempts(), 1u);
  EXPECT_EQ(r.status().error_message(), "batch.sft.examples[0].tokens[0] = 9 is outside");
}

TEST_F(ClientRpc, OneAttemptWhenRetriesAreOff) {
  fake_.unavailable_left = 1;
  options_.retry.max_attempts = 1;
  auto r = Make()->TrainStep({});
  EXPECT_EQ(r.code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.status().error_message(), "try again");
  EXPECT_EQ(Attempts(), 1u);
}

// On a caller's channel the client does not know how often gRPC retried: the options'
// retry policy (3 attempts by default) is not claimed in the message.
TEST_F(ClientRpc, CallersChannelClaimsNoRetries) {
  fake_.unavailable_left = 1;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto channel = grpc::CreateCustomChannel(options_.target, grpc::InsecureChannelCredentials(), args);
  ASSERT_GT(options_.retry.max_attempts, 1);
  auto r = Client::Create(channel, options_)->GetInfo();
  EXPECT_EQ(r.code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.status().error_message(), "try again");
  EXPECT_EQ(Attempts(), 1u);
}

// gRPC keeps a request for a retry only up to its per-call retry buffer (256 KiB unless
// raised): a 1 MiB batch must still be retried, with its one request id.
TEST_F(ClientRpc, LargeRequestsAreRetriedToo) {
  fake_.unavailable_left = 2;
  v1::TrainStepRequest request;
  auto* tokens = request.mutable_batch()->mutable_sft()->add_examples()->mutable_tokens();
  for (int i = 0; i < 400000; ++i) tokens->Add(100000 + i);
  ASSERT_GT(request.ByteSizeLong(), 1u << 20);
  auto r = Make()->TrainStep(request);
  ASSERT_TRUE(r.ok()) << r.status().error_message();
  ASSERT_EQ(fake_.request_ids.size(), 3u);
  EXPECT_EQ(fake_.request_ids[2], fake_.request_ids[0]);
  EXPECT_EQ(fake_.request_ids[1], fake_.request_ids[0]);
  EXPECT_GT(fake_.largest_request, 1u << 20);
}

TEST_F(ClientRpc, RetriesStopAtTheDeadline) {
  fake_.unavailable_left = 100;
  options_.retry = {.max_attempts = 5, .initial_backoff_s = 2, .max_backoff_s = 2};
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Make()->GetInfo({.timeout = Seconds(0.3)});
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(r.code() == grpc::StatusCode::DEADLINE_EXCEEDED || r.code() == grpc::StatusCode::UNAVAILABLE)
      << StatusCodeName(r.code());
  EXPECT_LT(elapsed, std::chrono::milliseconds(1500));
  EXPECT_LE(Attempts(), 2u);
}

TEST_F(ClientRpc, DeadlineCoversTheCall) {
  fake_.delay = std::chrono::milliseconds(300);
  auto client = Make();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = client->GetInfo({.timeout = Seconds(0.05)});
  EXPECT_EQ(r.code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  // The default of its kind applies without an override.
  options_.info_timeout = Seconds(0.05);
  EXPECT_EQ(Make()->GetInfo().code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  options_.info_timeout = Seconds(5);
  EXPECT_TRUE(Make()->GetInfo().ok());
}

TEST_F(ClientRpc, ConcurrentCallsFromSeveralThreads) {
  auto client = Make();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) ok += client->TrainStep({}).ok() ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 80);
  std::set<std::string> ids(fake_.request_ids.begin(), fake_.request_ids.end());
  EXPECT_EQ(ids.size(), 80u);
}

TEST_F(ClientRpc, ExportWeightsReassemblesAndVerifies) {
  fake_.chunks = Chunks(file_, 3000);
  auto w = Make()->ExportWeights();
  ASSERT_TRUE(w.ok()) << w.status().error_message();
  EXPECT_EQ(w->data, file_);
  EXPECT_EQ(w->total_bytes, 10000);
  EXPECT_EQ(w->policy_version, 7);
  EXPECT_EQ(w->sha256, Sha256Hex(file_));
  EXPECT_EQ(w->config_json, "{\"architectures\":[\"LlamaForCausalLM\"]}");

  // One message holding everything.
  fake_.chunks = Chunks(file_, 1 << 20);
  EXPECT_EQ(Make()->ExportWeights()->data, file_);
}

TEST_F(ClientRpc, ExportWeightsRejectsBadStreams) {
  auto client = Make();
  auto expect_data_loss = [&](const std::vector<v1::WeightsChunk>& chunks, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(fake_.mu);
      fake_.chunks = chunks;
    }
    auto w = client->ExportWeights();
    EXPECT_EQ(w.code(), grpc::StatusCode::DATA_LOSS) << what;
    EXPECT_NE(w.status().error_message().find(what), std::string::npos) << w.status().error_message();
  };
  auto good = Chunks(file_, 3000);
  auto gap = good;
  gap.erase(gap.begin() + 1);
  expect_data_loss(gap, "offset 6000, expected 3000");
  auto bad_sha = good;
  bad_sha.back().set_sha256(std::string(64, '0'));
  expect_data_loss(bad_sha, "sha256 mismatch");
  auto no_last = good;
  no_last.back().set_last(false);
  expect_data_loss(no_last, "without its last message");
  auto short_total = good;
  short_total.front().set_total_bytes(20000);
  expect_data_loss(short_total, "received 10000 bytes, expected total_bytes 20000");
  auto over = good;
  over.front().set_total_bytes(5000);
  expect_data_loss(over, "data beyond total_bytes 5000");
  auto after_last = good;
  after_last.push_back(good.back());
  expect_data_loss(after_last, "after the last one");
  auto no_sha = good;
  no_sha.back().clear_sha256();
  expect_data_loss(no_sha, "no sha256");
  EXPECT_EQ(fake_.export_streams.load(), 7);  // a corrupt stream is not retried
}

// gRPC retries only until the first response message: a stream broken later ends
// UNAVAILABLE (not retried, nothing half-written), and calling again gets the whole file.
TEST_F(ClientRpc, ExportWeightsBrokenMidStreamIsReportedNotRetried) {
  fake_.chunks = Chunks(file_, 4096);
  fake_.break_after_first_chunk = true;
  const auto dir = std::filesystem::temp_directory_path() / ("streambp_client_rpc_" + NewRequestId());
  std::filesystem::create_directories(dir);
  const auto path = (dir / "model.safetensors").string();
  auto client = Make();
  auto w = client->ExportWeightsToFile(path);
  EXPECT_EQ(w.code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(fake_.export_streams.load(), 1);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  fake_.break_after_first_chunk = false;
  auto again = client->ExportWeightsToFile(path);
  ASSERT_TRUE(again.ok()) << again.status().error_message();
  std::stringstream ss;
  ss << std::ifstream(path, std::ios::binary).rdbuf();
  EXPECT_EQ(ss.str(), file_);
  std::filesystem::remove_all(dir);
}

TEST_F(ClientRpc, ExportWeightsToFileRetriesFromTheStart) {
  fake_.chunks = Chunks(file_, 4096);
  fake_.unavailable_left = 1;
  const auto dir = std::filesystem::temp_directory_path() / ("streambp_client_rpc_" + NewRequestId());
  std::filesystem::create_directories(dir);
  const auto path = (dir / "model.safetensors").string();
  std::vector<int64_t> seen;
  auto w = Make()->ExportWeightsToFile(path, {}, {}, [&](int64_t received, int64_t total) {
    EXPECT_EQ(total, 10000);
    seen.push_back(received);
  });
  ASSERT_TRUE(w.ok()) << w.status().error_message();
  EXPECT_EQ(fake_.export_streams.load(), 2);
  EXPECT_TRUE(w->data.empty());
  std::stringstream ss;
  ss << std::ifstream(path, std::ios::binary).rdbuf();
  EXPECT_EQ(ss.str(), file_);
  EXPECT_EQ(seen, (std::vector<int64_t>{4096, 8192, 10000}));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // A corrupt stream leaves neither the file nor the temporary.
  std::filesystem::remove(path);
  fake_.chunks.back().set_sha256(std::string(64, 'f'));
  EXPECT_EQ(Make()->ExportWeightsToFile(path).code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove_all(dir);
}

TEST(ClientCreate, BadOptions) {
  auto code_of = [](const ClientOptions& o) {
    try {
      Client::Create(o);
    } catch (const ClientError& e) {
      return e.code();
    }
    return grpc::StatusCode::OK;
  };
  ClientOptions o;
  EXPECT_EQ(code_of(o), grpc::StatusCode::OK);
  o.target = "";
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
  o = {};
  o.tls.root_ca_file = "/tmp/ca.pem";  // without tls.enabled
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
  o = {};
  o.tls.enabled = true;
  o.tls.cert_file = "/tmp/cert.pem";  // without its key
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
  o = {};
  o.tls.enabled = true;
  o.tls.root_ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(code_of(o), grpc::StatusCode::NOT_FOUND);
  o = {};
  o.step_timeout = Seconds(0);
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
  o = {};
  o.max_message_bytes = 0;
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
  o = {};
  o.retry.max_attempts = 0;
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
  o = {};
  o.retry.max_attempts = 6;  // above gRPC's cap
  EXPECT_EQ(code_of(o), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(ClientCreate, NoServerIsUnavailableAfterRetries) {
  ClientOptions o;
  o.target = "127.0.0.1:1";  // nothing listens on port 1
  o.retry.max_attempts = 2;
  o.retry.initial_backoff_s = 0.01;
  auto r = Client::Create(o)->GetInfo({.timeout = Seconds(10)});
  EXPECT_EQ(r.code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.status().error_message().find("(retried up to 2 attempts)"), std::string::npos)
      << r.status().error_message();
}

}  // namespace
}  // namespace streambp::client
