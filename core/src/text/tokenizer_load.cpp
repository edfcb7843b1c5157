// Reading a tokenizer from the Hugging Face files: tokenizer.json (model, normalizer,
// pre-tokenizer, post-processor, decoder, added tokens), tokenizer_config.json and
// special_tokens_map.json; every unsupported part is refused by name.
#include "tokenizer_impl.h"

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "added_tokens.h"
#include "bpe.h"
#include "byte_level.h"
#include "regex_split.h"
#include "streambp/error.h"
#include "unicode.h"

namespace streambp {

using nlohmann::json;
using text::AddedToken;
using text::AddedTokenMatcher;
using text::BpeModel;
using text::RegexSplitter;

namespace {

// GPT-2's split regex: what ByteLevel(use_regex = true) splits with.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string TypeOf(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool BoolField(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw InvalidArgument(where + "." + key + " must be true or false");
  return j[key].get<bool>();
}

// A special token named in tokenizer_config.json / special_tokens_map.json: a string, an
// AddedToken object ({"content": ...}) or null.
std::string TokenName(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound("cannot read " + path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json ParseJson(const std::string& contents, const std::string& name) {
  try {
    return json::parse(contents);
  } catch (const json::parse_error& e) {
    throw InvalidArgument(name + " is not valid JSON: " + e.what());
  }
}

}  // namespace

void Tokenizer::Impl::parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j);
  if (type == "NFC") {
    normalizers.push_back({true, "", ""});
  } else if (type == "Replace") {
    const json& pattern = j.contains("pattern") ? j["pattern"] : json();
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string()) {
      throw InvalidArgument(where + ": Replace with a pattern other than {\"String\": ...} is not supported");
    }
    if (!j.contains("content") || !j["content"].is_string())
      throw InvalidArgument(where + ".content must be a string");
    NormalizerStep step{false, pattern["String"].get<std::string>(), j["content"].get<std::string>()};
    if (step.from.empty()) throw InvalidArgument(where + ".pattern.String must not be empty");
    if (text::FindInvalidUtf8(step.from) != std::string::npos || text::FindInvalidUtf8(step.to) != std::string::npos)
      throw InvalidArgument(where + ": pattern and content must be UTF-8");
    normalizers.push_back(std::move(step));
  } else if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      throw InvalidArgument(where + ".normalizers must be a list");
    }
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      parse_normalizer(j["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]");
    }
  } else {
    throw InvalidArgument(where + ": normalizer '" + (type.empty() ? j.dump() : type) +
                          "' is not supported (supported: NFC, Replace, Sequence, null)");
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      throw InvalidArgument(where + ".pretokenizers must be a list");
    }
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i) {
      parse_pre_tokenizer(j["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]");
    }
  } else if (type == "Split") {
    if (byte_level) throw InvalidArgument(where + ": a Split after ByteLevel is not supported");
    const std::string behavior = j.value("behavior", "");
    if (behavior != "Isolated" && behavior != "MergedWithPrevious") {
      throw InvalidArgument(where + ": Split behavior '" + behavior +
                            "' is not supported (supported: Isolated, MergedWithPrevious)");
    }
    if (BoolField(j, "invert", false, where))
      throw InvalidArgument(where + ": Split with invert true is not supported");
    const json& pattern = j.contains("pattern") ? j["pattern"] : json();
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      splitters.push_back(
          RegexSplitter::Compile(pattern["Regex"].get<std::string>(), where + ".pattern.Regex"));
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      splitters.push_back(
          RegexSplitter::Literal(pattern["String"].get<std::string>(), where + ".pattern.String"));
    } else {
      throw InvalidArgument(where + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (behavior == "MergedWithPrevious") splitters.back()->set_behavior(text::SplitBehavior::kMergedWithPrevious);
  } else if (type == "ByteLevel") {
    if (BoolField(j, "add_prefix_space", true, where)) {
      throw InvalidArgument(where + ": ByteLevel with add_prefix_space true is not supported");
    }
    if (BoolField(j, "use_regex", true, where))
      splitters.push_back(RegexSplitter::Compile(kGpt2Pattern, where));
    byte_level = true;
  } else {
    throw InvalidArgument(where + ": pre-tokenizer '" + (type.empty() ? j.dump() : type) +
                          "' is not supported (supported: ByteLevel, Split, Sequence)");
  }
}

void Tokenizer::Impl::parse_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      throw InvalidArgument(where + ".processors must be a list");
    }
    for (size_t i = 0; i < j["processors"].size(); ++i) {
      parse_post_processor(j["processors"][i], where + ".processors[" + std::to_string(i) + "]");
    }
    return;
  }
  if (type != "TemplateProcessing") {
    throw InvalidArgument(where + ": post-processor '" + (type.empty() ? j.dump() : type) +
                          "' is not supported (supported: ByteLevel, TemplateProcessing, Sequence, null)");
  }
  if (!prefix_ids.empty() || !suffix_ids.empty())
    throw InvalidArgument(where + ": a second TemplateProcessing");
  if (!j.contains("single") || !j["single"].is_array())
    throw InvalidArgument(where + ".single must be a list");
  const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
  bool seen_sequence = false;
  for (size_t i = 0; i < j["single"].size(); ++i) {
    const json& item = j["single"][i];
    const std::string item_where = where + ".single[" + std::to_string(i) + "]";
    if (item.contains("Sequence")) {
      if (seen_sequence || item["Sequence"].value("id", "") != "A") {
        throw InvalidArgument(item_where + ": only one sequence, A, is supported");
      }
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", "");
      if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
        throw InvalidArgument(item_where + ": special token '" + name + "' is not in " + where +
                              ".special_tokens");
      }
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer())
          throw InvalidArgument(where + ".special_tokens['" + name + "'].ids must be integers");
        (seen_sequence ? suffix_ids : prefix_ids).push_back(id.get<int64_t>());
      }
    } else {
      throw InvalidArgument(item_where + " must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_sequence) throw InvalidArgument(where + ".single has no sequence A");
}

// Decoders: ByteLevel alone, or Replace (string) steps, then ByteFallback, then Fuse, each
// optional, in that order (what Gemma's and SentencePiece-converted files have). `fused`: a
// Fuse has been read, after which nothing but another Fuse may come.
void Tokenizer::Impl::parse_decoder(const json& j, const std::string& where, bool& fused) {
  if (j.is_null()) return;
  const std::string type = TypeOf(j);
  auto piecewise = [&] {
    if (decoder == Decoder::kByteLevel)
      throw InvalidArgument(where + ": a " + type + " decoder with ByteLevel is not supported");
    decoder = Decoder::kPieces;
  };
  if (type == "ByteLevel") {
    if (decoder == Decoder::kPieces)
      throw InvalidArgument(where + ": ByteLevel with other decoders is not supported");
    decoder = Decoder::kByteLevel;
  } else if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array()) {
    for (size_t i = 0; i < j["decoders"].size(); ++i) {
      parse_decoder(j["decoders"][i], where + ".decoders[" + std::to_string(i) + "]", fused);
    }
  } else if (type == "Replace") {
    piecewise();
    if (decoder_byte_fallback || fused)
      throw InvalidArgument(where + ": a Replace decoder after ByteFallback or Fuse is not supported");
    const json& pattern = j.contains("pattern") ? j["pattern"] : json();
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        pattern["String"].get<std::string>().empty() || !j.contains("content") || !j["content"].is_string()) {
      throw InvalidArgument(where + ": only a Replace of a non-empty {\"String\": ...} by a string content is supported");
    }
    decoder_replace.emplace_back(pattern["String"].get<std::string>(), j["content"].get<std::string>());
  } else if (type == "ByteFallback") {
    piecewise();
    if (fused) throw InvalidArgument(where + ": ByteFallback after Fuse is not supported");
    decoder_byte_fallback = true;
  } else if (type == "Fuse") {
    piecewise();
    fused = true;  // pieces are joined without separators anyway
  } else {
    throw InvalidArgument(where + ": decoder '" + (type.empty() ? j.dump() : type) +
                          "' is not supported (supported: ByteLevel; or Replace, ByteFallback, Fuse; "
                          "Sequence, null)");
  }
}

void Tokenizer::Impl::parse_model(const json& j) {
  const std::string where = "tokenizer.json: model";
  if (!j.is_object()) throw InvalidArgument(where + " is missing");
  std::string type = TypeOf(j);
  if (type.empty() && j.contains("merges")) type = "BPE";
  if (type != "BPE") {
    throw InvalidArgument(where + ": model type '" + (type.empty() ? "(none)" : type) +
                          "' is not supported (supported: BPE)");
  }
  if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() != 0.0) {
    throw InvalidArgument(where + ".dropout is not supported");
  }
  const bool byte_fallback = BoolField(j, "byte_fallback", false, where);
  if (byte_fallback && byte_level)
    throw InvalidArgument(where + ".byte_fallback true with a ByteLevel pre-tokenizer is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_string() && j[key].get<std::string>().empty())) {
      throw InvalidArgument(where + "." + key + " is not supported");
    }
  }
  if (!j.contains("vocab") || !j["vocab"].is_object())
    throw InvalidArgument(where + ".vocab must be an object");
  text::Vocab vocab;
  vocab.reserve(j["vocab"].size());
  for (const auto& [token, id] : j["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw InvalidArgument(where + ".vocab['" + token + "'] must be a non-negative integer id");
    }
    vocab.emplace(token, static_cast<int32_t>(id.get<int64_t>()));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const json& merge_list = j.contains("merges") ? j["merges"] : json::array();
  if (!merge_list.is_array()) throw InvalidArgument(where + ".merges must be a list");
  merges.reserve(merge_list.size());
  for (size_t i = 0; i < merge_list.size(); ++i) {
    const json& m = merge_list[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        throw InvalidArgument(where + ".merges[" + std::to_string(i) + "] '" + s + "' is not two tokens");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      throw InvalidArgument(where + ".merges[" + std::to_string(i) + "] must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  text::BpeOptions options;
  options.ignore_merges = BoolField(j, "ignore_merges", false, where);
  options.byte_level = byte_level;
  options.byte_fallback = byte_fallback;
  options.fuse_unk = BoolField(j, "fuse_unk", false, where);
  if (j.contains("unk_token") && j["unk_token"].is_string()) {
    auto it = vocab.find(j["unk_token"].get<std::string>());
    if (it == vocab.end()) throw InvalidArgument(where + ".unk_token is not in the vocabulary");
    options.unk_id = it->second;
  }
  model = std::make_unique<BpeModel>(std::move(vocab), merges, options);
}

void Tokenizer::Impl::parse_added_tokens(const json& j) {
  if (j.is_null()) return;
  const std::string where = "tokenizer.json: added_tokens";
  if (!j.is_array()) throw InvalidArgument(where + " must be a list");
  for (size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    const std::string item = where + "[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id") ||
        !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX) {
      throw InvalidArgument(item + " must have a string content and a non-negative integer id");
    }
    AddedToken token;
    token.content = t["content"].get<std::string>();
    if (text::FindInvalidUtf8(token.content) != std::string::npos || token.content.empty()) {
      throw InvalidArgument(item + ".content must be non-empty UTF-8");
    }
    token.id = static_cast<int32_t>(t["id"].get<int64_t>());
    token.special = BoolField(t, "special", false, item);
    token.single_word = BoolField(t, "single_word", false, item);
    token.lstrip = BoolField(t, "lstrip", false, item);
    token.rstrip = BoolField(t, "rstrip", false, item);
    token.normalized = BoolField(t, "normalized", !token.special, item);
    added.push_back(std::move(token));
  }
}

void Tokenizer::Impl::parse_config(const json& config, const json& special_map) {
  if (config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      // Several named templates: the one called "default" is the chat template.
      for (const json& named : t) {
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string()) {
          chat_template = named["template"].get<std::string>();
        }
      }
    }
  }
  auto name = [&](const char* key) {
    if (config.contains(key) && !config[key].is_null()) return TokenName(config[key]);
    if (special_map.contains(key)) return TokenName(special_map[key]);
    return std::string();
  };
  bos_token = name("bos_token");
  eos_token = name("eos_token");
  pad_token = name("pad_token");
  unk_token = name("unk_token");
  split_special_tokens = BoolField(config, "split_special_tokens", false, "tokenizer_config.json");
}

void Tokenizer::Impl::build_tables() {
  int64_t size = 0;
  for (const auto& [token, id] : model->vocab()) size = std::max<int64_t>(size, int64_t{id} + 1);
  for (const AddedToken& t : added) size = std::max<int64_t>(size, int64_t{t.id} + 1);
  tokens.assign(size, std::string());
  bytes.assign(size, std::string());
  exists.assign(size, 0);
  special.assign(size, 0);
  fallback_byte.assign(size, -1);
  // What a token stands for when decoded. ByteLevel (and no decoder, for token_bytes): a token
  // whose characters are all in the byte alphabet stands for those bytes, any other (an added
  // token with a space, say) for its own UTF-8. Pieces: the spelling with the decoder's
  // replacements, or the byte of a `<0xNN>` token (HF's ByteFallback: 6 characters, hex digits).
  auto decoded = [&](std::string_view token, int32_t id) {
    if (decoder == Decoder::kPieces) {
      std::string out(token);
      for (const auto& [from, to] : decoder_replace) {
        std::string replaced;
        text::OffsetMap unused;
        if (text::AppendReplaced(out, from, to, replaced, unused)) out = std::move(replaced);
      }
      auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
      if (decoder_byte_fallback && out.size() == 6 && out.compare(0, 3, "<0x") == 0 && out[5] == '>' &&
          hex(out[3]) && hex(out[4])) {
        const int byte = std::stoi(out.substr(3, 2), nullptr, 16);
        fallback_byte[static_cast<size_t>(id)] = static_cast<int16_t>(byte);
        return std::string(1, static_cast<char>(byte));
      }
      return out;
    }
    std::string out;
    size_t i = 0;
    while (i < token.size()) {
      const int b = text::CharToByte(text::NextCodePoint(token, i));
      if (b < 0) return std::string(token);
      out += static_cast<char>(b);
    }
    return out;
  };
  for (const auto& [token, id] : model->vocab()) {
    tokens[id] = token;
    bytes[id] = decoded(token, id);
    exists[id] = 1;
  }
  for (const AddedToken& t : added) {
    tokens[t.id] = t.content;
    bytes[t.id] = decoded(t.content, t.id);
    exists[t.id] = 1;
    special[t.id] = t.special;
    added_ids.emplace(t.content, t.id);
  }
  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& t : added) {
    if (t.special && split_special_tokens) continue;
    // Without a normalizer there is no difference; match everything in the raw text.
    (t.normalized && !normalizers.empty() ? normalized : raw).push_back(&t);
  }
  raw_matcher = std::make_unique<AddedTokenMatcher>(raw);
  normalized_matcher = std::make_unique<AddedTokenMatcher>(normalized);
}

std::unique_ptr<Tokenizer> Tokenizer::FromJson(const std::string& tokenizer_json,
                                               const std::string& tokenizer_config_json,
                                               const std::string& special_tokens_map_json) {
  const json j = ParseJson(tokenizer_json, "tokenizer.json");
  if (!j.is_object()) throw InvalidArgument("tokenizer.json must be a JSON object");
  const json config = tokenizer_config_json.empty()
                          ? json::object()
                          : ParseJson(tokenizer_config_json, "tokenizer_config.json");
  const json special_map = special_tokens_map_json.empty()
                               ? json::object()
                               : ParseJson(special_tokens_map_json, "special_tokens_map.json");
  if (!config.is_object()) throw InvalidArgument("tokenizer_config.json must be a JSON object");
  if (!special_map.is_object()) throw InvalidArgument("special_tokens_map.json must be a JSON object");

  auto impl = std::make_unique<Impl>();
  static const json kNull;
  auto field = [&](const char* key) -> const json& { return j.contains(key) ? j[key] : kNull; };
  try {
    impl->parse_normalizer(field("normalizer"), "tokenizer.json: normalizer");
    impl->parse_pre_tokenizer(field("pre_tokenizer"), "tokenizer.json: pre_tokenizer");
    impl->parse_model(field("model"));
    impl->parse_post_processor(field("post_processor"), "tokenizer.json: post_processor");
    bool fused = false;
    impl->parse_decoder(field("decoder"), "tokenizer.json: decoder", fused);
    impl->parse_added_tokens(field("added_tokens"));
    impl->parse_config(config, special_map);
  } catch (const json::exception& e) {
    // A field of the wrong JSON type somewhere the checks above do not look.
    throw InvalidArgument(std::string("tokenizer files: unexpected JSON: ") + e.what());
  }
  impl->build_tables();
  for (const auto* ids : {&impl->prefix_ids, &impl->suffix_ids}) {
    for (int64_t id : *ids) {
      if (id < 0 || id >= static_cast<int64_t>(impl->exists.size()) || !impl->exists[id]) {
        throw InvalidArgument("tokenizer.json: post_processor names token id " + std::to_string(id) +
                              ", which does not exist");
      }
    }
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::unique_ptr<Tokenizer> Tokenizer::FromDir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const fs::path main = root / "tokenizer.json";
  if (!fs::exists(main)) throw NotFound(main.string() + " not found: the model folder has no tokenizer");
  auto optional_file = [&](const char* name) {
    const fs::path p = root / name;
    return fs::exists(p) ? ReadFile(p) : std::string();
  };
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = FromJson(ReadFile(main), optional_file("tokenizer_config.json"),
                         optional_file("special_tokens_map.json"));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(dir + ": " + e.what());
  }
  if (std::string jinja = optional_file("chat_template.jinja"); !jinja.empty()) {
    tokenizer->impl_->chat_template = std::move(jinja);
  }
  return tokenizer;
}

}  // namespace streambp
