#pragma once
/// The model folder's tokenizer and chat format as the server uses them (docs/architecture.md: Models "Text"):
/// text and conversations in requests become ids here, with errors that name the request's
/// field. Immutable after creation; shared by the gRPC threads.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace streambp {
class Tokenizer;
class ChatFormat;
struct ChatMessage;
}  // namespace streambp

namespace streambp::server {

/// What GetInfo says about the tokenizer.
struct TokenizerReport {
  bool available = false;
  std::string type;         ///< "BPE (byte-level)", "BPE (characters, byte fallback)"
  int64_t vocab_size = 0;
  std::string chat_format;  ///< "" = none recognized (messages are refused)
  std::string bos_token, eos_token;
  std::string unavailable;  ///< why there is none (FAILED_PRECONDITION text)
};

/// A conversation as ids.
struct RenderedIds {
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss_mask;
  std::string text;
};

class TextCodec {
 public:
  /// The tokenizer of model folder `dir` (tokenizer.json, tokenizer_config.json, ...) and its
  /// chat format (`chat_format`, or the one its chat_template is recognized as). Returns null
  /// and sets *why when there is none or it cannot be used (unsupported tokenizer, more tokens
  /// than the model's vocabulary): the server then answers text with FAILED_PRECONDITION.
  static std::shared_ptr<const TextCodec> FromDir(const std::string& dir, const std::string& chat_format,
                                                  int64_t model_vocab_size, std::string* why);
  ~TextCodec();

  /// encode() of the tokenizer; InvalidArgument "<field>: ..." (invalid UTF-8).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens, const std::string& field) const;
  /// The conversation rendered by the chat format; InvalidArgument "<field>[i].role ...";
  /// FailedPrecondition when the model has no recognized chat format.
  RenderedIds render(std::span<const ChatMessage> messages, bool add_generation_prompt, bool enable_thinking,
                     const std::string& field) const;
  std::string decode(std::span<const int64_t> ids, bool skip_special_tokens) const;
  /// The bytes token `id` adds to a decoded text at most (0 for an id that names no token).
  int64_t token_bytes(int64_t id) const;
  /// The tokenizer's end-of-sequence token (appended to plain-text training examples), or -1.
  int64_t eos_token_id() const { return eos_id_; }
  TokenizerReport report() const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  TextCodec() = default;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatFormat> chat_;
  std::string chat_unavailable_;
  int64_t eos_id_ = -1;
};

}  // namespace streambp::server
