// qkv/runtime/io/quote.hpp — user data in messages, bounded: a name from a file or a flag is
// quoted with its control characters, quotes and backslashes escaped, and cut after a bounded
// number of bytes with its full length said, so a 1 MB name gives one short line and a NUL
// byte does not end the message early.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qkv {

/// `s` between `quote` characters (a single quote unless said), escaped (\n, \t, \r, \\, the
/// quote, \xNN for other bytes below 0x20 and 0x7f; bytes from 0x80 on are kept, so UTF-8 names
/// read as written), and cut after `max` bytes of `s` (at a UTF-8 character boundary) with
/// "... (N bytes)" after the closing quote.
inline std::string quote_text(std::string_view s, std::size_t max = 80, char quote = '\'') {
  std::size_t keep = s.size();
  if (keep > max) {
    keep = max;
    while (keep > 0 && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80) --keep;  // not inside a character
  }
  std::string out(1, quote);
  for (std::size_t i = 0; i < keep; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c == static_cast<unsigned char>(quote)) {
          out += '\\';
          out += quote;
        } else if (c < 0x20 || c == 0x7f) {
          constexpr char kHex[] = "0123456789abcdef";
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += quote;
  if (keep < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace qkv
