#include "regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "streambp/error.h"

namespace streambp::text {
namespace {

// Unicode's White_Space property as class items.
constexpr std::string_view kWhiteSpaceItems =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{"
    "3000}";

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buffer));
}

}  // namespace

std::string RewriteWhiteSpaceClasses(std::string_view pattern, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceItems;
        } else {
          out += '[';
          out += kWhiteSpaceItems;
          out += ']';
        }
      } else if (e == 'S') {
        if (in_class) {
          throw InvalidArgument(where + ": \\S inside a character class is not supported");
        }
        out += "[^";
        out += kWhiteSpaceItems;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::MatchState::MatchState(const RegexSplitter& splitter)
    : data(pcre2_match_data_create_from_pattern(splitter.impl_->code, nullptr)),
      context(pcre2_match_context_create(nullptr)) {
  if (!data || !context) {
    pcre2_match_data_free(static_cast<pcre2_match_data*>(data));
    pcre2_match_context_free(static_cast<pcre2_match_context*>(context));
    throw std::bad_alloc();
  }
}

RegexSplitter::MatchState::~MatchState() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(data));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context));
  if (jit_stack) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack));
}

RegexSplitter::RegexSplitter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RegexSplitter::~RegexSplitter() = default;

std::unique_ptr<RegexSplitter> RegexSplitter::Compile(std::string_view pattern, const std::string& where) {
  const std::string rewritten = RewriteWhiteSpaceClasses(pattern, where);
  auto impl = std::make_unique<Impl>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!impl->code) {
    throw InvalidArgument(where + ": the regex does not compile (" + Pcre2Message(error) + " at offset " +
                          std::to_string(offset) + "): " + std::string(pattern));
  }
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  impl->jit = have_jit && pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<RegexSplitter>(new RegexSplitter(std::move(impl)));
}

std::unique_ptr<RegexSplitter> RegexSplitter::Literal(std::string_view literal, const std::string& where) {
  std::string quoted;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) quoted += '\\';
    quoted += c;
  }
  return Compile(quoted, where);
}

bool RegexSplitter::find(MatchState& state, std::string_view text, size_t start, size_t& begin,
                         size_t& end) const {
  auto* data = static_cast<pcre2_match_data*>(state.data);
  auto* context = static_cast<pcre2_match_context*>(state.context);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // PCRE2's default match limit (10 million steps per call) is a guard against runaway
  // patterns, but a tokenizer's regex legitimately scans a whole run of whitespace once per
  // match (`\s*[\r\n]+` tried over 10 MiB of spaces): the limit grows with what is left of the
  // text, so every text within the request limits splits, and a call stays linear in it.
  const uint64_t limit = std::max<uint64_t>(10'000'000, 16 * static_cast<uint64_t>(text.size() - std::min(start, text.size())));
  pcre2_set_match_limit(context, static_cast<uint32_t>(std::min<uint64_t>(limit, 0xFFFFFFFFu)));
  if (impl_->jit && state.jit_stack == nullptr && text.size() - std::min(start, text.size()) > (size_t{1} << 16)) {
    // A long subject may backtrack deeper than JIT's default 32 KiB stack allows.
    state.jit_stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
    if (state.jit_stack) pcre2_jit_stack_assign(context, nullptr, state.jit_stack);
  }
  // The text was validated as UTF-8 before it got here.
  const int rc =
      impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, data, context)
                 : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error(ErrorCode::kInternal, "pre-tokenizer regex: " + Pcre2Message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  begin = ovector[0];
  end = ovector[1];
  return true;
}

}  // namespace streambp::text
