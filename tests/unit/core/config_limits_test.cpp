// What the config reader bounds against a hostile file (docs/security.md,
// "Bounded parsing"): key depth, fallback expansion, durations. No timing
// here: the tests named ParseScaling.* run as their own ctest with a TIMEOUT
// (tests/unit/CMakeLists.txt), which a quadratic or exponential expansion
// would blow; the others build small inputs.
#include "core_test_support.hpp"

#include <devalloc/core/config.hpp>
#include <devalloc/core/device_selection.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace devalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const auto error_of = test::config_error_of;
const auto parsed = test::parsed_config;

// "a" joined n times by separator.
std::string parts(size_t n, std::string_view part = "a",
                  std::string_view separator = ".") {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += separator;
    out += part;
  }
  return out;
}

std::string deep_key_error(uint32_t line, uint32_t column) {
  return "/cfg/devalloc.toml:" + std::to_string(line) + ":" +
         std::to_string(column) +
         ": a key of more than 64 dotted parts (a table header or dotted "
         "key; devalloc's keys have at most 4)";
}

// --- Keys of many dotted parts --------------------------------------------

// 50 000 parts overflowed the stack inside toml++ (SIGSEGV), whose nesting
// limit covers only inline arrays and tables.
TEST(ConfigKeyDepth, GivenHeaderOrDottedKeyOf50000Parts_WhenParsing_ThenRefusedWithItsPlace) {
  EXPECT_EQ(error_of("[" + parts(50000) + "]\n"), deep_key_error(1, 2));
  EXPECT_EQ(error_of("[[" + parts(50000) + "]]\n"), deep_key_error(1, 3));
  EXPECT_EQ(error_of("[load]\n" + parts(50000) + " = 1\n"), deep_key_error(2, 1));
  EXPECT_EQ(error_of("x = { " + parts(50000) + " = 1 }\n"), deep_key_error(1, 7));
  // Whitespace around the dots and quoted parts are legal TOML.
  EXPECT_EQ(error_of("[devices]\n  " + parts(50000, "a", " . ") + " = 1\n"),
            deep_key_error(2, 3));
  EXPECT_EQ(error_of("[" + parts(50000, "\"x.y\"", ".") + "]\n"),
            deep_key_error(1, 2));
  EXPECT_EQ(error_of("['é'." + parts(50000, "'z'", "\t.\t") + "]\n"),
            deep_key_error(1, 2));
}

TEST(ConfigKeyDepth, GivenKeysOf64And65Parts_WhenParsing_ThenOnlyThe65PartsOneIsRefused) {
  // 64 parts pass the depth check and reach the reader, which knows no "a".
  EXPECT_THAT(error_of("[" + parts(64) + "]\n"),
              HasSubstr(": unknown key \"a\" at the top level"));
  EXPECT_THAT(error_of(parts(64) + " = 1\n"),
              HasSubstr(": unknown key \"a\" at the top level"));
  EXPECT_EQ(error_of("[" + parts(65) + "]\n"), deep_key_error(1, 2));
  EXPECT_EQ(error_of(parts(65) + " = 1\n"), deep_key_error(1, 1));
  // The place of a later key counts lines and code points.
  EXPECT_EQ(error_of("# é\n[load]\nthreads = 1\n  \"é\"." + parts(64) + " = 1\n"),
            deep_key_error(4, 3));
}

// Dots inside strings and comments are not key parts: values, quoted keys
// and comments full of dots are read as before.
TEST(ConfigKeyDepth, GivenDotsInStringsAndComments_WhenParsing_ThenTheyAreNotCounted) {
  const std::string dots = parts(200);
  const std::string text =
      "# " + dots + "\n"
      "[plugins.x.options]  # " + dots + "\n"
      "\"" + dots + "\" = \"" + dots + "\"\n"
      "'lit." + dots + "' = '" + dots + "'\n"
      "escaped = \"\\\"" + dots + "\\\\\"\n"
      "basic_ml = \"\"\"\n" + dots + "\\\"\"\"\n" + dots + "\"\"\"\n"
      "literal_ml = '''" + dots + "\n" + dots + "'''''\n"
      "quotes_ml = \"\"\"" + dots + "\"\"\"\"\"\n"
      "number = 15\n";
  const RuntimeConfig config = parsed(text);
  const PluginConfig plugin = config.plugin("x");
  ASSERT_EQ(plugin.options.size(), 7u);
  const auto value = [&](std::string_view key) {
    for (const auto& [k, v] : plugin.options) {
      if (k == key) return v;
    }
    return std::string("(missing)");
  };
  EXPECT_EQ(value(dots), dots);
  EXPECT_EQ(value("lit." + dots), dots);
  EXPECT_EQ(value("escaped"), "\"" + dots + "\\");
  EXPECT_EQ(value("basic_ml"), dots + "\"\"\"\n" + dots);
  EXPECT_EQ(value("literal_ml"), dots + "\n" + dots + "''");
  EXPECT_EQ(value("quotes_ml"), dots + "\"\"");
  EXPECT_EQ(value("number"), "15");
}

// A string must end where toml++ ends it: an escaped backslash before the
// closing quotes does not hide the deep key after it, nor does a string left
// open at the end of its line.
TEST(ConfigKeyDepth, GivenDeepKeyAfterTrickyStrings_WhenParsing_ThenItIsStillFound) {
  EXPECT_EQ(error_of("a = \"\"\"x\\\\\"\"\"\n" + parts(65) + " = 1\n"),
            deep_key_error(2, 1));
  EXPECT_EQ(error_of("a = 'x\\'\n" + parts(65) + " = 1\n"), deep_key_error(2, 1));
  EXPECT_EQ(error_of("a = \"x\\\\\"\n" + parts(65) + " = 1\n"), deep_key_error(2, 1));
  EXPECT_EQ(error_of("a = \"x\n" + parts(65) + " = 1\n"), deep_key_error(2, 1));
  EXPECT_EQ(error_of("a = '''x'''''\n" + parts(65) + " = 1\n"), deep_key_error(2, 1));
}

// toml++ caps the nesting of arrays and inline tables at 256 but not the
// dotted keys inside each level: 255 inline tables each with a 64-part key
// made a tree 16 000 levels deep. Values may nest 32 deep.
TEST(ConfigKeyDepth, GivenValuesNestedMoreThan32Deep_WhenParsing_ThenRefusedAtTheBracket) {
  const std::string key = parts(64);
  std::string text = "[load]\nthreads = ";
  for (int i = 0; i < 255; ++i) text += "{ " + key + " = ";  // 132 columns
  EXPECT_EQ(error_of(text + "1" + parts(255, " }", "") + "\n"),
            "/cfg/devalloc.toml:2:" + std::to_string(11 + 32 * 132) +
                ": arrays and inline tables nested more than 32 deep "
                "(devalloc's values nest at most 3)");
  EXPECT_EQ(error_of("x = [\n" + parts(33, "[", "\n") + "\n"),
            "/cfg/devalloc.toml:33:1: arrays and inline tables nested more than "
            "32 deep (devalloc's values nest at most 3)");
  // 32 deep passes, and so do headers, arrays of tables and brackets in
  // strings and comments around values, which do not count.
  EXPECT_THAT(error_of("[[x]]\n[x.y]\nz = \"[[[\"  # [[[[\n[load]\nthreads = " +
                       parts(32, "[", "") + parts(32, "]", "") + "\n"),
              HasSubstr(": unknown key \"x\" at the top level"));
}

// --- Code points that reach toml++ 3.3's whitespace table -----------------

// toml++ 3.3's is_non_ascii_horizontal_whitespace reaches
// __builtin_unreachable for most code points of U+00A1-U+0499,
// U+2C6E-U+3067 and U+FBC6-U+FEFE (found by fuzz_config with toml++
// compiled into the instrumented core; docs/security.md). The core links
// Debian's compiled library, whose code answers "not whitespace" there. These
// tests pin that, for every code point of the Basic Multilingual Plane above
// ASCII, in the three places a config's text reaches the table: the first
// character after a line-ending backslash of a multi-line string (valid
// TOML, which must keep the character), a key, and the character right after
// a value (both errors at their place). A toml++ built otherwise fails here,
// not in a user's load.

std::string utf8(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// The code points toml++'s table means to call horizontal whitespace, and
// the three it calls vertical.
bool toml_whitespace(char32_t cp) {
  return cp == 0xA0 || cp == 0x1680 || cp == 0x180E || (cp >= 0x2000 && cp <= 0x200B) ||
         cp == 0x202F || cp == 0x205F || cp == 0x2060 || cp == 0x3000 || cp == 0xFEFF ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

// Runs check on every code point from U+0080 to U+FFFF but the surrogates;
// it returns what went wrong, or nothing. Reports the first few failures.
template <typename Check>
void for_each_bmp_code_point(Check check) {
  size_t failures = 0;
  for (char32_t cp = 0x80; cp <= 0xFFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string wrong = check(cp);
    if (wrong.empty()) continue;
    if (++failures <= 5) {
      ADD_FAILURE() << "U+" << std::hex << std::uppercase << static_cast<uint32_t>(cp)
                    << ": " << wrong;
    }
  }
  EXPECT_EQ(failures, 0u);
}

TEST(ConfigCodePoints, GivenEachCodePointAfterALineEndingBackslash_WhenParsing_ThenTheStringKeepsIt) {
  for_each_bmp_code_point([](char32_t cp) -> std::string {
    if (toml_whitespace(cp)) return {};
    const std::string c = utf8(cp);
    auto config = parse_config("[plugins.host.options]\nname = \"\"\"x\\\n  " + c +
                                   "y\"\"\"\n",
                               test::kConfigSource);
    if (!config.ok()) return config.status().message();
    const auto& options = config->plugins.at("host").options;
    const std::string expected = "x" + c + "y";
    if (options.size() != 1 || options.begin()->second != expected) {
      return "the option is not \"" + expected + "\"";
    }
    return {};
  });
}

TEST(ConfigCodePoints, GivenEachCodePointAsAKeyOrAfterAValue_WhenParsing_ThenRefusedAtItsPlace) {
  for_each_bmp_code_point([](char32_t cp) -> std::string {
    const std::string c = utf8(cp);
    for (const auto& [text, place] :
         {std::pair<std::string, std::string>{"[load]\n" + c + "threads = 1\n", ":2:1: "},
          {"[load]\nthreads = 1" + c + "\n", ":2:12: "}}) {
      auto config = parse_config(text, test::kConfigSource);
      if (config.ok()) return "parsed: " + text;
      const std::string prefix = std::string(test::kConfigSource) + place;
      if (config.status().message().rfind(prefix, 0) != 0) {
        return "not at " + prefix + ": " + config.status().message();
      }
    }
    return {};
  });
}

// --- Fallback expansion ----------------------------------------------------

std::vector<std::string> describe_all(const std::vector<DeviceCandidate>& all) {
  std::vector<std::string> out;
  for (const auto& c : all) {
    out.push_back(c.binding.to_string() + " via " + c.via_tag +
                  (c.is_fallback ? " (fallback)" : ""));
  }
  return out;
}

// K levels of two tags, each falling back to both tags of the next level:
// 2^K paths: K = 24 took 20 s and K = 40 would take days when every path
// was expanded.
std::string ladder(int levels) {
  std::string text;
  for (int i = 0; i < levels; ++i) {
    for (int j = 0; j < 2; ++j) {
      text += "[devices.l" + std::to_string(i) + "_" + std::to_string(j) +
              "]\nfallback = [\"l" + std::to_string(i + 1) + "_0\", \"l" +
              std::to_string(i + 1) + "_1\"]\n";
    }
  }
  text += "[devices.l" + std::to_string(levels) + "_0]\nuse = \"host\"\n";
  text += "[devices.l" + std::to_string(levels) + "_1]\nuse = \"host\"\n";
  return text;
}

TEST(CandidateExpansion, GivenSmallLadder_WhenExpanding_ThenDepthFirstOrderFirstOccurrenceWins) {
  const RuntimeConfig config = parsed(ladder(2));
  EXPECT_THAT(describe_all(candidate_bindings(config, "l0_0").value()),
              ElementsAre("l0_0 index 0 via l0_0", "l1_0 index 0 via l1_0 (fallback)",
                          "host index 0 via l2_0 (fallback)",
                          "l1_1 index 0 via l1_1 (fallback)"));
}

TEST(ParseScaling, GivenLadderOf40DiamondLevels_WhenReadingAndExpanding_ThenEachTagOnce) {
  const RuntimeConfig config = parsed(ladder(40));
  ASSERT_EQ(config.devices.size(), 82u);
  const auto candidates = candidate_bindings(config, "l0_0");
  ASSERT_TRUE(candidates.ok()) << candidates.status().message();
  // l0_0, l1_0 .. l39_0, host (via l40_0), then l39_1 .. l1_1 on the way
  // back: each binding once.
  ASSERT_EQ(candidates->size(), 80u);
  EXPECT_EQ(describe_all(*candidates)[40], "host index 0 via l40_0 (fallback)");
  EXPECT_EQ(describe_all(*candidates)[41], "l39_1 index 0 via l39_1 (fallback)");
  EXPECT_EQ(describe_all(*candidates)[79], "l1_1 index 0 via l1_1 (fallback)");
}

// t0 -> t1 -> ... -> tN-1 (hex names), as long as 1 MiB allows: the
// expansion of every tag at read time was cubic, and its recursion
// overflowed the stack.
std::string chain(size_t n) {
  std::string text;
  char line[64];
  for (size_t i = 0; i < n; ++i) {
    if (i + 1 < n) {
      std::snprintf(line, sizeof line, "[devices.%zx]\nfallback=[\"%zx\"]\n", i, i + 1);
    } else {
      std::snprintf(line, sizeof line, "[devices.%zx]\nuse=\"host\"\n", i);
    }
    text += line;
  }
  return text;
}

TEST(ParseScaling, GivenFallbackChainOf1MiB_WhenReadingAndExpanding_ThenEveryTagIsThere) {
  const size_t n = 30000;
  const std::string text = chain(n);
  ASSERT_LE(text.size(), kMaxConfigBytes);
  const RuntimeConfig config = parsed(text);
  ASSERT_EQ(config.devices.size(), n);
  const auto candidates = candidate_bindings(config, "0");
  ASSERT_TRUE(candidates.ok()) << candidates.status().message();
  ASSERT_EQ(candidates->size(), n);
  EXPECT_EQ(describe_all(*candidates)[1], "1 index 0 via 1 (fallback)");
  EXPECT_EQ(describe_all(*candidates)[n - 1], "host index 0 via 752f (fallback)");
}

TEST(ParseScaling, GivenFallbackCycleOf30000Tags_WhenReading_ThenTheCycleIsNamedShortly) {
  // The chain, its last tag falling back to the first.
  std::string text = chain(30000);
  text.replace(text.rfind("use=\"host\""), 10, "fallback=[\"0\"]");
  const std::string message = error_of(text);
  EXPECT_THAT(message, StartsWith("/cfg/devalloc.toml:60000:11: fallback cycle: "
                                  "\"0\" -> \"1\" -> \"2\" -> \"3\" -> \"4\" -> "
                                  "\"5\" -> \"6\" -> \"7\" -> ... (29984 more) -> "
                                  "\"7528\" -> "));
  EXPECT_THAT(message, HasSubstr("\"752f\" -> \"0\""));
  EXPECT_LT(message.size(), 400u);
}

TEST(CandidateExpansion, GivenCycleOfSixteenTags_WhenReading_ThenEveryTagIsNamed) {
  std::string text;
  for (int i = 0; i < 16; ++i) {
    text += "[devices.t" + std::to_string(i) + "]\nfallback = [\"t" +
            std::to_string((i + 1) % 16) + "\"]\n";
  }
  EXPECT_EQ(error_of(text),
            "/cfg/devalloc.toml:32:13: fallback cycle: \"t0\" -> \"t1\" -> "
            "\"t2\" -> \"t3\" -> \"t4\" -> \"t5\" -> \"t6\" -> \"t7\" -> "
            "\"t8\" -> \"t9\" -> \"t10\" -> \"t11\" -> \"t12\" -> \"t13\" -> "
            "\"t14\" -> \"t15\" -> \"t0\"");
}

// Tags are checked in order, each once: a cycle reachable from an earlier
// tag is reported as that tag's expansion meets it, after a diamond.
TEST(CandidateExpansion, GivenDiamondThenCycle_WhenReading_ThenTheCycleOfTheFirstTagIsReported) {
  EXPECT_EQ(error_of("[devices.a]\nfallback = [\"b\", \"c\"]\n"
                     "[devices.b]\nfallback = [\"d\"]\n"
                     "[devices.c]\nfallback = [\"d\", \"e\"]\n"
                     "[devices.d]\nuse = \"host\"\n"
                     "[devices.e]\nfallback = [\"c\"]\n"),
            "/cfg/devalloc.toml:10:13: fallback cycle: \"c\" -> \"e\" -> \"c\"");
}

// --- Durations -------------------------------------------------------------

// "10000000000s" was accepted, and the wait's deadline overflowed: the load
// failed at once, "not released 10000000000000 ms after synchronize".
TEST(ConfigDurations, GivenReleaseTimeoutAboveADay_WhenParsing_ThenRefusedWithTheLimit) {
  EXPECT_EQ(error_of("[load]\nrelease_timeout = \"10000000000s\"\n"),
            "/cfg/devalloc.toml:2:19: \"release_timeout\" in [load] must be at "
            "most 1440min (a day), found \"10000000000s\"");
  EXPECT_EQ(error_of("[load]\nrelease_timeout = \"86400001ms\"\n"),
            "/cfg/devalloc.toml:2:19: \"release_timeout\" in [load] must be at "
            "most 1440min (a day), found \"86400001ms\"");
  EXPECT_EQ(parsed("[load]\nrelease_timeout = \"1440min\"\n").load.release_timeout,
            std::chrono::hours(24));
  EXPECT_EQ(parsed("[load]\nrelease_timeout = \"86400000ms\"\n").load.release_timeout,
            std::chrono::hours(24));
}

// --- Sizes -----------------------------------------------------------------

// docs/config.md: spaces (not tabs) may stand between the number and the
// unit, of a size as of a duration.
TEST(ConfigSizes, GivenSpacesBetweenNumberAndUnit_WhenParsing_ThenAccepted) {
  EXPECT_EQ(parsed("[load]\nstaging = \"1   MiB\"\n").load.staging_bytes,
            uint64_t{1} << 20);
  EXPECT_EQ(parsed("[load]\nrelease_timeout = \"2  s\"\n").load.release_timeout,
            std::chrono::seconds(2));
  EXPECT_THAT(error_of("[load]\nstaging = \"1\tMiB\"\n"),
              HasSubstr("unknown unit"));
}

// --- Lengths of tags and plugin names ---------------------------------------

// A 1 MB tag in [memory] was a valid tag: accepted here, it was repeated
// whole by every message of the load that looked it up (4 to 8 MB).
TEST(ConfigLengths, GivenMemoryTagOf1MB_WhenParsing_ThenRefusedWithItsStartAndLength) {
  const std::string message =
      error_of("[memory]\n7 = \"" + std::string(1000000, 'a') + "\"\n");
  EXPECT_THAT(message, StartsWith("/cfg/devalloc.toml:2:5: memory id 7 in [memory] maps to "
                                  "\"aaaa"));
  EXPECT_THAT(message, HasSubstr("...\" (1000000 bytes), which is not a device tag: expected "
                                 "\"name\" or \"name:index\" of at most 256 bytes"));
  EXPECT_LT(message.size(), 600u);
}

TEST(ConfigLengths, GivenTagsOf256And257Bytes_WhenParsing_ThenOnlyThe257ByteOneIsRefused) {
  const std::string at_limit(256, 'a');
  const std::string past_limit(257, 'a');
  EXPECT_EQ(parsed("[memory]\n7 = \"" + at_limit + "\"\n").memory_overrides.at(7), at_limit);
  EXPECT_EQ(parsed("[devices.\"" + std::string(254, 'a') + ":1\"]\n").devices.size(), 1u);
  EXPECT_THAT(error_of("[devices.\"" + past_limit + "\"]\n"),
              HasSubstr("invalid device tag \"" + std::string(200, 'a') + "...\" (257 bytes)"));
  EXPECT_THAT(error_of("[devices.x]\nfallback = [\"" + past_limit + "\"]\n"),
              HasSubstr("(257 bytes), which is not a device tag"));
}

TEST(ConfigLengths, GivenPluginNameOver256Bytes_WhenParsing_ThenRefusedWhereverItIsGiven) {
  const std::string name(300, 'p');
  EXPECT_THAT(error_of("[plugins." + name + "]\n"),
              HasSubstr("invalid plugin name \"" + std::string(200, 'p') +
                        "...\" (300 bytes) in [plugins]: use at most 256 letters"));
  EXPECT_THAT(error_of("[devices.x]\nuse = \"" + name + "\"\n"),
              HasSubstr("(300 bytes): use at most 256 letters"));
  EXPECT_THAT(error_of("[devices.x]\nuse = [\"" + name + "\", { index = 0 }]\n"),
              HasSubstr("(300 bytes): use at most 256 letters"));
  EXPECT_EQ(parsed("[plugins." + std::string(256, 'p') + "]\n").plugins.size(), 1u);
}

// --- [load] fallback ------------------------------------------------------

TEST(ConfigFallbackPolicy, GivenEachPolicyOrNone_WhenParsing_ThenItIsTheLoadsPolicy) {
  EXPECT_EQ(parsed("").load.fallback, FallbackPolicy::warn);
  EXPECT_EQ(parsed("[load]\nfallback = \"allow\"\n").load.fallback, FallbackPolicy::allow);
  EXPECT_EQ(parsed("[load]\nfallback = \"warn\"\n").load.fallback, FallbackPolicy::warn);
  EXPECT_EQ(parsed("[load]\nfallback = \"error\"\n").load.fallback, FallbackPolicy::error);
}

TEST(ConfigFallbackPolicy, GivenUnknownPolicyOrType_WhenParsing_ThenRefusedWithTheKnownOnes) {
  EXPECT_EQ(error_of("[load]\nfallback = \"deny\"\n"),
            "/cfg/devalloc.toml:2:12: \"fallback\" in [load] is \"deny\"; known: allow, "
            "warn, error");
  EXPECT_EQ(error_of("[load]\nfallback = false\n"),
            "/cfg/devalloc.toml:2:12: \"fallback\" in [load] must be \"allow\", \"warn\" or "
            "\"error\", found a boolean");
}

}  // namespace
}  // namespace devalloc
