// A seeded random mutator over valid requests of every RPC (issue 12): byte-level damage
// (bit flips, cuts, insertions, repeats) and field-level edge values (extremes, NaN, huge
// counts, bad ids) sent over the real wire. Every answer must be a deliberate one (never
// INTERNAL or UNKNOWN), and the server must still serve at the end. The seed and the
// number of cases come from STREAMBP_FUZZ_SEED / STREAMBP_FUZZ_CASES; a failure prints the
// input in hex to reproduce it.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <limits>
#include <random>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "device_worker.h"
#include "integration/server_fixture.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

std::string Hex(const std::string& bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes.substr(0, 512)) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  // Byte-level damage of a serialized message.
  std::string bytes(std::string s) {
    const int edits = 1 + pick(4);
    for (int e = 0; e < edits; ++e) {
      const size_t n = s.size();
      switch (pick(6)) {
        case 0:  // flip bits
          if (n) s[pick(n)] ^= static_cast<char>(1 << pick(8));
          break;
        case 1:  // cut
          s.resize(n ? pick(n) : 0);
          break;
        case 2:  // insert random bytes
          s.insert(n ? pick(n + 1) : 0, random_bytes(1 + pick(16)));
          break;
        case 3:  // repeat a range (duplicate fields)
          if (n) {
            const size_t a = pick(n), len = 1 + pick(std::min<size_t>(n - a, 64));
            s.insert(pick(n + 1), s.substr(a, len));
          }
          break;
        case 4:  // a varint of 10 bytes (huge lengths, overflowing tags)
          s.insert(n ? pick(n + 1) : 0, std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 10));
          break;
        default:  // overwrite with a random byte
          if (n) s[pick(n)] = static_cast<char>(pick(256));
      }
    }
    return s;
  }

  // Field-level edge values, recursively.
  void fields(Message* m, int depth = 0) {
    const auto* d = m->GetDescriptor();
    const auto* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const auto* f = d->field(i);
      if (pick(3) != 0) continue;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        if (depth > 5) continue;
        if (f->is_map()) continue;
        if (f->is_repeated()) {
          const int add = pick(3);
          for (int k = 0; k < add; ++k) fields(r->AddMessage(m, f), depth + 1);
          for (int k = 0; k < r->FieldSize(*m, f); ++k) {
            if (pick(2)) fields(r->MutableRepeatedMessage(m, f, k), depth + 1);
          }
        } else {
          fields(r->MutableMessage(m, f), depth + 1);
        }
        continue;
      }
      if (f->is_repeated()) {
        const int add = pick(4) == 0 ? 200 + pick(800) : pick(4);
        for (int k = 0; k < add; ++k) add_scalar(m, f);
        if (pick(4) == 0) r->ClearField(m, f);
        continue;
      }
      set_scalar(m, f);
    }
  }

 private:
  size_t pick(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  std::string random_bytes(size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(pick(256));
    return s;
  }
  int64_t int_value() {
    static const int64_t kEdges[] = {0, 1, -1, 2, 15, 16, 17, 255, 256, 32767, 32768, 1 << 20, INT32_MAX, INT32_MIN,
                                     INT64_MAX, INT64_MIN, int64_t{1} << 40};
    return pick(3) == 0 ? static_cast<int64_t>(pick(300)) : kEdges[pick(std::size(kEdges))];
  }
  double double_value() {
    static const double kEdges[] = {0.0, -0.0, 1.0, -1.0, 1e-300, -1e300, 1e300, 0.5, 2.0,
                                    std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                    -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::denorm_min()};
    return kEdges[pick(std::size(kEdges))];
  }
  std::string string_value() {
    static const char* kEdges[] = {"", "sft", "dpo", "grpo", "stream", "full", "checkpoint", "..", "../etc",
                                   "/abs", "a/b", "srv:x", "group", "x.tmp-1", ".staging", "dapo", "sequence"};
    switch (pick(4)) {
      case 0: {  // printable: invalid UTF-8 comes from the byte-level damage
        std::string t(pick(40), ' ');
        for (auto& ch : t) ch = static_cast<char>(' ' + pick(95));
        return t;
      }
      case 1: return std::string(pick(3) == 0 ? 5000 : 200, 'z');
      default: return kEdges[pick(std::size(kEdges))];
    }
  }
  void set_scalar(Message* m, const FieldDescriptor* f) {
    const auto* r = m->GetReflection();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, static_cast<int32_t>(int_value())); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, int_value()); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, static_cast<uint64_t>(int_value())); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, static_cast<uint32_t>(int_value())); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, double_value()); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, static_cast<float>(double_value())); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, pick(2)); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, string_value()); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(m, f, static_cast<int>(int_value())); break;
      default: break;
    }
  }
  void add_scalar(Message* m, const FieldDescriptor* f) {
    const auto* r = m->GetReflection();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(m, f, static_cast<int32_t>(int_value())); break;
      case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(m, f, int_value()); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(m, f, double_value()); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(m, f, static_cast<float>(double_value())); break;
      case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, string_value()); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(m, f, pick(2)); break;
      default: break;
    }
  }
  std::mt19937_64 rng_;
};

template <class Field, class T>
void Fill(Field* field, std::initializer_list<T> values) {
  for (const T& v : values) field->Add(v);
}

// Valid requests of every unary RPC, from which the mutations start.
std::vector<std::pair<std::string, std::unique_ptr<Message>>> Seeds() {
  std::vector<std::pair<std::string, std::unique_ptr<Message>>> out;
  auto add = [&](const std::string& method, std::unique_ptr<Message> m) { out.emplace_back(method, std::move(m)); };
  auto sft = std::make_unique<v1::TrainStepRequest>();
  Fill(sft->mutable_batch()->mutable_sft()->add_examples()->mutable_tokens(), {1, 2, 3, 4, 5});
  sft->set_request_id("seed");
  auto dpo = std::make_unique<v1::ForwardBackwardRequest>();
  auto* pair = dpo->mutable_batch()->mutable_dpo()->add_pairs();
  Fill(pair->mutable_prompt(), {1, 2});
  Fill(pair->mutable_chosen(), {3, 4});
  Fill(pair->mutable_rejected(), {5});
  auto grpo = std::make_unique<v1::TrainStepRequest>();
  auto* g = grpo->mutable_batch()->mutable_grpo()->add_groups();
  Fill(g->mutable_prompt(), {1, 2});
  auto* c1 = g->add_completions();
  Fill(c1->mutable_tokens(), {3, 4});
  c1->set_reward(1);
  Fill(c1->mutable_logprobs(), {-1.0f, -2.0f});
  Fill(g->add_completions()->mutable_tokens(), {5});
  grpo->mutable_grpo()->set_loss_type("grpo");
  // A data batch (Datum) for ppo with its config by name.
  auto data = std::make_unique<v1::TrainStepRequest>();
  data->set_objective("ppo");
  auto* datum = data->mutable_batch()->mutable_data()->add_data();
  Fill(datum->mutable_model_input()->mutable_tokens(), {1, 2, 3});
  auto& inputs = *datum->mutable_loss_fn_inputs();
  Fill(inputs["target_tokens"].mutable_int_data(), {int64_t{2}, int64_t{3}, int64_t{4}});
  Fill(inputs["logprobs"].mutable_float_data(), {-1.0, -2.0, -0.5});
  Fill(inputs["advantages"].mutable_float_data(), {1.0, -1.0, 0.5});
  (*data->mutable_loss_fn_config())["clip_low_threshold"].set_number(0.9);
  auto logprobs = std::make_unique<v1::ComputeLogprobsRequest>();
  Fill(logprobs->add_sequences()->mutable_tokens(), {1, 2, 3});
  auto sample = std::make_unique<v1::SampleRequest>();
  Fill(sample->add_prompts()->mutable_tokens(), {1, 2});
  sample->set_n(2);
  sample->set_max_tokens(4);
  auto estimate = std::make_unique<v1::EstimateMemoryRequest>();
  estimate->set_seq_len(64);
  auto push = std::make_unique<v1::PushRolloutsRequest>();
  auto* rg = push->add_groups();
  Fill(rg->mutable_prompt(), {1, 2});
  Fill(rg->add_completions()->mutable_tokens(), {3});
  Fill(rg->add_completions()->mutable_tokens(), {4});
  auto save = std::make_unique<v1::SaveCheckpointRequest>();
  save->set_name("fuzz");
  auto load = std::make_unique<v1::LoadCheckpointRequest>();
  load->set_name("fuzz");
  add("TrainStep", std::move(sft));
  add("ForwardBackward", std::move(dpo));
  add("TrainStep", std::move(grpo));
  add("TrainStep", std::move(data));
  add("OptimStep", std::make_unique<v1::OptimStepRequest>());
  add("ComputeLogprobs", std::move(logprobs));
  add("Sample", std::move(sample));
  add("EstimateMemory", std::move(estimate));
  add("PushRollouts", std::move(push));
  add("SaveCheckpoint", std::move(save));
  add("LoadCheckpoint", std::move(load));
  add("GetInfo", std::make_unique<v1::GetInfoRequest>());
  add("GetRolloutStats", std::make_unique<v1::GetRolloutStatsRequest>());
  auto history = std::make_unique<v1::GetHistoryRequest>();
  history->set_after_index(1);
  history->set_max_records(3);
  add("GetHistory", std::move(history));
  return out;
}

bool Deliberate(grpc::StatusCode code) {
  return code != grpc::StatusCode::INTERNAL && code != grpc::StatusCode::UNKNOWN &&
         code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::UNIMPLEMENTED;
}

TEST(Fuzz, MutatedRequestsOfEveryRpcGetDeliberateAnswers) {
  auto config = testing::TestConfig();
  config.checkpoint_dir = testing::TempDir("fuzz");
  config.rollouts.groups_per_step = 2;
  config.limits.max_sampled_tokens = 4096;
  auto s = testing::StartServer(config);
  auto channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  auto stub = v1::Trainer::NewStub(channel);
  const uint64_t seed = EnvOr("STREAMBP_FUZZ_SEED", 20261123);
  const uint64_t cases = EnvOr("STREAMBP_FUZZ_CASES", 1500);
  Mutator mutate(seed);
  auto seeds = Seeds();
  std::map<std::string, std::map<int, int>> codes;  // method -> code -> count
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < cases; ++i) {
    auto& [method, proto] = seeds[i % seeds.size()];
    std::string body;
    if (i % 2 == 0) {
      body = mutate.bytes(proto->SerializeAsString());
    } else {
      std::unique_ptr<Message> copy(proto->New());
      copy->CopyFrom(*proto);
      mutate.fields(copy.get());
      body = copy->SerializeAsString();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Slice slice(body);
    grpc::ByteBuffer request(&slice, 1), reply;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/streambp.v1.Trainer/" + method, grpc::StubOptions(), &request, &reply,
                      [&done](grpc::Status st) { done.set_value(st); });
    const auto st = done.get_future().get();
    codes[method][st.error_code()]++;
    ASSERT_TRUE(Deliberate(st.error_code()))
        << method << " case " << i << " (seed " << seed << "): " << st.error_code() << " " << st.error_message()
        << "\ninput: " << Hex(body);
  }
  // The streams: WatchPolicy and ExportWeights with mutated requests, a push stream of
  // mutated groups.
  for (int i = 0; i < 40; ++i) {
    v1::ExportWeightsRequest e;
    e.set_max_chunk_bytes(i % 3 == 0 ? 65536 : 0);
    mutate.fields(&e);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->ExportWeights(&ctx, e);
    v1::WeightsChunk chunk;
    while (reader->Read(&chunk)) {
    }
    const auto st = reader->Finish();
    ASSERT_TRUE(Deliberate(st.error_code())) << "ExportWeights: " << st.error_message();
    v1::WatchPolicyRequest w;
    mutate.fields(&w);
    grpc::ClientContext wctx;
    wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto watch = stub->WatchPolicy(&wctx, w);
    v1::PolicyUpdate u;
    while (watch->Read(&u)) {
    }
    const auto wst = watch->Finish();
    ASSERT_TRUE(Deliberate(wst.error_code()) || wst.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << "WatchPolicy: " << wst.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub->PushRolloutsStream(&ctx);
    int written = 0;
    for (int i = 0; i < 100; ++i) {
      v1::RolloutGroup g;
      Fill(g.mutable_prompt(), {1, 2});
      Fill(g.add_completions()->mutable_tokens(), {3});
      Fill(g.add_completions()->mutable_tokens(), {4});
      mutate.fields(&g);
      if (!stream->Write(g)) break;
      ++written;
    }
    stream->WritesDone();
    v1::RolloutAck ack;
    int acks = 0;
    while (stream->Read(&ack)) ++acks;
    const auto st = stream->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(acks, written);
  }
  ASSERT_TRUE(s.server->worker().wait_idle(std::chrono::seconds(120)));
  EXPECT_TRUE(s.client->GetInfo().ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string summary;
  for (const auto& [method, by_code] : codes) {
    summary += "\n  " + method + ":";
    for (const auto& [code, n] : by_code) summary += " " + std::to_string(code) + "x" + std::to_string(n);
  }
  std::printf("fuzz: %llu cases (seed %llu) in %.1f s; codes by method:%s\n", static_cast<unsigned long long>(cases),
              static_cast<unsigned long long>(seed), seconds, summary.c_str());
}

// The surfaces added since the first round: sessions, text (charged and refused without a
// tokenizer, or past its bounds), weighted batches, Tokenize/Detokenize and the progress
// streams, on a server with sessions.
TEST(Fuzz, SessionsTextAndProgressStreamsGetDeliberateAnswers) {
  auto config = testing::TestConfig();
  config.checkpoint_dir = testing::TempDir("fuzz-sessions");
  config.sessions.enabled = true;
  config.sessions.idle_seconds = 0;
  config.limits.max_text_bytes = 4096;
  auto s = testing::StartServer(config);
  auto channel = grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  auto stub = v1::Trainer::NewStub(channel);
  {
    v1::CreateSessionRequest c;
    c.set_name("fz");
    c.mutable_lora()->set_r(2);
    v1::SessionInfo info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->CreateSession(&ctx, c, &info).ok());
  }
  std::vector<std::pair<std::string, std::unique_ptr<Message>>> seeds;
  auto create = std::make_unique<v1::CreateSessionRequest>();
  create->set_name("fz2");
  create->set_request_id("c1");
  create->mutable_lora()->set_r(2);
  create->mutable_training()->mutable_optimizer()->set_lr(0.01);
  auto get = std::make_unique<v1::GetSessionRequest>();
  get->set_name("fz");
  auto del = std::make_unique<v1::DeleteSessionRequest>();
  del->set_name("fz2");
  del->set_request_id("d1");
  auto tokenize = std::make_unique<v1::TokenizeRequest>();
  tokenize->add_inputs()->set_text("hello world");
  auto* m = tokenize->add_inputs()->add_messages();
  m->set_role("user");
  m->set_content("hi");
  auto detok = std::make_unique<v1::DetokenizeRequest>();
  Fill(detok->add_sequences()->mutable_tokens(), {1, 2, 3});
  auto text_step = std::make_unique<v1::TrainStepRequest>();
  text_step->set_session("fz");
  text_step->mutable_batch()->mutable_sft()->add_examples()->set_text("some text");
  auto weighted = std::make_unique<v1::TrainStepRequest>();
  weighted->set_session("fz");
  auto* wseq = weighted->mutable_batch()->mutable_weighted()->add_sequences();
  Fill(wseq->mutable_tokens(), {1, 2, 3, 4});
  Fill(wseq->mutable_weights(), {1.0, -1.0, 0.5});
  auto ids_step = std::make_unique<v1::ForwardBackwardRequest>();
  ids_step->set_session("fz");
  Fill(ids_step->mutable_batch()->mutable_sft()->add_examples()->mutable_tokens(), {1, 2, 3});
  auto sample = std::make_unique<v1::SampleRequest>();
  sample->set_session("fz");
  sample->add_text_prompts()->set_text("hi");
  sample->set_max_tokens(2);
  auto snapshot = std::make_unique<v1::SaveWeightsForSamplerRequest>();
  snapshot->set_session("fz");
  snapshot->set_name("snap");
  snapshot->set_ttl_seconds(30);
  snapshot->set_replace_oldest(true);
  auto list_snapshots = std::make_unique<v1::ListSnapshotsRequest>();
  list_snapshots->set_session("fz");
  auto del_snapshot = std::make_unique<v1::DeleteSnapshotRequest>();
  del_snapshot->set_session("fz");
  del_snapshot->set_name("snap");
  auto snapshot_sample = std::make_unique<v1::SampleRequest>();
  snapshot_sample->set_session("fz");
  snapshot_sample->set_snapshot("snap");
  Fill(snapshot_sample->add_prompts()->mutable_tokens(), {1, 2});
  snapshot_sample->set_max_tokens(2);
  seeds.emplace_back("SaveWeightsForSampler", std::move(snapshot));
  seeds.emplace_back("ListSnapshots", std::move(list_snapshots));
  seeds.emplace_back("Sample", std::move(snapshot_sample));
  seeds.emplace_back("DeleteSnapshot", std::move(del_snapshot));
  seeds.emplace_back("CreateSession", std::move(create));
  seeds.emplace_back("GetSession", std::move(get));
  seeds.emplace_back("ListSessions", std::make_unique<v1::ListSessionsRequest>());
  seeds.emplace_back("DeleteSession", std::move(del));
  seeds.emplace_back("Tokenize", std::move(tokenize));
  seeds.emplace_back("Detokenize", std::move(detok));
  seeds.emplace_back("TrainStep", std::move(text_step));
  seeds.emplace_back("TrainStep", std::move(weighted));
  seeds.emplace_back("ForwardBackward", std::move(ids_step));
  seeds.emplace_back("Sample", std::move(sample));
  const uint64_t seed = EnvOr("STREAMBP_FUZZ_SEED", 20261125);
  const uint64_t cases = EnvOr("STREAMBP_FUZZ_CASES", 1500) / 3;
  Mutator mutate(seed);
  for (uint64_t i = 0; i < cases; ++i) {
    auto& [method, proto] = seeds[i % seeds.size()];
    std::unique_ptr<Message> copy(proto->New());
    copy->CopyFrom(*proto);
    const std::string body = i % 2 == 0 ? mutate.bytes(proto->SerializeAsString())
                                        : (mutate.fields(copy.get()), copy->SerializeAsString());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Slice slice(body);
    grpc::ByteBuffer request(&slice, 1), reply;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/streambp.v1.Trainer/" + method, grpc::StubOptions(), &request, &reply,
                      [&done](grpc::Status st) { done.set_value(st); });
    const auto st = done.get_future().get();
    ASSERT_TRUE(Deliberate(st.error_code()))
        << method << " case " << i << " (seed " << seed << "): " << st.error_code() << " " << st.error_message()
        << "\ninput: " << Hex(body);
  }
  // The progress streams with mutated requests (ids and text forms).
  for (int i = 0; i < 40; ++i) {
    v1::TrainStepRequest t;
    t.set_session("fz");
    if (i % 2 == 0) {
      Fill(t.mutable_batch()->mutable_sft()->add_examples()->mutable_tokens(), {1, 2, 3});
    } else {
      t.mutable_batch()->mutable_sft()->add_examples()->set_text("text");
    }
    mutate.fields(&t);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = i % 4 < 2 ? stub->TrainStepProgress(&ctx, t) : nullptr;
    std::unique_ptr<grpc::ClientReader<v1::StepProgress>> fb;
    if (!reader) {
      v1::ForwardBackwardRequest f;
      *f.mutable_batch() = t.batch();
      f.set_session(t.session());
      fb = stub->ForwardBackwardProgress(&ctx, f);
    }
    auto& r = reader ? reader : fb;
    v1::StepProgress p;
    while (r->Read(&p)) {
    }
    const auto st = r->Finish();
    ASSERT_TRUE(Deliberate(st.error_code())) << "progress stream " << i << ": " << st.error_message();
  }
  ASSERT_TRUE(s.server->worker().wait_idle(std::chrono::seconds(120)));
  v1::ListSessionsResponse list;
  grpc::ClientContext ctx;
  EXPECT_TRUE(stub->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
}

}  // namespace
}  // namespace streambp
