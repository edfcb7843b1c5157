#include "unicode.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <vector>

#include <utf8proc.h>

#include "streambp/interrupt.h"

namespace streambp::text {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when ill-formed; when
// ill-formed, `maximal` is the length of its maximal subpart (at least 1).
size_t SequenceLength(std::string_view s, size_t i, size_t& maximal) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  maximal = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
    maximal = k + 1;
  }
  return need;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::copy_n(s.data() + i, 8, reinterpret_cast<char*>(&w));
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    size_t maximal;
    const size_t len = SequenceLength(s, i, maximal);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

void AppendUtf8Lossy(std::string_view bytes, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    size_t maximal;
    const size_t len = SequenceLength(bytes, i, maximal);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      i += maximal;
    } else {
      out.append(bytes.data() + i, len);
      i += len;
    }
  }
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

char32_t NextCodePoint(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t c = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return c;
}

char32_t PrevCodePoint(std::string_view s, size_t end, size_t& begin) {
  begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
  size_t i = begin;
  return NextCodePoint(s, i);
}

bool IsWhiteSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsAlphanumeric(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

void OffsetMap::add_change(size_t out_begin, size_t out_end, size_t in_begin, size_t in_end) {
  changes_.push_back({out_begin, out_end, in_begin, in_end});
}

size_t OffsetMap::to_input(size_t out) const {
  // The last change that starts at or before `out`.
  auto it = std::upper_bound(changes_.begin(), changes_.end(), out,
                             [](size_t o, const Change& c) { return o < c.out_begin; });
  if (it == changes_.begin()) return out;
  --it;
  if (out < it->out_end) return it->in_begin;
  return out - it->out_end + it->in_end;
}

namespace {

// NFC of a chunk of valid UTF-8, appended to `out`, in time linear in its length (up to the
// log of the longest run of combining marks): the canonical decomposition of each character
// (utf8proc's tables), the canonical ordering of each run of marks by combining class as a
// stable sort, then utf8proc's composition pass, which is linear. utf8proc_map would sort
// the marks by adjacent swaps, quadratic in a long run of them.
void NormalizeNfcChunk(std::string_view chunk, std::string& out) {
  struct Mark {
    utf8proc_int32_t cp;
    uint8_t ccc;  // canonical combining class, looked up once
  };
  thread_local std::vector<Mark> cps;
  thread_local std::vector<Mark> scratch;
  cps.clear();
  size_t i = 0;
  utf8proc_int32_t decomposed[32];  // no character decomposes canonically into more than 4
  auto push = [](utf8proc_int32_t c) {
    cps.push_back({c, static_cast<uint8_t>(utf8proc_get_property(c)->combining_class)});
  };
  while (i < chunk.size()) {
    PollInterrupt();
    const auto c = static_cast<utf8proc_int32_t>(NextCodePoint(chunk, i));
    const utf8proc_ssize_t n = utf8proc_decompose_char(c, decomposed, 32, UTF8PROC_DECOMPOSE, nullptr);
    if (n < 0 || n > 32) {
      push(c);
    } else {
      for (utf8proc_ssize_t k = 0; k < n; ++k) push(decomposed[k]);
    }
  }
  // Canonical ordering: each maximal run of non-starters sorted by combining class, stably —
  // by insertion for the usual run of a few marks, by counting (256 classes) for a long one.
  for (size_t a = 0; a < cps.size();) {
    if (cps[a].ccc == 0) {
      ++a;
      continue;
    }
    size_t b = a + 1;
    bool sorted = true;
    while (b < cps.size() && cps[b].ccc != 0) {
      sorted = sorted && cps[b - 1].ccc <= cps[b].ccc;
      ++b;
    }
    if (!sorted && b - a <= 16) {
      for (size_t k = a + 1; k < b; ++k) {
        const Mark m = cps[k];
        size_t j = k;
        for (; j > a && cps[j - 1].ccc > m.ccc; --j) cps[j] = cps[j - 1];
        cps[j] = m;
      }
    } else if (!sorted) {
      std::array<size_t, 257> start{};
      for (size_t k = a; k < b; ++k) ++start[cps[k].ccc + 1];
      for (size_t c = 1; c < start.size(); ++c) start[c] += start[c - 1];
      scratch.resize(b - a);
      for (size_t k = a; k < b; ++k) scratch[start[cps[k].ccc]++] = cps[k];
      std::copy(scratch.begin(), scratch.end(), cps.begin() + static_cast<std::ptrdiff_t>(a));
    }
    a = b;
  }
  thread_local std::vector<utf8proc_int32_t> code_points;
  code_points.resize(cps.size());
  for (size_t k = 0; k < cps.size(); ++k) code_points[k] = cps[k].cp;
  const utf8proc_ssize_t len =
      utf8proc_normalize_utf32(code_points.data(), static_cast<utf8proc_ssize_t>(code_points.size()),
                               static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  for (utf8proc_ssize_t k = 0; k < len; ++k) AppendUtf8(static_cast<char32_t>(code_points[static_cast<size_t>(k)]), out);
  if (cps.capacity() > (size_t{1} << 20)) {  // a huge chunk: do not keep its buffers
    cps = {};
    scratch = {};
    code_points = {};
  }
}

}  // namespace

bool AppendNfc(std::string_view in, std::string& out, OffsetMap& map) {
  // Every ASCII character is a normalization boundary before it (it never composes with what
  // precedes it and is never reordered), so NFC works chunk by chunk: an ASCII character
  // (which may compose with the marks after it) and the run of non-ASCII characters after it.
  const size_t base = out.size();
  bool changed = false;
  size_t i = 0;
  const size_t n = in.size();
  thread_local std::string normalized;
  while (i < n) {
    size_t j = i;
    while (j < n && static_cast<unsigned char>(in[j]) < 0x80) ++j;
    if (j == n) {
      out.append(in.data() + i, n - i);
      break;
    }
    const size_t chunk_begin = j > i ? j - 1 : j;
    out.append(in.data() + i, chunk_begin - i);
    size_t chunk_end = j;
    while (chunk_end < n && static_cast<unsigned char>(in[chunk_end]) >= 0x80) ++chunk_end;
    const std::string_view chunk = in.substr(chunk_begin, chunk_end - chunk_begin);
    normalized.clear();
    NormalizeNfcChunk(chunk, normalized);
    if (normalized != chunk) {
      changed = true;
      map.add_change(out.size() - base, out.size() - base + normalized.size(), chunk_begin, chunk_end);
    }
    out.append(normalized);
    i = chunk_end;
  }
  if (normalized.capacity() > (size_t{1} << 20)) normalized = std::string();
  return changed;
}

bool AppendReplaced(std::string_view in, std::string_view from, std::string_view to, std::string& out,
                    OffsetMap& map) {
  size_t done = 0, hit = in.find(from);
  if (hit == std::string_view::npos) {
    out.append(in);
    return false;
  }
  const size_t base = out.size();
  for (; hit != std::string_view::npos; hit = in.find(from, done)) {
    out.append(in.substr(done, hit - done));
    const size_t at = out.size() - base;
    out.append(to);
    map.add_change(at, at + to.size(), hit, hit + from.size());
    done = hit + from.size();
  }
  out.append(in.substr(done));
  return true;
}

}  // namespace streambp::text
