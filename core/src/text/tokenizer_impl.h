#pragma once
// The tokenizer's state (private to src/text): the BPE model, added tokens, normalizer,
// pre-tokenizer splitters, post-processor ids and the tables by id. tokenizer_load.cpp
// fills it from the Hugging Face files; tokenizer.cpp encodes and decodes with it.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "added_tokens.h"
#include "bpe.h"
#include "regex_split.h"
#include "streambp/tokenizer.h"
#include "unicode.h"

namespace streambp {

struct Tokenizer::Impl {
  std::unique_ptr<text::BpeModel> model;
  std::vector<text::AddedToken> added;
  std::unique_ptr<text::AddedTokenMatcher> raw_matcher;         // added tokens matched in the raw text
  std::unique_ptr<text::AddedTokenMatcher> normalized_matcher;  // ... and in the normalized text
  /// A normalizer step: NFC, or Replace of a string (`from` -> `to`). Applied in order.
  struct NormalizerStep {
    bool nfc = false;
    std::string from, to;
  };
  std::vector<NormalizerStep> normalizers;
  std::vector<std::unique_ptr<text::RegexSplitter>> splitters;  // applied in order
  bool byte_level = false;                                      // a ByteLevel pre-tokenizer
  std::vector<int64_t> prefix_ids, suffix_ids;                  // post-processor template
  /// kNone: tokens joined with spaces (HF without a decoder); kByteLevel: the byte alphabet;
  /// kPieces: each token's spelling with `decoder_replace` applied, `<0xNN>` tokens as bytes
  /// when `decoder_byte_fallback` (Replace..., ByteFallback, Fuse: Gemma).
  enum class Decoder { kNone, kByteLevel, kPieces };
  Decoder decoder = Decoder::kNone;
  std::vector<std::pair<std::string, std::string>> decoder_replace;
  bool decoder_byte_fallback = false;
  std::vector<int16_t> fallback_byte;  // by id, kPieces: the byte a `<0xNN>` token stands for, or -1

  // By id: spelling, raw bytes, whether it exists and is special.
  std::vector<std::string> tokens;
  std::vector<std::string> bytes;
  std::vector<uint8_t> exists, special;
  std::unordered_map<std::string, int32_t, text::StringHash, std::equal_to<>> added_ids;

  std::string chat_template, bos_token, eos_token, pad_token, unk_token;
  bool split_special_tokens = false;

  void parse_normalizer(const nlohmann::json& j, const std::string& where);
  void parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);
  void parse_post_processor(const nlohmann::json& j, const std::string& where);
  void parse_decoder(const nlohmann::json& j, const std::string& where, bool& fused);
  void parse_model(const nlohmann::json& j);
  void parse_added_tokens(const nlohmann::json& j);
  void parse_config(const nlohmann::json& config, const nlohmann::json& special_map);
  void build_tables();

  void encode(std::string_view text, bool add_special_tokens, std::vector<int64_t>& ids,
              std::vector<size_t>* offsets) const;
  void encode_segment(std::string_view segment, size_t segment_offset, std::vector<int64_t>& ids,
                      std::vector<size_t>* offsets) const;
  /// `maps`: what each normalizer step that changed the segment did, in order.
  void encode_normalized(std::string_view text, size_t text_offset, std::span<const text::OffsetMap> maps,
                         size_t segment_offset, std::vector<int64_t>& ids,
                         std::vector<size_t>* offsets) const;
  void decode_pieces(std::span<const int64_t> ids, bool skip_special_tokens, std::string& out) const;
  template <class F>
  void split_pieces(std::string_view text, size_t level, size_t base, F&& piece) const;
};

}  // namespace streambp
