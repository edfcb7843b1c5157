#pragma once
// The tokenizer's state (private to src/text): the BPE model, added tokens, normalizer,
// pre-tokenizer splitters, post-processor ids and the tables by id. tokenizer_load.cpp
// fills it from the Hugging Face files; tokenizer.cpp encodes and decodes with it.
#include <memory>
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
  bool nfc = false;
  std::vector<std::unique_ptr<text::RegexSplitter>> splitters;  // applied in order
  std::vector<int64_t> prefix_ids, suffix_ids;            // post-processor template
  bool byte_level_decoder = false;

  // By id: spelling, raw bytes, whether it exists and is special.
  std::vector<std::string> tokens;
  std::vector<std::string> bytes;
  std::vector<uint8_t> exists, special;
  std::unordered_map<std::string, int32_t, text::StringHash, std::equal_to<>> added_ids;

  std::string chat_template, bos_token, eos_token, pad_token, unk_token;
  bool split_special_tokens = false;

  void parse_normalizer(const nlohmann::json& j, const std::string& where);
  void parse_pre_tokenizer(const nlohmann::json& j, const std::string& where, bool& byte_level);
  void parse_post_processor(const nlohmann::json& j, const std::string& where);
  void parse_decoder(const nlohmann::json& j, const std::string& where);
  void parse_model(const nlohmann::json& j);
  void parse_added_tokens(const nlohmann::json& j);
  void parse_config(const nlohmann::json& config, const nlohmann::json& special_map);
  void build_tables();

  void encode(std::string_view text, bool add_special_tokens, std::vector<int64_t>& ids,
              std::vector<size_t>* offsets) const;
  void encode_segment(std::string_view segment, size_t segment_offset, std::vector<int64_t>& ids,
                      std::vector<size_t>* offsets) const;
  void encode_normalized(std::string_view text, size_t text_offset, const text::OffsetMap& map,
                         size_t segment_offset, std::vector<int64_t>& ids,
                         std::vector<size_t>* offsets) const;
  template <class F>
  void split_pieces(std::string_view text, size_t level, size_t base, F&& piece) const;
};

}  // namespace streambp
