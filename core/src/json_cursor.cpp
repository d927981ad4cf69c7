#include "json_cursor.hpp"

#include <charconv>
#include <cstring>

namespace devalloc::detail {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// "'x'" for a printable ASCII byte, "byte 0xff" otherwise.
std::string describe_byte(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x20 && byte < 0x7f) return std::string("'") + c + "'";
  static const char digits[] = "0123456789abcdef";
  return std::string("byte 0x") + digits[byte >> 4] + digits[byte & 0xf];
}

void append_utf8(std::string& out, uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xc0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xe0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  }
}

// Four hex digits at the start of `text` as a code unit; false, with the
// offset of the first that is not one in `bad`, otherwise.
bool hex4_value(std::string_view text, uint32_t& code, size_t& bad) {
  code = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (i == text.size()) {
      bad = i;
      return false;
    }
    const char h = text[i];
    uint32_t digit = 0;
    if (is_digit(h)) {
      digit = static_cast<uint32_t>(h - '0');
    } else if (h >= 'a' && h <= 'f') {
      digit = static_cast<uint32_t>(h - 'a' + 10);
    } else if (h >= 'A' && h <= 'F') {
      digit = static_cast<uint32_t>(h - 'A' + 10);
    } else {
      bad = i;
      return false;
    }
    code = code * 16 + digit;
  }
  return true;
}

}  // namespace

std::string JsonError::position() const {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

bool JsonCursor::fail(size_t byte, std::string reason) {
  if (!error_) error_ = JsonError{byte, 1, 1, std::move(reason)};
  return false;
}

JsonError JsonCursor::error() const {
  JsonError error = error_.value_or(JsonError{pos_, 1, 1, "no error"});
  // Line and column only now: a text read without error never counts lines.
  const size_t byte = static_cast<size_t>(std::min<uint64_t>(error.byte, text_.size()));
  size_t line_start = 0;
  for (size_t i = 0; i < byte; ++i) {
    if (text_[i] == '\n') {
      ++error.line;
      line_start = i + 1;
    }
  }
  error.column = byte - line_start + 1;
  return error;
}

bool JsonCursor::expected(const char* what) {
  if (at_end()) return fail(pos_, std::string("unexpected end of text; expected ") + what);
  return fail(pos_, std::string("expected ") + what + ", found " + describe_byte(current()));
}

bool JsonCursor::too_deep() {
  return fail(pos_, "nesting deeper than " + std::to_string(max_depth_) +
                        (max_depth_ == 1 ? " level" : " levels"));
}

bool JsonCursor::string_slow(size_t start, std::string_view& out, std::string& buffer) {
  // First without copying: a string with UTF-8 but no escape is still a
  // view of the text.
  bool copying = false;
  while (true) {
    const size_t run = plain_ascii_prefix(text_.substr(pos_));
    if (copying) buffer.append(text_.substr(pos_, run));
    pos_ += run;
    if (at_end()) return fail(start, "string is not closed");
    const char c = current();
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"') {
      if (!copying) {
        out = text_.substr(start + 1, pos_ - start - 1);
      } else {
        out = buffer;
      }
      ++pos_;
      return true;
    }
    if (byte < 0x20) {
      return fail(pos_, byte == 0 ? "NUL byte inside a string"
                                  : "control character " + describe_byte(c) +
                                        " inside a string (escape it)");
    }
    if (c == '\\') {
      if (text_.size() - pos_ < 2) return fail(start, "string is not closed");
      if (!copying) {
        buffer.assign(text_.substr(start + 1, pos_ - start - 1));
        copying = true;
      }
      if (!escape(buffer)) return false;
      continue;
    }
    // A byte of 0x80 or above (plain_ascii_prefix stops at no other).
    const size_t length = utf8_sequence_length(text_.substr(pos_));
    if (length == 0) {
      return fail(pos_, "invalid UTF-8 (" + describe_byte(c) + ") inside a string");
    }
    if (copying) buffer.append(text_.substr(pos_, length));
    pos_ += length;
  }
}

// At a backslash with a byte after it (string_slow checks).
bool JsonCursor::escape(std::string& out) {
  const size_t start = pos_;
  const char kind = text_[pos_ + 1];
  pos_ += 2;
  switch (kind) {
    case '"': out += '"'; break;
    case '\\': out += '\\'; break;
    case '/': out += '/'; break;
    case 'b': out += '\b'; break;
    case 'f': out += '\f'; break;
    case 'n': out += '\n'; break;
    case 'r': out += '\r'; break;
    case 't': out += '\t'; break;
    case 'u': {
      uint32_t code = 0;
      size_t bad = 0;
      if (!hex4_value(text_.substr(pos_), code, bad)) {
        if (pos_ + bad == text_.size()) return fail(pos_ + bad, "\\u needs four hex digits");
        return fail(pos_ + bad,
                    "\\u needs four hex digits, found " + describe_byte(text_[pos_ + bad]));
      }
      pos_ += 4;
      if (code >= 0xdc00 && code <= 0xdfff) {
        return fail(start, "\\u escape is a lone low surrogate");
      }
      if (code >= 0xd800 && code <= 0xdbff) {
        uint32_t low = 0;
        if (text_.substr(pos_, 2) != "\\u" || !hex4_value(text_.substr(pos_ + 2), low, bad) ||
            low < 0xdc00 || low > 0xdfff) {
          return fail(start, "\\u escape is a high surrogate without a low one");
        }
        pos_ += 6;
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
      }
      if (code == 0) return fail(start, "\\u0000 (NUL) inside a string");
      append_utf8(out, code);
      break;
    }
    default:
      return fail(start, "invalid escape: " + describe_byte(kind) + " after '\\'");
  }
  return true;
}

bool JsonCursor::long_unsigned(size_t start, uint64_t& out) {
  while (!at_end() && is_digit(current())) ++pos_;
  if (at_end() || (current() != '.' && current() != 'e' && current() != 'E')) {
    if (const std::optional<uint64_t> value = json_unsigned(text_.substr(start, pos_ - start))) {
      out = *value;
      return true;
    }
  }
  pos_ = start;
  return false;
}

bool JsonCursor::number_slow(JsonNumber& out) {
  const size_t start = pos_;
  if (at_end() || (current() != '-' && !is_digit(current()))) return expected("a number");
  take('-');
  if (at_end() || !is_digit(current())) return expected("a digit after '-'");
  if (!take('0')) {
    while (!at_end() && is_digit(current())) ++pos_;
  }
  if (take('.')) {
    if (at_end() || !is_digit(current())) return expected("a digit after '.'");
    while (!at_end() && is_digit(current())) ++pos_;
  }
  if (take('e') || take('E')) {
    if (!take('+')) take('-');
    if (at_end() || !is_digit(current())) return expected("a digit in the exponent");
    while (!at_end() && is_digit(current())) ++pos_;
  }
  out.text = text_.substr(start, pos_ - start);
  out.as_unsigned = json_unsigned(out.text);
  return true;
}

bool JsonCursor::literal(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) return false;
  pos_ += word.size();
  return true;
}

bool JsonCursor::boolean(bool& out) {
  space();
  if (literal("true")) {
    out = true;
    return true;
  }
  if (literal("false")) {
    out = false;
    return true;
  }
  return expected("true or false");
}

bool JsonCursor::null() {
  space();
  return literal("null") || expected("null");
}

bool JsonCursor::skip(std::string_view& text) {
  space();
  const Mark start = mark();
  std::string closers;  // of the containers open inside the value
  while (true) {
    // A value.
    JsonKind kind = JsonKind::null;
    if (!peek(kind)) return false;
    bool opened = false;
    switch (kind) {
      case JsonKind::object:
      case JsonKind::array: {
        const char open = kind == JsonKind::object ? '{' : '[';
        const char close = kind == JsonKind::object ? '}' : ']';
        if (!enter(open)) return false;
        space();
        if (take(close)) {
          --depth_;
        } else {
          closers += close;
          opened = true;
        }
        break;
      }
      case JsonKind::string: {
        std::string_view ignored;
        if (!string_into(ignored, skip_buffer_)) return false;
        break;
      }
      case JsonKind::number: {
        JsonNumber ignored;
        if (!number(ignored)) return false;
        break;
      }
      case JsonKind::boolean: {
        bool ignored = false;
        if (!boolean(ignored)) return false;
        break;
      }
      case JsonKind::null:
        if (!null()) return false;
        break;
    }
    if (opened && closers.back() == '}') {
      std::string_view ignored;
      if (!key(ignored, skip_buffer_)) return false;
      continue;
    }
    if (opened) continue;
    // After a value: the next one in the innermost open container, or
    // close it (and perhaps those around it).
    while (!closers.empty()) {
      bool more = false;
      if (!next(closers.back(), more)) return false;
      if (more) break;
      closers.pop_back();
      --depth_;
    }
    if (closers.empty()) break;
    if (closers.back() == '}') {
      std::string_view ignored;
      if (!key(ignored, skip_buffer_)) return false;
    }
  }
  text = text_since(start);
  return true;
}

bool JsonCursor::at_text_end() {
  space();
  if (at_end()) return true;
  return fail(pos_, describe_byte(current()) + " after the end of the JSON value");
}

std::optional<uint64_t> json_unsigned(std::string_view number_text) {
  if (number_text.empty() || (number_text[0] == '0' && number_text.size() > 1)) {
    return std::nullopt;
  }
  uint64_t value = 0;
  const char* first = number_text.data();
  const char* last = first + number_text.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end != last) return std::nullopt;
  return value;
}

const char* json_kind_name(std::string_view text) {
  if (text.empty()) return "nothing";
  switch (text[0]) {
    case '{': return "object";
    case '[': return "array";
    case '"': return "string";
    case 't':
    case 'f': return "boolean";
    case 'n': return "null";
    default: return "number";
  }
}

std::string json_excerpt(std::string_view text) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < text.size() && out.size() <= kMaxQuotedBytes; ++i) {
    const char c = text[i];
    const auto byte = static_cast<unsigned char>(c);
    if (!in_string) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
      if (c == '"') in_string = true;
      out += c;
      continue;
    }
    if (c == '\\') {
      // An escape as written; the byte after it is ASCII.
      out += c;
      if (i + 1 < text.size()) out += text[++i];
      continue;
    }
    if (c == '"') in_string = false;
    if (byte < 0x80) {
      out += c;
      continue;
    }
    // A UTF-8 sequence (valid: the text was read) as \u escapes.
    const size_t length = utf8_sequence_length(text.substr(i));
    if (length == 0) {
      out += "\\ufffd";
      continue;
    }
    uint32_t code = utf8_code_point(text.substr(i, length));
    i += length - 1;
    const auto u = [&](uint32_t unit) {
      static const char digits[] = "0123456789abcdef";
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += digits[(unit >> shift) & 0xf];
    };
    if (code < 0x10000) {
      u(code);
    } else {
      code -= 0x10000;
      u(0xd800 + (code >> 10));
      u(0xdc00 + (code & 0x3ff));
    }
  }
  if (out.size() <= kMaxQuotedBytes) return out;
  out.resize(kMaxQuotedBytes);
  return out + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string json_pointer_token(std::string_view key) {
  std::string token;
  for (char c : key) {
    if (c == '~') {
      token += "~0";
    } else if (c == '/') {
      token += "~1";
    } else {
      token += c;
    }
  }
  return token;
}

}  // namespace devalloc::detail
