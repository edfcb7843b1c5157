#pragma once
/// BPE (internal), as Hugging Face tokenizers' BPE model: a vocabulary, merges by rank, a cache
/// of word -> ids. Two alphabets: byte-level (GPT-2's: a word's symbols are its bytes, spelled
/// in the byte alphabet: Qwen, Llama 3) and character-level (a word's symbols are its code
/// points as UTF-8, a character missing from the vocabulary falls back to its bytes'
/// `<0xNN>` tokens or to unk: Gemma). Thread-safe: encode_word may be called from several
/// threads at once.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "large_buffer.h"

namespace streambp::text {

/// Hash of strings that also accepts string_views (heterogeneous lookup).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  /// A word that is itself in the vocabulary becomes that token without merging (Llama 3).
  bool ignore_merges = false;
  /// The id of unk_token: a character not in the vocabulary becomes it (otherwise it is dropped).
  std::optional<int32_t> unk_id;
  /// Byte-level alphabet (the tokenizer has a ByteLevel pre-tokenizer); false: characters.
  bool byte_level = true;
  /// Character-level: a character not in the vocabulary becomes the tokens `<0xNN>` of its
  /// bytes when all of them exist (before unk is tried).
  bool byte_fallback = false;
  /// Character-level: consecutive unknown characters become one unk token.
  bool fuse_unk = false;
};

class BpeModel {
 public:
  /// `merges` are (left, right) token strings, rank = position; a later duplicate overrides an
  /// earlier one. Throws InvalidArgument when a merge names a token not in `vocab`
  /// ("model.merges[12]: 'a' is not in the vocabulary").
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  ~BpeModel();

  /// Appends the ids of one pre-tokenized word (raw bytes; valid UTF-8 when character-level)
  /// to `out`. With `starts`, also appends where in `word` each of those tokens begins.
  void encode_word(std::string_view word, std::vector<int64_t>& out,
                   std::vector<uint32_t>* starts = nullptr) const;

  const Vocab& vocab() const { return vocab_; }
  const BpeOptions& options() const { return options_; }
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// Empties the word cache (for measuring cold throughput).
  void clear_cache() const;

 private:
  struct MergeTarget {
    uint32_t rank;
    int32_t id;
  };
  /// (left id, right id) -> merge, open addressing with linear probing: one cache line per
  /// lookup in the common case, which is what BPE spends its time on.
  class MergeTable {
   public:
    void reserve(size_t entries);
    void insert_or_assign(uint64_t key, MergeTarget target);
    const MergeTarget* find(uint64_t key) const {
      for (size_t i = slot(key);; i = (i + 1) & mask_) {
        if (slots_[i].key == key) return &slots_[i].target;
        if (slots_[i].key == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
      uint64_t key = kEmpty;
      MergeTarget target{};
    };
    size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ULL) >> shift_; }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    int shift_ = 64;
  };
  class WordCache;

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void merge_word(std::string_view word, std::vector<int64_t>& out, std::vector<uint32_t>* starts) const;
  /// One symbol per byte (byte-level) or character of a word, in a doubly linked list; a
  /// merged-away symbol has len 0; `start` is where it begins in the word.
  struct Symbol {
    int32_t id, prev, next;
    uint32_t len, start;
  };
  using Symbols = std::vector<Symbol, LargeBufferAllocator<Symbol>>;
  void initial_symbols(std::string_view word, Symbols& symbols) const;
  /// Words longer than this many bytes merge through per-rank buckets (linear time);
  /// shorter ones through a binary heap. Both give the same ids.
  static constexpr size_t kLongWord = 256;
  void merge_short(Symbols& symbols) const;
  void merge_long(Symbols& symbols) const;

  Vocab vocab_;
  MergeTable merges_;
  /// By rank: the pair it merges and the token it makes (merge_long checks a queued candidate
  /// against its rank's pair here: the rank is hot, a hash probe is not).
  struct RankedMerge {
    uint64_t pair;
    int32_t id;
  };
  std::vector<RankedMerge> by_rank_;
  // Byte-level: the token of each byte; character-level: of each ASCII character. -1: none.
  std::array<int32_t, 256> byte_ids_;
  std::array<int32_t, 256> fallback_ids_;  // character-level: the `<0xNN>` tokens, -1 when none
  /// By id: how many bytes of a word the token stands for (byte-level: its bytes; characters:
  /// its spelling, 1 for `<0xNN>`), 0 when that is not fixed (unk).
  std::vector<uint32_t> span_;
  BpeOptions options_;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace streambp::text
