// Text in, text out over the wire (issue 16). The model is the tiny preset around the real Qwen3 tokenizer
// (from the npm reference packages, tests/text/reference/setup.sh); the expected ids come
// from the tokenizer and chat-format library directly, following the documented rules, so
// the server's own text path is what is checked.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "device_worker.h"
#include "host.h"
#include "integration/server_fixture.h"
#include "integration/text_model.h"
#include "integration/wire.h"
#include "streambp/chat.h"
#include "streambp/model.h"
#include "streambp/tokenizer.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

namespace fs = std::filesystem;
using testing::TestConfig;
using testing::QwenModelDir;
using testing::ReferenceModels;
using testing::Add;
using testing::Ids;
using testing::Wire;

server::ServerConfig TextConfig(const std::string& model_dir) {
  auto c = TestConfig();
  c.model.dir = model_dir;
  c.model.dtype = "float32";
  c.trainer.optimizer.name = "sgd";
  c.trainer.optimizer.lr = 1e-2;
  c.trainer.engine = EngineOptions{EngineKind::kStream, 16, 16};
  return c;
}



class Text : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_REFERENCE();
    tokenizer_ = Tokenizer::FromDir(QwenModelDir());
    chat_ = ChatFormat::Create("qwen3");
    eos_ = tokenizer_->eos_token_ids().front();
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatFormat> chat_;
  int64_t eos_ = -1;
};

// --- Tokenize, Detokenize, GetInfo --------------------------------------------------------------

TEST_F(Text, TokenizeAndDetokenizeUseTheModelsTokenizerAndChatFormat) {
  auto s = testing::StartServer(TextConfig(QwenModelDir()));
  Wire w(s.target);
  v1::GetInfoResponse info;
  ASSERT_TRUE(w.stub->GetInfo(Wire::ctx().get(), {}, &info).ok());
  EXPECT_TRUE(info.tokenizer().available());
  EXPECT_EQ(info.tokenizer().chat_format(), "qwen3");
  EXPECT_EQ(info.tokenizer().eos_token(), "<|im_end|>");
  ASSERT_GE(info.tokenizer().eos_token_ids_size(), 1);
  EXPECT_EQ(info.tokenizer().eos_token_ids(0), eos_);

  v1::TokenizeRequest req;
  const std::string text = "Hello, world! 你好 👩‍💻  tabs\tand\nnewlines 12345";
  req.add_inputs()->set_text(text);
  auto* conv = req.add_inputs();
  Add(conv->mutable_messages(), "system", "Be brief.");
  Add(conv->mutable_messages(), "user", "What is 2+2?");
  Add(conv->mutable_messages(), "assistant", "4");
  v1::TokenizeResponse out;
  ASSERT_TRUE(w.stub->Tokenize(Wire::ctx().get(), req, &out).ok());
  ASSERT_EQ(out.outputs_size(), 2);
  EXPECT_EQ(Ids(out.outputs(0).ids()), tokenizer_->encode(text));
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "4"}};
  const auto expected = chat_->render(*tokenizer_, messages);
  EXPECT_EQ(out.outputs(1).text(), expected.text);
  EXPECT_EQ(Ids(out.outputs(1).ids()), expected.ids);
  EXPECT_EQ(std::vector<uint8_t>(out.outputs(1).loss_mask().begin(), out.outputs(1).loss_mask().end()),
            expected.loss_mask);

  v1::DetokenizeRequest d;
  d.add_sequences()->mutable_tokens()->CopyFrom(out.outputs(0).ids());
  d.add_sequences()->mutable_tokens()->CopyFrom(out.outputs(1).ids());
  d.set_skip_special_tokens(true);
  v1::DetokenizeResponse texts;
  ASSERT_TRUE(w.stub->Detokenize(Wire::ctx().get(), d, &texts).ok());
  EXPECT_EQ(texts.texts(0), text);
  EXPECT_EQ(texts.texts(1).find("<|im_start|>"), std::string::npos);
}

// --- Training from text: the ids each form stands for -------------------------------------------

TEST_F(Text, EveryTextFormResolvesToTheDocumentedIdsAndTrainsAsThoseIds) {
  auto s = testing::StartServer(TextConfig(QwenModelDir()));
  Wire w(s.target);
  v1::Batch text;
  auto* sft = text.mutable_sft();
  sft->add_examples()->set_text("The quick brown fox.");
  auto* chat = sft->add_examples();
  Add(chat->mutable_messages(), "user", "Name a colour.");
  Add(chat->mutable_messages(), "assistant", "Blue.");
  auto* pc = sft->add_examples();
  pc->mutable_prompt_text()->set_text("Q: 1+1=");
  pc->mutable_completion_text()->set_text(" 2");
  auto* pcm = sft->add_examples();
  Add(pcm->mutable_prompt_text()->mutable_messages(), "user", "Say hi.");
  Add(pcm->mutable_completion_text()->mutable_messages(), "assistant", "Hi!");

  v1::TokenizeRequest req;
  *req.mutable_batch() = text;
  v1::TokenizeResponse resolved;
  ASSERT_TRUE(w.stub->Tokenize(Wire::ctx().get(), req, &resolved).ok());
  const auto& ex = resolved.batch().sft().examples();
  ASSERT_EQ(ex.size(), 4);
  // text: the tokens plus the end token, loss on all.
  auto plain = tokenizer_->encode("The quick brown fox.", true);
  plain.push_back(eos_);
  EXPECT_EQ(Ids(ex[0].tokens()), plain);
  EXPECT_TRUE(ex[0].loss_mask().empty());
  // messages: the chat format's ids, loss on the assistant turn only.
  const std::vector<ChatMessage> conv = {{"user", "Name a colour."}, {"assistant", "Blue."}};
  const auto r = chat_->render(*tokenizer_, conv);
  EXPECT_EQ(Ids(ex[1].tokens()), r.ids);
  EXPECT_EQ(std::vector<uint8_t>(ex[1].loss_mask().begin(), ex[1].loss_mask().end()), r.loss_mask);
  int64_t trained = 0;
  for (auto m : r.loss_mask) trained += m;
  EXPECT_GT(trained, 0);
  EXPECT_LT(trained, static_cast<int64_t>(r.ids.size()));
  // string prompt + completion: prompt ids, completion ids + end token.
  EXPECT_EQ(Ids(ex[2].prompt()), tokenizer_->encode("Q: 1+1=", true));
  auto completion = tokenizer_->encode(" 2");
  completion.push_back(eos_);
  EXPECT_EQ(Ids(ex[2].completion()), completion);
  // conversational prompt + completion: one conversation, only the completion's turn trained.
  std::vector<ChatMessage> pair = {{"user", "Say hi."}, {"assistant", "Hi!"}};
  pair[0].train = false;
  const auto rp = chat_->render(*tokenizer_, pair);
  EXPECT_EQ(Ids(ex[3].tokens()), rp.ids);
  EXPECT_EQ(std::vector<uint8_t>(ex[3].loss_mask().begin(), ex[3].loss_mask().end()), rp.loss_mask);

  // The step on text and the step on the resolved ids: the same loss, bit for bit.
  v1::ForwardBackwardRequest a;
  *a.mutable_batch() = text;
  v1::ForwardBackwardResponse ra, rb;
  ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), a, &ra).ok());
  v1::ForwardBackwardRequest b;
  *b.mutable_batch() = resolved.batch();
  ASSERT_TRUE(w.stub->ForwardBackward(Wire::ctx().get(), b, &rb).ok());
  EXPECT_EQ(ra.stats().loss(), rb.stats().loss());
  EXPECT_EQ(ra.stats().targets(), rb.stats().targets());
  EXPECT_GT(ra.stats().targets(), 0);
}

TEST_F(Text, DpoAndGrpoTextResolveAsDocumented) {
  auto s = testing::StartServer(TextConfig(QwenModelDir()));
  Wire w(s.target);
  v1::TokenizeRequest req;
  auto* dpo = req.mutable_batch()->mutable_dpo();
  auto* pair = dpo->add_pairs();
  Add(pair->mutable_prompt_text()->mutable_messages(), "user", "Pick one.");
  Add(pair->mutable_chosen_text()->mutable_messages(), "assistant", "A.");
  Add(pair->mutable_rejected_text()->mutable_messages(), "assistant", "B, obviously.");
  auto* plain = dpo->add_pairs();
  plain->mutable_prompt_text()->set_text("2+2=");
  plain->mutable_chosen_text()->set_text("4");
  plain->mutable_rejected_text()->set_text("5");
  v1::TokenizeResponse out;
  ASSERT_TRUE(w.stub->Tokenize(Wire::ctx().get(), req, &out).ok());
  const auto& p = out.batch().dpo().pairs(0);
  ChatOptions gen;
  gen.add_generation_prompt = true;
  const std::vector<ChatMessage> prompt = {{"user", "Pick one."}};
  const auto prompt_ids = chat_->render(*tokenizer_, prompt, gen).ids;
  EXPECT_EQ(Ids(p.prompt()), prompt_ids);
  for (const auto& [completion, ids] : {std::pair<std::string, const google::protobuf::RepeatedField<int32_t>*>{"A.", &p.chosen()},
                                        {"B, obviously.", &p.rejected()}}) {
    const std::vector<ChatMessage> whole = {{"user", "Pick one."}, {"assistant", completion}};
    const auto full = chat_->render(*tokenizer_, whole).ids;
    std::vector<int64_t> expected(full.begin() + static_cast<std::ptrdiff_t>(prompt_ids.size()), full.end());
    EXPECT_EQ(Ids(*ids), expected) << completion;
  }
  const auto& q = out.batch().dpo().pairs(1);
  EXPECT_EQ(Ids(q.prompt()), tokenizer_->encode("2+2=", true));
  EXPECT_EQ(Ids(q.chosen()), (std::vector<int64_t>{tokenizer_->encode("4").front(), eos_}));

  v1::TokenizeRequest g;
  auto* group = g.mutable_batch()->mutable_grpo()->add_groups();
  Add(group->mutable_prompt_text()->mutable_messages(), "user", "Count to three.");
  group->add_completions()->set_text("1, 2, 3");
  group->add_completions()->set_text("one two three");
  ASSERT_TRUE(w.stub->Tokenize(Wire::ctx().get(), g, &out).ok());
  const auto& rg = out.batch().grpo().groups(0);
  const std::vector<ChatMessage> count = {{"user", "Count to three."}};
  EXPECT_EQ(Ids(rg.prompt()), chat_->render(*tokenizer_, count, gen).ids);
  EXPECT_EQ(Ids(rg.completions(1).tokens()), tokenizer_->encode("one two three"));
}

// --- Sampling text, and the model's end tokens ------------------------------------------------

TEST_F(Text, SampleTakesTextAndStopsAtTheModelsEndTokens) {
  auto s = testing::StartServer(TextConfig(QwenModelDir()));
  Wire w(s.target);
  v1::SampleRequest req;
  auto* prompt = req.add_text_prompts();
  Add(prompt->mutable_messages(), "user", "Tell me a story.");
  req.set_max_tokens(6);
  req.set_temperature(0);
  req.set_ignore_eos(true);
  v1::SampleResponse greedy;
  ASSERT_TRUE(w.stub->Sample(Wire::ctx().get(), req, &greedy).ok());
  ASSERT_EQ(greedy.completions_size(), 1);
  const auto& c = greedy.completions(0);
  ASSERT_EQ(c.tokens_size(), 6);
  EXPECT_EQ(c.finish_reason(), "length");
  EXPECT_EQ(c.text(), tokenizer_->decode(Ids(c.tokens()), true));

  // The same folder with generation_config.json naming the greedy path's third token as an end
  // token: sampling stops there (finish "stop"), unless ignore_eos.
  const auto dir = testing::TempDir("text-model-eos");
  for (const auto& e : fs::directory_iterator(QwenModelDir())) fs::copy(e.path(), fs::path(dir) / e.path().filename());
  const int32_t stop = c.tokens(2);
  int stop_at = 0;  // the first place the greedy path produces that token
  while (c.tokens(stop_at) != stop) ++stop_at;
  std::ofstream(fs::path(dir) / "generation_config.json") << "{\"eos_token_id\": [" << eos_ << ", " << stop << "]}";
  auto s2 = testing::StartServer(TextConfig(dir));
  Wire w2(s2.target);
  v1::GetInfoResponse info;
  ASSERT_TRUE(w2.stub->GetInfo(Wire::ctx().get(), {}, &info).ok());
  ASSERT_EQ(info.tokenizer().eos_token_ids_size(), 2);
  EXPECT_EQ(info.tokenizer().eos_token_ids(1), stop);
  req.set_ignore_eos(false);
  v1::SampleResponse stopped;
  ASSERT_TRUE(w2.stub->Sample(Wire::ctx().get(), req, &stopped).ok());
  const auto& sc = stopped.completions(0);
  ASSERT_EQ(sc.tokens_size(), stop_at + 1) << "stops after the end token";
  EXPECT_EQ(sc.tokens(stop_at), stop);
  EXPECT_EQ(sc.finish_reason(), "stop");
  req.set_ignore_eos(true);
  ASSERT_TRUE(w2.stub->Sample(Wire::ctx().get(), req, &stopped).ok());
  EXPECT_EQ(stopped.completions(0).tokens_size(), 6);
}

// --- Bad text: a clear error naming the field, and nothing changed --------------------------------

TEST_F(Text, BadTextIsRefusedNamingTheFieldAndChangesNothing) {
  auto config = TextConfig(QwenModelDir());
  config.limits.max_sequence_length = 64;
  auto s = testing::StartServer(config);
  Wire w(s.target);
  const auto before = testing::ExportedTensors(*s.client);
  auto train = [&](const v1::Batch& batch) {
    v1::TrainStepRequest r;
    *r.mutable_batch() = batch;
    v1::TrainStepResponse out;
    return w.stub->TrainStep(Wire::ctx().get(), r, &out);
  };
  struct Case {
    std::string name;
    std::function<void(v1::Batch*)> make;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown role",
       [](v1::Batch* b) {
         auto* e = b->mutable_sft()->add_examples();
         Add(e->mutable_messages(), "user", "hi");
         Add(e->mutable_messages(), "bot", "hello");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "batch.sft.examples[0].messages[1].role"},
      {"no assistant turn",
       [](v1::Batch* b) { Add(b->mutable_sft()->add_examples()->mutable_messages(), "user", "hi"); },
       grpc::StatusCode::INVALID_ARGUMENT, "batch.sft.examples[0].messages: no assistant message"},
      {"two forms",
       [](v1::Batch* b) {
         auto* e = b->mutable_sft()->add_examples();
         e->set_text("a");
         e->add_tokens(1);
         e->add_tokens(2);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "batch.sft.examples[0]: give one of"},
      {"empty messages of a prompt",
       [](v1::Batch* b) {
         auto* e = b->mutable_sft()->add_examples();
         e->mutable_prompt_text();
         e->mutable_completion_text()->set_text("x");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "batch.sft.examples[0].prompt_text is empty"},
      {"too long after tokenization",
       [](v1::Batch* b) {
         std::string long_text;
         for (int i = 0; i < 200; ++i) long_text += " word" + std::to_string(i);
         b->mutable_sft()->add_examples()->set_text(long_text);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "batch.sft.examples[0]: "},
  };
  for (const auto& c : cases) {
    v1::Batch batch;
    c.make(&batch);
    auto st = train(batch);
    EXPECT_EQ(st.error_code(), c.code) << c.name << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(c.message), std::string::npos) << c.name << ": " << st.error_message();
  }
  // Invalid UTF-8 cannot be a protobuf string: the body does not parse, and the answer names the field.
  {
    v1::TrainStepRequest r;
    r.mutable_batch()->mutable_sft()->add_examples()->set_text(std::string("ok \xff\xfe bad", 9));
    std::string bytes;
    ASSERT_TRUE(r.SerializePartialToString(&bytes));
    grpc::ByteBuffer in, out;
    grpc::Slice slice(bytes);
    in = grpc::ByteBuffer(&slice, 1);
    grpc::GenericStub generic(grpc::CreateChannel(s.target, grpc::InsecureChannelCredentials()));
    auto ctx = Wire::ctx();
    grpc::CompletionQueue cq;
    auto call = generic.PrepareUnaryCall(ctx.get(), "/streambp.v1.Trainer/TrainStep", in, &cq);
    grpc::Status st;
    call->StartCall();
    call->Finish(&out, &st, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("batch.sft.examples[0].text is not valid UTF-8 at byte 3"), std::string::npos)
        << st.error_message();
  }
  testing::ExpectSameTensors(before, testing::ExportedTensors(*s.client));
}

TEST(TextWithoutTokenizer, TextIsFailedPreconditionAndIdsStillWork) {
  auto s = testing::StartServer(TestConfig());  // the embedded preset: no tokenizer
  Wire w(s.target);
  v1::TrainStepRequest r;
  r.mutable_batch()->mutable_sft()->add_examples()->set_text("hello");
  v1::TrainStepResponse out;
  auto st = w.stub->TrainStep(Wire::ctx().get(), r, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("tokenizer"), std::string::npos) << st.error_message();
  v1::TokenizeRequest t;
  t.add_inputs()->set_text("hello");
  v1::TokenizeResponse tr;
  EXPECT_EQ(w.stub->Tokenize(Wire::ctx().get(), t, &tr).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::GetInfoResponse info;
  ASSERT_TRUE(w.stub->GetInfo(Wire::ctx().get(), {}, &info).ok());
  EXPECT_FALSE(info.tokenizer().available());
  v1::TrainStepRequest ids;
  auto* e = ids.mutable_batch()->mutable_sft()->add_examples();
  for (int t = 0; t < 8; ++t) e->add_tokens(t + 3);
  EXPECT_TRUE(w.stub->TrainStep(Wire::ctx().get(), ids, &out).ok());
}

// --- Files travel with the weights ------------------------------------------------------------------

TEST_F(Text, TokenizerFilesTravelIntoCheckpointsAndExports) {
  auto config = TextConfig(QwenModelDir());
  config.checkpoint_dir = testing::TempDir("text-ckpt");
  auto s = testing::StartServer(config);
  Wire w(s.target);
  v1::SaveCheckpointRequest save;
  save.set_name("with-tokenizer");
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE(w.stub->SaveCheckpoint(Wire::ctx().get(), save, &saved).ok());
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const fs::path model(QwenModelDir());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(read(fs::path(config.checkpoint_dir) / "with-tokenizer" / f), read(model / f)) << f;
  }
  v1::ExportWeightsRequest req;
  req.set_with_files(true);
  auto ctx = Wire::ctx();
  auto reader = w.stub->ExportWeights(ctx.get(), req);
  v1::WeightsChunk chunk;
  std::map<std::string, std::string> files;
  std::map<std::string, std::string> digests;
  while (reader->Read(&chunk)) {
    auto& bytes = files[chunk.file()];
    EXPECT_EQ(static_cast<int64_t>(bytes.size()), chunk.offset()) << chunk.file();
    bytes += chunk.data();
    if (chunk.last()) digests[chunk.file()] = chunk.sha256();
  }
  const auto finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_code() << ": " << finished.error_message();
  EXPECT_TRUE(files.count(""));  // the weights first
  EXPECT_EQ(files["tokenizer.json"], read(model / "tokenizer.json"));
  EXPECT_EQ(files["tokenizer_config.json"], read(model / "tokenizer_config.json"));
  EXPECT_EQ(digests.size(), files.size());
}

}  // namespace
}  // namespace streambp
