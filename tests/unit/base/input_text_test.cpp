// Quoting input in messages and checking names and paths (issue 9).
#include <devalloc/input_text.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace devalloc {
namespace {

TEST(Quote, GivenPlainText_ThenItIsQuotedAsIs) {
  EXPECT_EQ(quote("blk.0.attn.weight"), "\"blk.0.attn.weight\"");
  EXPECT_EQ(quote("größe"), "\"größe\"");
  EXPECT_EQ(escaped("a/b"), "a/b");
}

TEST(Quote, GivenTerminalControls_ThenTheyAreEscaped) {
  EXPECT_EQ(quote("a\x1b[2Jb"), "\"a\\x1b[2Jb\"");
  EXPECT_EQ(quote("line\nnext\ttab\r"), "\"line\\nnext\\ttab\\r\"");
  EXPECT_EQ(quote(std::string("nul\0x", 5)), "\"nul\\x00x\"");
  EXPECT_EQ(quote("del\x7f"), "\"del\\x7f\"");
  // C1 control (U+009B, CSI) and a right-to-left override.
  EXPECT_EQ(quote("c1\xc2\x9b" "31m"), "\"c1\\u{009b}31m\"");
  EXPECT_EQ(quote("abc\xe2\x80\xae" "fdp.exe"), "\"abc\\u{202e}fdp.exe\"");
  EXPECT_EQ(quote("say \"hi\" \\"), "\"say \\\"hi\\\" \\\\\"");
}

TEST(Quote, GivenInvalidUtf8_ThenEachBadByteIsShownInHex) {
  EXPECT_EQ(quote("a\xff\xfe" "b"), "\"a\\xff\\xfeb\"");
  EXPECT_EQ(quote("\xc0\xaf"), "\"\\xc0\\xaf\"");          // overlong '/'
  EXPECT_EQ(quote("\xed\xa0\x80"), "\"\\xed\\xa0\\x80\"");  // a surrogate
}

TEST(Quote, GivenLongValue_ThenCutWithItsLengthSaid) {
  const std::string value(10'000'000, 'x');
  const std::string shown = quote(value);
  EXPECT_EQ(shown, "\"" + std::string(kMaxQuotedBytes, 'x') + "...\" (10000000 bytes)");
  EXPECT_EQ(escaped("abcdef", 3), "abc... (6 bytes)");
}

TEST(Quote, GivenCutInsideACharacter_ThenTheCharacterIsLeftOutWhole) {
  // "é" is two bytes; a cut after 2 bytes keeps "a" only.
  EXPECT_EQ(quote("aé", 2), "\"a...\" (3 bytes)");
}

TEST(CheckText, GivenNulOrInvalidUtf8_ThenTheReasonGivesTheOffset) {
  EXPECT_EQ(check_text("fine/path.safetensors"), std::nullopt);
  EXPECT_EQ(check_text(std::string("model.safetensors\0/../../etc/passwd", 35)),
            "contains a NUL byte at offset 17");
  EXPECT_EQ(check_text("ab\xff"), "is not valid UTF-8 at byte 2");
  EXPECT_EQ(invalid_utf8_offset("ok\xe2\x82"), 2u);  // cut short
  EXPECT_EQ(invalid_utf8_offset("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(invalid_utf8_offset("\xf0\x9f\x98\x80"), std::nullopt);
}

// The word-at-a-time scan stops at the first byte a JSON string cannot
// hold as it is, or that is not ASCII, wherever it lies in a word of eight:
// checked at every position of texts of 1 to 40 bytes against a byte loop.
TEST(PlainAsciiPrefix, GivenEachStopByteAtEachPosition_ThenThePrefixEndsThere) {
  const char stops[] = {'"', '\\', '\0', '\x01', '\x1f', '\x80', '\xc3', '\xff'};
  const char keeps[] = {' ', '!', '#', '[', ']', '~', '\x7f', 'a'};
  for (size_t length = 1; length <= 40; ++length) {
    for (size_t at = 0; at < length; ++at) {
      for (const char keep : keeps) {
        std::string text(length, keep);
        EXPECT_EQ(plain_ascii_prefix(text), length) << int(keep);
        for (const char stop : stops) {
          text[at] = stop;
          EXPECT_EQ(plain_ascii_prefix(text), at) << length << " " << at << " " << int(stop);
          text[at] = keep;
        }
      }
    }
  }
  EXPECT_EQ(plain_ascii_prefix(""), 0u);
}

// With several stop bytes in one word (a borrow from one can flag bytes
// above it), the first is still the one found: random texts of 1 to 40
// bytes (sixteen at a time, then eight, then one) around each boundary,
// against a byte loop.
TEST(PlainAsciiPrefix, GivenRandomTextsOfBoundaryBytes_ThenThePrefixMatchesAByteLoop) {
  const char bytes[] = {'\0', '\x01', '\x1f', ' ', '!', '"', '#', '[', '\\', ']',
                        '\x7f', '\x80', '\xa2', '\xdc', '\xff', 'a'};
  const auto expected = [](const std::string& text) {
    size_t i = 0;
    while (i < text.size()) {
      const auto byte = static_cast<unsigned char>(text[i]);
      if (byte < 0x20 || byte >= 0x80 || byte == '"' || byte == '\\') break;
      ++i;
    }
    return i;
  };
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int round = 0; round < 200000; ++round) {
    std::string text(1 + next() % 40, 'a');
    // Some texts mostly plain (long prefixes), some dense with stops.
    const uint64_t density = 1 + round % 4;
    for (char& c : text) c = next() % density == 0 ? bytes[next() % sizeof bytes] : 'a';
    ASSERT_EQ(plain_ascii_prefix(text), expected(text)) << testing::PrintToString(text);
  }
}

// Past eight ASCII bytes at a time, a bad byte is still found at its offset.
TEST(CheckText, GivenLongAsciiRunsAroundABadByte_ThenItsOffsetIsExact) {
  for (size_t at = 0; at < 40; ++at) {
    std::string text(48, 'x');
    text[at] = '\xff';
    EXPECT_EQ(invalid_utf8_offset(text), at);
    text[at] = '\xc3';  // a lead byte cut short by the 'x' after it
    EXPECT_EQ(invalid_utf8_offset(text), at);
    text.replace(at, 2, "\xc3\xa9");  // a whole "é"
    EXPECT_EQ(invalid_utf8_offset(text), std::nullopt) << at;
  }
}

}  // namespace
}  // namespace devalloc
