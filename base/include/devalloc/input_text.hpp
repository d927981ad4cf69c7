// Quoting and checking text that came from an input file, a command line or a
// plugin, so that a message about it stays short and safe to print.
//
// One helper for every message that repeats input: a value is cut to a
// bounded length (the message then says how long it was) and bytes that a
// terminal would act on are escaped, so a hostile name can neither flood
// stderr nor move the cursor, recolour or reorder what follows it.
#pragma once

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace devalloc {

// Longest excerpt of a value that a message repeats, in bytes of input.
inline constexpr size_t kMaxQuotedBytes = 200;

// `text` for a terminal: control characters (C0, DEL, C1) and the Unicode
// bidirectional overrides become \n, \t, \xNN, \u{202e}; bytes that are not
// valid UTF-8 become \xNN; a backslash becomes \\. At most max_bytes of input
// are shown; a longer value ends in "..." and " (N bytes)".
std::string escaped(std::string_view text, size_t max_bytes = kMaxQuotedBytes);

// escaped() in double quotes (a quote inside is written \"): "\"w\"".
std::string quote(std::string_view text, size_t max_bytes = kMaxQuotedBytes);

// A path at the start of a message ("<path>: reason"): escaped() with room for
// any path the system accepts (PATH_MAX is 4096 bytes).
inline std::string path_for_message(std::string_view path) { return escaped(path, 4096); }

// Length of the valid UTF-8 sequence that starts `text` (1 to 4), or 0 when
// it starts with none (an empty text, a stray byte, an overlong form, a
// surrogate, a code point above U+10FFFF).
size_t utf8_sequence_length(std::string_view text);

// The code point of `sequence`, one whole valid UTF-8 sequence (1 to 4
// bytes, as utf8_sequence_length measured it).
uint32_t utf8_code_point(std::string_view sequence);

// Offset of the first byte of `text` that does not start a valid UTF-8
// sequence (overlong forms, surrogates, above U+10FFFF), or nullopt.
std::optional<size_t> invalid_utf8_offset(std::string_view text);

// Length of the longest prefix of `text` made of bytes that a JSON string
// holds as they are and that are ASCII: none is '"', '\\', a control byte
// (below 0x20) or 0x80 and above. Sixteen bytes at a time with SSE2, then
// eight (and on other machines eight): the readers and writers of plans
// and headers spend their time in names and keys.
inline size_t plain_ascii_prefix(std::string_view text) {
  size_t i = 0;
#ifdef __SSE2__
  // Signed bytes: 0x80 and above are negative, so "below 0x20" takes them
  // with the control bytes.
  const __m128i below = _mm_set1_epi8(0x20);
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  for (; i + 16 <= text.size(); i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(text.data() + i));
    const int found = _mm_movemask_epi8(_mm_or_si128(
        _mm_cmplt_epi8(v, below),
        _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash))));
    if (found != 0) return i + static_cast<size_t>(std::countr_zero(static_cast<unsigned>(found)));
  }
#endif
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  constexpr uint64_t kHigh = 0x8080808080808080ull;
  const auto has_zero = [](uint64_t v) { return (v - kOnes) & ~v & kHigh; };
  for (; i + 8 <= text.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, text.data() + i, 8);
    // Bytes below 0x20, 0x80 and above, '"' and '\\'. A borrow can flag
    // a byte above the first one found, never one below it: the lowest
    // flag is the first such byte (little-endian: the lowest address).
    const uint64_t found = (((w - 0x20 * kOnes) & ~w) | w | has_zero(w ^ (0x22 * kOnes)) |
                            has_zero(w ^ (0x5c * kOnes))) &
                           kHigh;
    if (found != 0) {
      if constexpr (std::endian::native == std::endian::little) {
        return i + static_cast<size_t>(std::countr_zero(found) / 8);
      }
      break;
    }
  }
  for (; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte >= 0x80 || byte == '"' || byte == '\\') break;
  }
  return i;
}

// Why `text` is unfit as a name, path or option value, or nullopt when it is
// fine: "contains a NUL byte at offset 17" or "is not valid UTF-8 at byte 3".
std::optional<std::string> check_text(std::string_view text);

}  // namespace devalloc
