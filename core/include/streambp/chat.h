#pragma once
/// Chat formats (docs/architecture.md: Models "Text"): explicit renderers per model family that turn a
/// conversation into the text the model's own `chat_template` renders (under transformers'
/// `apply_chat_template`), its token ids, and a loss mask selecting the assistant turns.
///
/// Formats:
///   qwen3     Qwen3's template: <|im_start|>role\n...<|im_end|>\n; a leading system turn;
///             tool results grouped into one user turn of <tool_response> blocks; assistant
///             turns after the last user query carry their <think>...</think> block (the final
///             one always, an empty one if it had none), earlier ones lose it;
///             `enable_thinking = false` adds an empty think block to the generation prompt.
///   llama3    Meta-Llama-3-*-Instruct's template: <|begin_of_text|> then
///             <|start_header_id|>role<|end_header_id|>\n\n + trimmed content + <|eot_id|>
///             per turn; that template always ends with the assistant header, whatever
///             add_generation_prompt says, and so does this renderer.
///   llama3.1  Llama 3.1 / 3.3: as llama3, but always a system turn first, with
///             "Cutting Knowledge Date: December 2023" and "Today Date: <date_string>"
///             (default "26 Jul 2024", the template's own), tool turns as "ipython" with their
///             content written as a JSON string, and the assistant header only when
///             add_generation_prompt.
///   llama3.2  Llama 3.2: as llama3.1, but the default date is today's ("%d %b %Y", local time),
///             as the template's strftime_now gives it.
///   gemma     Gemma 3's template: <bos>, then <start_of_turn>role\n + trimmed content +
///             <end_of_turn>\n per turn, the assistant's role written "model"; a leading
///             system turn's content (untrimmed) + "\n\n" opens the first turn's body; the
///             turns after it must alternate user, assistant, ... from user (the template
///             raises otherwise: InvalidArgument here); generation prompt <start_of_turn>model\n.
///   chatml    <|im_start|>role\n + content + <|im_end|>\n per turn, nothing else.
///
/// Loss mask: a token is in the mask when any of its bytes lies in a trained turn's body: what
/// the template writes for the turn after its role header, through the turn's end token
/// (<|im_end|>, <|eot_id|>, <end_of_turn>) — not the header, not the newline after the end token. That is the
/// completion as TRL's assistant-only masks take it (transformers' assistant_masks take the
/// tokens from the one holding a span's first character to the one holding its last, so a
/// token that straddles the header and the body, "\n\n" before a body starting with "\n", is
/// in); for qwen3 it includes the turn's rendered <think> block. By default the assistant
/// turns are trained and nothing else; a message's `train` overrides that (e.g. train only
/// the completion turns of a prompt/completion pair).
/// The generation prompt is never in the mask.
///
/// Content is used as given: special-token text inside it is read as those tokens, as
/// transformers does.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "streambp/tokenizer.h"

namespace streambp {

/// One turn of a conversation.
struct ChatMessage {
  std::string role;     ///< system | user | assistant | tool
  std::string content;  ///< UTF-8
  /// qwen3 only, assistant turns only: the thinking, given apart from the content (HF's
  /// `reasoning_content`); otherwise it is taken from a <think>...</think> in the content.
  std::optional<std::string> reasoning_content;
  /// Whether the turn's body is in the loss mask; default: assistant turns only.
  std::optional<bool> train;
};

struct ChatOptions {
  /// Ends the text with the header the model's reply follows (what sampling starts from).
  bool add_generation_prompt = false;
  /// qwen3: false adds an empty <think></think> block to the generation prompt.
  bool enable_thinking = true;
  /// llama3.1 / llama3.2: the "Today Date" line; empty: the format's default.
  std::string date_string;
};

/// A conversation as text, with the byte ranges of the text whose tokens are trained.
struct RenderedText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> train_spans;  ///< [begin, end) byte ranges, in order
};

/// A conversation as token ids with its loss mask.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> train_spans;
  std::vector<int64_t> ids;        ///< the tokenizer's encode(text), no special tokens added
  std::vector<uint8_t> loss_mask;  ///< one per id: 1 = in the loss
};

/// A renderer. Immutable; thread-safe.
class ChatFormat {
 public:
  virtual ~ChatFormat() = default;

  /// qwen3 | llama3 | llama3.1 | llama3.2 | gemma | chatml
  virtual std::string_view name() const = 0;

  /// Renders `messages`. InvalidArgument naming the field for: no messages, a role that is not
  /// system / user / assistant / tool ("messages[2].role 'bot' is not one of system, user,
  /// assistant, tool"), content or reasoning_content that is not UTF-8 ("messages[1].content is
  /// not valid UTF-8 at byte 5"), reasoning_content where the format has no use for it.
  RenderedText render_text(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;

  /// render_text(), then `tokenizer.encode(text)` (as apply_chat_template(tokenize=True)) and
  /// the loss mask.
  RenderedChat render(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                      const ChatOptions& options = {}) const;

  /// The format called `name`; `bos_token` is what llama and gemma formats begin with (empty:
  /// the family's own, <|begin_of_text|> / <bos>).
  /// InvalidArgument for an unknown name, listing the known ones.
  static std::unique_ptr<ChatFormat> Create(std::string_view name, std::string_view bos_token = "");

  /// The format of a model folder's tokenizer: `name` when given, otherwise the one its
  /// chat_template is recognized as (InferName). FailedPrecondition when the tokenizer has no
  /// chat template or one that is not recognized, saying to name the format.
  static std::unique_ptr<ChatFormat> ForTokenizer(const Tokenizer& tokenizer, std::string_view name = "");

  /// The format a chat template is (by its markers), or "" when none is recognized.
  static std::string InferName(std::string_view chat_template);

  /// All format names.
  static std::vector<std::string> Names();

 protected:
  class Builder;
  /// Renders validated messages into `out`.
  virtual void render_into(std::span<const ChatMessage> messages, const ChatOptions& options,
                           Builder& out) const = 0;
  /// Whether the format reads reasoning_content (qwen3).
  virtual bool reads_reasoning() const { return false; }
};

}  // namespace streambp
