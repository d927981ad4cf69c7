// Writing JSON text directly into a string, for the writers of plans and
// safetensors headers: a file of 100 000 tensors is not first built as a
// JSON document (whose ordered objects also look keys up one by one).
// Strings are escaped as JSON requires (quote, backslash, control
// characters; the short forms \b \f \n \r \t, else \u00xx) and otherwise
// kept as UTF-8, byte for byte what a JSON library's compact dump writes.
// A string that is not valid UTF-8 is written anyway and remembered as the
// error, which the writer reports instead of writing the file.
#pragma once

#include <devalloc/input_text.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc::detail {

class JsonText {
 public:
  // Why the text must not be written ("tensor \"w\" name is not valid UTF-8
  // at byte 1"): the first bad string met.
  const std::optional<std::string>& error() const { return error_; }
  std::string& text() { return text_; }

  void raw(std::string_view s) { text_ += s; }
  void number(uint64_t n) {
    char digits[20];
    const auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
    text_.append(digits, static_cast<size_t>(end - digits));
  }

  // `what()` names the string in the error: "tensor \"w\" name".
  template <typename What>
  void string(std::string_view s, What what) {
    static constexpr char kHex[] = "0123456789abcdef";
    text_ += '"';
    bool ascii = true;
    size_t pos = 0;
    while (pos < s.size()) {
      // Runs that need no escape go in whole; bytes of 0x80 and above are
      // kept as they are (and the string's UTF-8 is checked below).
      const size_t run = plain_ascii_prefix(s.substr(pos));
      text_.append(s.data() + pos, run);
      pos += run;
      if (pos == s.size()) break;
      const char c = s[pos++];
      switch (c) {
        case '"': text_ += "\\\""; break;
        case '\\': text_ += "\\\\"; break;
        case '\b': text_ += "\\b"; break;
        case '\f': text_ += "\\f"; break;
        case '\n': text_ += "\\n"; break;
        case '\r': text_ += "\\r"; break;
        case '\t': text_ += "\\t"; break;
        default: {
          const auto byte = static_cast<unsigned char>(c);
          if (byte < 0x20) {
            text_ += "\\u00";
            text_ += kHex[byte >> 4];
            text_ += kHex[byte & 0xf];
          } else {
            ascii = false;
            text_ += c;
          }
        }
      }
    }
    text_ += '"';
    if (!ascii && !error_) {
      if (const std::optional<size_t> bad = invalid_utf8_offset(s)) {
        error_ = what() + " is not valid UTF-8 at byte " + std::to_string(*bad);
      }
    }
  }

  template <typename T>
  void numbers(const std::vector<T>& values) {
    text_ += '[';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i != 0) text_ += ',';
      number(values[i]);
    }
    text_ += ']';
  }

 private:
  std::string text_;
  std::optional<std::string> error_;
};

}  // namespace devalloc::detail
