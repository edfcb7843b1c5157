#pragma once
/// Finding added tokens (special tokens and the like) in text before the pre-tokenizer runs
/// (internal), as HF tokenizers' AddedVocabulary does: leftmost-longest matches, with each
/// token's single_word / lstrip / rstrip flags. Immutable after construction; thread-safe.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace streambp::text {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;  ///< only matched when not inside a word
  bool lstrip = false;       ///< swallows the whitespace on its left
  bool rstrip = false;       ///< swallows the whitespace on its right
  bool normalized = false;   ///< matched in the normalized text rather than the raw text
};

class AddedTokenMatcher {
 public:
  /// `tokens` must outlive the matcher.
  explicit AddedTokenMatcher(std::vector<const AddedToken*> tokens);

  struct Match {
    size_t begin, end;  ///< the bytes the token takes, stripped whitespace included
    const AddedToken* token;
  };
  /// The matches in valid UTF-8 `text`, in order, not overlapping.
  std::vector<Match> find_all(std::string_view text) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    const AddedToken* token = nullptr;                        // a token ends here
  };
  int32_t child(int32_t node, unsigned char byte) const;
  /// The longest token starting at text[pos], or nullptr.
  const AddedToken* longest_at(std::string_view text, size_t pos, size_t& end) const;

  std::vector<Node> nodes_;
  std::vector<bool> first_byte_;  // 256 entries: some token starts with this byte
};

}  // namespace streambp::text
