#include "text_codec.h"

#include <filesystem>

#include "streambp/chat.h"
#include "streambp/error.h"
#include "streambp/tokenizer.h"

namespace streambp::server {

TextCodec::~TextCodec() = default;

std::shared_ptr<const TextCodec> TextCodec::FromDir(const std::string& dir, const std::string& chat_format,
                                                    int64_t model_vocab_size, std::string* why) {
  namespace fs = std::filesystem;
  if (dir.empty()) {
    *why = "the model is an embedded preset without a tokenizer: send token ids, or serve a model folder with a "
           "tokenizer.json (streambp-server init-model --tokenizer DIR writes one)";
    return nullptr;
  }
  if (!fs::is_regular_file(fs::path(dir) / "tokenizer.json")) {
    *why = "the model folder " + dir + " has no tokenizer.json: send token ids, or add the model's tokenizer files";
    return nullptr;
  }
  std::shared_ptr<TextCodec> codec(new TextCodec());
  try {
    codec->tokenizer_ = Tokenizer::FromDir(dir);
  } catch (const Error& e) {
    *why = "the model folder's tokenizer cannot be used: " + std::string(e.what());
    return nullptr;
  }
  if (codec->tokenizer_->vocab_size() > model_vocab_size) {
    *why = "the tokenizer in " + dir + " has " + std::to_string(codec->tokenizer_->vocab_size()) +
           " tokens but the model's vocabulary has " + std::to_string(model_vocab_size) +
           ": it is not this model's tokenizer";
    return nullptr;
  }
  try {
    codec->chat_ = ChatFormat::ForTokenizer(*codec->tokenizer_, chat_format);
  } catch (const FailedPrecondition& e) {
    codec->chat_unavailable_ = e.what();
  }
  const auto eos = codec->tokenizer_->eos_token_ids();
  codec->eos_id_ = eos.empty() ? -1 : eos.front();
  return codec;
}

std::vector<int64_t> TextCodec::encode(std::string_view text, bool add_special_tokens, const std::string& field) const {
  try {
    return tokenizer_->encode(text, add_special_tokens);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(field + ": " + e.what());
  }
}

RenderedIds TextCodec::render(std::span<const ChatMessage> messages, bool add_generation_prompt, bool enable_thinking,
                              const std::string& field) const {
  if (!chat_) throw FailedPrecondition(field + ": messages need a chat format, and " + chat_unavailable_);
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.enable_thinking = enable_thinking;
  RenderedChat r;
  try {
    r = chat_->render(*tokenizer_, messages, options);
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    // The renderer names "messages[2].role ...": the request's field comes first.
    throw InvalidArgument(field + (what.rfind("messages", 0) == 0 ? what.substr(8) : ": " + what));
  }
  return RenderedIds{std::move(r.ids), std::move(r.loss_mask), std::move(r.text)};
}

std::string TextCodec::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  return tokenizer_->decode(ids, skip_special_tokens);
}

int64_t TextCodec::token_bytes(int64_t id) const {
  if (id < 0 || id >= tokenizer_->vocab_size()) return 0;
  try {
    return static_cast<int64_t>(tokenizer_->token_bytes(id).size());
  } catch (const InvalidArgument&) {
    return 0;  // a gap in the vocabulary: decode skips it
  }
}

TokenizerReport TextCodec::report() const {
  TokenizerReport r;
  r.available = true;
  r.type = tokenizer_->kind();
  r.vocab_size = tokenizer_->vocab_size();
  r.chat_format = chat_ ? std::string(chat_->name()) : "";
  r.bos_token = tokenizer_->bos_token();
  r.eos_token = tokenizer_->eos_token();
  return r;
}

}  // namespace streambp::server
