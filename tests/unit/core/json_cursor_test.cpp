#include "json_cursor.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace devalloc::detail {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

// "byte 3 (1:4) reason": the byte at fault, its line:column, and why.
std::string describe(const JsonError& error) {
  return "byte " + std::to_string(error.byte) + " (" + std::to_string(error.line) + ":" +
         std::to_string(error.column) + ") " + error.reason;
}

// The error of `read` (which must fail) on `text`.
template <typename Read>
std::string read_error(std::string_view text, Read read, size_t max_depth = 64) {
  JsonCursor cursor(text, max_depth);
  EXPECT_FALSE(read(cursor)) << text;
  EXPECT_TRUE(cursor.failed()) << text;
  return describe(cursor.error());
}

// The error of reading `text` as one value (skip()) and its end.
std::string skip_error(std::string_view text, size_t max_depth = 64) {
  const auto skip = [](JsonCursor& cursor) {
    std::string_view value;
    return cursor.skip(value) && cursor.at_text_end();
  };
  return read_error(text, skip, max_depth);
}

TEST(JsonCursor, GivenNestedDocument_WhenWalked_ThenEveryValueIsRead) {
  JsonCursor cursor(R"({"a": [1, 2, 3], "b": {"c": true, "d": null}, "e": "x"})", 2);
  std::vector<std::string> keys;
  std::vector<JsonKind> kinds;
  std::vector<uint64_t> a;
  bool c = false;
  std::string_view e;
  const auto peek = [&] {
    JsonKind kind = JsonKind::null;
    if (!cursor.peek(kind)) return false;
    kinds.push_back(kind);
    return true;
  };
  ASSERT_TRUE(peek());
  const bool read = cursor.members([&](std::string_view key) {
    keys.emplace_back(key);
    if (!peek()) return false;
    if (key == "a") {
      return cursor.elements([&](size_t index) {
        uint64_t number = 0;
        if (index != a.size() || !cursor.unsigned_number(number)) return false;
        a.push_back(number);
        return true;
      });
    }
    if (key == "b") {
      return cursor.members([&](std::string_view inner) {
        keys.emplace_back(inner);
        return peek() && (inner == "c" ? cursor.boolean(c) : cursor.null());
      });
    }
    return cursor.string(e);
  });
  ASSERT_TRUE(read) << describe(cursor.error());
  EXPECT_TRUE(cursor.at_text_end());
  EXPECT_FALSE(cursor.failed());
  EXPECT_THAT(keys, ElementsAre("a", "b", "c", "d", "e"));
  EXPECT_THAT(kinds, ElementsAre(JsonKind::object, JsonKind::array, JsonKind::object,
                                 JsonKind::boolean, JsonKind::null, JsonKind::string));
  EXPECT_THAT(a, ElementsAre(1u, 2u, 3u));
  EXPECT_TRUE(c);
  EXPECT_EQ(e, "x");
}

TEST(JsonCursor, GivenEachFirstByte_ThenPeekSaysTheKindAndEmptyContainersCallNothing) {
  const std::pair<std::string_view, JsonKind> cases[] = {
      {"{}", JsonKind::object},     {" [ ]", JsonKind::array}, {"\"\"", JsonKind::string},
      {"-1", JsonKind::number},     {"7", JsonKind::number},   {"true", JsonKind::boolean},
      {"false", JsonKind::boolean}, {"null", JsonKind::null}};
  for (const auto& [text, expected] : cases) {
    JsonCursor cursor(text, 1);
    JsonKind kind = JsonKind::null;
    EXPECT_TRUE(cursor.peek(kind) && kind == expected) << text;
  }
  JsonCursor object("{ } [\n] ", 1);
  EXPECT_TRUE(object.members([](std::string_view) { return false; }));
  EXPECT_TRUE(object.elements([](size_t) { return false; }));
  EXPECT_TRUE(object.at_text_end());
}

TEST(JsonCursor, GivenValueOfAnotherKind_WhenReadAsOne_ThenTheErrorSaysWhatWasFound) {
  const auto any_member = [](JsonCursor& c) {
    return c.members([](std::string_view) { return true; });
  };
  EXPECT_EQ(read_error("[1]", any_member), "byte 0 (1:1) expected '{', found '['");
  EXPECT_EQ(read_error("{a: 1}", any_member),
            "byte 1 (1:2) expected a key in double quotes, found 'a'");
  std::string_view s;
  EXPECT_EQ(read_error(" 1", [&](JsonCursor& c) { return c.string(s); }),
            "byte 1 (1:2) expected a string, found '1'");
  EXPECT_EQ(read_error("nul", [](JsonCursor& c) { return c.null(); }),
            "byte 0 (1:1) expected null, found 'n'");
  JsonKind kind = JsonKind::null;
  EXPECT_EQ(read_error("  ", [&](JsonCursor& c) { return c.peek(kind); }),
            "byte 2 (1:3) unexpected end of text; expected a value");
  EXPECT_EQ(read_error("\x01", [&](JsonCursor& c) { return c.peek(kind); }),
            "byte 0 (1:1) expected a value, found byte 0x01");
}

// A string without escapes, UTF-8 or not, is a view of the text.
TEST(JsonCursor, GivenStrings_ThenEscapesAreDecodedAndOthersAreViewsOfTheText) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {R"("plain text")", "plain text"},
      {"\"h\xc3\xa9llo \xf0\x9f\x98\x80\"", "h\xc3\xa9llo \xf0\x9f\x98\x80"},
      {R"("q\"b\\s\/c\b\f\n\r\t.")", "q\"b\\s/c\b\f\n\r\t."},
      {R"("\u00e9\u00E9\u0041\u20ac")", "\xc3\xa9\xc3\xa9" "A\xe2\x82\xac"},
      {R"("\ud83d\ude00")", "\xf0\x9f\x98\x80"},
      {"\"\xc3\xa9\\n\xc3\xa9 x\"", "\xc3\xa9\n\xc3\xa9 x"}};
  for (const auto& [text, expected] : cases) {
    JsonCursor cursor(text, 1);
    std::string_view value;
    ASSERT_TRUE(cursor.string(value)) << describe(cursor.error());
    EXPECT_EQ(value, expected) << text;
    const bool view = text.find('\\') == std::string_view::npos;
    EXPECT_EQ(value.data() == text.data() + 1, view) << text;
    EXPECT_TRUE(cursor.at_text_end());
  }
}

TEST(JsonCursor, GivenEscapedKeyAndValue_WhenTheValueIsRead_ThenTheKeyIsStillValid) {
  const std::string_view text =
      R"({"k\u00e9y": "v\u00e0lue, longer than the key", "\u0032": "\u0033"})";
  JsonCursor cursor(text, 1);
  std::vector<std::pair<std::string, std::string>> members;
  ASSERT_TRUE(cursor.members([&](std::string_view key) {
    std::string_view value;
    if (!cursor.string(value)) return false;
    members.emplace_back(key, value);
    return true;
  })) << describe(cursor.error());
  EXPECT_THAT(members, ElementsAre(Pair("k\xc3\xa9y", "v\xc3\xa0lue, longer than the key"),
                                   Pair("2", "3")));
}

// A reader that refuses a member's value skips it to show it, and then
// names the member: the key, its place and a string read before outlive
// the skip.
TEST(JsonCursor, GivenEscapedKey_WhenItsValueIsSkipped_ThenTheKeyAndTheLastStringStayValid) {
  const std::string long_key(100, 'y');
  const std::string text = R"({"first": "\u0061bc", "\u0066ormat": {"\u0078)" + long_key +
                           R"(": "\u0078"}})";
  JsonCursor cursor(text, 2);
  std::string_view first;
  std::vector<std::string> keys_after_skip;
  size_t key_at_after_skip = 0;
  ASSERT_TRUE(cursor.members([&](std::string_view key) {
    if (key == "first") return cursor.string(first);
    std::string_view value;
    if (!cursor.skip(value)) return false;
    keys_after_skip.emplace_back(key);
    key_at_after_skip = cursor.key_at();
    return true;
  })) << describe(cursor.error());
  EXPECT_THAT(keys_after_skip, ElementsAre("format"));
  EXPECT_EQ(first, "abc");
  // key_at() is still the member's key, not one inside the skipped value.
  EXPECT_EQ(key_at_after_skip, text.find("\\u0066ormat") - 1);
}

TEST(JsonCursor, GivenBadString_ThenTheErrorIsAtTheByteAtFault) {
  EXPECT_EQ(skip_error(R"(["abc)"), "byte 1 (1:2) string is not closed");
  EXPECT_EQ(skip_error(R"(["ab\)"), "byte 1 (1:2) string is not closed");
  EXPECT_EQ(skip_error(std::string("[\"a\0b\"]", 7)), "byte 3 (1:4) NUL byte inside a string");
  EXPECT_EQ(skip_error(R"(["a\u0000"])"), "byte 3 (1:4) \\u0000 (NUL) inside a string");
  EXPECT_EQ(skip_error("[\"a\tb\"]"),
            "byte 3 (1:4) control character byte 0x09 inside a string (escape it)");
  EXPECT_EQ(skip_error("[\"a\xff" "b\"]"),
            "byte 3 (1:4) invalid UTF-8 (byte 0xff) inside a string");
  EXPECT_EQ(skip_error(R"(["\x"])"), "byte 2 (1:3) invalid escape: 'x' after '\\'");
  EXPECT_EQ(skip_error(R"(["\u12"])"), "byte 6 (1:7) \\u needs four hex digits, found '\"'");
  EXPECT_EQ(skip_error(R"(["\udc00"])"), "byte 2 (1:3) \\u escape is a lone low surrogate");
  EXPECT_EQ(skip_error(R"(["\ud83d"])"),
            "byte 2 (1:3) \\u escape is a high surrogate without a low one");
  EXPECT_EQ(skip_error(R"(["\ud83d\u0041"])"),
            "byte 2 (1:3) \\u escape is a high surrogate without a low one");
}

TEST(JsonCursor, GivenBadStructure_ThenTheErrorIsAtTheByteAtFault) {
  EXPECT_EQ(skip_error("[1,]"), "byte 3 (1:4) expected a value, found ']'");
  EXPECT_EQ(skip_error(R"({"a": 1,})"), "byte 8 (1:9) expected a key in double quotes, found '}'");
  EXPECT_EQ(skip_error(R"({"a" 1})"), "byte 5 (1:6) expected ':' after a key, found '1'");
  EXPECT_EQ(skip_error("[1 2]"), "byte 3 (1:4) expected ',' or ']', found '2'");
  EXPECT_EQ(skip_error("{} x"), "byte 3 (1:4) 'x' after the end of the JSON value");
  EXPECT_EQ(skip_error("[1, "), "byte 4 (1:5) unexpected end of text; expected a value");
  EXPECT_EQ(skip_error(R"({"a": )"), "byte 6 (1:7) unexpected end of text; expected a value");
  EXPECT_EQ(skip_error(""), "byte 0 (1:1) unexpected end of text; expected a value");
  EXPECT_EQ(skip_error(R"({"a": [1, tru]})"), "byte 10 (1:11) expected true or false, found 't'");
  EXPECT_EQ(skip_error("{\n  \"a\": 1,\n  \"b\": x\n}"),
            "byte 19 (3:8) expected a value, found 'x'");
  JsonCursor cursor("\n\n  x", 1);
  EXPECT_FALSE(cursor.null());
  EXPECT_EQ(cursor.error().position(), "line 3, column 3");
}

TEST(JsonCursor, GivenMaxDepth_ThenDeeperContainersAreRefusedAtTheirOpeningByte) {
  JsonCursor cursor("[[1]]", 2);
  std::string_view value;
  ASSERT_TRUE(cursor.skip(value));
  EXPECT_EQ(value, "[[1]]");
  EXPECT_EQ(skip_error("[[[1]]]", 2), "byte 2 (1:3) nesting deeper than 2 levels");
  EXPECT_EQ(skip_error("[[1]]", 1), "byte 1 (1:2) nesting deeper than 1 level");
  // An empty container counts too: depth is checked before it is entered.
  EXPECT_EQ(skip_error(R"({"a": {"b": {}}})", 2), "byte 12 (1:13) nesting deeper than 2 levels");
  // skip() counts the levels the reader has entered.
  const auto skip_inside = [](JsonCursor& c) {
    return c.elements([&](size_t) {
      std::string_view ignored;
      return c.skip(ignored);
    });
  };
  EXPECT_EQ(read_error("[[[1]]]", skip_inside, 2), "byte 2 (1:3) nesting deeper than 2 levels");
}

TEST(JsonCursor, GivenHundredThousandNestedArrays_ThenRefusedAtTheLimitAndReadWithoutRecursion) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(skip_error(deep, 64), "byte 64 (1:65) nesting deeper than 64 levels");
  JsonCursor cursor(deep, 100000);
  std::string_view value;
  EXPECT_TRUE(cursor.skip(value) && value.size() == deep.size() && cursor.at_text_end());
}

TEST(JsonCursor, GivenNonNegativeIntegers_ThenUnsignedNumberReadsThem) {
  const std::pair<std::string_view, uint64_t> cases[] = {
      {"0", 0}, {"12345", 12345}, {" 7", 7}, {"9999999999999999999", 9999999999999999999u},
      {"10000000000000000000", 10000000000000000000u}, {"18446744073709551615", kMax64}};
  for (const auto& [text, expected] : cases) {
    JsonCursor cursor(text, 1);
    uint64_t value = 1;
    ASSERT_TRUE(cursor.unsigned_number(value)) << text;
    EXPECT_EQ(value, expected) << text;
    EXPECT_TRUE(cursor.at_text_end()) << text;
  }
}

TEST(JsonCursor, GivenAnythingElse_WhenReadAsUnsigned_ThenFalseWithTheCursorUnmovedAndNoError) {
  for (const std::string_view text :
       {"-1", "1.5", "1e3", "2E3", "0.5", "0e1", "1234567890123456789.5", "12345678901234567890e1",
        "18446744073709551616", "123456789012345678901", "\"7\"", "true", "[1]"}) {
    JsonCursor cursor(text, 1);
    uint64_t value = 0;
    EXPECT_FALSE(cursor.unsigned_number(value)) << text;
    EXPECT_EQ(cursor.mark().offset, 0u) << text;
    EXPECT_FALSE(cursor.failed()) << text;
    std::string_view skipped;
    ASSERT_TRUE(cursor.skip(skipped)) << text;
    EXPECT_EQ(skipped, text);
    EXPECT_TRUE(cursor.at_text_end()) << text;
  }
}

// A leading zero ends the number: the digit after it is what comes next.
TEST(JsonCursor, GivenLeadingZero_ThenZeroIsReadAndTheNextDigitIsOutOfPlace) {
  JsonCursor cursor("[01]", 1);
  uint64_t value = 9;
  EXPECT_FALSE(cursor.elements([&](size_t) { return cursor.unsigned_number(value); }));
  EXPECT_EQ(value, 0u);
  EXPECT_EQ(describe(cursor.error()), "byte 2 (1:3) expected ',' or ']', found '1'");
  EXPECT_EQ(skip_error("[01]"), "byte 2 (1:3) expected ',' or ']', found '1'");
}

TEST(JsonCursor, GivenNumbers_ThenNumberKeepsTheTextAndSetsAsUnsignedOnlyForPlainIntegers) {
  const std::pair<std::string_view, std::optional<uint64_t>> cases[] = {
      {"0", 0},        {"42", 42},          {"18446744073709551615", kMax64},
      {"-0", {}},      {"-12", {}},         {"18446744073709551616", {}},
      {"1.0", {}},     {"1E+2", {}},        {"2e-3", {}},
      {"-0.5e10", {}}, {"01", 0}};
  for (const auto& [written, as_unsigned] : cases) {
    const std::string text = std::string(written) + " ,";
    JsonCursor cursor(text, 1);
    JsonNumber number;
    ASSERT_TRUE(cursor.number(number)) << written;
    const std::string_view expected_text = written == "01" ? "0" : written;
    EXPECT_EQ(number.text, expected_text);
    EXPECT_EQ(number.text.data(), text.data());
    EXPECT_EQ(number.as_unsigned, as_unsigned) << written;
    EXPECT_EQ(cursor.mark().offset, expected_text.size()) << written;
  }
}

TEST(JsonCursor, GivenNumberAgainstTheGrammar_ThenTheErrorIsAtTheByteAtFault) {
  const auto number = [](JsonCursor& c) {
    JsonNumber ignored;
    return c.number(ignored);
  };
  EXPECT_EQ(read_error("x", number), "byte 0 (1:1) expected a number, found 'x'");
  EXPECT_EQ(read_error("-x", number), "byte 1 (1:2) expected a digit after '-', found 'x'");
  EXPECT_EQ(read_error("-", number),
            "byte 1 (1:2) unexpected end of text; expected a digit after '-'");
  EXPECT_EQ(read_error("1.x", number), "byte 2 (1:3) expected a digit after '.', found 'x'");
  EXPECT_EQ(read_error("1ex", number), "byte 2 (1:3) expected a digit in the exponent, found 'x'");
  EXPECT_EQ(read_error("1e+", number),
            "byte 3 (1:4) unexpected end of text; expected a digit in the exponent");
}

TEST(JsonCursor, GivenEachKindOfValue_WhenSkipped_ThenItsTextAsWrittenAndTheCursorAfterIt) {
  const std::string_view text =
      R"( [ {"a" : [1, {}], "b": "x\"y"} , [ ] , "s\u00e9" , -1.5e3 , true , false , null ] )";
  JsonCursor cursor(text, 4);
  std::vector<std::string> skipped;
  ASSERT_TRUE(cursor.elements([&](size_t) {
    std::string_view value;
    if (!cursor.skip(value)) return false;
    skipped.emplace_back(value);
    return true;
  })) << describe(cursor.error());
  EXPECT_TRUE(cursor.at_text_end());
  EXPECT_THAT(skipped, ElementsAre(R"({"a" : [1, {}], "b": "x\"y"})", "[ ]", R"("s\u00e9")",
                                   "-1.5e3", "true", "false", "null"));
}

// elements() stopped early leaves the array's level open; with max_depth 2,
// skip() can enter the array again only if rewind() restored the depth.
TEST(JsonCursor, GivenElementsStoppedEarly_WhenRewoundToTheArray_ThenItIsSkippedWhole) {
  JsonCursor cursor(R"({"size": [1, "x", 3], "next": 4})", 2);
  uint64_t size = 0;
  std::string shown;
  uint64_t next = 0;
  ASSERT_TRUE(cursor.members([&](std::string_view key) {
    if (key == "next") return cursor.unsigned_number(next);
    const JsonCursor::Mark start = cursor.mark();
    EXPECT_FALSE(cursor.elements([&](size_t) { return cursor.unsigned_number(size); }));
    EXPECT_FALSE(cursor.failed());
    EXPECT_EQ(cursor.text_since(start), "[1, ");
    cursor.rewind(start);
    std::string_view value;
    if (!cursor.skip(value)) return false;
    shown = json_excerpt(value);
    return true;
  })) << describe(cursor.error());
  EXPECT_TRUE(cursor.at_text_end());
  EXPECT_EQ(size, 1u);
  EXPECT_EQ(shown, R"([1,"x",3])");
  EXPECT_EQ(next, 4u);
}

TEST(JsonCursor, GivenValueAsWritten_ThenExcerptIsCompactAsciiWithStringsAsWritten) {
  EXPECT_EQ(json_excerpt("[ 1 , 2 ]"), "[1,2]");
  EXPECT_EQ(json_excerpt("{\n  \"a b\" :\t\"c  d\"\r\n}"), R"({"a b":"c  d"})");
  // An escaped quote or backslash does not end the string.
  EXPECT_EQ(json_excerpt(R"([ "\" ]" , "\\" , 1 ])"), R"(["\" ]","\\",1])");
  EXPECT_EQ(json_excerpt(R"("\u00e9\n")"), R"("\u00e9\n")");
  EXPECT_EQ(json_excerpt("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""),
            R"("caf\u00e9 \u20ac \ud83d\ude00")");
}

TEST(JsonCursor, GivenValueLongerThanTheLimit_ThenExcerptIsCutAndSaysTheLengthAsWritten) {
  ASSERT_EQ(kMaxQuotedBytes, 200u);
  const std::string fits = "\"" + std::string(198, 'a') + "\"";
  EXPECT_EQ(json_excerpt(fits), fits);
  const std::string over = "\"" + std::string(199, 'a') + "\"";
  EXPECT_EQ(json_excerpt(over), over.substr(0, 200) + "... (201 bytes)");
  // 150 ones, 450 bytes as written: cut after the first 100 (200 bytes).
  std::string spaced = "[1";
  for (int i = 1; i < 150; ++i) spaced += ", 1";
  spaced += "]";
  std::string compact = "[1";
  for (int i = 1; i < 100; ++i) compact += ",1";
  EXPECT_EQ(json_excerpt(spaced), compact + "... (450 bytes)");
}

TEST(JsonCursor, GivenValueAsWritten_ThenKindNameFollowsItsFirstByte) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"{}", "object"},   {"[1]", "array"},      {"\"s\"", "string"}, {"-1", "number"},
      {"0.5", "number"},  {"true", "boolean"},   {"false", "boolean"}, {"null", "null"},
      {"", "nothing"}};
  for (const auto& [text, name] : cases) EXPECT_EQ(json_kind_name(text), name) << text;
}

TEST(JsonCursor, GivenKeyWithSlashAndTilde_ThenPointerTokenEscapesThem) {
  EXPECT_EQ(json_pointer_token("a/b~c"), "a~1b~0c");
  EXPECT_EQ(json_pointer_token("~1"), "~01");
}

TEST(JsonCursor, GivenNumberText_ThenJsonUnsignedTakesOnlyPlainIntegersThatFit) {
  EXPECT_EQ(json_unsigned("0"), 0u);
  EXPECT_EQ(json_unsigned("1234"), 1234u);
  EXPECT_EQ(json_unsigned("18446744073709551615"), kMax64);
  for (const std::string_view text : {"", "00", "01", "-0", "-1", "+1", " 1", "1 ", "1.0", "1e3",
                                      "18446744073709551616", "99999999999999999999"}) {
    EXPECT_EQ(json_unsigned(text), std::nullopt) << '"' << text << '"';
  }
}

// A reader's own finding (a key given twice) is placed like a syntax error.
TEST(JsonCursor, GivenKeyGivenTwice_WhenReaderFailsAtKeyAt_ThenErrorIsThereAndTheFirstStays) {
  JsonCursor cursor("{\n  \"a\": 1,\n  \"a\": 2\n}", 1);
  std::set<std::string, std::less<>> seen;
  std::vector<size_t> key_at;
  EXPECT_FALSE(cursor.members([&](std::string_view key) {
    key_at.push_back(cursor.key_at());
    if (!seen.emplace(key).second) return cursor.fail(cursor.key_at(), "key appears twice");
    uint64_t value = 0;
    return cursor.unsigned_number(value);
  }));
  EXPECT_THAT(key_at, ElementsAre(4u, 14u));
  ASSERT_TRUE(cursor.failed());
  EXPECT_EQ(describe(cursor.error()), "byte 14 (3:3) key appears twice");
  EXPECT_FALSE(cursor.fail(0, "second"));
  EXPECT_FALSE(cursor.null());  // a syntax error after it does not replace it either
  EXPECT_EQ(describe(cursor.error()), "byte 14 (3:3) key appears twice");
}

}  // namespace
}  // namespace devalloc::detail
