#include "streambp/chat.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>

#include "streambp/error.h"
#include "streambp/interrupt.h"
#include "unicode.h"

namespace streambp {

/// Accumulates the rendered text and the byte ranges to train on.
class ChatFormat::Builder {
 public:
  /// Appends `s`; trained text extends the current span or opens one.
  void add(std::string_view s, bool train = false) {
    if (train && !s.empty()) {
      if (!out_.train_spans.empty() && out_.train_spans.back().second == out_.text.size()) {
        out_.train_spans.back().second += s.size();
      } else {
        out_.train_spans.emplace_back(out_.text.size(), out_.text.size() + s.size());
      }
    }
    out_.text += s;
  }
  RenderedText take() { return std::move(out_); }

 private:
  RenderedText out_;
};

namespace {

constexpr std::string_view kRoles[] = {"system", "user", "assistant", "tool"};

bool Trained(const ChatMessage& m) { return m.train.value_or(m.role == "assistant"); }

// Python's str.isspace() characters (what Jinja's `trim` strips).
bool IsPythonSpace(char32_t c) { return text::IsWhiteSpace(c) || (c >= 0x1C && c <= 0x1F); }

// Python's str.strip() with no arguments.
std::string_view PyStrip(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t next = begin;
    if (!IsPythonSpace(text::NextCodePoint(s, next))) break;
    begin = next;
  }
  while (end > begin) {
    size_t prev;
    if (!IsPythonSpace(text::PrevCodePoint(s, end, prev))) break;
    end = prev;
  }
  return s.substr(begin, end - begin);
}

std::string_view LstripNewlines(std::string_view s) {
  const size_t i = s.find_first_not_of('\n');
  return i == std::string_view::npos ? std::string_view() : s.substr(i);
}

std::string_view RstripNewlines(std::string_view s) {
  const size_t i = s.find_last_not_of('\n');
  return i == std::string_view::npos ? std::string_view() : s.substr(0, i + 1);
}

std::string_view StripNewlines(std::string_view s) { return RstripNewlines(LstripNewlines(s)); }

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// transformers' `tojson` of a string: json.dumps(s, ensure_ascii=False).
std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned char>(c));
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%d %b %Y", &local);
  return buffer;
}

// --- qwen3 -----------------------------------------------------------------------------------

class Qwen3Format : public ChatFormat {
 public:
  std::string_view name() const override { return "qwen3"; }

 protected:
  bool reads_reasoning() const override { return true; }

  void render_into(std::span<const ChatMessage> messages, const ChatOptions& options,
                   Builder& out) const override {
    const size_t n = messages.size();
    if (messages[0].role == "system") {
      out.add("<|im_start|>system\n");
      out.add(messages[0].content + "<|im_end|>", Trained(messages[0]));
      out.add("\n");
    }
    // The last user turn that is a query, not tool results handed back as a user turn.
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
      const ChatMessage& m = messages[k];
      if (m.role == "user" &&
          !(StartsWith(m.content, "<tool_response>") && EndsWith(m.content, "</tool_response>"))) {
        last_query = k;
        break;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const ChatMessage& m = messages[i];
      const bool last = i + 1 == n;
      if (m.role == "user" || (m.role == "system" && i > 0)) {
        out.add("<|im_start|>" + m.role + "\n");
        out.add(m.content + "<|im_end|>", Trained(m));
        out.add("\n");
      } else if (m.role == "assistant") {
        std::string_view content = m.content, reasoning;
        if (m.reasoning_content) {
          reasoning = *m.reasoning_content;
        } else if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
          const std::string_view before = RstripNewlines(content.substr(0, close));
          const size_t open = before.rfind("<think>");
          reasoning = LstripNewlines(open == std::string_view::npos ? before : before.substr(open + 7));
          content = LstripNewlines(content.substr(content.rfind("</think>") + 8));
        }
        out.add("<|im_start|>assistant\n");
        std::string body;
        if (i > last_query && (last || !reasoning.empty())) {
          body = "<think>\n";
          body += StripNewlines(reasoning);
          body += "\n</think>\n\n";
          body += LstripNewlines(content);
        } else {
          body = content;
        }
        out.add(body + "<|im_end|>", Trained(m));
        out.add("\n");
      } else if (m.role == "tool") {  // consecutive results share one user turn
        if (i == 0 || messages[i - 1].role != "tool") out.add("<|im_start|>user");
        const bool closes = last || messages[i + 1].role != "tool";
        out.add("\n<tool_response>\n" + m.content + "\n</tool_response>" + (closes ? "<|im_end|>" : ""),
                Trained(m));
        if (closes) out.add("\n");
      }
    }
    if (options.add_generation_prompt) {
      out.add("<|im_start|>assistant\n");
      if (!options.enable_thinking) out.add("<think>\n\n</think>\n\n");
    }
  }
};

// --- llama3 ----------------------------------------------------------------------------------

class Llama3Format : public ChatFormat {
 public:
  explicit Llama3Format(std::string bos_token) : bos_token_(std::move(bos_token)) {}
  std::string_view name() const override { return "llama3"; }

 protected:
  void render_into(std::span<const ChatMessage> messages, const ChatOptions& options,
                   Builder& out) const override {
    out.add(bos_token_);
    for (const ChatMessage& m : messages) {
      out.add("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
      out.add(std::string(PyStrip(m.content)) + "<|eot_id|>", Trained(m));
    }
    // The template ends with the assistant header unconditionally.
    out.add("<|start_header_id|>assistant<|end_header_id|>\n\n");
  }

 private:
  std::string bos_token_;
};

class Llama31Format : public ChatFormat {
 public:
  Llama31Format(std::string bos_token, bool today_by_default)
      : bos_token_(std::move(bos_token)), today_by_default_(today_by_default) {}
  std::string_view name() const override { return today_by_default_ ? "llama3.2" : "llama3.1"; }

 protected:
  void render_into(std::span<const ChatMessage> messages, const ChatOptions& options,
                   Builder& out) const override {
    const std::string date = !options.date_string.empty() ? options.date_string
                             : today_by_default_          ? Today()
                                                          : "26 Jul 2024";
    out.add(bos_token_);
    const bool has_system = messages[0].role == "system";
    out.add("<|start_header_id|>system<|end_header_id|>\n\n");
    out.add("Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n" +
                (has_system ? std::string(PyStrip(messages[0].content)) : std::string()) + "<|eot_id|>",
            has_system && Trained(messages[0]));
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "tool") {
        // A string is iterable, so the template writes it with tojson.
        out.add("<|start_header_id|>ipython<|end_header_id|>\n\n");
        out.add(JsonString(m.content) + "<|eot_id|>", Trained(m));
      } else {
        out.add("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
        out.add(std::string(PyStrip(m.content)) + "<|eot_id|>", Trained(m));
      }
    }
    if (options.add_generation_prompt) out.add("<|start_header_id|>assistant<|end_header_id|>\n\n");
  }

 private:
  std::string bos_token_;
  bool today_by_default_;
};

// --- gemma -----------------------------------------------------------------------------------

class GemmaFormat : public ChatFormat {
 public:
  explicit GemmaFormat(std::string bos_token) : bos_token_(std::move(bos_token)) {}
  std::string_view name() const override { return "gemma"; }

 protected:
  void render_into(std::span<const ChatMessage> messages, const ChatOptions& options,
                   Builder& out) const override {
    out.add(bos_token_);
    // A leading system turn is folded into the first turn, before its content, untrimmed.
    const bool has_system = messages[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      // The template raises unless turns alternate user, other, user, ... from the first one.
      if ((m.role == "user") != ((i - first) % 2 == 0)) {
        throw InvalidArgument("messages[" + std::to_string(i) + "].role '" + m.role +
                              "': the gemma format needs the turns after an optional system "
                              "turn to alternate user, assistant, user, ... starting with user");
      }
      out.add("<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n");
      if (i == first && has_system) {
        out.add(messages[0].content + "\n\n", Trained(messages[0]));
      }
      out.add(std::string(PyStrip(m.content)) + "<end_of_turn>", Trained(m));
      out.add("\n");
    }
    if (options.add_generation_prompt) out.add("<start_of_turn>model\n");
  }

 private:
  std::string bos_token_;
};

// --- chatml ----------------------------------------------------------------------------------

class ChatMlFormat : public ChatFormat {
 public:
  std::string_view name() const override { return "chatml"; }

 protected:
  void render_into(std::span<const ChatMessage> messages, const ChatOptions& options,
                   Builder& out) const override {
    for (const ChatMessage& m : messages) {
      out.add("<|im_start|>" + m.role + "\n");
      out.add(m.content + "<|im_end|>", Trained(m));
      out.add("\n");
    }
    if (options.add_generation_prompt) out.add("<|im_start|>assistant\n");
  }
};

std::string WithoutWhitespace(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  }
  return out;
}

}  // namespace

RenderedText ChatFormat::render_text(std::span<const ChatMessage> messages,
                                     const ChatOptions& options) const {
  if (messages.empty()) throw InvalidArgument("messages is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    PollInterrupt(static_cast<int64_t>(m.content.size()) + 64);
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles)) {
      throw InvalidArgument(where + ".role '" + m.role + "' is not one of system, user, assistant, tool");
    }
    if (const size_t bad = text::FindInvalidUtf8(m.content); bad != std::string::npos) {
      throw InvalidArgument(where + ".content is not valid UTF-8 at byte " + std::to_string(bad));
    }
    if (m.reasoning_content) {
      if (!reads_reasoning()) {
        throw InvalidArgument(where + ".reasoning_content: the " + std::string(name()) +
                              " format has no place for it");
      }
      if (m.role != "assistant")
        throw InvalidArgument(where + ".reasoning_content is only for assistant turns");
      if (const size_t bad = text::FindInvalidUtf8(*m.reasoning_content); bad != std::string::npos) {
        throw InvalidArgument(where + ".reasoning_content is not valid UTF-8 at byte " + std::to_string(bad));
      }
    }
  }
  if (const size_t bad = text::FindInvalidUtf8(options.date_string); bad != std::string::npos) {
    throw InvalidArgument("date_string is not valid UTF-8 at byte " + std::to_string(bad));
  }
  Builder builder;
  render_into(messages, options, builder);
  return builder.take();
}

RenderedChat ChatFormat::render(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                const ChatOptions& options) const {
  RenderedText rendered = render_text(messages, options);
  Encoding encoding = tokenizer.encode_with_offsets(rendered.text);
  RenderedChat chat;
  chat.loss_mask.assign(encoding.ids.size(), 0);
  // Token i covers [offsets[i], offsets[i + 1]) (at least its first byte where NFC mapped
  // several tokens to one offset); it is trained when that meets a span.
  const auto& spans = rendered.train_spans;
  size_t span = 0;
  for (size_t i = 0; i < encoding.ids.size(); ++i) {
    const size_t begin = encoding.offsets[i];
    const size_t next = i + 1 < encoding.ids.size() ? encoding.offsets[i + 1] : rendered.text.size();
    const size_t end = std::max(next, begin + 1);
    while (span < spans.size() && spans[span].second <= begin) ++span;
    if (span < spans.size() && spans[span].first < end) chat.loss_mask[i] = 1;
  }
  chat.text = std::move(rendered.text);
  chat.train_spans = std::move(rendered.train_spans);
  chat.ids = std::move(encoding.ids);
  return chat;
}

std::unique_ptr<ChatFormat> ChatFormat::Create(std::string_view name, std::string_view bos_token) {
  auto bos = [&](std::string_view fallback) { return std::string(bos_token.empty() ? fallback : bos_token); };
  if (name == "qwen3") return std::make_unique<Qwen3Format>();
  if (name == "llama3") return std::make_unique<Llama3Format>(bos("<|begin_of_text|>"));
  if (name == "llama3.1") return std::make_unique<Llama31Format>(bos("<|begin_of_text|>"), false);
  if (name == "llama3.2") return std::make_unique<Llama31Format>(bos("<|begin_of_text|>"), true);
  if (name == "gemma") return std::make_unique<GemmaFormat>(bos("<bos>"));
  if (name == "chatml") return std::make_unique<ChatMlFormat>();
  std::string known;
  for (const auto& n : Names()) known += (known.empty() ? "" : ", ") + n;
  throw InvalidArgument("chat format '" + std::string(name) + "' is not one of " + known);
}

std::unique_ptr<ChatFormat> ChatFormat::ForTokenizer(const Tokenizer& tokenizer, std::string_view name) {
  std::string chosen(name);
  if (chosen.empty()) {
    if (tokenizer.chat_template().empty()) {
      throw FailedPrecondition(
          "the tokenizer has no chat_template: name the chat format (one of qwen3, llama3, "
          "llama3.1, llama3.2, gemma, chatml)");
    }
    chosen = InferName(tokenizer.chat_template());
    if (chosen.empty()) {
      throw FailedPrecondition(
          "the tokenizer's chat_template is not one this server renders: name the chat "
          "format (one of qwen3, llama3, llama3.1, llama3.2, gemma, chatml)");
    }
  }
  return Create(chosen, tokenizer.bos_token());
}

std::string ChatFormat::InferName(std::string_view chat_template) {
  auto has = [&](std::string_view marker) { return chat_template.find(marker) != std::string_view::npos; };
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    if (!has("Cutting Knowledge Date")) return "llama3";
    return has("strftime_now") ? "llama3.2" : "llama3.1";
  }
  if (has("<|im_start|>") && has("<think>") && has("</think>") && has("last_query_index")) return "qwen3";
  // Gemma 3's (Gemma 2's refuses a system turn; its template has no first_user_prefix).
  if (has("<start_of_turn>") && has("<end_of_turn>") && has("first_user_prefix")) return "gemma";
  // ChatML only as its common template has it: anything more (a default system prompt, say)
  // would render differently.
  static const std::string kChatMl[] = {
      WithoutWhitespace(
          "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
      WithoutWhitespace(
          "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
          "{% endif %}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
  };
  const std::string compact = WithoutWhitespace(chat_template);
  for (const auto& known : kChatMl) {
    if (compact == known) return "chatml";
  }
  return "";
}

std::vector<std::string> ChatFormat::Names() {
  return {"qwen3", "llama3", "llama3.1", "llama3.2", "gemma", "chatml"};
}

}  // namespace streambp
