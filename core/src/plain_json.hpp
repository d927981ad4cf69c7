// The fast readers' JSON scanner: the plain form that devalloc's and the
// reference's writers emit, read straight from the text with no JSON values
// built. It takes strings without escapes (valid UTF-8, no control bytes),
// unsigned integers without sign, fraction, exponent or leading zero that
// fit 64 bits, true, false, null, and whitespace anywhere JSON allows it.
// Every read returns false at anything else, with no reason: a fast reader
// then gives up, and its strict reader (json_parse.hpp) reads the text
// from the start and says what is wrong. So a fast reader only needs to be
// right about what it accepts; the fuzz targets check that it is.
#pragma once

#include <devalloc/input_text.hpp>

#include <cstdint>
#include <string_view>

namespace devalloc::detail {

class PlainJson {
 public:
  explicit PlainJson(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  void space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool take(char c) {
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // Nothing but whitespace is left.
  bool at_text_end() {
    space();
    return p_ == end_;
  }
  // The text not read yet.
  std::string_view rest() const { return std::string_view(p_, static_cast<size_t>(end_ - p_)); }
  bool word(std::string_view w) {
    if (static_cast<size_t>(end_ - p_) < w.size() || std::string_view(p_, w.size()) != w) {
      return false;
    }
    p_ += w.size();
    return true;
  }

  // A string without escapes or control bytes, valid UTF-8; `out` views the
  // text.
  bool plain_string(std::string_view& out) {
    if (!take('"')) return false;
    const char* start = p_;
    while (p_ != end_) {
      p_ += plain_ascii_prefix(std::string_view(p_, static_cast<size_t>(end_ - p_)));
      if (p_ == end_) break;
      const auto byte = static_cast<unsigned char>(*p_);
      if (byte == '"') {
        out = std::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return true;
      }
      if (byte < 0x20 || byte == '\\') return false;
      if (byte < 0x80) {
        ++p_;
        continue;
      }
      const size_t length =
          utf8_sequence_length(std::string_view(p_, static_cast<size_t>(end_ - p_)));
      if (length == 0) return false;
      p_ += length;
    }
    return false;
  }

  // Digits only, no leading zero, no fraction or exponent, fits 64 bits.
  bool plain_unsigned(uint64_t& out) {
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    out = 0;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') {
        if (__builtin_mul_overflow(out, uint64_t{10}, &out) ||
            __builtin_add_overflow(out, static_cast<uint64_t>(*p_ - '0'), &out)) {
          return false;
        }
        ++p_;
      }
    }
    return p_ != end_ && *p_ != '.' && *p_ != 'e' && *p_ != 'E' && (*p_ < '0' || *p_ > '9');
  }

  // open item, item, ... close (whitespace anywhere between); item() reads
  // one and returns false to refuse it.
  template <typename Item>
  bool sequence(char open, char close, Item item) {
    if (!take(open)) return false;
    space();
    if (take(close)) return true;
    while (true) {
      if (!item()) return false;
      space();
      if (take(close)) return true;
      if (!take(',')) return false;
      space();
    }
  }

  // {"key": value, ...} with plain keys; on_member(key) reads each value.
  // A key given twice is the caller's to refuse.
  template <typename OnMember>
  bool members(OnMember on_member) {
    return sequence('{', '}', [&] {
      std::string_view key;
      if (!plain_string(key)) return false;
      space();
      if (!take(':')) return false;
      space();
      return on_member(key);
    });
  }

  // [n, n, ...] of plain unsigned integers, each passed to add().
  template <typename Add>
  bool unsigned_array(Add add) {
    return sequence('[', ']', [&] {
      uint64_t value = 0;
      return plain_unsigned(value) && add(value);
    });
  }

  // [s, s, ...] of plain strings, each passed to add().
  template <typename Add>
  bool string_array(Add add) {
    return sequence('[', ']', [&] {
      std::string_view value;
      return plain_string(value) && add(value);
    });
  }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace devalloc::detail
