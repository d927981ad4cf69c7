#include "json_parse.hpp"

#include <devalloc/input_text.hpp>

#include <charconv>
#include <cmath>
#include <unordered_set>
#include <vector>

namespace devalloc::detail {

namespace {

using nlohmann::json;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
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

class Parser {
 public:
  Parser(std::string_view text, size_t max_depth) : text_(text), max_depth_(max_depth) {}

  std::variant<json, JsonError> parse() {
    json root;
    skip_space();
    if (!value(root)) return std::move(*error_);
    while (!stack_.empty()) {
      if (!step()) return std::move(*error_);
    }
    if (!at_text_end()) return std::move(*error_);
    return root;
  }

  // parse_json_members: the root object's members go to on_member one by
  // one, each built alone and dropped after the call.
  std::variant<std::monostate, json, JsonError> parse_members(const MemberHandler& on_member) {
    skip_space();
    if (at_end() || text_[pos_] != '{') {
      auto whole = parse();
      if (auto* error = std::get_if<JsonError>(&whole)) return std::move(*error);
      return std::move(std::get<json>(whole));
    }
    json root;  // stays empty: members go to member_ instead
    if (!value(root)) return std::move(*error_);
    on_member_ = &on_member;
    while (!stack_.empty()) {
      if (!step()) {
        if (stopped_) return std::monostate{};
        return std::move(*error_);
      }
      if (member_open_ && stack_.size() == 1 && !emit_member()) return std::monostate{};
    }
    if (!at_text_end()) return std::move(*error_);
    return std::monostate{};
  }

 private:
  // One open object or array.
  struct Frame {
    json* container;
    size_t count = 0;  // members or elements read so far
    std::string key;   // objects: the key of the member being read
  };

  bool fail(size_t byte, std::string reason) {
    JsonError error;
    error.byte = byte;
    error.line = line_;
    // A failing byte is never before the start of its line: lines only
    // advance in whitespace, which is read before any byte after it.
    error.column = byte - line_start_ + 1;
    error.reason = std::move(reason);
    error_ = std::move(error);
    return false;
  }

  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) {
      if (text_[pos_] == '\n') {
        ++line_;
        line_start_ = pos_ + 1;
      }
      ++pos_;
    }
  }

  bool at_end() const { return pos_ >= text_.size(); }

  // After the root value: nothing but whitespace.
  bool at_text_end() {
    skip_space();
    if (pos_ == text_.size()) return true;
    return fail(pos_, describe_byte(text_[pos_]) + " after the end of the JSON value");
  }

  // Hands the finished root member to the handler; false when it said stop.
  bool emit_member() {
    member_open_ = false;
    Frame& root = stack_.front();
    if (!(*on_member_)(root.key, std::move(member_))) {
      stopped_ = true;
      return false;
    }
    member_ = nullptr;
    return true;
  }

  // Reads the next member or element of the innermost container, or closes it.
  bool step() {
    Frame& frame = stack_.back();
    const bool is_object = frame.container->is_object();
    const char close = is_object ? '}' : ']';
    skip_space();
    if (at_end()) {
      return fail(pos_, std::string("unexpected end of text; expected '") + close + "'");
    }
    if (text_[pos_] == close) {
      ++pos_;
      stack_.pop_back();
      return true;
    }
    if (frame.count > 0) {
      if (text_[pos_] != ',') {
        return fail(pos_, "expected ',' or '" + std::string(1, close) + "', found " +
                              describe_byte(text_[pos_]));
      }
      ++pos_;
      skip_space();
    }
    ++frame.count;
    if (!is_object) {
      frame.container->push_back(nullptr);
      return value(frame.container->back());
    }
    if (at_end() || text_[pos_] != '"') {
      return fail(pos_, at_end() ? "unexpected end of text; expected a key"
                                 : "expected a key in double quotes, found " +
                                       describe_byte(text_[pos_]));
    }
    const size_t key_at = pos_;
    std::string key;
    if (!string(key)) return false;
    // Streamed root members are checked against the keys seen, not a map.
    const bool streamed = on_member_ != nullptr && stack_.size() == 1;
    json* slot = nullptr;
    bool twice = false;
    if (streamed) {
      twice = !root_keys_.insert(key).second;
      slot = &member_;
      member_open_ = true;
    } else {
      // One lookup for the duplicate check and the insertion, hinted at
      // the end: writers mostly emit keys in order, and then it costs no
      // search.
      auto& members = frame.container->get_ref<json::object_t&>();
      const size_t before = members.size();
      slot = &members.emplace_hint(members.end(), key, nullptr)->second;
      twice = members.size() == before;
    }
    if (twice) {
      fail(key_at, "key appears twice in one object");
      error_->duplicate = DuplicateKey{pointer_to_top(), key};
      return false;
    }
    skip_space();
    if (at_end() || text_[pos_] != ':') {
      return fail(pos_, at_end() ? "unexpected end of text; expected ':'"
                                 : "expected ':' after a key, found " +
                                       describe_byte(text_[pos_]));
    }
    ++pos_;
    skip_space();
    frame.key = std::move(key);
    return value(*slot);
  }

  // JSON pointer of the innermost container.
  std::string pointer_to_top() const {
    std::string pointer;
    for (size_t i = 0; i + 1 < stack_.size(); ++i) {
      const Frame& frame = stack_[i];
      pointer += '/';
      pointer += frame.container->is_object() ? json_pointer_token(frame.key)
                                              : std::to_string(frame.count - 1);
    }
    return pointer;
  }

  // A scalar into `slot`, or an empty container there that step() fills.
  bool value(json& slot) {
    if (at_end()) return fail(pos_, "unexpected end of text; expected a value");
    const char c = text_[pos_];
    if (c == '{' || c == '[') {
      if (stack_.size() >= max_depth_) {
        return fail(pos_, "nesting deeper than " + std::to_string(max_depth_) +
                              (max_depth_ == 1 ? " level" : " levels"));
      }
      ++pos_;
      slot = c == '{' ? json::object() : json::array();
      stack_.push_back(Frame{&slot, 0, {}});
      return true;
    }
    if (c == '"') {
      std::string text;
      if (!string(text)) return false;
      slot = std::move(text);
      return true;
    }
    if (c == '-' || is_digit(c)) return number(slot);
    for (const auto& [word, literal] :
         {std::pair<std::string_view, json>{"true", true}, {"false", false}, {"null", nullptr}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        slot = literal;
        return true;
      }
    }
    return fail(pos_, "expected a value, found " + describe_byte(c));
  }

  bool string(std::string& out) {
    const size_t start = pos_;
    ++pos_;  // the opening quote
    while (true) {
      if (at_end()) return fail(start, "string is not closed");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      const auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20) {
        return fail(pos_, byte == 0 ? "NUL byte inside a string"
                                    : "control character " + describe_byte(c) +
                                          " inside a string (escape it)");
      }
      if (c == '\\') {
        if (!escape(out)) return false;
        continue;
      }
      const size_t length = devalloc::utf8_sequence_length(text_.substr(pos_));
      if (length == 0) {
        return fail(pos_, "invalid UTF-8 (" + describe_byte(c) + ") inside a string");
      }
      out.append(text_.substr(pos_, length));
      pos_ += length;
    }
  }

  bool hex4(size_t at, uint32_t& code) {
    if (text_.size() - at < 4) return fail(at, "\\u needs four hex digits");
    code = 0;
    for (size_t i = at; i < at + 4; ++i) {
      const char h = text_[i];
      uint32_t digit = 0;
      if (is_digit(h)) {
        digit = static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        digit = static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        digit = static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return fail(i, "\\u needs four hex digits, found " + describe_byte(h));
      }
      code = code * 16 + digit;
    }
    return true;
  }

  bool escape(std::string& out) {
    const size_t start = pos_;
    if (text_.size() - pos_ < 2) return fail(start, "string is not closed");
    const char kind = text_[pos_ + 1];
    pos_ += 2;
    switch (kind) {
      case '"': out += '"'; return true;
      case '\\': out += '\\'; return true;
      case '/': out += '/'; return true;
      case 'b': out += '\b'; return true;
      case 'f': out += '\f'; return true;
      case 'n': out += '\n'; return true;
      case 'r': out += '\r'; return true;
      case 't': out += '\t'; return true;
      case 'u': break;
      default: return fail(start, "invalid escape: " + describe_byte(kind) + " after '\\'");
    }
    uint32_t code = 0;
    if (!hex4(pos_, code)) return false;
    pos_ += 4;
    if (code >= 0xdc00 && code <= 0xdfff) {
      return fail(start, "\\u escape is a lone low surrogate");
    }
    if (code >= 0xd800 && code <= 0xdbff) {
      uint32_t low = 0;
      if (text_.substr(pos_, 2) != "\\u" || !hex4(pos_ + 2, low) || low < 0xdc00 ||
          low > 0xdfff) {
        error_.reset();
        return fail(start, "\\u escape is a high surrogate without a low one");
      }
      pos_ += 6;
      code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
    }
    if (code == 0) return fail(start, "\\u0000 (NUL) inside a string");
    append_utf8(out, code);
    return true;
  }

  bool number(json& slot) {
    const size_t start = pos_;
    size_t end = pos_;
    if (text_[end] == '-') ++end;
    if (end >= text_.size() || !is_digit(text_[end])) {
      return fail(end, "expected a digit after '-'");
    }
    if (text_[end] == '0') {
      ++end;
    } else {
      while (end < text_.size() && is_digit(text_[end])) ++end;
    }
    bool integral = true;
    if (end < text_.size() && text_[end] == '.') {
      integral = false;
      ++end;
      if (end >= text_.size() || !is_digit(text_[end])) {
        return fail(end, "expected a digit after '.'");
      }
      while (end < text_.size() && is_digit(text_[end])) ++end;
    }
    if (end < text_.size() && (text_[end] == 'e' || text_[end] == 'E')) {
      integral = false;
      ++end;
      if (end < text_.size() && (text_[end] == '+' || text_[end] == '-')) ++end;
      if (end >= text_.size() || !is_digit(text_[end])) {
        return fail(end, "expected a digit in the exponent");
      }
      while (end < text_.size() && is_digit(text_[end])) ++end;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + end;
    pos_ = end;
    if (integral) {
      if (*first == '-') {
        int64_t signed_value = 0;
        if (std::from_chars(first, last, signed_value).ec == std::errc()) {
          // "-0" is the float -0.0, as the reference safetensors reader
          // reads it: not an integer, so never a size or an offset.
          if (signed_value == 0) {
            slot = -0.0;
          } else {
            slot = signed_value;
          }
          return true;
        }
      } else {
        uint64_t unsigned_value = 0;
        if (std::from_chars(first, last, unsigned_value).ec == std::errc()) {
          slot = unsigned_value;
          return true;
        }
      }
      // Too long for 64 bits: kept as a double, which no reader takes as an
      // integer, so it is refused where an integer was expected.
    }
    double real = 0;
    const auto parsed = std::from_chars(first, last, real);
    if (parsed.ec != std::errc() || !std::isfinite(real)) {
      const size_t shown = std::min<size_t>(end - start, 32);
      return fail(start, "number " + std::string(text_.substr(start, shown)) +
                             (shown < end - start ? "..." : "") +
                             " is out of the range of a 64-bit float");
    }
    slot = real;
    return true;
  }

  std::string_view text_;
  size_t max_depth_;
  size_t pos_ = 0;
  uint64_t line_ = 1;
  size_t line_start_ = 0;
  std::vector<Frame> stack_;
  std::optional<JsonError> error_;
  // parse_members only.
  const MemberHandler* on_member_ = nullptr;
  json member_;               // the root member being read
  bool member_open_ = false;  // member_ is being read, not yet handed over
  bool stopped_ = false;      // the handler said stop
  std::unordered_set<std::string> root_keys_;
};

}  // namespace

std::string JsonError::position() const {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::variant<json, JsonError> parse_json(std::string_view text, size_t max_depth) {
  return Parser(text, max_depth).parse();
}

std::variant<std::monostate, json, JsonError> parse_json_members(std::string_view text,
                                                                 size_t max_depth,
                                                                 const MemberHandler& on_member) {
  return Parser(text, max_depth).parse_members(on_member);
}

std::string json_excerpt(const json& value) {
  std::string text = value.dump(-1, ' ', true);
  if (text.size() <= kMaxQuotedBytes) return text;
  const size_t total = text.size();
  text.resize(kMaxQuotedBytes);
  return text + "... (" + std::to_string(total) + " bytes)";
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
