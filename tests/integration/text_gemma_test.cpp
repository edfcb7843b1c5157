// Text in, text out on a Gemma 3 model (issue 24): the tiny preset as a gemma3 folder around
// the real Gemma 3 tokenizer (character-level BPE with byte fallback, npm reference package).
// The server must take the folder's own tokenizer and recognize its chat template as `gemma`;
// the expected ids come from the tokenizer and chat-format library, whose ids are checked
// against the reference in tests/text.
#include <cmath>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "integration/text_model.h"
#include "integration/wire.h"
#include "streambp/chat.h"
#include "streambp/tokenizer.h"
#include "streambp/v1/trainer.grpc.pb.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

using testing::GemmaModelDir;

using testing::Add;
using testing::Ids;
using testing::Wire;

TEST(TextGemma, AGemma3FolderTokenizesTrainsAndSamplesWithItsOwnTokenizerAndChatFormat) {
  REQUIRE_REFERENCE();
  auto config = testing::TestConfig();
  config.model.dir = GemmaModelDir();
  config.model.dtype = "float32";
  config.trainer.optimizer.name = "sgd";
  config.trainer.optimizer.lr = 1e-2;
  auto s = testing::StartServer(config);
  Wire w(s.target);
  auto& stub = w.stub;
  const auto tokenizer = Tokenizer::FromDir(GemmaModelDir());
  const auto chat = ChatFormat::Create("gemma", "<bos>");

  v1::GetInfoResponse info;
  ASSERT_TRUE(stub->GetInfo(Wire::ctx().get(), {}, &info).ok());
  EXPECT_EQ(info.architecture(), "Gemma3ForCausalLM");
  EXPECT_TRUE(info.tokenizer().available());
  EXPECT_EQ(info.tokenizer().type(), "BPE (characters, byte fallback)");
  EXPECT_EQ(info.tokenizer().vocab_size(), 262145);
  EXPECT_EQ(info.tokenizer().chat_format(), "gemma");
  EXPECT_EQ(info.tokenizer().eos_token(), "<end_of_turn>");

  // Text (spaces, a byte-fallback character, CJK, emoji) and a conversation with a system turn.
  const std::string text = "Hello,  world!\tA rare sign: \u2e3b and 素数 🙂\n\nEnd";
  v1::TokenizeRequest req;
  req.add_inputs()->set_text(text);
  auto* conv = req.add_inputs();
  Add(conv->mutable_messages(), "system", "Be brief.");
  Add(conv->mutable_messages(), "user", "What is 2+2?");
  Add(conv->mutable_messages(), "assistant", " 4 ");
  v1::TokenizeResponse out;
  ASSERT_TRUE(stub->Tokenize(Wire::ctx().get(), req, &out).ok());
  ASSERT_EQ(out.outputs_size(), 2);
  EXPECT_EQ(Ids(out.outputs(0).ids()), tokenizer->encode(text));
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", " 4 "}};
  const RenderedChat expected = chat->render(*tokenizer, messages);
  EXPECT_EQ(out.outputs(1).text(),
            "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n");
  EXPECT_EQ(Ids(out.outputs(1).ids()), expected.ids);
  std::vector<int64_t> trained;
  for (int i = 0; i < out.outputs(1).ids_size(); ++i) {
    if (out.outputs(1).loss_mask(i)) trained.push_back(out.outputs(1).ids(i));
  }
  EXPECT_EQ(tokenizer->decode(trained), "4<end_of_turn>");

  v1::DetokenizeRequest d;
  d.add_sequences()->mutable_tokens()->CopyFrom(out.outputs(0).ids());
  v1::DetokenizeResponse texts;
  ASSERT_TRUE(stub->Detokenize(Wire::ctx().get(), d, &texts).ok());
  EXPECT_EQ(texts.texts(0), text);

  // An SFT step from the conversation: a finite loss over the assistant's tokens only.
  v1::TrainStepRequest step;
  step.set_objective("sft");
  auto* example = step.mutable_batch()->mutable_sft()->add_examples();
  for (const auto& m : messages) Add(example->mutable_messages(), m.role, m.content);
  v1::TrainStepResponse trained_step;
  const grpc::Status status = stub->TrainStep(Wire::ctx().get(), step, &trained_step);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(std::isfinite(trained_step.stats().loss()));
  EXPECT_GT(trained_step.stats().loss(), 0.0);
  EXPECT_EQ(trained_step.stats().targets(), 2);  // "4" and <end_of_turn>

  // Sampling from a text prompt: the generation prompt is Gemma's, the text is the tokens'.
  v1::SampleRequest sample;
  Add(sample.add_text_prompts()->mutable_messages(), "user", "Tell me a story.");
  sample.set_max_tokens(5);
  sample.set_temperature(0);
  sample.set_ignore_eos(true);
  v1::SampleResponse sampled;
  ASSERT_TRUE(stub->Sample(Wire::ctx().get(), sample, &sampled).ok());
  ASSERT_EQ(sampled.completions_size(), 1);
  ASSERT_EQ(sampled.completions(0).tokens_size(), 5);
  EXPECT_EQ(sampled.completions(0).text(), tokenizer->decode(Ids(sampled.completions(0).tokens()), true));
}

}  // namespace
}  // namespace streambp
