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
  void number(uint64_t n) { text_ += std::to_string(n); }

  // `what()` names the string in the error: "tensor \"w\" name".
  template <typename What>
  void string(std::string_view s, What what) {
    if (const std::optional<size_t> bad = invalid_utf8_offset(s); bad && !error_) {
      error_ = what() + " is not valid UTF-8 at byte " + std::to_string(*bad);
    }
    static constexpr char kHex[] = "0123456789abcdef";
    text_ += '"';
    for (const char c : s) {
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
            text_ += c;
          }
        }
      }
    }
    text_ += '"';
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
