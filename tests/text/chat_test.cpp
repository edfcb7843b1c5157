// The chat formats against the models' own chat templates rendered by Jinja2
// (tests/text/chat_reference.py): the same text, the tokenizer's ids of that text, and a loss
// mask that is exactly the tokens starting inside the assistant turns' bodies, located in the
// reference rendering by their markers.
#include <gtest/gtest.h>

#include "reference.h"
#include "streambp/chat.h"
#include "streambp/error.h"
#include "streambp/tokenizer.h"

namespace streambp {
namespace {

using nlohmann::json;
using text_test::ReferenceDir;

const Tokenizer& Load(const std::string& model) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[model];
  if (!slot) slot = Tokenizer::FromDir(ReferenceDir() + "/models/" + model);
  return *slot;
}

std::vector<ChatMessage> Messages(const json& j) {
  std::vector<ChatMessage> messages;
  for (const json& m : j) {
    ChatMessage message{m["role"], m["content"], std::nullopt, std::nullopt};
    if (m.contains("reasoning_content"))
      message.reasoning_content = m["reasoning_content"].get<std::string>();
    messages.push_back(std::move(message));
  }
  return messages;
}

// The expected mask, from the reference's spans: a token is in it when the bytes it stands for
// (after the sum of the byte lengths of the tokens before it, in the text as the tokenizer
// sees it) meet a span.
std::vector<uint8_t> ExpectedMask(const Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                                  const json& spans) {
  std::vector<uint8_t> mask;
  size_t at = 0;
  for (int64_t id : ids) {
    const size_t end = at + tokenizer.token_bytes(id).size();
    bool inside = false;
    for (const json& span : spans) inside |= span[0].get<size_t>() < end && at < span[1].get<size_t>();
    mask.push_back(inside);
    at = end;
  }
  return mask;
}

std::string MaskedText(const Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                       const std::vector<uint8_t>& mask) {
  std::vector<int64_t> kept;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (mask[i]) kept.push_back(ids[i]);
  }
  return tokenizer.decode(kept);
}

TEST(ChatReference, EveryCaseMatchesJinja2) {
  STREAMBP_REQUIRE_REFERENCE();
  const json cases = json::parse(text_test::ReadText(ReferenceDir() + "/chat.json"));
  const json inputs = json::parse(text_test::ReadText(text_test::SourceDir() + "/chat_cases.json"));
  ASSERT_EQ(cases.size(), inputs.size());
  size_t masked_tokens = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& ref = cases[i];
    const json& input = inputs[i];
    SCOPED_TRACE(ref["name"].get<std::string>());
    const Tokenizer& tokenizer = Load(ref["tokenizer"]);
    // The format is recognized from the template that rendered the reference.
    EXPECT_EQ(ChatFormat::InferName(ref["template"].get<std::string>()), ref["format"].get<std::string>());
    const auto format = ChatFormat::Create(ref["format"].get<std::string>(), tokenizer.bos_token());
    ChatOptions options;
    options.add_generation_prompt = input.value("add_generation_prompt", false);
    options.enable_thinking = input.value("enable_thinking", true);
    options.date_string = input.value("date_string", "");
    const auto messages = Messages(input["messages"]);
    const RenderedChat chat = format->render(tokenizer, messages, options);
    const std::string expected_text = ref["text"];
    EXPECT_EQ(chat.text, expected_text);
    const auto expected_ids = tokenizer.encode(expected_text);
    EXPECT_EQ(chat.ids, expected_ids);
    const auto expected_mask = ExpectedMask(tokenizer, expected_ids, ref["assistant_spans"]);
    EXPECT_EQ(chat.loss_mask, expected_mask)
        << "trained: " << json(MaskedText(tokenizer, chat.ids, chat.loss_mask))
        << "\nexpected: " << json(MaskedText(tokenizer, expected_ids, expected_mask));
    // The masked tokens decode to the assistant bodies, each with what a token straddling its
    // start brings from before it.
    // (Positions are in the text as the tokenizer sees it: NFC for Qwen.)
    const std::string seen = ref["normalized_text"];
    std::string bodies;
    size_t at = 0;
    for (size_t k = 0; k < expected_ids.size(); ++k) {
      const std::string& bytes = tokenizer.token_bytes(expected_ids[k]);
      if (expected_mask[k]) bodies += seen.substr(at, bytes.size());
      at += bytes.size();
    }
    EXPECT_EQ(at, seen.size());
    EXPECT_EQ(MaskedText(tokenizer, chat.ids, chat.loss_mask), bodies);
    for (const json& span : ref["assistant_spans"]) {
      const size_t begin = span[0], end = span[1];
      EXPECT_NE(bodies.find(seen.substr(begin, end - begin)), std::string::npos);
    }
    EXPECT_EQ(ref["assistant_spans"].size(),
              static_cast<size_t>(std::count_if(messages.begin(), messages.end(),
                                                [](const ChatMessage& m) { return m.role == "assistant"; })));
    for (uint8_t m : chat.loss_mask) masked_tokens += m;
  }
  EXPECT_GT(masked_tokens, 100u);
}

TEST(ChatReference, FormatFromTheModelFolder) {
  STREAMBP_REQUIRE_REFERENCE();
  EXPECT_EQ(ChatFormat::ForTokenizer(Load("qwen3"))->name(), "qwen3");
  EXPECT_EQ(ChatFormat::ForTokenizer(Load("llama3"))->name(), "llama3");
  EXPECT_EQ(ChatFormat::ForTokenizer(Load("gemma3"))->name(), "gemma");
  EXPECT_EQ(ChatFormat::ForTokenizer(Load("qwen3"), "chatml")->name(), "chatml");
  EXPECT_THROW(ChatFormat::ForTokenizer(Load("qwen3"), "vicuna"), InvalidArgument);
}

TEST(ChatReference, TrainOverridesTheDefaultMask) {
  STREAMBP_REQUIRE_REFERENCE();
  const Tokenizer& tokenizer = Load("qwen3");
  const auto format = ChatFormat::Create("qwen3");
  std::vector<ChatMessage> messages = {{"user", "Q1", std::nullopt, std::nullopt},
                                       {"assistant", "A1", std::nullopt, std::nullopt},
                                       {"user", "Q2", std::nullopt, std::nullopt},
                                       {"assistant", "A2", std::nullopt, std::nullopt}};
  const RenderedChat all = format->render(tokenizer, messages);
  messages[1].train = false;  // prompt/completion: only the completion's turn is trained
  const RenderedChat last = format->render(tokenizer, messages);
  EXPECT_EQ(all.ids, last.ids);
  EXPECT_EQ(MaskedText(tokenizer, all.ids, all.loss_mask), "A1<|im_end|><think>\n\n</think>\n\nA2<|im_end|>");
  EXPECT_EQ(MaskedText(tokenizer, last.ids, last.loss_mask), "<think>\n\n</think>\n\nA2<|im_end|>");
  messages[0].train = true;
  EXPECT_EQ(MaskedText(tokenizer, last.ids, format->render(tokenizer, messages).loss_mask),
            "Q1<|im_end|>" + MaskedText(tokenizer, last.ids, last.loss_mask));
}

// --- bad input, no reference needed -----------------------------------------------------------

std::string ErrorOf(const std::vector<ChatMessage>& messages, const std::string& format = "qwen3") {
  try {
    ChatFormat::Create(format)->render_text(messages);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Chat, BadInputNamesTheField) {
  EXPECT_EQ(ErrorOf({}), "messages is empty");
  EXPECT_EQ(ErrorOf({{"user", "hi", std::nullopt, std::nullopt},
                     {"assistant", "hello", std::nullopt, std::nullopt},
                     {"bot", "beep", std::nullopt, std::nullopt}}),
            "messages[2].role 'bot' is not one of system, user, assistant, tool");
  EXPECT_EQ(
      ErrorOf({{"user", "ok", std::nullopt, std::nullopt}, {"user", "bad \xC3", std::nullopt, std::nullopt}}),
      "messages[1].content is not valid UTF-8 at byte 4");
  EXPECT_EQ(ErrorOf({{"assistant", "x", std::string("\xFF"), std::nullopt}}),
            "messages[0].reasoning_content is not valid UTF-8 at byte 0");
  EXPECT_EQ(ErrorOf({{"user", "x", std::string("why"), std::nullopt}}),
            "messages[0].reasoning_content is only for assistant turns");
  EXPECT_EQ(ErrorOf({{"assistant", "x", std::string("why"), std::nullopt}}, "llama3"),
            "messages[0].reasoning_content: the llama3 format has no place for it");
  EXPECT_EQ(ErrorOf({{"User", "x", std::nullopt, std::nullopt}}),
            "messages[0].role 'User' is not one of system, user, assistant, tool");
  try {
    ChatFormat::Create("alpaca");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "chat format 'alpaca' is not one of qwen3, llama3, llama3.1, llama3.2, gemma, chatml");
  }
  // Gemma's template raises unless the turns alternate from user (after a system turn).
  const std::string alternate =
      "': the gemma format needs the turns after an optional system turn to alternate user, "
      "assistant, user, ... starting with user";
  EXPECT_EQ(ErrorOf({{"assistant", "x", std::nullopt, std::nullopt}}, "gemma"),
            "messages[0].role 'assistant" + alternate);
  EXPECT_EQ(ErrorOf({{"system", "s", std::nullopt, std::nullopt},
                     {"user", "a", std::nullopt, std::nullopt},
                     {"user", "b", std::nullopt, std::nullopt}},
                    "gemma"),
            "messages[2].role 'user" + alternate);
  EXPECT_EQ(ErrorOf({{"user", "a", std::nullopt, std::nullopt}, {"system", "late", std::nullopt, std::nullopt}},
                    "gemma"),
            "(no error)");  // the template renders a later system turn as "<start_of_turn>system"
  EXPECT_EQ(ChatFormat::InferName("{{ messages }}"), "");
}

}  // namespace
}  // namespace streambp
