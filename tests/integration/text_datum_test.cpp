// Text as a Datum's model input (issue 28): a string or a conversation the server tokenizes
// with the model's tokenizer and chat format (the tiny preset around the real Qwen3 tokenizer,
// tests/text/reference/setup.sh). The datum becomes the tokenization less its last token, its
// targets the tokenization shifted by one and, for a conversation, the loss mask its trained
// assistant turns; it trains as those ids sent as tokens (bit for bit), a conversation's
// cross_entropy is SFT's loss times its target count, Tokenize with the batch shows the ids,
// and bad text datums are refused naming the field with nothing changed.
#include <algorithm>
#include <functional>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "integration/text_model.h"
#include "integration/wire.h"
#include "streambp/chat.h"
#include "streambp/tokenizer.h"
#include "streambp/v1/trainer.grpc.pb.h"

namespace streambp {
namespace {

using testing::Add;
using testing::Ids;
using testing::QwenModelDir;
using testing::Wire;

server::ServerConfig TextF64() {
  auto c = testing::TestConfig();
  c.model.dir = QwenModelDir();
  c.model.dtype = "float64";
  c.trainer.optimizer.name = "sgd";
  c.trainer.optimizer.lr = 0.1;
  return c;
}

class TextDatum : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_REFERENCE();
    tokenizer_ = Tokenizer::FromDir(QwenModelDir());
    chat_ = ChatFormat::Create("qwen3");
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatFormat> chat_;
};

void Conversation(v1::Datum* d, const std::string& question, const std::string& answer) {
  auto* messages = d->mutable_model_input()->mutable_text()->mutable_messages();
  Add(messages, "user", question);
  Add(messages, "assistant", answer);
}

TEST_F(TextDatum, AConversationTrainsAsItsTokensAndAsSftSummed) {
  const std::vector<std::pair<std::string, std::string>> qa = {{"What is 2+2?", "4, of course."},
                                                                {"Name a colour.", "Blue."}};
  v1::TrainStepRequest text;
  text.set_objective("cross_entropy");
  for (const auto& [q, a] : qa) Conversation(text.mutable_batch()->mutable_data()->add_data(), q, a);

  // What the datums become: the chat format's ids less the last, targets shifted, the mask of
  // the assistant turns at the positions that predict them.
  auto a = testing::StartServer(TextF64());
  Wire wa(a.target);
  v1::TokenizeRequest tokenize;
  *tokenize.mutable_batch() = text.batch();
  v1::TokenizeResponse resolved;
  ASSERT_TRUE(wa.stub->Tokenize(Wire::ctx().get(), tokenize, &resolved).ok());
  ASSERT_EQ(resolved.batch().data().data_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const std::vector<ChatMessage> conv = {{"user", qa[i].first}, {"assistant", qa[i].second}};
    const auto r = chat_->render(*tokenizer_, conv);
    const auto& d = resolved.batch().data().data(i);
    EXPECT_FALSE(d.model_input().has_text());
    EXPECT_EQ(Ids(d.model_input().tokens()), std::vector<int64_t>(r.ids.begin(), r.ids.end() - 1));
    const auto& targets = d.loss_fn_inputs().at("target_tokens").int_data();
    EXPECT_EQ(std::vector<int64_t>(targets.begin(), targets.end()), std::vector<int64_t>(r.ids.begin() + 1, r.ids.end()));
    EXPECT_EQ(std::vector<uint8_t>(d.model_input().loss_mask().begin(), d.model_input().loss_mask().end()),
              std::vector<uint8_t>(r.loss_mask.begin() + 1, r.loss_mask.end()));
  }

  const auto on_text = a.client->TrainStep(text);
  ASSERT_TRUE(on_text.ok()) << on_text.status().error_message();

  // The resolved batch sent as ids: the same loss, targets and update, bit for bit.
  auto b = testing::StartServer(TextF64());
  v1::TrainStepRequest ids;
  ids.set_objective("cross_entropy");
  *ids.mutable_batch() = resolved.batch();
  const auto on_ids = b.client->TrainStep(ids);
  ASSERT_TRUE(on_ids.ok()) << on_ids.status().error_message();
  EXPECT_EQ(on_text->stats().loss(), on_ids->stats().loss());
  EXPECT_EQ(on_text->stats().targets(), on_ids->stats().targets());
  testing::ExpectSameTensors(testing::ExportedTensors(*a.client), testing::ExportedTensors(*b.client));

  // SFT on the same messages: the mean over the same targets.
  auto c = testing::StartServer(TextF64());
  v1::ForwardBackwardRequest sft;
  for (const auto& [q, ans] : qa) {
    auto* e = sft.mutable_batch()->mutable_sft()->add_examples();
    Add(e->mutable_messages(), "user", q);
    Add(e->mutable_messages(), "assistant", ans);
  }
  const auto on_sft = c.client->ForwardBackward(sft);
  ASSERT_TRUE(on_sft.ok()) << on_sft.status().error_message();
  // And the mask given as cross_entropy's weights instead: the same loss.
  v1::ForwardBackwardRequest weighted;
  weighted.set_objective("cross_entropy");
  *weighted.mutable_batch() = resolved.batch();
  for (auto& d : *weighted.mutable_batch()->mutable_data()->mutable_data()) {
    auto& w = (*d.mutable_loss_fn_inputs())["weights"];
    for (int m : d.model_input().loss_mask()) w.add_float_data(m);
    d.mutable_model_input()->clear_loss_mask();
  }
  const auto on_weights = c.client->ForwardBackward(weighted);
  ASSERT_TRUE(on_weights.ok()) << on_weights.status().error_message();
  EXPECT_EQ(on_weights->stats().loss(), on_text->stats().loss());
  EXPECT_EQ(on_sft->stats().targets(), on_text->stats().targets());
  EXPECT_GT(on_text->stats().targets(), 4);
  EXPECT_NEAR(on_sft->stats().loss() * static_cast<double>(on_text->stats().targets()), on_text->stats().loss(),
              1e-12 * on_text->stats().loss());
}

TEST_F(TextDatum, AStringTrainsOnEveryTokenAndOtherLossesTakeTheirInputsPerToken) {
  auto s = testing::StartServer(TextF64());
  Wire w(s.target);
  // A string: its tokens and the end token; every target trained.
  auto expected = tokenizer_->encode("The quick brown fox.", true);
  expected.push_back(tokenizer_->eos_token_ids().front());
  v1::ForwardBackwardRequest text;
  text.set_objective("cross_entropy");
  text.mutable_batch()->mutable_data()->add_data()->mutable_model_input()->mutable_text()->set_text(
      "The quick brown fox.");
  v1::ForwardBackwardRequest ids;
  ids.set_objective("cross_entropy");
  auto* d = ids.mutable_batch()->mutable_data()->add_data();
  for (size_t t = 0; t + 1 < expected.size(); ++t) d->mutable_model_input()->add_tokens(static_cast<int32_t>(expected[t]));
  for (size_t t = 1; t < expected.size(); ++t) (*d->mutable_loss_fn_inputs())["target_tokens"].add_int_data(expected[t]);
  const auto on_text = s.client->ForwardBackward(text);
  ASSERT_TRUE(on_text.ok()) << on_text.status().error_message();
  const auto on_ids = s.client->ForwardBackward(ids);
  ASSERT_TRUE(on_ids.ok()) << on_ids.status().error_message();
  EXPECT_EQ(on_text->stats().loss(), on_ids->stats().loss());
  EXPECT_EQ(on_text->stats().targets(), static_cast<int64_t>(expected.size()) - 1);

  // ppo on a conversation: its sampler log-probs and advantages, one per token Tokenize shows.
  v1::TrainStepRequest ppo;
  ppo.set_objective("ppo");
  auto* conv = ppo.mutable_batch()->mutable_data()->add_data();
  Conversation(conv, "Say hi.", "Hi!");
  v1::TokenizeRequest tokenize;
  *tokenize.mutable_batch() = ppo.batch();
  v1::TokenizeResponse resolved;
  ASSERT_TRUE(w.stub->Tokenize(Wire::ctx().get(), tokenize, &resolved).ok());
  const int n = resolved.batch().data().data(0).model_input().tokens_size();
  auto& q = (*conv->mutable_loss_fn_inputs())["logprobs"];
  auto& adv = (*conv->mutable_loss_fn_inputs())["advantages"];
  for (int t = 0; t < n + 1; ++t) {
    q.add_float_data(-2.0);
    adv.add_float_data(t % 2 == 0 ? 1.0 : -0.5);
  }
  const auto too_many = s.client->TrainStep(ppo);
  EXPECT_EQ(too_many.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(too_many.status().error_message().find("loss_fn_inputs[logprobs] has " + std::to_string(n + 1) +
                                                   " values but model_input has " + std::to_string(n) + " tokens"),
            std::string::npos)
      << too_many.status().error_message();
  EXPECT_NE(too_many.status().error_message().find("Tokenize with the batch shows"), std::string::npos);
  q.mutable_float_data()->RemoveLast();
  adv.mutable_float_data()->RemoveLast();
  const auto trained = s.client->TrainStep(ppo);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();
  // Only the assistant turn's tokens are targets.
  const auto& mask = resolved.batch().data().data(0).model_input().loss_mask();
  EXPECT_EQ(trained->stats().targets(), std::count(mask.begin(), mask.end(), 1));
  EXPECT_LT(trained->stats().targets(), n);
}

TEST_F(TextDatum, BadTextDatumsAreRefusedNamingTheFieldAndChangeNothing) {
  auto s = testing::StartServer(TextF64());
  v1::TrainStepRequest good;
  good.set_objective("cross_entropy");
  Conversation(good.mutable_batch()->mutable_data()->add_data(), "Name a colour.", "Blue.");
  auto datum = [](v1::TrainStepRequest& r) { return r.mutable_batch()->mutable_data()->mutable_data(0); };
  const auto before = testing::ExportedTensors(*s.client);
  struct Case {
    std::string what;
    std::function<void(v1::TrainStepRequest&)> edit;
    std::string message;
  };
  const std::string f = "batch.data.data[0].model_input";
  const std::vector<Case> cases = {
      {"tokens and text", [&](auto& r) { datum(r)->mutable_model_input()->add_tokens(5); },
       f + ": give tokens or text, not both"},
      {"text and messages", [&](auto& r) { datum(r)->mutable_model_input()->mutable_text()->set_text("x"); },
       f + ".text: give text or messages, not both"},
      {"nothing to train on", [&](auto& r) {
         datum(r)->mutable_model_input()->mutable_text()->mutable_messages(1)->set_train(false);
       }, f + ".text.messages: no assistant message to train on"},
      {"a mask with a conversation", [&](auto& r) { datum(r)->mutable_model_input()->add_loss_mask(1); },
       f + ".loss_mask: a conversation sets its own"},
      {"targets that are not the text's", [&](auto& r) {
         (*datum(r)->mutable_loss_fn_inputs())["target_tokens"].add_int_data(1);
       }, "loss_fn_inputs[target_tokens] has 1 values but model_input has"},
      {"a mask of the wrong length", [&](auto& r) {
         auto* mi = datum(r)->mutable_model_input();
         mi->clear_text();
         for (int t : {3, 4, 5}) mi->add_tokens(t);
         auto& targets = (*datum(r)->mutable_loss_fn_inputs())["target_tokens"];
         for (int t : {4, 5, 6}) targets.add_int_data(t);
         mi->add_loss_mask(1);
       }, f + ".loss_mask has 1 entries but model_input has 3 tokens"},
      {"a mask that is not 0/1", [&](auto& r) {
         auto* mi = datum(r)->mutable_model_input();
         mi->clear_text();
         for (int t : {3, 4, 5}) mi->add_tokens(t);
         auto& targets = (*datum(r)->mutable_loss_fn_inputs())["target_tokens"];
         for (int t : {4, 5, 6}) targets.add_int_data(t);
         for (int m : {1, 2, 0}) mi->add_loss_mask(m);
       }, f + ".loss_mask[1] = 2 must be 0 or 1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = good;
    c.edit(r);
    const auto refused = s.client->TrainStep(r);
    EXPECT_EQ(refused.code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(refused.status().error_message().find(c.message), std::string::npos) << refused.status().error_message();
  }
  testing::ExpectSameTensors(before, testing::ExportedTensors(*s.client));
  const auto trained = s.client->TrainStep(good);
  ASSERT_TRUE(trained.ok()) << trained.status().error_message();

  // A server without a tokenizer: text is FAILED_PRECONDITION.
  auto bare = testing::StartServer(testing::TestConfig());
  const auto refused = bare.client->TrainStep(good);
  EXPECT_EQ(refused.code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.status().error_message().find("tokenizer"), std::string::npos) << refused.status().error_message();
}

}  // namespace
}  // namespace streambp
