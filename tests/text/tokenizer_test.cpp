// The tokenizer against the real Qwen3 and Llama 3 tokenizer files and an independent encoder
// (transformers.js, through @lenml/tokenizers in Node): ids for every corpus line, with and
// without special tokens, decode, and the errors the API promises.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "reference.h"
#include "streambp/error.h"
#include "streambp/tokenizer.h"

namespace streambp {
namespace {

using nlohmann::json;
using text_test::FromHex;
using text_test::ReadJsonLines;
using text_test::ReferenceDir;
using text_test::SourceDir;

std::string Show(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + (ids.size() > 40 ? ",...]" : "]");
}

std::string Excerpt(const std::string& text) {
  std::string s = json(text.substr(0, 80)).dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 80 ? s + "..." : s;
}

const Tokenizer& Load(const std::string& model) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[model];
  if (!slot) slot = Tokenizer::FromDir(ReferenceDir() + "/models/" + model);
  return *slot;
}

// Compares every corpus line with the reference's ids; reports each mismatch.
// `nfc`: the tokenizer normalizes; `round_trip`: decode(encode(x)) gives x back (not when added
// tokens strip the whitespace beside them); `space_marker`: what the tokenizer writes spaces as
// (Gemma's "▁"), which decode gives back as spaces wherever it was.
void CompareWithReference(const std::string& model, bool nfc, bool round_trip = true,
                          const std::string& space_marker = "") {
  STREAMBP_REQUIRE_REFERENCE();
  const Tokenizer& tokenizer = Load(model);
  const auto corpus = ReadJsonLines(SourceDir() + "/corpus.jsonl");
  const auto reference = ReadJsonLines(ReferenceDir() + "/ids/" + model + ".jsonl");
  ASSERT_EQ(corpus.size(), reference.size()) << "the reference is stale: rerun the fixture";
  size_t compared = 0, failures = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const json& entry = corpus[i];
    const json& ref = reference[i];
    const std::string where =
        model + " corpus line " + std::to_string(i + 1) + " (" + entry["kind"].get<std::string>() + ")";
    auto check = [&](bool ok, const std::string& what) {
      if (!ok && ++failures <= 20) ADD_FAILURE() << where << ": " << what;
    };
    if (entry["kind"] == "invalid") {
      const std::string bytes = FromHex(entry["hex"]);
      const std::string expected = "at byte " + std::to_string(entry["at"].get<int>());
      try {
        tokenizer.encode(bytes);
        check(false, "invalid UTF-8 was encoded");
      } catch (const InvalidArgument& e) {
        check(std::string(e.what()).find(expected) != std::string::npos,
              std::string("error '") + e.what() + "' does not say '" + expected + "'");
      }
      continue;
    }
    if (entry["kind"] == "decode") {
      const auto ids = ref["ids"].get<std::vector<int64_t>>();
      const std::string decoded = tokenizer.decode(ids);
      if (ref.contains("hf_decoded")) {
        // Byte-fallback tokens: HF's rule (one U+FFFD per byte of an ill-formed run), which
        // transformers.js and TextDecoder follow only where the run is well-formed.
        const std::string hf = ref["hf_decoded"];
        check(decoded == hf, "decode " + Excerpt(decoded) + " != HF's ByteFallback " + Excerpt(hf));
        if (hf == ref["text_decoder"].get<std::string>()) {
          check(decoded == ref["decoded"].get<std::string>(), "decode differs from the reference's");
        }
        ++compared;
        continue;
      }
      check(decoded == ref["decoded"].get<std::string>(),
            "decode " + Excerpt(decoded) + " != reference " + Excerpt(ref["decoded"].get<std::string>()));
      check(decoded == ref["text_decoder"].get<std::string>(), "decode differs from TextDecoder's");
      ++compared;
      continue;
    }
    const std::string text = entry["text"];
    const auto expected = ref["ids"].get<std::vector<int64_t>>();
    const auto expected_special = ref["ids_special"].get<std::vector<int64_t>>();
    const auto ids = tokenizer.encode(text);
    check(ids == expected, Excerpt(text) + ": ids " + Show(ids) + " != reference " + Show(expected));
    const auto ids_special = tokenizer.encode(text, /*add_special_tokens=*/true);
    check(ids_special == expected_special, Excerpt(text) + ": with special tokens, ids " + Show(ids_special) +
                                               " != reference " + Show(expected_special));
    // decode(encode(x)) == x, or NFC(x) (the reference's String.normalize) where the
    // tokenizer normalizes.
    const std::string decoded = tokenizer.decode(ids);
    const std::string normalized = nfc ? ref["nfc"].get<std::string>() : text;
    std::string original;
    for (size_t at = 0; at < normalized.size();) {
      if (!space_marker.empty() && normalized.compare(at, space_marker.size(), space_marker) == 0) {
        original += ' ';
        at += space_marker.size();
      } else {
        original += normalized[at++];
      }
    }
    if (round_trip) {
      check(decoded == original, "decode(encode(x)) " + Excerpt(decoded) + " != " + Excerpt(original));
    }
    check(tokenizer.decode(expected) == ref["decoded"].get<std::string>(),
          "decode differs from the reference's");
    check(tokenizer.decode(expected, /*skip_special_tokens=*/true) ==
              ref["decoded_skip_special"].get<std::string>(),
          "decode(skip_special_tokens) differs from the reference's");
    // The offsets name where each token starts, in order.
    const Encoding enc = tokenizer.encode_with_offsets(text);
    check(enc.ids == ids && enc.offsets.size() == ids.size() &&
              std::is_sorted(enc.offsets.begin(), enc.offsets.end()) &&
              (enc.offsets.empty() || enc.offsets.back() < text.size()),
          "encode_with_offsets is inconsistent");
    // Where the tokens give the text back byte for byte, each starts where the bytes of the
    // tokens before it end.
    if (decoded == text) {
      size_t at = 0;
      bool exact = true;
      for (size_t k = 0; k < ids.size() && exact; ++k) {
        exact = enc.offsets[k] == at;
        at += tokenizer.token_bytes(ids[k]).size();
      }
      check(exact, Excerpt(text) + ": an offset is not where the tokens before it end");
    }
    ++compared;
  }
  EXPECT_EQ(failures, 0u) << failures << " mismatches (first 20 shown)";
  std::printf("[ %s ] %zu corpus lines compared with the reference\n", model.c_str(), compared);
}

TEST(TokenizerReference, Qwen3MatchesReferenceOnCorpus) { CompareWithReference("qwen3", /*nfc=*/true); }
TEST(TokenizerReference, Llama3MatchesReferenceOnCorpus) { CompareWithReference("llama3", /*nfc=*/false); }
TEST(TokenizerReference, Llama3WithBosTemplateMatchesReferenceOnCorpus) {
  CompareWithReference("llama3-bos", /*nfc=*/false);
}

// Gemma 3: "▁"-BPE over characters with byte fallback, a Replace normalizer, 6415 added tokens
// (newline and tab runs, HTML tags, <0xNN>), a <bos> template and Replace/ByteFallback/Fuse decoders.
TEST(TokenizerReference, Gemma3MatchesReferenceOnCorpus) {
  CompareWithReference("gemma3", /*nfc=*/false, /*round_trip=*/true, "\u2581");
}

// The same without byte fallback: characters missing from the vocabulary become <unk>, a run of
// them one <unk> (fuse_unk), and decode leaves them out of the round trip.
TEST(TokenizerReference, Gemma3WithoutByteFallbackFusesUnknownCharacters) {
  CompareWithReference("gemma3-unk", /*nfc=*/false, /*round_trip=*/false);
}

TEST(TokenizerReference, AddedTokensStripWhitespaceMatchReferenceOnCorpus) {
  CompareWithReference("qwen3-strip", /*nfc=*/true, /*round_trip=*/false);
}

TEST(TokenizerReference, SpecialTokensAndMetadata) {
  STREAMBP_REQUIRE_REFERENCE();
  const Tokenizer& qwen = Load("qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_EQ(qwen.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(qwen.eos_token_ids(), std::vector<int64_t>{151645});
  EXPECT_EQ(qwen.pad_token_id(), 151643);
  EXPECT_EQ(qwen.bos_token_id(), std::nullopt);
  EXPECT_TRUE(qwen.is_special(151645));
  EXPECT_FALSE(qwen.is_special(151667));  // <think> is an added token, not a special one
  EXPECT_EQ(qwen.id_to_token(151667), "<think>");
  EXPECT_NE(qwen.chat_template().find("<think>"), std::string::npos);
  // Ids past the tokenizer (Qwen3's embedding has 151936 rows) decode to nothing, as in HF.
  EXPECT_EQ(qwen.decode(std::vector<int64_t>{9707, 151700, 0}), "Hello!");
  EXPECT_THROW(qwen.decode(std::vector<int64_t>{-1}), InvalidArgument);
  EXPECT_THROW(qwen.id_to_token(151700), InvalidArgument);

  const Tokenizer& llama = Load("llama3");
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.bos_token_id(), 128000);
  EXPECT_EQ(llama.eos_token_ids(), std::vector<int64_t>{128001});
  EXPECT_EQ(llama.token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(llama.token_bytes(*llama.token_to_id("Ġthe")), " the");
}

TEST(TokenizerReference, ConcurrentEncodesAgree) {
  STREAMBP_REQUIRE_REFERENCE();
  const Tokenizer& tokenizer = Load("qwen3");
  tokenizer.clear_cache();
  std::vector<std::string> texts;
  for (const json& entry : ReadJsonLines(SourceDir() + "/corpus.jsonl")) {
    if (entry.contains("text")) texts.push_back(entry["text"]);
  }
  std::vector<std::vector<int64_t>> expected;
  for (const auto& t : texts) expected.push_back(tokenizer.encode(t));
  tokenizer.clear_cache();
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * (t + 1) + round) % texts.size();
          if (tokenizer.encode(texts[k]) != expected[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Speed on English text (the README and Debian's license texts): printed, not asserted.
TEST(TokenizerReference, ThroughputOnEnglish) {
  STREAMBP_REQUIRE_REFERENCE();
  std::string english = text_test::ReadText(SourceDir() + "/../../README.md");
  for (const char* license : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"}) {
    english += text_test::ReadText(license);
  }
  // Cold: one pass with an empty word cache; warm: passes after it, as in a long-running server.
  for (const char* model : {"qwen3", "llama3", "gemma3"}) {
    const EncodeThroughput t = MeasureEncodeThroughput(Load(model), english, 1.0);
    std::printf("[ %s ] English, %.0f kB, %zu tokens: cold %.1f MB/s, warm %.1f MB/s (one core)\n", model,
                t.bytes / 1e3, t.tokens, t.cold_mb_s, t.warm_mb_s);
  }
}

// --- without the reference: errors the API promises ------------------------------------------

json TinyTokenizer() {
  // Bytes a, b, c, space as their own tokens, "ab" and "abc" by merges.
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 7, "content": "<|end|>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "abc": 5, "Ġa": 6},
              "merges": ["a b", "ab c", "Ġ a"]}
  })");
}

std::string ErrorOf(const json& tokenizer_json) {
  try {
    Tokenizer::FromJson(tokenizer_json.dump());
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// A character-level tokenizer as Gemma's, small: spaces written as "▁" by the normalizer,
// characters missing from the vocabulary to their <0xNN> tokens or to <unk>.
json TinyCharTokenizer() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [],
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    "pre_tokenizer": null, "post_processor": null,
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
              "vocab": {"<unk>": 0, "a": 1, "b": 2, "▁": 3, "ab": 4, "▁ab": 5, "é": 6, "<0xC3>": 7, "<0xA9>": 8},
              "merges": ["a b", "▁ ab"]}
  })");
}

TEST(Tokenizer, CharacterLevelUnknownRunsAndTheirOffsets) {
  const auto t = Tokenizer::FromJson(TinyCharTokenizer().dump());
  // "ab ab": a b merge, then ▁ ab; "xyz" is one fused <unk> (3 bytes); "é" is in the vocabulary.
  const std::string text = "ab abxyzé ab";
  const Encoding enc = t->encode_with_offsets(text);
  EXPECT_EQ(enc.ids, (std::vector<int64_t>{4, 5, 0, 6, 5}));
  EXPECT_EQ(enc.offsets, (std::vector<size_t>{0, 2, 5, 8, 10}));
  EXPECT_EQ(t->decode(enc.ids), "ab ab<unk>é ab");
  // Without fuse_unk each unknown character is its own <unk>.
  json unfused = TinyCharTokenizer();
  unfused["model"]["fuse_unk"] = false;
  const Encoding each = Tokenizer::FromJson(unfused.dump())->encode_with_offsets(text);
  EXPECT_EQ(each.ids, (std::vector<int64_t>{4, 5, 0, 0, 0, 6, 5}));
  EXPECT_EQ(each.offsets, (std::vector<size_t>{0, 2, 5, 6, 7, 8, 10}));
  // Byte fallback: a character missing from the vocabulary becomes its bytes when they all have
  // tokens, <unk> otherwise; ill-formed runs of byte tokens decode to one U+FFFD per byte.
  json fallback = TinyCharTokenizer();
  fallback["model"]["byte_fallback"] = true;
  fallback["model"]["vocab"].erase("é");
  const auto f = Tokenizer::FromJson(fallback.dump());
  EXPECT_EQ(f->encode("éx"), (std::vector<int64_t>{7, 8, 0}));
  EXPECT_EQ(f->decode(std::vector<int64_t>{7, 8, 1}), "éa");
  EXPECT_EQ(f->decode(std::vector<int64_t>{7, 1, 8, 8}), "\uFFFDa\uFFFD\uFFFD");
  EXPECT_EQ(f->token_bytes(7), "\xC3");
  EXPECT_EQ(f->token_bytes(5), " ab");
}

// HF's example of the MergedWithPrevious behaviour: "the-final--countdown" split on "-" gives
// "the-", "final-", "-", "countdown".
TEST(Tokenizer, SplitMergedWithPreviousKeepsTheDelimiterWithTheGapBeforeIt) {
  json j = TinyCharTokenizer();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"String": "-"},
                                       "behavior": "MergedWithPrevious", "invert": false})");
  j["model"]["vocab"] = json::parse(R"({"<unk>": 0, "-": 1, "t": 2, "h": 3, "e": 4, "f": 5, "i": 6, "n": 7,
                                        "a": 8, "l": 9, "c": 10, "o": 11, "u": 12, "d": 13, "w": 14,
                                        "l-": 15, "-c": 16})");
  j["model"]["merges"] = json::parse(R"([["l", "-"], ["-", "c"]])");
  // "l-" merges inside "final-"; "-c" never does: the "-" before "countdown" is a piece alone.
  EXPECT_EQ(Tokenizer::FromJson(j.dump())->encode("the-final--countdown"),
            (std::vector<int64_t>{2, 3, 4, 1, 5, 6, 7, 8, 15, 1, 10, 11, 12, 7, 2, 13, 11, 14, 7}));
  j["pre_tokenizer"]["behavior"] = "Isolated";
  EXPECT_EQ(Tokenizer::FromJson(j.dump())->encode("final-")[4], 9);  // "l" and "-" apart
}

TEST(Tokenizer, MergesAsStringsOrPairsGiveTheSameIds) {
  json strings = TinyTokenizer();
  json pairs = TinyTokenizer();
  pairs["model"]["merges"] = json::parse(R"([["a", "b"], ["ab", "c"], ["Ġ", "a"]])");
  const auto a = Tokenizer::FromJson(strings.dump()), b = Tokenizer::FromJson(pairs.dump());
  EXPECT_EQ(a->encode("abc ab a<|end|>"), b->encode("abc ab a<|end|>"));
  // " ab" is Ġ a b: "a b" outranks "Ġ a", so it ends as Ġ + ab.
  EXPECT_EQ(a->encode("abc ab a<|end|>"), (std::vector<int64_t>{5, 3, 4, 6, 7}));
}

TEST(Tokenizer, RefusesWhatItDoesNotImplementNamingIt) {
  json unigram = TinyTokenizer();
  unigram["model"] = json::parse(R"({"type": "Unigram", "vocab": [["a", 0.0]]})");
  EXPECT_NE(ErrorOf(unigram).find("'Unigram'"), std::string::npos) << ErrorOf(unigram);
  json wordpiece = TinyTokenizer();
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_NE(ErrorOf(wordpiece).find("'WordPiece'"), std::string::npos) << ErrorOf(wordpiece);
  json metaspace = TinyTokenizer();
  metaspace["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "▁"})");
  EXPECT_NE(ErrorOf(metaspace).find("'Metaspace'"), std::string::npos) << ErrorOf(metaspace);
  json nfkc = TinyTokenizer();
  nfkc["normalizer"] =
      json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFKC"}]})");
  EXPECT_NE(ErrorOf(nfkc).find("'NFKC'"), std::string::npos) << ErrorOf(nfkc);
  json roberta = TinyTokenizer();
  roberta["post_processor"] =
      json::parse(R"({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]})");
  EXPECT_NE(ErrorOf(roberta).find("'RobertaProcessing'"), std::string::npos) << ErrorOf(roberta);
  json metaspace_decoder = TinyTokenizer();
  metaspace_decoder["decoder"] = json::parse(R"({"type": "Metaspace"})");
  EXPECT_NE(ErrorOf(metaspace_decoder).find("'Metaspace'"), std::string::npos);
  json removed = TinyTokenizer();
  removed["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})");
  EXPECT_NE(ErrorOf(removed).find("'Removed'"), std::string::npos) << ErrorOf(removed);
  json bad_merge = TinyTokenizer();
  bad_merge["model"]["merges"].push_back("a zz");
  EXPECT_NE(ErrorOf(bad_merge).find("model.merges[3]: 'zz' is not in the vocabulary"), std::string::npos)
      << ErrorOf(bad_merge);
  json bad_regex = TinyTokenizer();
  bad_regex["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})");
  EXPECT_NE(ErrorOf(bad_regex).find("does not compile"), std::string::npos) << ErrorOf(bad_regex);
  json regex_replace = TinyCharTokenizer();
  regex_replace["normalizer"]["pattern"] = json::parse(R"({"Regex": "\\s"})");
  EXPECT_NE(ErrorOf(regex_replace).find("Replace with a pattern other than"), std::string::npos)
      << ErrorOf(regex_replace);
  json strip = TinyCharTokenizer();
  strip["decoder"]["decoders"].push_back(json::parse(R"({"type": "Strip", "content": " ", "start": 1, "stop": 0})"));
  EXPECT_NE(ErrorOf(strip).find("'Strip'"), std::string::npos) << ErrorOf(strip);
  json late_replace = TinyCharTokenizer();
  late_replace["decoder"]["decoders"].push_back(late_replace["decoder"]["decoders"][0]);
  EXPECT_NE(ErrorOf(late_replace).find("after ByteFallback or Fuse"), std::string::npos) << ErrorOf(late_replace);
  json byte_level_fallback = TinyTokenizer();
  byte_level_fallback["model"]["byte_fallback"] = true;
  EXPECT_NE(ErrorOf(byte_level_fallback).find("byte_fallback true with a ByteLevel"), std::string::npos);
  EXPECT_THROW(Tokenizer::FromJson("{not json"), InvalidArgument);
  EXPECT_THROW(Tokenizer::FromDir("/nonexistent/model"), NotFound);
}

TEST(Tokenizer, NamedTokensFromConfigSpecialTokensMapAndChatTemplateFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("streambp_text_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const char* name, const std::string& contents) { std::ofstream(dir / name) << contents; };
  write("tokenizer.json", TinyTokenizer().dump());
  // eos as an AddedToken object; pad only in special_tokens_map.json; templates as a named list.
  write("tokenizer_config.json", R"({"eos_token": {"content": "<|end|>", "special": true}, "pad_token": null,
      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  write("special_tokens_map.json", R"({"pad_token": "<|end|>", "bos_token": "a"})");
  auto tokenizer = Tokenizer::FromDir(dir.string());
  EXPECT_EQ(tokenizer->eos_token_ids(), std::vector<int64_t>{7});
  EXPECT_EQ(tokenizer->pad_token_id(), 7);
  EXPECT_EQ(tokenizer->bos_token_id(), 0);
  EXPECT_EQ(tokenizer->chat_template(), "D");
  write("chat_template.jinja", "J");  // preferred to the config's, as transformers does
  EXPECT_EQ(Tokenizer::FromDir(dir.string())->chat_template(), "J");
  fs::remove_all(dir);
}

TEST(Tokenizer, InvalidUtf8IsRefusedWithItsOffset) {
  const auto tokenizer = Tokenizer::FromJson(TinyTokenizer().dump());
  try {
    tokenizer->encode(std::string("ab c\xE2\x82", 6));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "text is not valid UTF-8 at byte 4");
  }
}

}  // namespace
}  // namespace streambp
