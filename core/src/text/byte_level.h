#pragma once
/// GPT-2's byte-level alphabet (internal): every byte is written as one printable character so
/// that BPE vocabularies are strings. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
/// themselves (as code points); the other 68 bytes, in increasing order, are U+0100, U+0101, ...
#include <array>
#include <string>

namespace streambp::text {

/// The character (code point) standing for each byte.
const std::array<char32_t, 256>& ByteToChar();

/// The UTF-8 encoding of the character standing for each byte (1 or 2 bytes).
const std::array<std::string, 256>& ByteToUtf8();

/// The byte a character stands for, or -1 when `c` is not in the alphabet.
int CharToByte(char32_t c);

}  // namespace streambp::text
