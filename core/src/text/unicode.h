#pragma once
/// UTF-8 and Unicode helpers of the text library (internal): validation, lossy decoding,
/// code points, White_Space, NFC with an offset map back to the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace streambp::text {

/// Byte offset of the first byte of the first ill-formed UTF-8 sequence in `s`, or
/// std::string_view::npos when `s` is valid UTF-8 (no overlongs, surrogates or > U+10FFFF).
size_t FindInvalidUtf8(std::string_view s);

/// Appends `bytes` to `out` as UTF-8, replacing each maximal ill-formed subsequence by one
/// U+FFFD — Unicode's "substitution of maximal subparts", which Rust's
/// String::from_utf8_lossy (HF tokenizers' decode) and the WHATWG decoder both follow.
void AppendUtf8Lossy(std::string_view bytes, std::string& out);

/// Appends the UTF-8 encoding of code point `c` to `out`.
void AppendUtf8(char32_t c, std::string& out);

/// The code point starting at s[i] of valid UTF-8 `s`; advances `i` past it.
char32_t NextCodePoint(std::string_view s, size_t& i);

/// The code point ending just before s[end] of valid UTF-8 `s`; sets `begin` to its start.
char32_t PrevCodePoint(std::string_view s, size_t end, size_t& begin);

/// Unicode's White_Space property (what Rust's char::is_whitespace and Oniguruma's \s test).
bool IsWhiteSpace(char32_t c);

/// Letters and numbers (general categories L* and N*).
bool IsAlphanumeric(char32_t c);

/// Maps offsets of a normalized string back to the string it was made from. Normalization
/// works on chunks; an unchanged chunk maps byte for byte, and every byte of a changed chunk
/// maps to the start of the chunk it came from.
class OffsetMap {
 public:
  /// Records that output bytes [out_begin, out_end) replaced input bytes [in_begin, in_end).
  void add_change(size_t out_begin, size_t out_end, size_t in_begin, size_t in_end);
  bool identity() const { return changes_.empty(); }
  /// The input offset of output offset `out`.
  size_t to_input(size_t out) const;

 private:
  struct Change {
    size_t out_begin, out_end, in_begin, in_end;
  };
  std::vector<Change> changes_;
};

/// Appends NFC(`in`) to `out` (Unicode normalization form C, utf8proc's tables) and records
/// in `map` (offsets relative to the start of `in` and to the appended text) where it differs
/// from `in`. Returns false, appending `in` unchanged, when `in` is already in NFC.
/// `in` must be valid UTF-8.
bool AppendNfc(std::string_view in, std::string& out, OffsetMap& map);

/// Appends `in` with every occurrence of `from` (non-empty; left to right, not overlapping)
/// replaced by `to`, recording each replacement in `map` (HF's Replace normalizer with a
/// string pattern). Returns false, appending `in` unchanged, when `from` does not occur.
bool AppendReplaced(std::string_view in, std::string_view from, std::string_view to, std::string& out,
                    OffsetMap& map);

}  // namespace streambp::text
