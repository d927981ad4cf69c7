// The config's part of the plugin trust model (docs/security.md):
// [security] trust_paths and [plugins.NAME] trust.
#include <devalloc/core/config.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;

constexpr std::string_view kSource = "/cfg/devalloc.toml";

std::string error_of(std::string_view text) {
  auto result = parse_config(text, kSource);
  EXPECT_FALSE(result.ok()) << "parsed, but should not:\n" << text;
  return result.status().message();
}

TEST(ConfigSecurity, GivenTrustPaths_WhenParsing_ThenResolvedAgainstTheConfigFolder) {
  auto config = parse_config("[security]\ntrust_paths = [\"p\", \"/opt/x\"]\n", kSource);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_THAT(config->trust_paths,
              ElementsAre(fs::path("/cfg/p"), fs::path("/opt/x")));
}

TEST(ConfigSecurity, GivenPluginTrust_WhenParsing_ThenOnlyThatPluginIsTrusted) {
  auto config = parse_config("[plugins.a]\ntrust = true\n[plugins.b]\n", kSource);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_TRUE(config->plugin("a").trust);
  EXPECT_FALSE(config->plugin("b").trust);
  EXPECT_FALSE(config->plugin("unconfigured").trust);
}

TEST(ConfigSecurity, GivenMistypedSecurityValues_WhenParsing_ThenEachIsReportedWithItsPlace) {
  EXPECT_EQ(error_of("[plugins.a]\ntrust = \"yes\"\n"),
            "/cfg/devalloc.toml:2:9: \"trust\" in [plugins.a] must be a "
            "boolean, found a string");
  EXPECT_EQ(error_of("security = 1\n"),
            "/cfg/devalloc.toml:1:12: \"security\" must be a table, found an "
            "integer");
  EXPECT_EQ(error_of("[security]\ntrust_paths = \"/opt\"\n"),
            "/cfg/devalloc.toml:2:15: \"trust_paths\" in [security] must be an "
            "array of strings, found a string");
  EXPECT_EQ(error_of("[security]\ntrust_paths = [\"\"]\n"),
            "/cfg/devalloc.toml:2:16: a \"trust_paths\" entry is empty");
  EXPECT_EQ(error_of("[security]\ntrust = [\"/opt\"]\n"),
            "/cfg/devalloc.toml:2:1: unknown key \"trust\" in [security] "
            "(known: trust_paths)");
}

// docs/security.md: a NUL is refused in every config path. A trust path
// with one named a folder for the config and its NUL-cut prefix for every
// C call that resolved it: "/srv/a\0/b" trusted all of /srv/a.
TEST(ConfigSecurity, GivenATrustPathWithANul_WhenParsing_ThenRefusedWithTheOffset) {
  EXPECT_EQ(error_of("[security]\ntrust_paths = [\"/srv/a\\u0000/b\"]\n"),
            "/cfg/devalloc.toml:2:16: the \"trust_paths\" entry \"/srv/a\\x00/b\" "
            "contains a NUL byte at offset 6");
}

}  // namespace
}  // namespace devalloc
