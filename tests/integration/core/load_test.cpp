// The core's load through the real loader and the host plugin: what is
// allocated and copied, where it goes, and that failures leave nothing.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/placement.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/input_text.hpp>

#include <gmock/gmock.h>

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

namespace devalloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Sync and async host plugin: the async one lands copies later on a worker,
// so release callbacks and synchronize are exercised for real.
class HostLoad : public LoadFixture, public ::testing::WithParamInterface<bool> {
 protected:
  RuntimeConfig host_config() {
    return config(std::string("[plugins.host]\noptions = { async = ") +
                  (GetParam() ? "true" : "false") + " }\n");
  }
};

TEST_P(HostLoad, GivenTwoMethodsSharingWeights_WhenLoadingBoth_ThenEachBufferAllocatedOnceAndEachConstantCopiedOnce) {
  auto runtime = Runtime::create(host_config());
  LoadReport report;
  auto program = runtime->load(plan(), {.methods = {"prefill", "decode"}, .report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(report.allocations, 3u);
  EXPECT_EQ(report.constants, 3u);  // w.a, w.b, head; "empty" has no bytes
  EXPECT_EQ(report.bytes, 256u + 512u + 256u);
  // w.a and w.b lie back to back in file and buffer: one piece for both,
  // copied through staging or read directly (pipeline_test.cpp tells which).
  EXPECT_EQ(report.copies + report.direct_reads, 2u);
  for (const char* name : {"w.a", "w.b", "head"}) {
    const std::optional<LoadedTensor> t = (*program)->find(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(read_back(*t), source(name)) << name;
    EXPECT_EQ(t->device().plugin_name, "host");
  }
}

TEST_P(HostLoad, GivenOneMethodLoaded_WhenLoadingTheOther_ThenSharedBuffersAndConstantsAreReused) {
  auto runtime = Runtime::create(host_config());
  LoadReport first, second;
  auto program = runtime->load(plan(), {.methods = {"prefill"}, .report = &first});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(first.allocations, 2u);
  EXPECT_EQ(first.constants, 2u);
  const uint64_t shared_address = (*program)->find("w.a")->address();
  EXPECT_FALSE((*program)->find("head"));

  ASSERT_TRUE((*program)->load_methods({.methods = {"decode"}, .report = &second}).ok());
  EXPECT_EQ(second.allocations, 1u);  // buffer 1 only
  EXPECT_EQ(second.constants, 1u);    // head only
  EXPECT_EQ((*program)->find("w.a")->address(), shared_address);
  EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
}

TEST_P(HostLoad, GivenBothMethodsLoaded_WhenUnloadingOne_ThenOnlyItsOwnBufferIsFreed) {
  const uint64_t before = DeviceBuffer::live_count();
  auto runtime = Runtime::create(host_config());
  auto program = runtime->load(plan());
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(DeviceBuffer::live_count(), before + 3);
  ASSERT_TRUE((*program)->unload_method("decode").ok());
  EXPECT_EQ(DeviceBuffer::live_count(), before + 2);
  EXPECT_FALSE((*program)->find("head"));
  ASSERT_TRUE((*program)->find("w.b"));
  EXPECT_EQ(read_back(*(*program)->find("w.b")), source("w.b"));
  EXPECT_EQ((*program)->unload_method("decode").code(), StatusCode::invalid_argument);
  ASSERT_TRUE((*program)->unload_method("prefill").ok());
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_P(HostLoad, GivenScratchAndEmptyTensors_WhenLoading_ThenTheyArePlacedButNotCopied) {
  auto runtime = Runtime::create(host_config());
  auto program = runtime->load(plan(), {.methods = {"prefill"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  const std::optional<LoadedTensor> scratch = (*program)->find("scratch");
  ASSERT_TRUE(scratch);
  EXPECT_FALSE(scratch->planned.is_constant());
  EXPECT_EQ(scratch->nbytes(), 1024u);
  const std::optional<LoadedTensor> empty = (*program)->find("empty");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->nbytes(), 0u);
  EXPECT_EQ(empty->address(), (*program)->find("w.a")->address() + 768);
}

TEST_P(HostLoad, GivenVerify_WhenTheCopyIsRight_ThenTheLoadReportsVerified) {
  RuntimeConfig c = host_config();
  c.load.verify = true;
  LoadReport report;
  auto program = Runtime::create(c)->load(plan(), {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_TRUE(report.verified);
}

TEST_P(HostLoad, GivenStagingBelowOneSlot_WhenLoading_ThenOneSlotOf4KiBCarriesEachTensorRight) {
  RuntimeConfig c = host_config();
  // Below one slot of 4 KiB: one slot of 4 KiB (docs/config.md), so that
  // the bookkeeping of the pieces never outgrows the model.
  c.load.staging_bytes = 1;
  c.load.direct = false;
  LoadReport report;
  auto program = Runtime::create(c)->load(plan(), {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(read_back(*(*program)->find("w.b")), source("w.b"));
  EXPECT_EQ(report.copies, 2u);  // w.a (768 bytes) and w.b (256 bytes), one piece each
  EXPECT_EQ(report.pipeline.staging_slots, 1u);
  EXPECT_EQ(report.pipeline.slot_bytes, 4096u);
  EXPECT_EQ(report.pipeline.max_in_flight_bytes, 768u);
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, HostLoad, ::testing::Bool(),
                         [](const auto& param_info) { return param_info.param ? "async" : "sync"; });

TEST_F(LoadFixture, GivenMemoryOverride_WhenLoading_ThenThatBufferGoesWhereTheOverrideSays) {
  plan().buffers[1].device = "nosuchvendor:0";
  auto program = Runtime::create(config("[memory]\n1 = \"host\"\n"))->load(plan());
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ((*program)->find("head")->device().plugin_name, "host");
}

// The report covers every device the load allocated on: one that holds only
// scratch memory has its row, with nothing copied (it had none, and
// `devalloc load` printed no line for it).
TEST_F(LoadFixture, GivenADeviceWithOnlyScratchBuffers_WhenLoading_ThenTheReportListsItWithNothingCopied) {
  plan().buffers[2].device = "other";
  RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_zoo_well_behaved.so").string() +
                           "\"\n[devices.other]\nuse = \"zoo\"\n");
  LoadReport report;
  auto program = Runtime::create(c)->load(plan(), {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(report.allocations, 3u);
  ASSERT_EQ(report.devices.size(), 2u);
  EXPECT_EQ(report.devices[0].device.plugin_name, "host");
  EXPECT_EQ(report.devices[0].tensors, 3u);
  EXPECT_EQ(report.devices[1].device.plugin_name, "zoo");
  EXPECT_EQ(report.devices[1].device.device, 0u);
  EXPECT_EQ(report.devices[1].tensors, 0u);
  EXPECT_EQ(report.devices[1].bytes, 0u);
  EXPECT_EQ(report.devices[1].copies + report.devices[1].direct_reads, 0u);
  EXPECT_EQ((*program)->find("scratch")->device().plugin_name, "zoo");
}

TEST_F(LoadFixture, GivenUnavailablePrimaryWithHostFallback_WhenLoading_ThenTheFallbackServesIt) {
  plan().buffers[0].device = "nosuchvendor:0";
  auto program = Runtime::create(config(R"(
[devices."nosuchvendor:0"]
use = ["nosuchvendor", { index = 0 }]
fallback = ["host"]
)"))->load(plan());
  ASSERT_TRUE(program.ok()) << program.status().message();
  const std::optional<LoadedTensor> t = (*program)->find("w.a");
  EXPECT_TRUE(t->device().is_fallback);
  EXPECT_EQ(t->device().plugin_name, "host");
  EXPECT_EQ(read_back(*t), source("w.a"));
}

TEST_F(LoadFixture, GivenUnresolvableDevice_WhenLoading_ThenErrorNamesTagMemoryIdAndWhyAndNothingIsLeft) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().buffers[1].device = "nosuchvendor:0";
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr(plan().path.string() +
                              ": /buffers/1: no device for \"nosuchvendor:0\" (memory id 1)"),
                    HasSubstr("libdevalloc_nosuchvendor.so")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(LoadFixture, GivenUnvalidatedPlanWithTensorPastItsBuffer_WhenLoading_ThenRefusedBeforeAllocating) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().buffers[1].size = 128;  // head has 256 bytes
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("tensor \"head\""), HasSubstr("do not fit in buffer 1 of 128 bytes")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// A load checks what validate_plan checks of constants that overlap, with
// the same message: the README's path (read_plan straight into load) must
// not place one constant's bytes over another's.
TEST_F(LoadFixture, GivenUnvalidatedPlanWithOverlappingConstants_WhenLoading_ThenRefusedNamingBothBeforeAllocating) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().tensors[1].offset = 128;  // w.b [128, 640) over w.a [0, 256)
  const Status validated = validate_plan(plan(), PlanValidationOptions{.check_sources = false});
  ASSERT_FALSE(validated.ok());
  auto program = Runtime::create(default_config())->load(plan(), {.verify = true});
  ASSERT_FALSE(program.ok()) << "the load placed w.b over w.a";
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(program.status().message(), validated.message());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("plan.json: "),
                    HasSubstr("/tensors/1 \"w.b\": bytes [128, 640) of buffer 0 overlap "
                              "/tensors/0 \"w.a\" at [0, 256)")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// The check covers the whole plan, not the methods of the call: a method
// loaded later would otherwise overwrite an earlier one's constant, and
// verify would pass (it reads the later copy back).
TEST_F(LoadFixture, GivenOverlapOnlyInAMethodNotLoaded_WhenLoadingAnother_ThenRefusedAlready) {
  plan().tensors[2].memory_id = 0;  // head (decode only) over w.a [0, 256)
  plan().tensors[2].offset = 0;
  auto program = Runtime::create(default_config())->load(plan(), {.methods = {"prefill"}});
  ASSERT_FALSE(program.ok()) << "a later load_methods({\"decode\"}) would overwrite w.a";
  EXPECT_THAT(program.status().message(),
              HasSubstr("/tensors/2 \"head\": bytes [0, 256) of buffer 0 overlap /tensors/0 \"w.a\""));
}

// The buffer check of an unvalidated plan also holds for an offset past
// the end of its buffer: size - offset must not wrap into "fits".
TEST_F(LoadFixture, GivenUnvalidatedPlanWithOffsetPastItsBuffer_WhenLoading_ThenRefusedBeforeAllocating) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().tensors[2].offset = 512;  // head, in buffer 1 of 256 bytes
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("tensor \"head\""), HasSubstr("256 bytes do not fit in buffer 1 of 256 bytes")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// An unvalidated plan whose shape is smaller than its source: the copy
// would take the file's byte count, past what the plan placed (and checked
// against the buffer). Refused, naming both sizes, before any copy.
TEST_F(LoadFixture, GivenUnvalidatedPlanWithAShapeSmallerThanItsSource_WhenLoading_ThenRefusedNamingBothSizes) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().tensors[2].shape = {64};  // head: 128 bytes planned, 256 in the file
  plan().tensors[2].offset = 128;  // the file's 256 would end past buffer 1
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("tensor \"head\""), HasSubstr("the plan says 128 bytes"),
                    HasSubstr("has 256 for \"head\"")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(LoadFixture, GivenUnvalidatedPlanWithAnAbsoluteSource_WhenLoading_ThenRefusedNamingTheTensorBeforeAllocating) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().tensors[2].source->file = "/etc/passwd";  // "head"; external files not allowed
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(program.status().message(),
            path_for_message(plan().path.string()) +
                ": /tensors/2 \"head\": source file \"/etc/passwd\" is absolute; source files "
                "are relative to the plan's folder unless \"allow_external_files\" is true");
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// A plan in a folder of its own whose sources lie beside that folder, as
// "allow_external_files" lets them: loaded by default; refused, before any
// buffer is allocated or file opened, by a runtime whose [load]
// external_files = false does not honour the plan's word (and by
// validate_plan told the same).
TEST_F(LoadFixture, GivenAPlanAllowingExternalFiles_WhenTheConfigRefusesThem_ThenTheLoadAndValidationAreRefused) {
  std::filesystem::create_directory(dir() / "plans");
  plan().path = dir() / "plans" / "plan.json";
  for (PlanTensor& t : plan().tensors) {
    if (t.source) t.source->file = "../model.safetensors";
  }
  plan().allow_external_files = true;
  ASSERT_TRUE(validate_plan(plan()).ok()) << validate_plan(plan()).message();
  auto allowed = Runtime::create(default_config())->load(plan());
  ASSERT_TRUE(allowed.ok()) << allowed.status().message();
  EXPECT_EQ(read_back(*(*allowed)->find("w.b")), source("w.b"));

  const std::string refused =
      ": /tensors/0 \"w.a\": source file \"../model.safetensors\" resolves to " +
      path_for_message(std::filesystem::weakly_canonical(dir() / "model.safetensors").string()) +
      ", outside the plan's folder " +
      path_for_message(std::filesystem::weakly_canonical(dir() / "plans").string()) +
      "; the plan sets \"allow_external_files\", which this runtime does not honour "
      "([load] external_files = false)";
  PlanValidationOptions strict;
  strict.external_files = false;
  const Status validated = validate_plan(plan(), strict);
  EXPECT_EQ(validated.message(), path_for_message(plan().path.string()) + refused);

  const uint64_t before = DeviceBuffer::live_count();
  auto program =
      Runtime::create(config("[load]\nexternal_files = false\n"))->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(program.status().message(), path_for_message(plan().path.string()) + refused);
  EXPECT_EQ(DeviceBuffer::live_count(), before);

  plan().tensors[0].source->file = "/etc/passwd";
  auto absolute =
      Runtime::create(config("[load]\nexternal_files = false\n"))->load(plan());
  ASSERT_FALSE(absolute.ok());
  EXPECT_THAT(absolute.status().message(),
              HasSubstr("source file \"/etc/passwd\" is absolute; source files are relative to "
                        "the plan's folder; the plan sets \"allow_external_files\""));
}

// A process that can write the plan's folder swaps its source between a
// hard link to the real file and a symbolic link to a file outside while
// loads run: no load ever copies the outside file's bytes. (The source was
// resolved and checked, then opened by name again, which followed the link
// swapped in between.)
TEST_F(LoadFixture, GivenTheSourceSwappedBetweenAHardLinkAndALinkOutsideThePlanFolder_WhenLoadingRepeatedly_ThenNoLoadReadsTheOutsideFile) {
  test::ScratchDir elsewhere{"outside"};
  const std::filesystem::path outside = elsewhere / "outside.safetensors";
  // The same tensors, every byte 0x5a.
  const std::vector<std::byte> foreign_256(256, std::byte{0x5a});
  const std::vector<std::byte> foreign_512(512, std::byte{0x5a});
  const std::vector<SafetensorsWriteTensor> written = {
      {"w.a", DType::f32, {64}, foreign_256},
      {"w.b", DType::f16, {16, 16}, foreign_512},
      {"head", DType::bf16, {128}, foreign_256},
      {"empty", DType::f32, {0}, {}}};
  ASSERT_TRUE(write_safetensors(outside, written).ok());
  const std::filesystem::path name = dir() / "model.safetensors";
  const std::filesystem::path real = dir() / "real.safetensors";
  std::filesystem::rename(name, real);
  std::filesystem::create_hard_link(real, name);

  // One rename(2) per swap: the name and a link beside it trade places.
  const std::filesystem::path link = dir() / "swap-link";
  std::filesystem::create_symlink(outside, link);
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    while (!stop.load()) {
      ::renameat2(AT_FDCWD, name.c_str(), AT_FDCWD, link.c_str(), RENAME_EXCHANGE);
    }
  });
  auto runtime = Runtime::create(default_config());
  for (int i = 0; i < 300; ++i) {
    auto program = runtime->load(plan(), {.methods = {"prefill"}});
    if (program.ok()) {
      EXPECT_EQ(read_back(*(*program)->find("w.a")), source("w.a")) << "load " << i;
    } else {
      // Refused by the check of the resolved path, or by the open beneath
      // the folder when the link came in after it; or the real file, which
      // each swap renames (its status change time moves), was seen changed
      // under its header.
      EXPECT_THAT(program.status().message(),
                  ::testing::AnyOf(HasSubstr("outside the plan's folder"),
                                   HasSubstr("refused: it leads out of the folder"),
                                   HasSubstr("modified in place")))
          << "load " << i;
    }
  }
  stop.store(true);
  swapper.join();
}

// The same race, one step at a time, as a load takes the steps: the source
// is resolved while it is a hard link (needs_of), then becomes a link to a
// file outside before it is opened (SafetensorsCache::open, beneath the
// folder needs_of gives): refused, naming the file and the folder.
TEST_F(LoadFixture, GivenTheSourceResolvedAndThenSwappedForALinkOutside_WhenOpenedAsALoadOpensIt_ThenRefused) {
  test::ScratchDir elsewhere{"outside"};
  const std::filesystem::path outside = elsewhere / "outside.safetensors";
  std::filesystem::copy_file(dir() / "model.safetensors", outside);
  auto needs = needs_of(plan(), {"prefill"}, /*external_files=*/true);
  ASSERT_TRUE(needs.ok()) << needs.status().message();
  ASSERT_EQ(needs->files.size(), 1u);
  const std::filesystem::path folder = std::filesystem::weakly_canonical(dir());
  EXPECT_EQ(needs->files_beneath, folder);  // the plan does not allow external files
  std::filesystem::remove(dir() / "model.safetensors");
  std::filesystem::create_symlink(outside, dir() / "model.safetensors");
  SafetensorsCache files;
  auto opened = files.open(needs->files[0], needs->files_beneath);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().message(),
            path_for_message((folder / "model.safetensors").string()) +
                ": refused: it leads out of the folder " + path_for_message(folder.string()) +
                " (through a symbolic link or \"..\"); only files inside it may be opened");
  // A plan that allows external files: nothing to stay beneath, opened by
  // its path as before.
  plan().allow_external_files = true;
  auto external = needs_of(plan(), {"prefill"}, true);
  ASSERT_TRUE(external.ok()) << external.status().message();
  EXPECT_TRUE(external->files_beneath.empty());
}

// Names from files reach messages escaped: a terminal control sequence in a
// key is shown, never acted on.
TEST_F(LoadFixture, GivenSourceKeyWithControlCharacters_WhenMissing_ThenTheErrorShowsItEscaped) {
  plan().tensors[0].source->key = "no\x1b[2J\nsuch";
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(), HasSubstr("has no tensor \"no\\x1b[2J\\nsuch\""));
  EXPECT_EQ(program.status().message().find('\x1b'), std::string::npos);
  EXPECT_EQ(program.status().message().find('\n'), std::string::npos);
}

// The host_faulty variant, configured under the tag "host".
// PLUGIN-11 on every load, validation off: a plugin whose allocate hands
// out a misaligned base (zoo_misaligned returns base + 1) is refused before
// any copy, its allocation handed back, nothing left; loading on from it
// would have placed every tensor one byte off, with --verify passing.
TEST_F(LoadFixture, GivenAllocateReturnsAMisalignedAddress_WhenLoading_ThenRefusedNamingPlugin11) {
  const uint64_t before = DeviceBuffer::live_count();
  RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_zoo_misaligned.so").string() +
                           "\"\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n");
  c.load.verify = true;
  auto program = Runtime::create(c)->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::device_error);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr(plan().path.string() + ": /buffers/0: allocating buffer 0 (768 "
                                "bytes, alignment 256) on host (plugin zoo"),
                    HasSubstr("plugin zoo broke PLUGIN-11: allocate returned address 0x"),
                    HasSubstr(", not aligned to 256")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// The same, from a plugin whose deallocate then refuses the address too:
// the error says the memory could not be handed back, rather than dropping
// that second failure.
TEST_F(LoadFixture, GivenAMisalignedAddressThatCannotBeHandedBack_WhenLoading_ThenTheErrorSaysSo) {
  const uint64_t before = DeviceBuffer::live_count();
  RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_zoo_misaligned_keeps.so").string() +
                           "\"\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n");
  auto program = Runtime::create(c)->load(plan());
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("plugin zoo broke PLUGIN-11: allocate returned address 0x"),
                    HasSubstr("; handing it back failed too (plugin zoo: "),
                    HasSubstr("deallocate refuses every address"),
                    HasSubstr("the memory stays allocated until the plugin is destroyed")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Allocations that overlap on one device (shared_addresses: every one
// starts at the same address) would take each other's constants: without
// the validation layer the plugin handle refuses the second, naming the
// range it overlaps, and the load frees what it allocated; never load
// silently wrong bytes.
TEST_F(LoadFixture, GivenAllocateReturnsOverlappingAddresses_WhenLoading_ThenRefusedNamingBothBuffers) {
  const uint64_t before = DeviceBuffer::live_count();
  RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_zoo_shared_addresses.so").string() +
                           "\"\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n");
  auto program = Runtime::create(c)->load(plan());
  ASSERT_FALSE(program.ok()) << "w.a reads back as "
                             << (read_back(*(*program)->find("w.a")) == source("w.a")
                                     ? "its own bytes"
                                     : "another tensor's bytes");
  EXPECT_EQ(program.status().code(), StatusCode::device_error);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr(plan().path.string() + ": /buffers/1"),
                    HasSubstr("plugin zoo broke PLUGIN-11: allocate returned"),
                    HasSubstr("which overlaps [0x100000000000, 0x100000000300), allocated "
                              "earlier on device 0 and not freed")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// A later load_methods checks its new buffers against the program's live
// ones too.
TEST_F(LoadFixture, GivenAllocateReturnsAnAddressOverlappingALiveBuffer_WhenLoadingMore_ThenRefusedAndTheProgramUnchanged) {
  RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_zoo_shared_addresses.so").string() +
                           "\"\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n"
                           "[devices.other]\nuse = [\"host\", { index = 0 }]\n");
  plan().buffers[2].device = "other";  // scratch apart: prefill has one zoo buffer
  auto program = Runtime::create(c)->load(plan(), {.methods = {"prefill"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  const uint64_t before = DeviceBuffer::live_count();
  const Status more = (*program)->load_methods({.methods = {"decode"}});  // buffer 1 on the zoo
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(more.message(), AllOf(HasSubstr("/buffers/1"),
                                    HasSubstr("which overlaps [0x")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
  EXPECT_EQ((*program)->methods(), std::vector<std::string>{"prefill"});
  // The overlapping address is not handed back: this plugin would free the
  // first allocation at it, which is the live buffer's.
  EXPECT_TRUE((*program)->find("w.a").has_value());
  EXPECT_FALSE((*program)->find("head").has_value());
}

// A buffer that ends exactly at 2^64 (top_addresses: slot 0 starts 1 MiB
// below it) is no wrap: its last tensor loads, verifies and reads back,
// through the validation layer too.
TEST_F(LoadFixture, GivenABufferEndingExactlyAt2To64_WhenLoadingWithValidationAndVerify_ThenItsLastTensorIsRight) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  plan().buffers[0].size = kMiB;
  plan().buffers[1].size = kMiB;
  plan().tensors[1].offset = kMiB - 512;  // w.b at the end of buffer 0
  plan().tensors[2].offset = kMiB - 256;  // head at the end of buffer 1
  ASSERT_TRUE(validate_plan(plan()).ok()) << validate_plan(plan()).message();
  RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_zoo_top_addresses.so").string() +
                           "\"\nvalidate = true\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n");
  c.load.verify = true;
  auto program = Runtime::create(c)->load(plan());
  ASSERT_TRUE(program.ok()) << program.status().message();
  int at_top = 0;
  for (const char* name : {"w.a", "w.b", "head"}) {
    const std::optional<LoadedTensor> t = (*program)->find(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(read_back(*t), source(name)) << name;
    at_top += t->address() + t->nbytes() == 0;
  }
  EXPECT_EQ(at_top, 1);  // one of the two buffers got slot 0
}

class FaultyLoad : public LoadFixture {
 protected:
  // `faults`: injected by the validation layer around the faulty plugin.
  Result<std::shared_ptr<LoadedProgram>> load_with(const std::string& options,
                                                   bool verify = false,
                                                   bool check_free_memory = true,
                                                   const FaultInjection& faults = {}) {
    RuntimeConfig c = faulty_config(options);
    c.load.verify = verify;
    c.load.check_free_memory = check_free_memory;
    c.plugins["faulty"].layers.faults = faults;
    return Runtime::create(c)->load(plan());
  }

  RuntimeConfig faulty_config(const std::string& options) {
    return config("[plugins.faulty]\nlibrary = \"" +
                             (kZooDir / "libdevalloc_host_faulty.so").string() +
                             "\"\noptions = { async = \"true\"" +
                             (options.empty() ? "" : ", " + options) + " }\n[devices.host]\nuse = [\"faulty\", { index = 0 }]\n"
                             // Copies, not direct reads: the faults are in
                             // them; one loading thread keeps file order, so
                             // "the N-th copy" is always the same tensor.
                             "[load]\ndirect = false\nthreads = 1\n");
  }
};

// load(..., verify) overrides [load] verify for one call, on one runtime
// (the Python package's load(verify=...) relies on it).
TEST_F(FaultyLoad, GivenVerifyOverride_WhenLoading_ThenItWinsOverTheConfigForThatCall) {
  RuntimeConfig c = faulty_config("flip_byte_at_copy = \"2\"");
  c.load.verify = false;
  auto runtime = Runtime::create(c);
  LoadReport report;
  auto checked = runtime->load(plan(), {.report = &report, .verify = true});
  ASSERT_FALSE(checked.ok()) << "the override turned verify on";
  EXPECT_THAT(checked.status().message(), HasSubstr("verify: tensor \"head\""));

  c.load.verify = true;
  auto unchecked = Runtime::create(c)->load(plan(), {.report = &report, .verify = false});
  ASSERT_TRUE(unchecked.ok()) << unchecked.status().message();
  EXPECT_FALSE(report.verified);
}

// The fit check runs before the first allocate: were any allocate reached,
// the injected fault would be the error.
TEST_F(FaultyLoad, GivenPlanAboveTheDevicesFreeMemory_WhenLoading_ThenRefusedBeforeAnyAllocate) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_with("memory_limit = \"1024\"", false, true, {.fail_allocate_at = 1});
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::out_of_device_memory);
  EXPECT_EQ(program.status().message(),
            plan().path.string() +
                ": the load does not fit, nothing was allocated: faulty device 0 \"host memory\": "
                "plan needs 2.0 KiB in 3 buffers, 1.0 KiB free of 1.0 KiB (/buffers/0 (memory id "
                "0), /buffers/1 (memory id 1), /buffers/2 (memory id 2))");
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// A hostile plan's buffer sizes that add up past 2^64 must not wrap into
// "fits": the fit check saturates and refuses before any allocate.
TEST_F(FaultyLoad, GivenBufferSizesWhoseSumWrapsPast64Bits_WhenLoading_ThenRefusedBeforeAnyAllocate) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().buffers[1].size = uint64_t{1} << 63;
  plan().buffers[2].size = uint64_t{1} << 63;  // with buffer 0: 2^64 + 768 bytes
  auto program = load_with("memory_limit = \"4096\"", false, true, {.fail_allocate_at = 1});
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("the load does not fit, nothing was allocated"),
                    HasSubstr("in 3 buffers")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(FaultyLoad, GivenCheckFreeMemoryOff_WhenThePlanIsAboveTheLimit_ThenAllocateIsReachedAndHasTheLastWord) {
  auto program = load_with("memory_limit = \"1024\"", false, false, {.fail_allocate_at = 1});
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(), HasSubstr("fault injection (fail_allocate_at = 1)"));
  auto limited = load_with("memory_limit = \"1024\"", false, false);
  ASSERT_FALSE(limited.ok());
  EXPECT_EQ(limited.status().code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(limited.status().message(), HasSubstr("memory_limit"));
}

TEST_F(LoadFixture, GivenAMethodLoaded_WhenLoadingTheNext_ThenOnlyItsNewBuffersMustFitTheFreeMemory) {
  // prefill: buffers 0 and 2 (1792 B); decode adds buffer 1 (256 B).
  auto runtime = Runtime::create(config("[plugins.host]\noptions = { memory_limit = \"2048\" }\n"));
  auto program = runtime->load(plan(), {.methods = {"prefill"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  ASSERT_TRUE((*program)->load_methods({.methods = {"decode"}}).ok()) << "exactly the 256 bytes left";
  EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));

  auto tight = Runtime::create(config("[plugins.host]\noptions = { memory_limit = \"2047\" }\n"));
  auto first = tight->load(plan(), {.methods = {"prefill"}});
  ASSERT_TRUE(first.ok()) << first.status().message();
  const Status second = (*first)->load_methods({.methods = {"decode"}});
  EXPECT_EQ(second.code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(second.message(), HasSubstr("plan needs 256 B in 1 buffer, 255 B free of 2.0 KiB"));
  EXPECT_EQ((*first)->methods(), std::vector<std::string>{"prefill"});
}

TEST_F(FaultyLoad, GivenCorruptingPlugin_WhenLoadingWithVerify_ThenTheCorruptTensorIsNamedAndNothingIsLeft) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_with("flip_byte_at_copy = \"2\"", /*verify=*/true);
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("verify: tensor \"head\""), HasSubstr("differs from"),
                    HasSubstr("model.safetensors"), HasSubstr("plugin faulty")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Two tensors with the same bytes, each in a buffer of its own (so each is
// a copy of its own): the second copy lands corrupted, and the read-back of
// that tensor writes nothing. A verify pass whose read-back buffer still
// held the first tensor's bytes would take them for the second's and vouch
// for a corrupt tensor.
TEST_F(FaultyLoad, GivenAReadBackThatWritesNothing_WhenVerifying_ThenStaleBytesOfAnEqualTensorDoNotPass) {
  std::vector<std::byte> same(4096);
  for (size_t i = 0; i < same.size(); ++i) same[i] = static_cast<std::byte>(i * 7 + 3);
  const std::vector<SafetensorsWriteTensor> written = {{"twin.a", DType::u8, {4096}, same},
                                                      {"twin.b", DType::u8, {4096}, same}};
  ASSERT_TRUE(write_safetensors(dir() / "twins.safetensors", written).ok());
  Plan twins;
  twins.path = dir() / "twins.json";
  twins.buffers = {{0, "host", 4096, 256, std::nullopt}, {1, "host", 4096, 256, std::nullopt}};
  twins.tensors = {PlanTensor{"twin.a", DType::u8, {4096}, 0, 0,
                              PlanSource{"twins.safetensors", "twin.a", std::nullopt}},
                   PlanTensor{"twin.b", DType::u8, {4096}, 1, 0,
                              PlanSource{"twins.safetensors", "twin.b", std::nullopt}}};
  twins.methods = {{"forward", {0, 1}, {"twin.a", "twin.b"}}};
  ASSERT_TRUE(validate_plan(twins).ok());
  const uint64_t before = DeviceBuffer::live_count();
  for (const char* options : {"skip_read_back_at = \"2\"",
                              "flip_byte_at_copy = \"2\", skip_read_back_at = \"2\""}) {
    SCOPED_TRACE(options);
    RuntimeConfig c = faulty_config(options);
    c.load.verify = true;
    auto program = Runtime::create(c)->load(twins);
    ASSERT_FALSE(program.ok()) << "verify vouched for a tensor it never read back";
    EXPECT_THAT(program.status().message(),
                AllOf(HasSubstr("verify: tensor \"twin.b\""), HasSubstr("differs from")));
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

TEST_F(FaultyLoad, GivenCorruptingPlugin_WhenLoadingWithoutVerify_ThenTheLoadCannotTell) {
  auto program = load_with("flip_byte_at_copy = \"2\"");
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_NE(read_back(*(*program)->find("head")), source("head"));
}

TEST_F(FaultyLoad, GivenAllocateFailure_WhenLoading_ThenRolledBackWithBufferDeviceAndPluginNamed) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_with("", false, true, {.fail_allocate_at = 2});
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("allocating buffer 1"), HasSubstr("plugin faulty"),
                    HasSubstr("fault injection (fail_allocate_at = 2)")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(FaultyLoad, GivenCopyFailure_WhenLoading_ThenRolledBackWithTensorNamed) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_with("", false, true, {.fail_copy_at = 2});
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::device_error);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("copying tensor \"head\""), HasSubstr("buffer 1"),
                    HasSubstr("plugin faulty")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(FaultyLoad, GivenSynchronizeFailure_WhenLoading_ThenRolledBackWithDeviceNamed) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_with("", false, true, {.fail_synchronize = true});
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("synchronizing host"), HasSubstr("plugin faulty"),
                    HasSubstr("fault injection (fail_synchronize)")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(LoadFixture, GivenLoadedTensor_WhenExportedAsDlpack_ThenItDescribesTheDeviceBytesAndOutlivesTheProgram) {
  const uint64_t before = DeviceBuffer::live_count();
  DLManagedTensor* managed = nullptr;
  {
    auto program = Runtime::create(default_config())->load(plan(), {.methods = {"decode"}});
    ASSERT_TRUE(program.ok()) << program.status().message();
    auto exported = (*program)->export_dlpack("w.b");
    ASSERT_TRUE(exported.ok()) << exported.status().message();
    managed = *exported;
    const DLTensor& dl = managed->dl_tensor;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dl.data), (*program)->find("w.b")->address());
    EXPECT_EQ(dl.device.device_type, kDLCPU);
    EXPECT_EQ(dl.ndim, 2);
    EXPECT_EQ(dl.shape[0], 16);
    EXPECT_EQ(dl.dtype.code, kDLFloat);
    EXPECT_EQ(dl.dtype.bits, 16);
    EXPECT_EQ((*program)->export_dlpack("nope").status().code(), StatusCode::invalid_argument);
  }
  // The program is gone; the export keeps the buffer (host memory) alive.
  EXPECT_GT(DeviceBuffer::live_count(), before);
  EXPECT_EQ(std::memcmp(managed->dl_tensor.data, source("w.b").data(), source("w.b").size()), 0);
  managed->deleter(managed);
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

}  // namespace
}  // namespace devalloc::testing
