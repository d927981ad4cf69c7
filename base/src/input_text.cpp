#include <devalloc/input_text.hpp>

#include <cstdint>

namespace devalloc {

namespace {

void append_hex(std::string& out, uint32_t value, int digits) {
  static const char hex[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) out += hex[(value >> shift) & 0xf];
}

// Code points a terminal acts on, besides C0 and DEL: C1 controls and the
// bidirectional embeddings, overrides and isolates.
bool hidden(uint32_t code) {
  return (code >= 0x80 && code <= 0x9f) || code == 0x061c || code == 0x200e ||
         code == 0x200f || (code >= 0x202a && code <= 0x202e) ||
         (code >= 0x2066 && code <= 0x2069);
}

std::string escape(std::string_view text, size_t max_bytes, bool in_quotes) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size() && pos < max_bytes) {
    const size_t length = utf8_sequence_length(text.substr(pos));
    if (length == 0) {
      out += "\\x";
      append_hex(out, static_cast<unsigned char>(text[pos]), 2);
      ++pos;
      continue;
    }
    if (pos + length > max_bytes) break;  // never cut a character in two
    const uint32_t code = utf8_code_point(text.substr(pos, length));
    if (code == '\\') {
      out += "\\\\";
    } else if (code == '"' && in_quotes) {
      out += "\\\"";
    } else if (code == '\n') {
      out += "\\n";
    } else if (code == '\t') {
      out += "\\t";
    } else if (code == '\r') {
      out += "\\r";
    } else if (code < 0x20 || code == 0x7f) {
      out += "\\x";
      append_hex(out, code, 2);
    } else if (hidden(code)) {
      out += "\\u{";
      append_hex(out, code, 4);
      out += '}';
    } else {
      out.append(text.substr(pos, length));
    }
    pos += length;
  }
  if (pos < text.size()) {
    out += "...";
    if (in_quotes) out += '"';
    out += " (" + std::to_string(text.size()) + " bytes)";
  } else if (in_quotes) {
    out += '"';
  }
  return out;
}

}  // namespace

uint32_t utf8_code_point(std::string_view sequence) {
  const auto at = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(sequence[i])); };
  switch (sequence.size()) {
    case 1: return at(0);
    case 2: return ((at(0) & 0x1f) << 6) | (at(1) & 0x3f);
    case 3: return ((at(0) & 0x0f) << 12) | ((at(1) & 0x3f) << 6) | (at(2) & 0x3f);
    default:
      return ((at(0) & 0x07) << 18) | ((at(1) & 0x3f) << 12) | ((at(2) & 0x3f) << 6) |
             (at(3) & 0x3f);
  }
}

size_t utf8_sequence_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = at(0);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;  // overlong
    if (lead == 0xed) high = 0x9f;  // surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;  // overlong
    if (lead == 0xf4) high = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || at(1) < low || at(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (at(i) < 0x80 || at(i) > 0xbf) return 0;
  }
  return length;
}

std::string escaped(std::string_view text, size_t max_bytes) {
  return escape(text, max_bytes, false);
}

std::string quote(std::string_view text, size_t max_bytes) {
  return "\"" + escape(text, max_bytes, true);
}

std::optional<size_t> invalid_utf8_offset(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII eight bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + pos, 8);
      if ((word & 0x8080808080808080ull) != 0) break;
      pos += 8;
    }
    if (pos == text.size()) break;
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t length = utf8_sequence_length(text.substr(pos));
    if (length == 0) return pos;
    pos += length;
  }
  return std::nullopt;
}

std::optional<std::string> check_text(std::string_view text) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return "contains a NUL byte at offset " + std::to_string(nul);
  }
  if (const auto bad = invalid_utf8_offset(text)) {
    return "is not valid UTF-8 at byte " + std::to_string(*bad);
  }
  return std::nullopt;
}

}  // namespace devalloc
