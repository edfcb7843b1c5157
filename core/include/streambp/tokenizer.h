#pragma once
/// A Hugging Face tokenizer read from a model folder's `tokenizer.json` (docs/text.md): BPE as
/// Qwen2/Qwen3 and Llama 3 (byte-level) and Gemma 3 (characters with byte fallback) use it,
/// giving the ids HF tokenizers gives.
///
/// Supported pipeline, as `tokenizer.json` describes it:
///   normalizer      null, NFC, Replace({"String": s} -> content), or a Sequence of those
///   pre_tokenizer   ByteLevel, Split(regex | string, behavior Isolated or MergedWithPrevious,
///                   invert false), or a Sequence of those; ByteLevel with add_prefix_space
///                   false (use_regex true adds GPT-2's split regex before the byte mapping)
///   model           BPE (merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token,
///                   fuse_unk); over the byte alphabet when a ByteLevel pre-tokenizer is there,
///                   otherwise over characters, with byte_fallback (`<0xNN>` tokens); no
///                   dropout, no continuing_subword_prefix / end_of_word_suffix
///   post_processor  null, ByteLevel, TemplateProcessing (single sequence), or a Sequence
///   decoder         null; ByteLevel; or Replace (string) steps, ByteFallback, Fuse in that
///                   order, alone or in a Sequence
///   added_tokens    matched in the text before everything else (leftmost, longest), with
///                   their single_word / lstrip / rstrip / normalized flags
/// Anything else (Unigram, WordPiece, another normalizer or pre-tokenizer, ...) is refused when
/// the tokenizer is built, with an InvalidArgument naming it. `truncation` and `padding` in
/// `tokenizer.json` are not applied (callers bound lengths themselves).
/// `tokenizer_config.json` (and `special_tokens_map.json`) give the chat template, the named
/// special tokens (bos/eos/pad/unk) and `split_special_tokens`.
///
/// Thread-safety: a built Tokenizer is immutable apart from an internal word cache with its
/// own locks; every const method may be called from several threads at once.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace streambp {

/// Token ids of a text and where each token starts in it.
struct Encoding {
  std::vector<int64_t> ids;
  /// offsets[i]: byte offset in the input text of the first byte token i stands for. Tokens
  /// added by the post-processor sit at 0 (before the text) or at the text's size (after it).
  /// Inside a stretch that the normalizer changed (NFC's recomposed characters; each space
  /// Gemma's Replace writes as "▁"), every token maps to the start of that stretch.
  std::vector<size_t> offsets;
};

class Tokenizer {
 public:
  /// Reads `dir`/tokenizer.json (required: NotFound when missing) and, where present,
  /// `tokenizer_config.json`, `special_tokens_map.json` (special tokens the config does not
  /// name) and `chat_template.jinja` (preferred to the config's chat_template, as transformers
  /// does). A malformed or unsupported file: InvalidArgument naming the file and the field.
  static std::unique_ptr<Tokenizer> FromDir(const std::string& dir);

  /// Builds from the contents of the files (the config ones may be empty strings).
  static std::unique_ptr<Tokenizer> FromJson(const std::string& tokenizer_json,
                                             const std::string& tokenizer_config_json = "",
                                             const std::string& special_tokens_map_json = "");
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// The ids of `text` (UTF-8), as HF's `tokenizer.encode(text, add_special_tokens=...)`:
  /// added tokens in the text are matched first (special ones unless `split_special_tokens`),
  /// then the rest is normalized, split and merged; `add_special_tokens` applies the
  /// post-processor's template (Llama 3: a leading <|begin_of_text|> where its tokenizer.json
  /// has a TemplateProcessing; Qwen: nothing). Invalid UTF-8: InvalidArgument saying at which
  /// byte offset ("text is not valid UTF-8 at byte 17").
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = false) const;

  /// encode() with the byte offset of each token in `text`.
  Encoding encode_with_offsets(std::string_view text, bool add_special_tokens = false) const;

  /// The text of `ids`, as HF tokenizers' `decode`. Byte-level: the bytes of all tokens joined,
  /// ill-formed UTF-8 replaced by U+FFFD (one per maximal ill-formed subsequence, as Rust's
  /// `String::from_utf8_lossy`). Gemma's decoders: each token's spelling with "▁" read as a
  /// space; a run of `<0xNN>` tokens is its bytes when they are UTF-8, otherwise one U+FFFD
  /// per byte (HF's ByteFallback). `skip_special_tokens` leaves out added tokens marked special.
  /// Ids that name no token (in the model's embedding but past the tokenizer's vocabulary) are
  /// left out, as HF does; a negative id is an InvalidArgument. No "clean up of tokenization
  /// spaces" is done (transformers' `clean_up_tokenization_spaces`), so decode(encode(x)) == x
  /// for every valid UTF-8 x that NFC leaves unchanged.
  std::string decode(std::span<const int64_t> ids, bool skip_special_tokens = false) const;

  /// The raw bytes token `id` stands for (possibly a partial UTF-8 character): the pieces that
  /// decode() joins (Gemma: "▁the" stands for " the", `<0x0A>` for one byte 0x0A). InvalidArgument for an id that names no token.
  const std::string& token_bytes(int64_t id) const;

  /// What kind of tokenizer this is: "BPE (byte-level)" or "BPE (characters, byte fallback)".
  std::string kind() const;

  /// One more than the largest token id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  /// The id of a token given in the vocabulary's own spelling (byte-level: "Ġthe"), or of an
  /// added token ("<|im_end|>"); nullopt when there is none.
  std::optional<int64_t> token_to_id(std::string_view token) const;
  /// The vocabulary spelling of `id`; InvalidArgument for an id that names no token.
  std::string id_to_token(int64_t id) const;
  /// Whether `id` is an added token marked special (what skip_special_tokens leaves out).
  bool is_special(int64_t id) const;

  /// The chat template (Jinja source) of tokenizer_config.json / chat_template.jinja, or "".
  const std::string& chat_template() const;
  /// The named special tokens of tokenizer_config.json / special_tokens_map.json ("" if none).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& pad_token() const;
  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  /// The id of eos_token as a list (empty when the tokenizer names none). The model's
  /// config.json / generation_config.json may name more end tokens; the caller merges them.
  std::vector<int64_t> eos_token_ids() const;

  /// Empties the word -> ids cache (to measure cold throughput).
  void clear_cache() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Encoding speed of `tokenizer` on `text` (one core, the calling thread).
struct EncodeThroughput {
  size_t bytes = 0;      ///< size of the text
  size_t tokens = 0;     ///< tokens of one pass
  double cold_mb_s = 0;  ///< first pass after clear_cache(), MB = 1e6 bytes
  double warm_mb_s = 0;  ///< later passes, until `min_seconds` have gone by
};
EncodeThroughput MeasureEncodeThroughput(const Tokenizer& tokenizer, std::string_view text,
                                         double min_seconds = 0.5);

}  // namespace streambp
