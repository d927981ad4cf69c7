// The one JSON reader of the safetensors header and the plan: a strict,
// bounded cursor that the readers walk in a single pass, taking each value
// straight from the text with no JSON values built.
//
// Input files come from strangers, so: time is linear in the text and
// memory bounded by the largest string; containers nest at most max_depth
// deep, checked before one is entered (no recursion in the cursor itself;
// a reader's own nesting is fixed by its format); strings are valid UTF-8
// without NUL, raw or escaped; every syntax error carries its byte and its
// line:column. What a value means (its kind, a key given twice, a key not
// known) is the reader's to judge: it asks the cursor what comes next and
// reports in its own words, showing the value as written (json_excerpt).
//
// The common form, what devalloc's and the reference's writers emit
// (strings without escapes, plain unsigned integers), costs no copy: a
// string without escapes is a view of the text.
#pragma once

#include <devalloc/input_text.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace devalloc::detail {

struct JsonError {
  uint64_t byte = 0;    // 0-based offset in the text of the byte at fault
  uint64_t line = 1;    // 1-based
  uint64_t column = 1;  // 1-based, in bytes
  std::string reason;   // "expected ',' or '}', found 'x'"

  // "line 3, column 14"
  std::string position() const;
};

enum class JsonKind { object, array, string, number, boolean, null };

// A number as written, checked against JSON's grammar.
struct JsonNumber {
  std::string_view text;
  // Set when the text is digits only (no sign, fraction or exponent) and
  // fits 64 bits: what devalloc's formats call a non-negative integer.
  std::optional<uint64_t> as_unsigned;
};

class JsonCursor {
 public:
  // The root object or array is depth 1; scalars add none.
  JsonCursor(std::string_view text, size_t max_depth) : text_(text), max_depth_(max_depth) {}
  JsonCursor(const JsonCursor&) = delete;
  JsonCursor& operator=(const JsonCursor&) = delete;

  // Skips whitespace and says what kind of value comes next; false (an
  // error) at the end of the text or at a byte that starts no value.
  bool peek(JsonKind& kind);

  // {"key": value, ...}: on_member(key) is called for each member with the
  // cursor at its value, reads it, and returns false to stop (then the
  // whole call returns false). `key` is decoded and valid until the next
  // key is read. A key given twice is the caller's to refuse (key_at()).
  template <typename OnMember>
  bool members(OnMember on_member);
  // [value, ...]: on_element(index) reads each element, as members().
  template <typename OnElement>
  bool elements(OnElement on_element);

  // A string, decoded: a view of the text when it has no escapes, else of a
  // buffer valid until the next string() (keys and skip() use their own).
  bool string(std::string_view& out);
  bool number(JsonNumber& out);
  // The common case of number(): a non-negative integer (digits only, that
  // fit 64 bits) is read into `out`; anything else, a syntax error
  // included, returns false with the cursor where it was and no error
  // recorded, for the reader to peek() and say what it found.
  bool unsigned_number(uint64_t& out);
  bool boolean(bool& out);
  bool null();
  // Any one value, its syntax and depth checked as if it were read (keys
  // given twice are the reader's to look for, and a skipped value is one
  // it refuses); `text` is the value as written, to show it.
  bool skip(std::string_view& text);
  // After the root value: nothing but whitespace.
  bool at_text_end();

  // A place in the text to come back to, to read a value again (to skip()
  // it for a message) even from inside it.
  struct Mark {
    size_t offset;
    size_t depth;
  };
  Mark mark() const { return Mark{pos_, depth_}; }
  void rewind(Mark mark) {
    pos_ = mark.offset;
    depth_ = mark.depth;
  }
  // The text from `mark` to the next unread byte.
  std::string_view text_since(Mark mark) const {
    return text_.substr(mark.offset, pos_ - mark.offset);
  }
  // Where the last key read by members() starts (its opening quote).
  size_t key_at() const { return key_at_; }

  // Records a syntax-level error at `byte` (for the reader's own findings,
  // such as a key given twice) and returns false. The first error stays.
  bool fail(size_t byte, std::string reason);
  bool failed() const { return error_.has_value(); }
  // The first error, with its line and column.
  JsonError error() const;

 private:
  bool at_end() const { return pos_ == text_.size(); }
  char current() const { return text_[pos_]; }
  void space() {
    while (pos_ != text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                    text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool take(char c) {
    if (pos_ == text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  // Opens a container at the current byte, which is `open`.
  bool enter(char open);
  // After an element or member: ',' (then true, more follows) or `close`
  // (then `more` is false); anything else is an error.
  bool next(char close, bool& more);
  bool key(std::string_view& out, std::string& buffer);
  bool string_into(std::string_view& out, std::string& buffer);
  bool string_slow(size_t start, std::string_view& out, std::string& buffer);
  bool escape(std::string& out);
  bool number_slow(JsonNumber& out);
  // unsigned_number() for a 20th digit, a fraction or an exponent: taken
  // only when the whole is still digits that fit 64 bits.
  bool long_unsigned(size_t start, uint64_t& out);
  bool literal(std::string_view word);
  // An error: `what` was expected at the current byte.
  bool expected(const char* what);
  // An error: the container at the current byte is one level too deep.
  bool too_deep();

  std::string_view text_;
  size_t max_depth_;
  size_t pos_ = 0;
  size_t depth_ = 0;
  size_t key_at_ = 0;
  std::string key_buffer_;
  std::string string_buffer_;
  // skip()'s own, so that skipping a member's value leaves its key and the
  // last string() as they were.
  std::string skip_buffer_;
  std::optional<JsonError> error_;
};

template <typename OnMember>
bool JsonCursor::members(OnMember on_member) {
  space();
  if (!enter('{')) return false;
  space();
  bool more = !take('}');
  while (more) {
    std::string_view name;
    key_at_ = pos_;
    if (!key(name, key_buffer_)) return false;
    if (!on_member(name)) return false;
    if (!next('}', more)) return false;
  }
  --depth_;
  return true;
}

template <typename OnElement>
bool JsonCursor::elements(OnElement on_element) {
  space();
  if (!enter('[')) return false;
  space();
  bool more = !take(']');
  for (size_t index = 0; more; ++index) {
    space();
    if (!on_element(index)) return false;
    if (!next(']', more)) return false;
  }
  --depth_;
  return true;
}

inline bool JsonCursor::peek(JsonKind& kind) {
  space();
  if (at_end()) return expected("a value");
  switch (current()) {
    case '{': kind = JsonKind::object; return true;
    case '[': kind = JsonKind::array; return true;
    case '"': kind = JsonKind::string; return true;
    case 't':
    case 'f': kind = JsonKind::boolean; return true;
    case 'n': kind = JsonKind::null; return true;
    default:
      if (current() == '-' || (current() >= '0' && current() <= '9')) {
        kind = JsonKind::number;
        return true;
      }
      return expected("a value");
  }
}

inline bool JsonCursor::enter(char open) {
  if (at_end() || current() != open) {
    return expected(open == '{' ? "'{'" : "'['");
  }
  if (depth_ >= max_depth_) return too_deep();
  ++pos_;
  ++depth_;
  return true;
}

inline bool JsonCursor::next(char close, bool& more) {
  space();
  if (take(close)) {
    more = false;
    return true;
  }
  if (take(',')) {
    more = true;
    space();
    return true;
  }
  return expected(close == '}' ? "',' or '}'" : "',' or ']'");
}

[[gnu::always_inline]] inline bool JsonCursor::key(std::string_view& out, std::string& buffer) {
  if (at_end() || current() != '"') return expected("a key in double quotes");
  if (!string_into(out, buffer)) return false;
  space();
  if (!take(':')) return expected("':' after a key");
  space();
  return true;
}

inline bool JsonCursor::string(std::string_view& out) {
  space();
  return string_into(out, string_buffer_);
}

// Inlined by force, as number() below: they run for every string and
// number of a header or plan, and a call costs as much as the common case.
[[gnu::always_inline]] inline bool JsonCursor::string_into(std::string_view& out,
                                                           std::string& buffer) {
  if (at_end() || current() != '"') return expected("a string");
  const size_t start = pos_;
  ++pos_;
  // The common case: printable ASCII up to the closing quote.
  pos_ += plain_ascii_prefix(text_.substr(pos_));
  if (pos_ != text_.size() && current() == '"') {
    out = text_.substr(start + 1, pos_ - start - 1);
    ++pos_;
    return true;
  }
  return string_slow(start, out, buffer);
}

[[gnu::always_inline]] inline bool JsonCursor::unsigned_number(uint64_t& out) {
  space();
  const size_t start = pos_;
  // 0, or up to 19 digits (always below 2^64) without a leading zero; then
  // a byte that cannot continue a number. Longer ones go the long way.
  if (at_end() || current() < '0' || current() > '9') return false;
  uint64_t value = 0;
  // A digit after a leading 0 does not continue the number: it is what
  // comes after it, and whoever reads on finds it out of place.
  const bool zero = current() == '0';
  if (zero) {
    ++pos_;
  } else {
    const size_t limit = start + std::min<size_t>(19, text_.size() - start);
    while (pos_ != limit && current() >= '0' && current() <= '9') {
      value = value * 10 + static_cast<uint64_t>(current() - '0');
      ++pos_;
    }
  }
  if (at_end() || (current() != '.' && current() != 'e' && current() != 'E' &&
                   (zero || current() < '0' || current() > '9'))) {
    out = value;
    return true;
  }
  return long_unsigned(start, out);
}

inline bool JsonCursor::number(JsonNumber& out) {
  space();
  const size_t start = pos_;
  uint64_t value = 0;
  if (unsigned_number(value)) {
    out.text = text_.substr(start, pos_ - start);
    out.as_unsigned = value;
    return true;
  }
  return number_slow(out);
}

// The non-negative integer a reader expects, as written; nullopt for any
// other number (a sign, a fraction, an exponent, above 64 bits).
std::optional<uint64_t> json_unsigned(std::string_view number_text);

// What kind of value `text` (a value as written) is: "object", "array",
// "string", "number", "boolean", "null".
const char* json_kind_name(std::string_view text);

// A value as written, for a message: compact (no whitespace outside
// strings), ASCII only (other characters as \u escapes, so it is safe on a
// terminal) and cut after kMaxQuotedBytes bytes, saying how long the value
// was: [1,2,3,... (10000001 bytes).
std::string json_excerpt(std::string_view text);

// A key as one JSON pointer reference token ("~" -> "~0", "/" -> "~1").
std::string json_pointer_token(std::string_view key);

}  // namespace devalloc::detail
