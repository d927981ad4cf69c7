#include <devalloc/core/device_selection.hpp>
#include <devalloc/core/placement.hpp>
#include <devalloc/core/plan.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace devalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RuntimeConfig parsed(std::string_view text) {
  auto result = parse_config(text, "/cfg/devalloc.toml");
  EXPECT_TRUE(result.ok()) << result.status().message();
  return result.ok() ? std::move(result).value() : RuntimeConfig{};
}

DeviceBinding at_index(std::string plugin, uint32_t index) {
  return DeviceBinding{std::move(plugin), DeviceSelector::by_index(index)};
}

// "plugin index" / "via" / fallback, compact for ElementsAre.
std::string describe(const DeviceCandidate& candidate) {
  return candidate.binding.to_string() + " via " + candidate.via_tag +
         (candidate.is_fallback ? " (fallback)" : "");
}

std::vector<std::string> describe_all(const std::vector<DeviceCandidate>& all) {
  std::vector<std::string> out;
  for (const auto& candidate : all) out.push_back(describe(candidate));
  return out;
}

DeviceInfo device(uint32_t index, std::array<uint8_t, 16> uuid,
                  std::string pci_bus_id) {
  DeviceInfo info;
  info.index = index;
  info.name = "fake " + std::to_string(index);
  info.uuid = uuid;
  info.pci_bus_id = std::move(pci_bus_id);
  return info;
}

// Three devices: distinct UUIDs and bus ids, listed out of index order and
// spelled the way plugins report them.
std::vector<DeviceInfo> fake_devices() {
  return {
      device(2, {0x0f, 0x3c, 0x2a, 0x1e, 0x5b, 0x6d, 0x4e, 0x7f, 0x8a, 0x9b,
                 0x0c, 0x1d, 0x2e, 0x3f, 0x4a, 0x5b},
             "00000000:AF:00.0"),
      device(0, {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa,
                 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00},
             "0000:3b:00.0"),
      device(1, {}, ""),
  };
}

TEST(DefaultBinding, GivenNoConfig_WhenExpandingTags_ThenTagNameIsPluginAndIndexIsDevice) {
  const RuntimeConfig config = default_config();
  EXPECT_THAT(describe_all(candidate_bindings(config, "cuda:3").value()),
              ElementsAre("cuda index 3 via cuda:3"));
  EXPECT_THAT(describe_all(candidate_bindings(config, "host").value()),
              ElementsAre("host index 0 via host"));
  EXPECT_THAT(describe_all(candidate_bindings(config, "level_zero:1").value()),
              ElementsAre("level_zero index 1 via level_zero:1"));
}

TEST(CandidateBindings, GivenInvalidTag_WhenExpanding_ThenErrorNamesIt) {
  const auto result = candidate_bindings(default_config(), "cuda:x");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "invalid device tag \"cuda:x\": expected \"name\" or "
            "\"name:index\"");
}

TEST(CandidateBindings, GivenFallbackChain_WhenExpanding_ThenPrimaryThenFallbacksDepthFirst) {
  const RuntimeConfig config = parsed(R"([devices."cuda:0"]
use = ["cuda", { pci_bus_id = "3b:00.0" }]
fallback = ["hip:0", ["cuda", { index = 1 }], "host"]

[devices."hip:0"]
fallback = ["level_zero:0"]
)");
  EXPECT_THAT(describe_all(candidate_bindings(config, "cuda:0").value()),
              ElementsAre("cuda pci_bus_id 0000:3b:00.0 via cuda:0",
                          "hip index 0 via hip:0 (fallback)",
                          "level_zero index 0 via level_zero:0 (fallback)",
                          "cuda index 1 via cuda:0 (fallback)",
                          "host index 0 via host (fallback)"));
  EXPECT_THAT(describe_all(candidate_bindings(config, "hip:0").value()),
              ElementsAre("hip index 0 via hip:0",
                          "level_zero index 0 via level_zero:0 (fallback)"));
}

TEST(CandidateBindings, GivenTwoPathsToOneBinding_WhenExpanding_ThenItIsTriedOnce) {
  const RuntimeConfig config = parsed(R"([devices.a]
use = ["cuda", { index = 0 }]
fallback = ["b", "c"]

[devices.b]
use = ["cuda", { index = 1 }]
fallback = ["c"]

[devices.c]
use = "host"
fallback = [["cuda", { index = 0 }]]
)");
  EXPECT_THAT(describe_all(candidate_bindings(config, "a").value()),
              ElementsAre("cuda index 0 via a", "cuda index 1 via b (fallback)",
                          "host index 0 via c (fallback)"));
}

TEST(CandidateBindings, GivenHandBuiltCycle_WhenExpanding_ThenCycleIsRejected) {
  RuntimeConfig config = default_config();
  for (const auto& [tag, next] :
       {std::pair{"x", "y"}, std::pair{"y", "z"}, std::pair{"z", "y"}}) {
    DeviceTagConfig device;
    device.tag = tag;
    device.primary = at_index("host", 0);
    device.fallbacks.push_back(DeviceFallback{std::string(next), {}});
    config.devices.emplace(tag, device);
  }
  const auto result = candidate_bindings(config, "x");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(result.status().message(),
            "fallback cycle: \"y\" -> \"z\" -> \"y\"");
}

TEST(CandidateBindings, GivenSameTagTwiceWithoutCycle_WhenExpanding_ThenItIsNotACycle) {
  const RuntimeConfig config = parsed(R"([devices.a]
fallback = ["host", "b"]

[devices.b]
fallback = ["host"]
)");
  EXPECT_THAT(describe_all(candidate_bindings(config, "a").value()),
              ElementsAre("a index 0 via a", "host index 0 via host (fallback)",
                          "b index 0 via b (fallback)"));
}

// The first ```toml block of docs/config.md, which the reference walks
// through.
std::string documented_example() {
  std::ifstream file(std::string(DEVALLOC_SOURCE_DIR) + "/docs/config.md");
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  const size_t open = doc.find("```toml\n");
  const size_t close = doc.find("```\n", open + 8);
  if (open == std::string::npos || close == std::string::npos) return {};
  return doc.substr(open + 8, close - open - 8);
}

TEST(CandidateBindings, GivenTheDocumentedExample_WhenExpandingCuda0_ThenTheDocumentedOrder) {
  const std::string example = documented_example();
  ASSERT_THAT(example, HasSubstr("[devices.\"cuda:0\"]"));
  const RuntimeConfig config = parsed(example);
  EXPECT_THAT(describe_all(candidate_bindings(config, "cuda:0").value()),
              ElementsAre("cuda uuid 0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b via cuda:0",
                          "cuda pci_bus_id 0000:af:00.0 via cuda:1 (fallback)",
                          "host index 0 via host (fallback)"));
  EXPECT_THAT(describe_all(candidate_bindings(config, "big").value()),
              ElementsAre("cuda12 index 0 via big", "cuda index 1 via big (fallback)",
                          "host index 0 via host (fallback)"));
  EXPECT_EQ(tag_for_memory(config, 12, "cuda:0"), "big");
}

TEST(TagForMemory, GivenOverride_WhenAskingForTag_ThenOverrideWinsOverPlan) {
  const RuntimeConfig config = parsed("[memory]\n7 = \"host\"\n");
  EXPECT_EQ(tag_for_memory(config, 7, "cuda:0"), "host");
  EXPECT_EQ(tag_for_memory(config, 8, "cuda:0"), "cuda:0");
  EXPECT_EQ(tag_for_memory(default_config(), 7, "hip:1"), "hip:1");
}

TEST(SelectDevice, GivenIndex_WhenSelecting_ThenDeviceWithThatIndexWhateverItsPosition) {
  const auto devices = fake_devices();
  EXPECT_EQ(select_device(DeviceSelector::by_index(0), devices), 0u);
  EXPECT_EQ(select_device(DeviceSelector::by_index(2), devices), 2u);
  EXPECT_EQ(select_device(DeviceSelector::by_index(3), devices), std::nullopt);
  EXPECT_EQ(select_device(DeviceSelector::by_index(0), {}), std::nullopt);
}

TEST(SelectDevice, GivenUuidInAnySpelling_WhenSelecting_ThenTheDeviceWithThatUuid) {
  const auto devices = fake_devices();
  for (const char* text : {"0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b",
                           "GPU-0F3C2A1E-5B6D-4E7F-8A9B-0C1D2E3F4A5B",
                           "0f3c2a1e5b6d4e7f8a9b0c1d2e3f4a5b"}) {
    EXPECT_EQ(select_device(*DeviceSelector::by_uuid(text), devices), 2u)
        << text;
  }
  EXPECT_EQ(select_device(*DeviceSelector::by_uuid(
                              "11223344-5566-7788-99aa-bbccddeeff00"),
                          devices),
            0u);
}

TEST(SelectDevice, GivenUnknownOrZeroUuid_WhenSelecting_ThenNothingMatches) {
  const auto devices = fake_devices();
  EXPECT_EQ(select_device(*DeviceSelector::by_uuid(
                              "0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5c"),
                          devices),
            std::nullopt);
  // Device 1 reports no UUID (all zero bytes); an all-zero selector must not
  // pick it.
  EXPECT_EQ(select_device(*DeviceSelector::by_uuid(
                              "00000000-0000-0000-0000-000000000000"),
                          devices),
            std::nullopt);
}

TEST(SelectDevice, GivenPciBusIdWithOrWithoutDomainInAnyCase_WhenSelecting_ThenThatDevice) {
  const auto devices = fake_devices();
  EXPECT_EQ(select_device(*DeviceSelector::by_pci_bus_id("af:00.0"), devices),
            2u);
  EXPECT_EQ(select_device(*DeviceSelector::by_pci_bus_id("0000:AF:00.0"),
                          devices),
            2u);
  EXPECT_EQ(select_device(*DeviceSelector::by_pci_bus_id("3B:00.0"), devices),
            0u);
  EXPECT_EQ(select_device(*DeviceSelector::by_pci_bus_id("0001:3b:00.0"),
                          devices),
            std::nullopt);
  EXPECT_EQ(select_device(*DeviceSelector::by_pci_bus_id("3b:00.1"), devices),
            std::nullopt);
}

TEST(NoMatchReason, GivenEachKind_WhenNothingMatched_ThenWhatThePluginHasIsListed) {
  const auto devices = fake_devices();
  EXPECT_EQ(no_match_reason(DeviceSelector::by_index(5), devices),
            "no device with index 5 (devices: 2, 0, 1)");
  EXPECT_EQ(no_match_reason(*DeviceSelector::by_pci_bus_id("3b:00.1"), devices),
            "no device with PCI bus id 0000:3b:00.1 (devices: #2 "
            "00000000:AF:00.0, #0 0000:3b:00.0, #1 no PCI bus id)");
  EXPECT_EQ(no_match_reason(*DeviceSelector::by_uuid(
                                "00000000-0000-0000-0000-000000000001"),
                            devices),
            "no device with uuid 00000000-0000-0000-0000-000000000001 "
            "(devices: #2 0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b, #0 "
            "11223344-5566-7788-99aa-bbccddeeff00, #1 no uuid)");
  EXPECT_EQ(no_match_reason(DeviceSelector::by_index(0), {}),
            "no device with index 0 (the plugin reports no devices)");
  // A plugin's PCI bus id is its own text: shown escaped.
  auto hostile = devices;
  hostile[0].pci_bus_id = "0000:\x1b[2J:00.0";
  EXPECT_EQ(no_match_reason(*DeviceSelector::by_pci_bus_id("3b:00.1"), hostile),
            "no device with PCI bus id 0000:3b:00.1 (devices: #2 "
            "0000:\\x1b[2J:00.0, #0 0000:3b:00.0, #1 no PCI bus id)");
}

TEST(NoDeviceError, GivenEveryCandidateFailed_WhenFormatting_ThenEachAttemptAndReasonIsListed) {
  const RuntimeConfig config = parsed(R"([devices."cuda:0"]
fallback = [["cuda", { index = 1 }], "host"]
)");
  const auto candidates = candidate_bindings(config, "cuda:0").value();
  ASSERT_EQ(candidates.size(), 3u);
  const std::vector<SelectionAttempt> attempts{
      {candidates[0], "plugin cuda is unavailable: libcuda.so.1 not found"},
      {candidates[1], "plugin cuda is unavailable: libcuda.so.1 not found"},
      {candidates[2], "no device with index 0 (the plugin reports no devices)"},
  };
  const Status status = no_device_error("cuda:0", 3u, attempts);
  EXPECT_EQ(status.code(), StatusCode::no_such_device);
  EXPECT_EQ(status.message(),
            "no device for \"cuda:0\" (memory id 3): cuda index 0: plugin cuda "
            "is unavailable: libcuda.so.1 not found; fallback cuda index 1: "
            "plugin cuda is unavailable: libcuda.so.1 not found; fallback host "
            "index 0 (device \"host\"): no device with index 0 (the plugin "
            "reports no devices)");
}

// Why a tag resolved only through a fallback is said as the error would
// say it had the fallback failed too (ResolvedDevice::fallback_reason).
TEST(AttemptsText, GivenFailedPrimary_WhenFormatting_ThenAsNoDeviceErrorListsIt) {
  const RuntimeConfig config = parsed(R"([devices."cuda:0"]
use = ["cdua", { index = 0 }]
fallback = ["host"]
)");
  const auto candidates = candidate_bindings(config, "cuda:0").value();
  ASSERT_EQ(candidates.size(), 2u);
  const std::vector<SelectionAttempt> attempts{
      {candidates[0], "plugin cdua is unavailable: not found"}};
  EXPECT_EQ(attempts_text("cuda:0", attempts), "cdua index 0: plugin cdua is unavailable: not found");
  EXPECT_EQ(no_device_error("cuda:0", 0u, attempts).message(),
            "no device for \"cuda:0\" (memory id 0): " + attempts_text("cuda:0", attempts));
  EXPECT_EQ(attempts_text("cuda:0", {}), "nothing was tried");
}

Plan plan_on(std::vector<std::string> tags) {
  Plan plan;
  plan.path = "/m/plan.json";
  for (uint32_t id = 0; id < tags.size(); ++id) plan.buffers.push_back({id, tags[id], 16, 1, std::nullopt});
  return plan;
}

// A [devices."cuda0"] entry (a typo of "cuda:0") was accepted without a word
// and the plan's "cuda:0" resolved by default.
TEST(UnusedDeviceEntries, GivenEntryNoBufferReaches_ThenOneLineNamingItAndWhere) {
  const RuntimeConfig config = parsed(R"([devices."cuda0"]
use = ["cuda", { index = 1 }]

[devices."cuda:1"]
fallback = ["spare"]

[devices.spare]
use = "host"

[devices."hip:0"]
)");
  EXPECT_THAT(unused_device_entries(config, plan_on({"cuda:0", "cuda:1", "cuda:0"})),
              ElementsAre("/cfg/devalloc.toml:1:10: [devices.\"cuda0\"] is used by no buffer of "
                          "/m/plan.json (its device tags: \"cuda:0\", \"cuda:1\")",
                          "/cfg/devalloc.toml:10:10: [devices.\"hip:0\"] is used by no buffer "
                          "of /m/plan.json (its device tags: \"cuda:0\", \"cuda:1\")"));
}

TEST(UnusedDeviceEntries, GivenEntriesReachedByTagMemoryOverrideOrFallback_ThenNone) {
  const RuntimeConfig config = parsed(R"([devices."cuda:0"]
fallback = ["b"]
[devices.b]
fallback = ["c"]
[devices.c]
[devices.moved]
[memory]
1 = "moved"
)");
  EXPECT_THAT(unused_device_entries(config, plan_on({"cuda:0", "host"})), ElementsAre());
  EXPECT_THAT(unused_device_entries(default_config(), plan_on({"cuda:0"})), ElementsAre());
}

TEST(NoDeviceError, GivenNoMemoryId_WhenFormatting_ThenItIsLeftOut) {
  const auto candidates = candidate_bindings(default_config(), "hip:1").value();
  const Status status =
      no_device_error("hip:1", std::nullopt, {{candidates[0], "boom"}});
  EXPECT_EQ(status.message(), "no device for \"hip:1\": hip index 1: boom");
}

TEST(Resolution, GivenOverrideAndFallback_WhenResolvingLikeTheRuntime_ThenFirstWorkingCandidateWins) {
  const RuntimeConfig config = parsed(R"([devices.fast]
use = ["cuda", { uuid = "11223344-5566-7788-99aa-bbccddeeff00" }]
fallback = ["host"]

[memory]
4 = "fast"
)");
  const std::vector<DeviceInfo> cuda_devices = fake_devices();
  const std::vector<DeviceInfo> host_devices{device(0, {}, "")};

  const std::string tag = tag_for_memory(config, 4, "cuda:0");
  ASSERT_EQ(tag, "fast");
  const auto candidates = candidate_bindings(config, tag);
  ASSERT_TRUE(candidates.ok()) << candidates.status().message();
  std::optional<std::pair<std::string, uint32_t>> chosen;
  for (const auto& candidate : candidates.value()) {
    const auto& devices =
        candidate.binding.plugin == "cuda" ? cuda_devices : host_devices;
    if (auto index = select_device(candidate.binding.selector, devices)) {
      chosen.emplace(candidate.binding.plugin, *index);
      break;
    }
  }
  EXPECT_EQ(chosen, std::make_pair(std::string("cuda"), 0u));
}

}  // namespace
}  // namespace devalloc
