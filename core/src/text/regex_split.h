#pragma once
/// The `Split` pre-tokenizer's regex (internal), compiled with PCRE2 (UTF + UCP, JIT when the
/// library has it). Thread-safe: split() may be called from several threads at once.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace streambp::text {

/// What Split does with a match (HF's SplitDelimiterBehavior): Isolated keeps it as a piece of
/// its own; MergedWithPrevious appends it to the gap before it (a match at the start or right
/// after another match stays a piece of its own).
enum class SplitBehavior { kIsolated, kMergedWithPrevious };

class RegexSplitter {
 public:
  /// Compiles `pattern` as HF tokenizers (Oniguruma) reads it: `\s` and `\S` are Unicode's
  /// White_Space and its complement (PCRE2's own `\s` also matches U+180E). `where` names the
  /// pattern in errors; a pattern PCRE2 refuses is an InvalidArgument with PCRE2's message.
  static std::unique_ptr<RegexSplitter> Compile(std::string_view pattern, const std::string& where);
  /// A literal string to split on (Split's {"String": ...} pattern).
  static std::unique_ptr<RegexSplitter> Literal(std::string_view literal, const std::string& where);
  ~RegexSplitter();

  /// How matches become pieces; Isolated unless set.
  void set_behavior(SplitBehavior behavior) { behavior_ = behavior; }

  /// Calls piece(begin, end) for every piece of valid UTF-8 `text`, in order: the non-empty
  /// gaps between matches, and the matches as the behaviour says.
  template <class F>
  void split(std::string_view text, F&& piece) const {
    size_t start = 0, gap = 0;
    size_t match_begin, match_end;
    MatchState state(*this);
    while (start <= text.size() && find(state, text, start, match_begin, match_end)) {
      if (match_end > match_begin && behavior_ == SplitBehavior::kMergedWithPrevious) {
        piece(gap, match_end);  // the gap, if any, with the match
        gap = start = match_end;
        continue;
      }
      if (match_begin > gap) piece(gap, match_begin);
      if (match_end > match_begin) {
        piece(match_begin, match_end);
        gap = start = match_end;
      } else {
        // An empty match produces no piece; step over one character.
        start = match_end + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
      }
    }
    if (text.size() > gap) piece(gap, text.size());
  }

 private:
  struct Impl;
  class MatchState {
   public:
    explicit MatchState(const RegexSplitter& splitter);
    ~MatchState();
    MatchState(const MatchState&) = delete;
    MatchState& operator=(const MatchState&) = delete;
    void* data;
    void* context;
    void* jit_stack = nullptr;
  };
  explicit RegexSplitter(std::unique_ptr<Impl> impl);
  bool find(MatchState& state, std::string_view text, size_t start, size_t& begin, size_t& end) const;

  std::unique_ptr<Impl> impl_;
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
};

/// Rewrites `\s` and `\S` in a regex to explicit White_Space classes (see Compile). Exposed
/// for tests. Throws InvalidArgument for `\S` inside a bracket class (no such pattern is known).
std::string RewriteWhiteSpaceClasses(std::string_view pattern, const std::string& where);

}  // namespace streambp::text
