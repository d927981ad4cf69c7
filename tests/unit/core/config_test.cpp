#include "core_test_support.hpp"

#include <devalloc/core/config.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

const auto error_of = test::config_error_of;
const auto parsed = test::parsed_config;

constexpr std::string_view kFullExample = R"(plugin_path = ["plugins", "/opt/vendor/plugins"]

[plugins.cuda]
options = { runtime_library = "libcuda.so.1", streams = 4, trace = true }

[plugins.mine]
library = "lib/libdevalloc_mine.so"

[devices."cuda:0"]
use = ["cuda", { uuid = "GPU-0F3C2A1E-5B6D-4E7F-8A9B-0C1D2E3F4A5B" }]
fallback = ["cuda:1", ["mine", { pci_bus_id = "3B:00.0" }], "host"]

[devices."cuda:1"]
use = "cuda"

[devices.gpu]
use = ["mine", { index = 2 }]

[memory]
7 = "host"
0 = "gpu"

[load]
staging = "128MiB"
threads = 4
verify = true
)";

TEST(ParseConfig, GivenFullExample_WhenParsing_ThenEveryValueLandsInItsStruct) {
  const RuntimeConfig config = parsed(kFullExample);

  EXPECT_EQ(config.source, fs::path("/cfg/devalloc.toml"));
  EXPECT_THAT(config.plugin_path,
              ElementsAre(fs::path("/cfg/plugins"),
                          fs::path("/opt/vendor/plugins")));

  ASSERT_EQ(config.plugins.size(), 2u);
  const PluginConfig& cuda = config.plugins.at("cuda");
  EXPECT_EQ(cuda.name, "cuda");
  EXPECT_FALSE(cuda.library.has_value());
  EXPECT_THAT(cuda.options,
              ElementsAre(Pair("runtime_library", "libcuda.so.1"),
                          Pair("streams", "4"), Pair("trace", "true")));
  EXPECT_EQ(cuda.where, (SourceLocation{"/cfg/devalloc.toml", 3, 10}));
  EXPECT_EQ(cuda.load_spec(), "cuda");
  const PluginConfig& mine = config.plugins.at("mine");
  EXPECT_EQ(mine.library, fs::path("/cfg/lib/libdevalloc_mine.so"));
  EXPECT_EQ(mine.load_spec(), "/cfg/lib/libdevalloc_mine.so");
  EXPECT_TRUE(mine.options.empty());

  ASSERT_EQ(config.devices.size(), 3u);
  const DeviceTagConfig& cuda0 = config.devices.at("cuda:0");
  EXPECT_EQ(cuda0.tag, "cuda:0");
  EXPECT_EQ(cuda0.where, (SourceLocation{"/cfg/devalloc.toml", 9, 10}));
  EXPECT_EQ(cuda0.primary,
            (DeviceBinding{"cuda", *DeviceSelector::by_uuid(
                                       "0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b")}));
  EXPECT_EQ(cuda0.primary.selector.id, "0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b");
  ASSERT_EQ(cuda0.fallbacks.size(), 3u);
  EXPECT_EQ(std::get<std::string>(cuda0.fallbacks[0].target), "cuda:1");
  EXPECT_EQ(cuda0.fallbacks[0].where,
            (SourceLocation{"/cfg/devalloc.toml", 11, 13}));
  const auto& mine_fallback = std::get<DeviceBinding>(cuda0.fallbacks[1].target);
  EXPECT_EQ(mine_fallback.plugin, "mine");
  EXPECT_EQ(mine_fallback.selector.kind, SelectorKind::pci_bus_id);
  EXPECT_EQ(mine_fallback.selector.id, "0000:3b:00.0");
  EXPECT_EQ(std::get<std::string>(cuda0.fallbacks[2].target), "host");

  EXPECT_EQ(config.devices.at("cuda:1").primary,
            (DeviceBinding{"cuda", DeviceSelector::by_index(1)}));
  EXPECT_TRUE(config.devices.at("cuda:1").fallbacks.empty());
  EXPECT_EQ(config.devices.at("gpu").primary,
            (DeviceBinding{"mine", DeviceSelector::by_index(2)}));

  EXPECT_THAT(config.memory_overrides,
              ElementsAre(Pair(0u, "gpu"), Pair(7u, "host")));

  EXPECT_EQ(config.load.staging_bytes, uint64_t{128} << 20);
  EXPECT_EQ(config.load.threads, 4u);
  EXPECT_TRUE(config.load.verify);
}

void expect_nothing_configured(const RuntimeConfig& config) {
  EXPECT_TRUE(config.plugin_path.empty());
  EXPECT_TRUE(config.plugins.empty());
  EXPECT_TRUE(config.devices.empty());
  EXPECT_TRUE(config.memory_overrides.empty());
  EXPECT_EQ(config.load.staging_bytes, uint64_t{64} << 20);
  EXPECT_EQ(config.load.threads, 0u);
  EXPECT_FALSE(config.load.verify);
}

TEST(ParseConfig, GivenEmptyText_WhenParsing_ThenDefaultsApply) {
  expect_nothing_configured(parsed(""));
}

TEST(ParseConfig, GivenDeviceWithOnlyFallback_WhenParsing_ThenPrimaryIsTheDefaultBinding) {
  const RuntimeConfig config = parsed(R"([devices."hip:3"]
fallback = ["host"]
)");
  EXPECT_EQ(config.devices.at("hip:3").primary,
            (DeviceBinding{"hip", DeviceSelector::by_index(3)}));
}

TEST(ParseConfig, GivenUseByNameOnTagWithoutIndex_WhenParsing_ThenIndexIsZero) {
  const RuntimeConfig config = parsed(R"([devices.accel]
use = "level_zero"
)");
  EXPECT_EQ(config.devices.at("accel").primary,
            (DeviceBinding{"level_zero", DeviceSelector::by_index(0)}));
}

TEST(ParseConfig, GivenOptionsAsSubTable_WhenParsing_ThenTheyAreRead) {
  const RuntimeConfig config = parsed(R"([plugins.hip.options]
runtime_library = "libamdhip64.so.5"
)");
  EXPECT_THAT(config.plugins.at("hip").options,
              ElementsAre(Pair("runtime_library", "libamdhip64.so.5")));
}

TEST(ParseConfig, GivenStagingAsInteger_WhenParsing_ThenItIsBytes) {
  EXPECT_EQ(parsed("load.staging = 4096").load.staging_bytes, 4096u);
}

TEST(ParseConfig, GivenPlainSourceName_WhenParsing_ThenRelativePathsUseTheCurrentDirectory) {
  const RuntimeConfig config =
      parse_config("plugin_path = [\"p\"]", "devalloc.toml").value();
  EXPECT_EQ(config.source, fs::path("devalloc.toml"));
  EXPECT_THAT(config.plugin_path, ElementsAre(fs::current_path() / "p"));
}

TEST(ParseConfigErrors, GivenTomlSyntaxError_WhenParsing_ThenTomlReasonAndPositionAreReported) {
  const std::string message = error_of("[load]\nstaging = \"64MiB\nthreads = 2\n");
  EXPECT_THAT(message, HasSubstr("/cfg/devalloc.toml:2:17: Error while "
                                 "parsing string"));
}

// toml++ escapes the character it quotes; the message shows it once
// escaped, and a control character of the file never reaches the terminal.
TEST(ParseConfigErrors, GivenAControlCharacterInAKey_WhenParsing_ThenTomlsEscapeIsShownOnceNotDoubled) {
  const std::string message = error_of("[load]\nsta\x01ging = 1\n");
  EXPECT_THAT(message, HasSubstr("/cfg/devalloc.toml:2:4: "));
  EXPECT_THAT(message, HasSubstr("saw '\\u0001'"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("\\\\")));
  EXPECT_EQ(message.find('\x01'), std::string::npos);
}

TEST(ParseConfigErrors, GivenRedefinedKey_WhenParsing_ThenTomlReportsItAtTheKey) {
  const std::string message = error_of("[load]\nthreads = 1\nthreads = 2\n");
  EXPECT_THAT(message, HasSubstr("/cfg/devalloc.toml:3:11: "));
  EXPECT_THAT(message, HasSubstr("cannot redefine existing integer (the key on this line is "
                                 "defined above)"));
}

// toml++ 3.3 repeats a quoted key garbled ('devices."cucuda:0"'): the key is
// left out, the position points at it.
TEST(ParseConfigErrors, GivenRedefinedQuotedKeyOrTable_WhenParsing_ThenNoGarbledKeyIsShown) {
  for (const auto& [text, line] :
       {std::pair{"[devices.\"cuda:0\"]\nuse = \"host\"\n[devices.\"cuda:0\"]\n", 3},
        std::pair{"[memory]\n0 = \"host\"\n\"0\" = \"host\"\n", 3},
        std::pair{"[devices.host]\n[devices.\"host\"]\n", 2}}) {
    const std::string message = error_of(text);
    EXPECT_THAT(message, HasSubstr("/cfg/devalloc.toml:" + std::to_string(line) + ":")) << text;
    EXPECT_THAT(message, HasSubstr("(the key on this line is defined above)")) << text;
    EXPECT_THAT(message, ::testing::Not(HasSubstr("cucuda"))) << text;
    EXPECT_THAT(message, ::testing::Not(HasSubstr("'"))) << text;
  }
}

TEST(ParseConfigErrors, GivenUnknownKeyInLoad_WhenParsing_ThenPositionAndKnownKeysAreNamed) {
  EXPECT_EQ(error_of("[load]\nthreads = 1\nstagin = \"64MiB\"\n"),
            "/cfg/devalloc.toml:3:1: unknown key \"stagin\" in [load] "
            "(known: check_free_memory, direct, external_files, fallback, read, "
            "release_timeout, staging, threads, verify)");
}

TEST(ParseConfigErrors, GivenUnknownTopLevelKey_WhenParsing_ThenItIsAnError) {
  EXPECT_EQ(error_of("\nplugin_paths = []\n"),
            "/cfg/devalloc.toml:2:1: unknown key \"plugin_paths\" at the top "
            "level (known: devices, load, memory, plugin_path, plugins, security)");
}

TEST(ParseConfigErrors, GivenUnknownKeyInPlugin_WhenParsing_ThenItIsAnError) {
  EXPECT_EQ(error_of("[plugins.cuda]\nlibrery = \"x.so\"\n"),
            "/cfg/devalloc.toml:2:1: unknown key \"librery\" in "
            "[plugins.cuda] (known: library, options, trust, validate)");
}

TEST(ParseConfigErrors, GivenUnknownKeyInDevice_WhenParsing_ThenItIsAnError) {
  EXPECT_EQ(error_of("[devices.\"cuda:0\"]\nfallbacks = [\"host\"]\n"),
            "/cfg/devalloc.toml:2:1: unknown key \"fallbacks\" in "
            "[devices.\"cuda:0\"] (known: fallback, use)");
}

TEST(ParseConfigErrors, GivenUnknownKeyInSelector_WhenParsing_ThenItIsAnError) {
  const std::string message =
      error_of("[devices.x]\nuse = [\"cuda\", { index = 1, idx = 2 }]\n");
  EXPECT_EQ(message,
            "/cfg/devalloc.toml:2:29: unknown key \"idx\" in the selector in "
            "\"use\" in [devices.x] (known: index, pci_bus_id, uuid)");
}

TEST(ParseConfigErrors, GivenThreadsAsString_WhenParsing_ThenTypeErrorNamesBothTypes) {
  EXPECT_EQ(error_of("[load]\nthreads = \"4\"\n"),
            "/cfg/devalloc.toml:2:11: \"threads\" in [load] must be an "
            "integer, found a string");
}

TEST(ParseConfig, GivenPipelineKeys_WhenParsing_ThenTheyLandInLoadOptions) {
  const RuntimeConfig config = parsed(
      "[load]\nrelease_timeout = \"250ms\"\nread = \"pread\"\ndirect = false\n"
      "check_free_memory = false\nexternal_files = false\n");
  EXPECT_EQ(config.load.release_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(config.load.read, ReadMode::pread);
  EXPECT_FALSE(config.load.direct);
  EXPECT_FALSE(config.load.check_free_memory);
  EXPECT_FALSE(config.load.external_files);
  const RuntimeConfig defaults = parsed("[load]\n");
  EXPECT_EQ(defaults.load.release_timeout, std::chrono::seconds(5));
  EXPECT_EQ(defaults.load.read, ReadMode::automatic);
  EXPECT_TRUE(defaults.load.direct);
  EXPECT_TRUE(defaults.load.check_free_memory);
  EXPECT_TRUE(defaults.load.external_files);
  EXPECT_EQ(parsed("[load]\nrelease_timeout = \"2min\"\n").load.release_timeout,
            std::chrono::minutes(2));
  EXPECT_EQ(parsed("[load]\nread = \"direct_io\"\n").load.read, ReadMode::direct_io);
}

TEST(ParseConfigErrors, GivenBadPipelineKeys_WhenParsing_ThenEachIsNamed) {
  EXPECT_EQ(error_of("[load]\nrelease_timeout = \"5\"\n"),
            "/cfg/devalloc.toml:2:19: \"release_timeout\" in [load]: invalid "
            "duration \"5\": unknown or missing unit \"\" (known: ms, s, min)");
  EXPECT_EQ(error_of("[load]\nrelease_timeout = \"0s\"\n"),
            "/cfg/devalloc.toml:2:19: \"release_timeout\" in [load] must be at "
            "least 1ms");
  EXPECT_EQ(error_of("[load]\nrelease_timeout = 5\n"),
            "/cfg/devalloc.toml:2:19: \"release_timeout\" in [load] must be a "
            "duration such as \"5s\", found an integer");
  EXPECT_EQ(error_of("[load]\ncheck_free_memory = 1\n"),
            "/cfg/devalloc.toml:2:21: \"check_free_memory\" in [load] must be a "
            "boolean, found an integer");
  EXPECT_EQ(error_of("[load]\nexternal_files = \"no\"\n"),
            "/cfg/devalloc.toml:2:18: \"external_files\" in [load] must be a "
            "boolean, found a string");
  EXPECT_EQ(error_of("[load]\nread = \"mmmap\"\n"),
            "/cfg/devalloc.toml:2:8: \"read\" in [load] is \"mmmap\"; known: "
            "auto, mmap, pread, direct_io");
  EXPECT_EQ(error_of("[load]\ndirect = \"yes\"\n"),
            "/cfg/devalloc.toml:2:10: \"direct\" in [load] must be a boolean, "
            "found a string");
}

TEST(ParseConfigErrors, GivenVerifyAsInteger_WhenParsing_ThenTypeError) {
  EXPECT_EQ(error_of("[load]\nverify = 1\n"),
            "/cfg/devalloc.toml:2:10: \"verify\" in [load] must be a boolean, "
            "found an integer");
}

TEST(ParseConfigErrors, GivenTrustAsString_WhenParsing_ThenTypeErrorNamingThePlugin) {
  EXPECT_EQ(error_of("[plugins.cuda]\ntrust = \"yes\"\n"),
            "/cfg/devalloc.toml:2:9: \"trust\" in [plugins.cuda] must be a boolean, "
            "found a string");
}

TEST(ParseConfigErrors, GivenPluginPathAsString_WhenParsing_ThenTypeError) {
  EXPECT_EQ(error_of("plugin_path = \"/opt\"\n"),
            "/cfg/devalloc.toml:1:15: \"plugin_path\" must be an array of "
            "strings, found a string");
}

TEST(ParseConfigErrors, GivenPluginPathEntryNotString_WhenParsing_ThenTypeErrorAtTheEntry) {
  EXPECT_EQ(error_of("plugin_path = [\"/opt\", 3]\n"),
            "/cfg/devalloc.toml:1:24: each \"plugin_path\" entry must be a "
            "string, found an integer");
}

TEST(ParseConfigErrors, GivenSectionOfWrongType_WhenParsing_ThenTypeError) {
  EXPECT_EQ(error_of("load = 3\n"),
            "/cfg/devalloc.toml:1:8: \"load\" must be a table, found an integer");
  EXPECT_EQ(error_of("plugins = []\n"),
            "/cfg/devalloc.toml:1:11: \"plugins\" must be a table, found an "
            "array");
}

TEST(ParseConfigErrors, GivenOptionOfUnsupportedType_WhenParsing_ThenTypeError) {
  EXPECT_EQ(error_of("[plugins.cuda]\noptions = { streams = [1, 2] }\n"),
            "/cfg/devalloc.toml:2:23: option \"streams\" of plugin \"cuda\" "
            "must be a string, an integer or a boolean, found an array");
  EXPECT_THAT(error_of("[plugins.cuda]\noptions = { ratio = 0.5 }\n"),
              HasSubstr("found a floating-point number"));
}

TEST(ParseConfigErrors, GivenLibraryEmptyOrNotString_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[plugins.mine]\nlibrary = \"\"\n"),
            "/cfg/devalloc.toml:2:11: \"library\" in [plugins.mine] is empty");
  EXPECT_EQ(error_of("[plugins.mine]\nlibrary = true\n"),
            "/cfg/devalloc.toml:2:11: \"library\" in [plugins.mine] must be a "
            "string, found a boolean");
}

TEST(ParseConfigErrors, GivenInvalidPluginName_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[plugins.\"my.plugin\"]\n"),
            "/cfg/devalloc.toml:1:10: invalid plugin name \"my.plugin\" in "
            "[plugins]: use at most 256 letters, digits, \"_\" and \"-\"");
}

TEST(ParseConfigErrors, GivenBadSizes_WhenParsing_ThenTheReasonIsGiven) {
  EXPECT_EQ(error_of("[load]\nstaging = \"64mb\"\n"),
            "/cfg/devalloc.toml:2:11: \"staging\" in [load]: invalid size "
            "\"64mb\": unknown unit \"mb\" (known: B, KiB, MiB, GiB, TiB, KB, "
            "MB, GB, TB)");
  EXPECT_THAT(error_of("[load]\nstaging = \"MiB\"\n"),
              HasSubstr("/cfg/devalloc.toml:2:11: \"staging\" in [load]: "
                        "invalid size \"MiB\": expected an integer"));
  EXPECT_THAT(error_of("[load]\nstaging = \"1.5GiB\"\n"),
              HasSubstr("/cfg/devalloc.toml:2:11: \"staging\" in [load]: "
                        "invalid size \"1.5GiB\": unknown unit \".5GiB\""));
  EXPECT_THAT(error_of("[load]\nstaging = \"16777216TiB\"\n"),
              HasSubstr("/cfg/devalloc.toml:2:11: \"staging\" in [load]: "
                        "invalid size \"16777216TiB\": does not fit in 64 bits"));
  EXPECT_EQ(error_of("[load]\nstaging = true\n"),
            "/cfg/devalloc.toml:2:11: \"staging\" in [load] must be a size "
            "such as \"64MiB\" or an integer number of bytes, found a boolean");
}

TEST(ParseConfigErrors, GivenZeroOrNegativeStaging_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[load]\nstaging = \"0MiB\"\n"),
            "/cfg/devalloc.toml:2:11: \"staging\" in [load] must be at least "
            "1 byte");
  EXPECT_EQ(error_of("[load]\nstaging = -1\n"),
            "/cfg/devalloc.toml:2:11: \"staging\" in [load] must not be "
            "negative, found -1");
}

TEST(ParseConfigErrors, GivenThreadsOutOfRange_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[load]\nthreads = -2\n"),
            "/cfg/devalloc.toml:2:11: \"threads\" in [load] must be between 0 "
            "and 1024 (0: automatic), found -2");
  EXPECT_THAT(error_of("[load]\nthreads = 1025\n"), HasSubstr("found 1025"));
  EXPECT_EQ(parsed("[load]\nthreads = 1024\n").load.threads, 1024u);
}

TEST(ParseConfigErrors, GivenMemoryIdNotUnsigned32Bit_WhenParsing_ThenErrorNamesTheKey) {
  for (const char* id : {"x", "-1", "4294967296", "07", "1.5"}) {
    const std::string text =
        std::string("[memory]\n\"") + id + "\" = \"host\"\n";
    EXPECT_EQ(error_of(text),
              std::string("/cfg/devalloc.toml:2:1: memory id \"") + id +
                  "\" in [memory] is not an unsigned 32-bit integer "
                  "(decimal, without sign or leading zeros)");
  }
  EXPECT_THAT(parsed("[memory]\n4294967295 = \"host\"\n").memory_overrides,
              ElementsAre(Pair(4294967295u, "host")));
}

TEST(ParseConfigErrors, GivenMemoryOverrideNotATag_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[memory]\n3 = 3\n"),
            "/cfg/devalloc.toml:2:5: memory id 3 in [memory] must be a device "
            "tag string such as \"host\", found an integer");
  EXPECT_THAT(error_of("[memory]\n3 = \"cuda:zero\"\n"),
              HasSubstr("/cfg/devalloc.toml:2:5: memory id 3 in [memory] maps "
                        "to \"cuda:zero\", which is not a device tag"));
}

TEST(ParseConfigErrors, GivenMalformedDeviceTags_WhenParsing_ThenErrorAtTheKey) {
  for (const char* tag : {"cuda:", "cuda:01", "a b", ":0", "cuda:0:1", "cuda:-1"}) {
    const std::string text = std::string("[devices.\"") + tag + "\"]\n";
    EXPECT_THAT(error_of(text),
                HasSubstr(std::string("/cfg/devalloc.toml:1:10: invalid device "
                                      "tag \"") +
                          tag + "\" in [devices]: expected \"name\" or "
                                "\"name:index\""));
  }
}

TEST(ParseConfigErrors, GivenFallbackThatIsNotATag_WhenParsing_ThenErrorAtTheEntry) {
  EXPECT_THAT(error_of("[devices.\"cuda:0\"]\nfallback = [\"host\", \"hip:x\"]\n"),
              HasSubstr("/cfg/devalloc.toml:2:21: \"fallback\" in "
                        "[devices.\"cuda:0\"] refers to \"hip:x\", which is "
                        "not a device tag"));
  EXPECT_EQ(error_of("[devices.\"cuda:0\"]\nfallback = [3]\n"),
            "/cfg/devalloc.toml:2:13: each entry of \"fallback\" in "
            "[devices.\"cuda:0\"] must be a device tag or [plugin, { index | "
            "uuid | pci_bus_id = ... }], found an integer");
  EXPECT_EQ(error_of("[devices.\"cuda:0\"]\nfallback = \"host\"\n"),
            "/cfg/devalloc.toml:2:12: \"fallback\" in [devices.\"cuda:0\"] "
            "must be an array, found a string");
}

TEST(ParseConfigErrors, GivenSelectorWithNoKey_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[devices.x]\nuse = [\"cuda\", {}]\n"),
            "/cfg/devalloc.toml:2:16: the selector in \"use\" in [devices.x] "
            "needs exactly one of index, uuid, pci_bus_id; found none");
}

TEST(ParseConfigErrors, GivenSelectorWithTwoKeys_WhenParsing_ThenErrorNamesBoth) {
  EXPECT_EQ(error_of("[devices.x]\nfallback = [[\"cuda\", { index = 0, "
                     "pci_bus_id = \"3b:00.0\" }]]\n"),
            "/cfg/devalloc.toml:2:22: the selector in an entry of \"fallback\" "
            "in [devices.x] needs exactly one of index, uuid, pci_bus_id; "
            "found index and pci_bus_id");
}

TEST(ParseConfigErrors, GivenBadUuid_WhenParsing_ThenErrorShowsTheExpectedForm) {
  EXPECT_THAT(error_of("[devices.x]\nuse = [\"cuda\", { uuid = \"GPU-1234\" }]\n"),
              HasSubstr("/cfg/devalloc.toml:2:25: invalid uuid \"GPU-1234\" in "
                        "the selector in \"use\" in [devices.x]: expected 32 "
                        "hex digits as 8-4-4-4-12"));
}

TEST(ParseConfigErrors, GivenBadPciBusId_WhenParsing_ThenErrorShowsTheExpectedForm) {
  EXPECT_THAT(
      error_of("[devices.x]\nuse = [\"cuda\", { pci_bus_id = \"3b:20.0\" }]\n"),
      HasSubstr("/cfg/devalloc.toml:2:31: invalid PCI bus id \"3b:20.0\" in "
                "the selector in \"use\" in [devices.x]: expected "
                "[domain:]bus:device.function"));
}

TEST(ParseConfigErrors, GivenNegativeOrHugeIndex_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[devices.x]\nuse = [\"cuda\", { index = -1 }]\n"),
            "/cfg/devalloc.toml:2:26: \"index\" of the selector in \"use\" in "
            "[devices.x] must be between 0 and 4294967295, found -1");
  EXPECT_THAT(
      error_of("[devices.x]\nuse = [\"cuda\", { index = 4294967296 }]\n"),
      HasSubstr("found 4294967296"));
  EXPECT_EQ(error_of("[devices.x]\nuse = [\"cuda\", { index = \"1\" }]\n"),
            "/cfg/devalloc.toml:2:26: \"index\" of the selector in \"use\" in "
            "[devices.x] must be an integer, found a string");
}

TEST(ParseConfigErrors, GivenUseNamingATagWithIndex_WhenParsing_ThenErrorShowsHowToWriteIt) {
  EXPECT_EQ(error_of("[devices.\"cuda:0\"]\nuse = \"cuda:1\"\n"),
            "/cfg/devalloc.toml:2:7: \"use\" in [devices.\"cuda:0\"] names "
            "\"cuda:1\", which is a device tag, not a plugin; write use = "
            "[\"cuda\", { index = 1 }]");
}

TEST(ParseConfigErrors, GivenUseArrayOfWrongLength_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[devices.x]\nuse = [\"cuda\"]\n"),
            "/cfg/devalloc.toml:2:7: \"use\" in [devices.x] must be [plugin, "
            "{ index | uuid | pci_bus_id = ... }], found an array of 1 element");
  EXPECT_THAT(error_of("[devices.x]\nuse = [\"cuda\", { index = 0 }, 3]\n"),
              HasSubstr("found an array of 3 elements"));
}

TEST(ParseConfigErrors, GivenUseWithBadPluginName_WhenParsing_ThenError) {
  EXPECT_EQ(error_of("[devices.x]\nuse = [\"cu da\", { index = 0 }]\n"),
            "/cfg/devalloc.toml:2:8: \"use\" in [devices.x]: invalid plugin "
            "name \"cu da\": use at most 256 letters, digits, \"_\" and \"-\"");
  EXPECT_EQ(error_of("[devices.x]\nuse = 5\n"),
            "/cfg/devalloc.toml:2:7: \"use\" in [devices.x] must be a plugin "
            "name or [plugin, { index | uuid | pci_bus_id = ... }], found an "
            "integer");
}

TEST(ParseConfigErrors, GivenTwoTagsFallingBackToEachOther_WhenParsing_ThenCycleIsReportedWhereItCloses) {
  const std::string message = error_of(R"([devices."cuda:0"]
fallback = ["hip:0"]

[devices."hip:0"]
fallback = ["host", "cuda:0"]
)");
  EXPECT_EQ(message,
            "/cfg/devalloc.toml:5:21: fallback cycle: \"cuda:0\" -> \"hip:0\" "
            "-> \"cuda:0\"");
}

TEST(ParseConfigErrors, GivenTagFallingBackToItself_WhenParsing_ThenCycleIsReported) {
  EXPECT_EQ(error_of("[devices.host]\nfallback = [\"host\"]\n"),
            "/cfg/devalloc.toml:2:13: fallback cycle: \"host\" -> \"host\"");
}

TEST(ParseConfigErrors, GivenSeveralErrors_WhenParsing_ThenAllAreReportedInFileOrder) {
  const std::string message = error_of(R"([memory]
x = "host"

[load]
threads = -1
stagin = 1
)");
  EXPECT_EQ(message,
            "/cfg/devalloc.toml:2:1: memory id \"x\" in [memory] is not an "
            "unsigned 32-bit integer (decimal, without sign or leading zeros)\n"
            "/cfg/devalloc.toml:5:11: \"threads\" in [load] must be between 0 "
            "and 1024 (0: automatic), found -1\n"
            "/cfg/devalloc.toml:6:1: unknown key \"stagin\" in [load] (known: "
            "check_free_memory, direct, external_files, fallback, read, release_timeout, staging, "
            "threads, verify)");
}

class ReadConfigTest : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, std::string_view text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }

  test::ScratchDir scratch_{"config"};
  const fs::path dir_ = scratch_.path();
};

TEST_F(ReadConfigTest, GivenFile_WhenReading_ThenRelativePathsResolveAgainstItsFolder) {
  const fs::path path = write("devalloc.toml", R"(plugin_path = ["plugins", "../other"]
[plugins.mine]
library = "libdevalloc_mine.so"
)");
  const auto config = read_config(path);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->source, path);
  EXPECT_THAT(config->plugin_path,
              ElementsAre(dir_ / "plugins", dir_.parent_path() / "other"));
  EXPECT_EQ(config->plugins.at("mine").library, dir_ / "libdevalloc_mine.so");
}

TEST_F(ReadConfigTest, GivenFileWithError_WhenReading_ThenErrorNamesThePath) {
  const fs::path path = write("bad.toml", "[load]\nverify = \"yes\"\n");
  const auto config = read_config(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            path.string() + ":2:10: \"verify\" in [load] must be a boolean, "
                            "found a string");
}

TEST_F(ReadConfigTest, GivenMissingFile_WhenReading_ThenErrorNamesPathAndReason) {
  const auto config = read_config(dir_ / "absent.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            (dir_ / "absent.toml").string() +
                ": cannot open: No such file or directory");
}

// The message began with the empty name: ": cannot open: ...".
TEST_F(ReadConfigTest, GivenEmptyPath_WhenReading_ThenSaysItNamesNoFile) {
  const auto config = read_config("");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(config.status().message(), "the config path is empty: it names no file");
}

// The C++ way without testing ok(): value() throws devalloc::Error whose
// what() is the message, not std::bad_variant_access.
TEST_F(ReadConfigTest, GivenMissingFile_WhenTakingTheValue_ThenErrorSaysWhy) {
  try {
    (void)read_config(dir_ / "absent.toml").value();
    FAIL() << "value() returned";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              (dir_ / "absent.toml").string() + ": cannot open: No such file or directory");
  }
}

TEST_F(ReadConfigTest, GivenDirectory_WhenReading_ThenError) {
  const auto config = read_config(dir_);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), dir_.string() + ": not a regular file (a directory)");
}

// Issue 9: a FIFO blocked the reader forever, /dev/zero filled memory.
TEST_F(ReadConfigTest, GivenFifoOrDevice_WhenReading_ThenRefusedAtOnce) {
  ::alarm(30);  // a hang fails instead of stalling the suite
  const fs::path fifo = dir_ / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_config(fifo).status().message(),
            fifo.string() + ": not a regular file (a FIFO)");
  EXPECT_EQ(read_config("/dev/zero").status().message(),
            "/dev/zero: not a regular file (a character device)");
  ::alarm(0);
}

TEST_F(ReadConfigTest, GivenFileAboveTheSizeLimit_WhenReading_ThenRefusedUnread) {
  const fs::path path = write("huge.toml", "");
  fs::resize_file(path, kMaxConfigBytes + 1);  // sparse
  EXPECT_EQ(read_config(path).status().message(),
            path.string() + ": the config is 1048577 bytes, above the limit of 1048576 bytes");
}

TEST(ParseConfigErrors, GivenNulOrInvalidUtf8InPathsAndOptions_WhenParsing_ThenErrorWithTheOffset) {
  const auto config = parse_config(
      "plugin_path = [\"dir\\u0000x\"]\n"
      "[plugins.mine]\n"
      "library = \"lib\\u0000.so\"\n"
      "options = { path = \"model.safetensors\\u0000/../../etc/passwd\" }\n",
      "/cfg/devalloc.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "/cfg/devalloc.toml:1:16: the \"plugin_path\" entry \"dir\\x00x\" contains a NUL "
            "byte at offset 3\n"
            "/cfg/devalloc.toml:3:11: \"library\" in [plugins.mine] \"lib\\x00.so\" contains a "
            "NUL byte at offset 3\n"
            "/cfg/devalloc.toml:4:20: the value of option \"path\" of plugin \"mine\" "
            "\"model.safetensors\\x00/../../etc/passwd\" contains a NUL byte at offset 17");
}

// A duration is quoted like every other value: escaped for the terminal
// and cut after 200 bytes (it was repeated raw and whole, twice).
TEST(ParseConfigErrors, GivenADurationWithEscapesOrOfAMegabyte_WhenRefused_ThenItIsQuotedEscapedAndCut) {
  EXPECT_EQ(error_of("[load]\nrelease_timeout = \"5\\u001b[2Js\"\n"),
            "/cfg/devalloc.toml:2:19: \"release_timeout\" in [load]: invalid "
            "duration \"5\\x1b[2Js\": unknown or missing unit \"\\x1b[2Js\" "
            "(known: ms, s, min)");
  const std::string message =
      error_of("[load]\nrelease_timeout = \"5" + std::string(1000000, 'x') + "\"\n");
  EXPECT_LT(message.size(), 1000u);
  EXPECT_NE(message.find("(1000001 bytes)"), std::string::npos) << message.substr(0, 300);
}

TEST(ParseByteSize, GivenEachUnit_WhenParsing_ThenItsFactorApplies) {
  EXPECT_EQ(parse_byte_size("4096").value(), 4096u);
  EXPECT_EQ(parse_byte_size("4096B").value(), 4096u);
  EXPECT_EQ(parse_byte_size("3KiB").value(), 3u * 1024);
  EXPECT_EQ(parse_byte_size("64MiB").value(), uint64_t{64} << 20);
  EXPECT_EQ(parse_byte_size("64 MiB").value(), uint64_t{64} << 20);
  EXPECT_EQ(parse_byte_size("2GiB").value(), uint64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("2TiB").value(), uint64_t{2} << 40);
  EXPECT_EQ(parse_byte_size("3KB").value(), 3000u);
  EXPECT_EQ(parse_byte_size("64MB").value(), 64000000u);
  EXPECT_EQ(parse_byte_size("2GB").value(), 2000000000u);
  EXPECT_EQ(parse_byte_size("2TB").value(), 2000000000000u);
  EXPECT_EQ(parse_byte_size("18446744073709551615").value(),
            18446744073709551615u);
}

TEST(ParseByteSize, GivenMalformedText_WhenParsing_ThenError) {
  for (const char* text :
       {"", "MiB", "-1MiB", "64mib", "64 M", "1.5GiB", "64MiB ", " 64MiB",
        "18446744073709551616", "16777216TiB"}) {
    EXPECT_FALSE(parse_byte_size(text).ok()) << text;
  }
}

TEST(DeviceTagSyntax, GivenValidAndInvalidTags_WhenParsing_ThenOnlyCanonicalFormsParse) {
  EXPECT_EQ(parse_device_tag("cuda:0"), (DeviceTag{"cuda", 0u}));
  EXPECT_EQ(parse_device_tag("level_zero:12"), (DeviceTag{"level_zero", 12u}));
  EXPECT_EQ(parse_device_tag("host"), (DeviceTag{"host", std::nullopt}));
  EXPECT_EQ(parse_device_tag("cuda:4294967295")->index, 4294967295u);
  for (const char* bad : {"", "cuda:", ":1", "cuda:01", "cuda:4294967296",
                          "cu/da:0", "cuda:0:0", "cuda:+1", "cu da"}) {
    EXPECT_FALSE(parse_device_tag(bad).has_value()) << bad;
  }
  EXPECT_EQ(parse_device_tag("hip:7")->to_string(), "hip:7");
  EXPECT_EQ(parse_device_tag("host")->to_string(), "host");
}

TEST(NormalizeUuid, GivenAcceptedSpellings_WhenNormalizing_ThenOneCanonicalForm) {
  const std::string canonical = "0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b";
  EXPECT_EQ(normalize_uuid(canonical), canonical);
  EXPECT_EQ(normalize_uuid("GPU-0F3C2A1E-5B6D-4E7F-8A9B-0C1D2E3F4A5B"), canonical);
  EXPECT_EQ(normalize_uuid("gpu-0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"), canonical);
  EXPECT_EQ(normalize_uuid("0f3c2a1e5b6d4e7f8a9b0c1d2e3f4a5b"), canonical);
  for (const char* bad : {"", "GPU-", "0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5",
                          "0f3c2a1e5b6d-4e7f-8a9b-0c1d2e3f4a5bx",
                          "0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5g",
                          "MIG-0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"}) {
    EXPECT_FALSE(normalize_uuid(bad).has_value()) << bad;
  }
}

TEST(NormalizePciBusId, GivenAcceptedSpellings_WhenNormalizing_ThenOneCanonicalForm) {
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("1:2:3.4"), "0001:02:03.4");
  EXPECT_EQ(normalize_pci_bus_id("10000:01:1f.7"), "10000:01:1f.7");
  for (const char* bad : {"", "3b:00", "3b.00.0", "3b:20.0", "3b:00.8",
                          "123:00.0", "000000000:3b:00.0", "x:3b:00.0",
                          "0000:3b:00:00.0", "3b:00.0 "}) {
    EXPECT_FALSE(normalize_pci_bus_id(bad).has_value()) << bad;
  }
}

TEST(DeviceSelectorText, GivenEachKind_WhenFormatting_ThenKindAndValueAreShown) {
  EXPECT_EQ(DeviceSelector::by_index(3).to_string(), "index 3");
  EXPECT_EQ(DeviceSelector::by_pci_bus_id("3b:00.0")->to_string(),
            "pci_bus_id 0000:3b:00.0");
  EXPECT_EQ(DeviceSelector::by_uuid("GPU-0F3C2A1E-5B6D-4E7F-8A9B-0C1D2E3F4A5B")
                ->to_string(),
            "uuid 0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b");
  EXPECT_FALSE(DeviceSelector::by_uuid("nope").has_value());
  EXPECT_FALSE(DeviceSelector::by_pci_bus_id("nope").has_value());
  EXPECT_EQ((DeviceBinding{"hip", DeviceSelector::by_index(1)}).to_string(),
            "hip index 1");
}

TEST(SourceLocationText, GivenLineAndColumn_WhenFormatting_ThenFileLineColumn) {
  EXPECT_EQ((SourceLocation{"a.toml", 12, 5}).to_string(), "a.toml:12:5");
  EXPECT_EQ((SourceLocation{"a.toml", 0, 0}).to_string(), "a.toml");
}

TEST(RuntimeConfigPlugin, GivenConfiguredAndUnconfiguredNames_WhenLookingUp_ThenOptionsOnlyForConfigured) {
  const RuntimeConfig config = parsed(R"([plugins.cuda]
options = { runtime_library = "libcuda.so.1" }
)");
  EXPECT_THAT(config.plugin("cuda").options,
              ElementsAre(Pair("runtime_library", "libcuda.so.1")));
  const PluginConfig other = config.plugin("hip");
  EXPECT_EQ(other.name, "hip");
  EXPECT_TRUE(other.options.empty());
  EXPECT_EQ(other.load_spec(), "hip");
}

TEST(DefaultConfig, GivenNoFile_WhenAskingForDefaults_ThenNothingIsConfigured) {
  const RuntimeConfig config = default_config();
  EXPECT_TRUE(config.source.empty());
  expect_nothing_configured(config);
}

}  // namespace
}  // namespace devalloc
