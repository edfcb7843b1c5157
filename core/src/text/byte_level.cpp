#include "byte_level.h"

#include "unicode.h"

namespace streambp::text {
namespace {

bool StandsForItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

std::array<char32_t, 256> MakeTable() {
  std::array<char32_t, 256> table{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) table[b] = StandsForItself(b) ? static_cast<char32_t>(b) : next++;
  return table;
}

}  // namespace

const std::array<char32_t, 256>& ByteToChar() {
  static const std::array<char32_t, 256> table = MakeTable();
  return table;
}

const std::array<std::string, 256>& ByteToUtf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) AppendUtf8(ByteToChar()[b], t[b]);
    return t;
  }();
  return table;
}

int CharToByte(char32_t c) {
  static const std::array<int, 0x144> reverse = [] {
    std::array<int, 0x144> r;
    r.fill(-1);
    for (int b = 0; b < 256; ++b) r[ByteToChar()[b]] = b;
    return r;
  }();
  return c < reverse.size() ? reverse[c] : -1;
}

}  // namespace streambp::text
