// The load pipeline of the copy schedule through the real loader and host
// plugins: the staging ring (fixed, pinned, never more in flight than the
// budget), direct reads into host-addressable memory, the read modes, and
// the release rules (PLUGIN-20 forward progress, PLUGIN-21 accounting) with
// the host variants that release only when synchronized or release twice.
#include <devalloc/core/config.hpp>
#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/core/safetensors.hpp>

#include "copy_schedule.hpp"
#include "verify.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "scratch_dir.hpp"

namespace devalloc::testing {
namespace {

// Whether the file system under dir takes O_DIRECT opens (tmpfs does not).
bool direct_io_works(const std::filesystem::path& dir) {
  const std::filesystem::path probe = dir / "o_direct_probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  return fd >= 0;
}

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::filesystem::path kZooDir = DEVALLOC_PLUGIN_ZOO_DIR;

constexpr uint64_t kTensors = 64;
constexpr uint64_t kTensorBytes = 4096;
constexpr uint64_t kModelBytes = kTensors * kTensorBytes;  // 256 KiB
constexpr uint64_t kStaging = 16 << 10;                    // 4 slots of 4 KiB

// 64 tensors of 4 KiB, back to back in the file and in one buffer ("big"),
// plus one tensor in a buffer of its own ("lone"): two ranges.
class PipelineLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<SafetensorsWriteTensor> out;
    data_.resize(kTensors + 1);
    for (uint64_t i = 0; i <= kTensors; ++i) {
      data_[i].resize(kTensorBytes);
      for (uint64_t b = 0; b < kTensorBytes; ++b) {
        data_[i][b] = static_cast<std::byte>((b * 7 + i * 13 + (b >> 8)) & 0xff);
      }
      out.push_back({name(i), DType::u8, {kTensorBytes}, data_[i]});
    }
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", out).ok());
    plan_.path = dir_ / "plan.json";
    plan_.buffers = {{0, "host", kModelBytes, 4096, std::nullopt}, {1, "host", kTensorBytes, 4096, std::nullopt}};
    PlanMethod method{"main", {0, 1}, {}};
    for (uint64_t i = 0; i <= kTensors; ++i) {
      const bool lone = i == kTensors;
      plan_.tensors.push_back(PlanTensor{name(i), DType::u8, {kTensorBytes},
                                         lone ? 1u : 0u, lone ? 0 : i * kTensorBytes,
                                         PlanSource{"model.safetensors", name(i), std::nullopt}});
      method.tensors.push_back(name(i));
    }
    plan_.methods = {method};
    ASSERT_TRUE(validate_plan(plan_).ok()) << validate_plan(plan_).message();
  }

  static std::string name(uint64_t i) { return "t" + std::to_string(1000 + i); }

  // The model's tensors, as SetUp writes them.
  std::vector<SafetensorsWriteTensor> written() const {
    std::vector<SafetensorsWriteTensor> out;
    for (uint64_t i = 0; i <= kTensors; ++i) out.push_back({name(i), DType::u8, {kTensorBytes}, data_[i]});
    return out;
  }

  // A config whose "host" tag is served by `library` (a file of the zoo,
  // created with `options`, or the host plugin by name) with the given
  // [load] lines.
  RuntimeConfig config_for(const std::string& plugin, const std::string& load,
                           const std::string& options = "") {
    std::string text;
    if (plugin != "host") {
      text = "[plugins.p]\nlibrary = \"" +
             (kZooDir / ("libdevalloc_" + plugin + ".so")).string() + "\"\n" +
             (options.empty() ? "" : "options = { " + options + " }\n") +
             "[devices.host]\nuse = [\"p\", { index = 0 }]\n";
    } else {
      text = "[plugins.host]\noptions = { async = true }\n";
    }
    text += "[load]\n" + load;
    auto parsed = parse_config(text, (dir_ / "devalloc.toml").string());
    EXPECT_TRUE(parsed.ok()) << parsed.status().message();
    return parsed.ok() ? *parsed : default_config();
  }

  // Each tensor of buffer 0 at twice its size apart: 65 ranges of 4 KiB,
  // none coalesced (five claims of a loading thread).
  void space_tensors_apart() {
    plan_.buffers[0].size = 2 * kModelBytes;
    for (uint64_t i = 0; i < kTensors; ++i) plan_.tensors[i].offset = 2 * i * kTensorBytes;
    ASSERT_TRUE(validate_plan(plan_).ok()) << validate_plan(plan_).message();
  }

  // The model's bytes with each byte xor 0x5a: same names, shapes and
  // layout, other bytes.
  std::vector<std::vector<std::byte>> flipped() const {
    std::vector<std::vector<std::byte>> other = data_;
    for (auto& t : other) {
      for (std::byte& b : t) b ^= std::byte{0x5a};
    }
    return other;
  }

  // Writes `tensors` over the model IN PLACE (the same inode, as `cp` onto
  // it does; its size is unchanged), then sets its modification time to
  // one of its own in 2001, never the same twice: the kernel stamps times
  // at its clock tick, and a write in the tick of the open could leave them
  // as they were.
  // `reversed` stores them in the opposite order: each tensor's old
  // offsets then hold another tensor's new bytes.
  void rewrite_in_place(const std::vector<std::vector<std::byte>>& tensors, bool reversed = false) {
    std::vector<SafetensorsWriteTensor> out;
    for (uint64_t k = 0; k <= kTensors; ++k) {
      const uint64_t i = reversed ? kTensors - k : k;
      out.push_back({name(i), DType::u8, {kTensorBytes}, tensors[i]});
    }
    write_in_place(out);
  }

  void write_in_place(const std::vector<SafetensorsWriteTensor>& out) {
    static int rewrites = 0;
    const std::filesystem::path staged = dir_ / "rewritten.safetensors";
    ASSERT_TRUE(write_safetensors(staged, out).ok());
    std::ifstream in(staged, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const int fd = ::open((dir_ / "model.safetensors").c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    const timespec times[2] = {{0, UTIME_OMIT}, {1'000'000'000 + ++rewrites, 0}};
    ASSERT_EQ(::futimens(fd, times), 0);
    ::close(fd);
  }

  // A request per tensor of `file`, tensor i to bytes i * kTensorBytes of
  // `buffer`.
  static std::vector<CopyRequest> requests_for(const SafetensorsFile& file,
                                               const std::shared_ptr<DeviceBuffer>& buffer) {
    std::vector<CopyRequest> requests;
    for (const SafetensorsTensor& t : file.tensors()) {
      const uint64_t i = std::stoull(t.name.substr(1)) - 1000;
      requests.push_back(CopyRequest{buffer, i * kTensorBytes, file.mapping(), t.offset, t.nbytes,
                                     t.name});
    }
    return requests;
  }

  void expect_loaded_right(const LoadedProgram& program) { expect_loaded(program, data_); }

  void expect_loaded(const LoadedProgram& program, const std::vector<std::vector<std::byte>>& data) {
    for (uint64_t i = 0; i <= kTensors; ++i) {
      const std::optional<LoadedTensor> t = program.find(name(i));
      ASSERT_TRUE(t.has_value()) << name(i);
      std::vector<std::byte> back(t->nbytes());
      ASSERT_TRUE(t->device()
                      .plugin->copy_to_host(t->device().device, back.data(),
                                            t->address(), t->nbytes())
                      .ok());
      ASSERT_EQ(back, data[i]) << name(i);
    }
  }

  test::ScratchDir scratch_{"pipeline"};
  const std::filesystem::path dir_ = scratch_.path();
  Plan plan_;
  std::vector<std::vector<std::byte>> data_;
};

TEST_F(PipelineLoad, GivenModelLargerThanStaging_WhenStaged_ThenCopiesComeFromAFixedPinnedRingWithinBudget) {
  LoadReport report;
  auto program = Runtime::create(config_for("host", "staging = 16384\ndirect = false\n"))
                     ->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  // Two ranges of 256 KiB and 4 KiB, in pieces of one 4 KiB slot.
  EXPECT_EQ(report.copies, kTensors + 1);
  EXPECT_EQ(report.direct_reads, 0u);
  EXPECT_EQ(report.pipeline.staging_slots, 4u);
  EXPECT_EQ(report.pipeline.slot_bytes, 4096u);
  EXPECT_TRUE(report.pipeline.pinned);  // the host plugin offers HOST_STAGING
  EXPECT_GT(report.pipeline.max_in_flight_bytes, 0u);
  EXPECT_LE(report.pipeline.max_in_flight_bytes, kStaging);
}

// A budget of one byte is one slot of 4 KiB: pieces are at most a slot, so
// a smaller slot would make the load's bookkeeping outgrow the model (a
// 10 MB model with staging = "1B" peaked at 1.48 GB before). And threads
// beyond the slots would only wait for one (1024 threads on one slot made
// millions of context switches).
TEST_F(PipelineLoad, GivenStagingOfOneByteAndTheMostThreads_WhenStaged_ThenOneSlotOf4KiBAndOneThreadLoadIt) {
  LoadReport report;
  auto program =
      Runtime::create(config_for("host", "staging = 1\nthreads = 1024\ndirect = false\n"))
          ->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  EXPECT_EQ(report.pipeline.staging_slots, 1u);
  EXPECT_EQ(report.pipeline.slot_bytes, 4096u);
  EXPECT_EQ(report.pipeline.threads, 1u);
  EXPECT_EQ(report.copies, kTensors + 1);  // 4 KiB pieces, not 1-byte ones
}

// A budget far above the model costs what the model needs: no slot larger
// than its largest range, no more slots than pieces. (Before, a budget of
// "1TiB" allocated 131 072 slots of 8 MiB up front, and 2^64 - 1 bytes never
// finished.)
TEST_F(PipelineLoad, GivenStagingFarAboveTheModel_WhenStaged_ThenTheRingIsSizedByTheModel) {
  LoadReport report;
  auto program = Runtime::create(config_for("host", "staging = \"256MiB\"\ndirect = false\n"))
                     ->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  // Two ranges, of 256 KiB and 4 KiB: one slot each, of the larger's size.
  EXPECT_EQ(report.pipeline.slot_bytes, 256u << 10);
  EXPECT_EQ(report.pipeline.staging_slots, 2u);
}

TEST_F(PipelineLoad, GivenEachReadMode_WhenStaged_ThenTheBytesAreRight) {
  for (const char* mode : {"mmap", "pread", "direct_io", "auto"}) {
    LoadReport report;
    auto program =
        Runtime::create(config_for("host", std::string("staging = 16384\ndirect = false\n"
                                                       "read = \"") + mode + "\"\n"))
            ->load(plan_, {.report = &report});
    ASSERT_TRUE(program.ok()) << mode << ": " << program.status().message();
    expect_loaded_right(**program);
    EXPECT_EQ(report.copies, kTensors + 1) << mode;
    // Room for block alignment around each piece: fewer slots, same budget.
    if (std::string(mode) == "direct_io" && !report.pipeline.direct_io_fallback) {
      EXPECT_LE(report.pipeline.staging_slots * (4096 + 8192), kStaging);
      EXPECT_EQ(report.pipeline.read, ReadMode::direct_io);
    } else if (std::string(mode) != "auto") {
      // direct_io on a file system that refuses O_DIRECT reads with pread.
      const std::string used = std::string(mode) == "direct_io" ? "pread" : mode;
      EXPECT_EQ(to_string(report.pipeline.read), used) << mode;
    }
  }
}

// read = auto measures mmap against pread on the load's first pieces of at
// least 1 MiB, then keeps the faster; a load with too few such pieces stays
// on mmap, unmeasured.
TEST_F(PipelineLoad, GivenReadAuto_WhenTheLoadHasEnoughLargePieces_ThenBothModesAreMeasuredAndOneChosen) {
  LoadReport small;
  auto unmeasured = Runtime::create(config_for("host", "direct = false\nread = \"auto\"\n"))
                        ->load(plan_, {.report = &small});
  ASSERT_TRUE(unmeasured.ok()) << unmeasured.status().message();
  EXPECT_FALSE(small.pipeline.read_measured);
  EXPECT_EQ(small.pipeline.read, ReadMode::mmap);

  // Ten tensors of 1 MiB in one buffer, staged through 1 MiB slots: ten
  // pieces, eight of them measured.
  constexpr uint64_t kMiB = 1 << 20;
  constexpr uint64_t kBig = 10;
  std::vector<SafetensorsWriteTensor> out;
  std::vector<std::vector<std::byte>> data(kBig, std::vector<std::byte>(kMiB));
  Plan plan;
  plan.path = dir_ / "big-plan.json";
  plan.buffers = {{0, "host", kBig * kMiB, 4096, std::nullopt}};
  PlanMethod method{"main", {0}, {}};
  for (uint64_t i = 0; i < kBig; ++i) {
    for (uint64_t b = 0; b < kMiB; ++b) data[i][b] = static_cast<std::byte>((b * 31 + i) >> 3);
    const std::string n = "big" + std::to_string(i);
    out.push_back({n, DType::u8, {kMiB}, data[i]});
    plan.tensors.push_back(
        PlanTensor{n, DType::u8, {kMiB}, 0, i * kMiB, PlanSource{"big.safetensors", n, std::nullopt}});
    method.tensors.push_back(n);
  }
  plan.methods = {method};
  ASSERT_TRUE(write_safetensors(dir_ / "big.safetensors", out).ok());
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    LoadReport report;
    // Direct reads come in pieces of up to 8 MiB: this model is one piece,
    // too few to measure, and its bytes must still be right.
    auto program = Runtime::create(
                       config_for("host", std::string("staging = \"4MiB\"\nread = \"auto\"\n") +
                                              (direct ? "" : "direct = false\n")))
                       ->load(plan, {.report = &report});
    ASSERT_TRUE(program.ok()) << program.status().message();
    EXPECT_EQ(report.pipeline.read_measured, !direct);
    if (!direct) {
      EXPECT_EQ(report.pipeline.slot_bytes, kMiB);
    }
    EXPECT_TRUE(report.pipeline.read == ReadMode::mmap || report.pipeline.read == ReadMode::pread)
        << to_string(report.pipeline.read);
    for (uint64_t i = 0; i < kBig; ++i) {
      const std::optional<LoadedTensor> t = (*program)->find("big" + std::to_string(i));
      ASSERT_TRUE(t.has_value());
      std::vector<std::byte> back(kMiB);
      ASSERT_TRUE(t->device().plugin->copy_to_host(0, back.data(), t->address(), kMiB).ok());
      EXPECT_EQ(back, data[i]) << i;
    }
  }
}

// PLUGIN-20: the plugin copies and releases only inside synchronize. A
// model 16 times the staging budget loads, because a wait for a slot
// synchronizes; and because the plugin reads each slot only then, a slot
// reused before its release would land wrong bytes.
TEST_F(PipelineLoad, GivenPluginReleasingOnlyInSynchronize_WhenModelExceedsStaging_ThenTheLoadCompletesWithinBudget) {
  LoadReport report;
  auto program =
      Runtime::create(config_for("host_release_on_sync", "staging = 16384\ndirect = false\n"))
          ->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  EXPECT_EQ(report.copies, kTensors + 1);
  EXPECT_EQ(report.pipeline.staging_slots, 4u);
  // The budget waited: never more than the ring in flight, and only
  // synchronize could free a slot.
  EXPECT_LE(report.pipeline.max_in_flight_bytes, kStaging);
  EXPECT_GE(report.pipeline.forced_synchronizes, (kTensors + 1) / 4 - 1);
}

// PLUGIN-14 / PLUGIN-21: the load ends with the plugin, the rule and the
// copy named, frees what it allocated, and does not hang.
TEST_F(PipelineLoad, GivenPluginReleasingTwice_WhenLoading_ThenTheLoadFailsNamingPluginRuleAndCopy) {
  const uint64_t before = DeviceBuffer::live_count();
  for (const char* threads : {"1", "2"}) {
    auto program = Runtime::create(config_for("host_double_release",
                                              std::string("staging = 16384\ndirect = false\n"
                                                          "threads = ") + threads + "\n"))
                       ->load(plan_);
    ASSERT_FALSE(program.ok()) << threads;
    EXPECT_EQ(program.status().code(), StatusCode::device_error);
    EXPECT_THAT(program.status().message(),
                AllOf(HasSubstr("plugin host_double_release"), HasSubstr("PLUGIN-14"),
                      HasSubstr("PLUGIN-21"), HasSubstr("released twice"),
                      HasSubstr("copy of tensor \"t1"), HasSubstr("of buffer ")));
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

// plugin_abi.h: allocate_host gives NULL only for 0 bytes. A plugin that
// answers OK without memory fails the load, never a write through NULL.
TEST_F(PipelineLoad, GivenPluginWhoseStagingAllocationIsNull_WhenLoadingStaged_ThenRefusedNamingTheCallAndNothingLeft) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = Runtime::create(config_for("zoo_null_staging", "staging = 16384\n"))
                     ->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::internal);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("allocating 4096 bytes of staging memory"),
                    HasSubstr("allocate_host(nbytes 4096) returned OK without memory (a null "
                              "pointer)")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// PLUGIN-18: staging memory is the host's from allocate_host to free_host.
// zoo_round_robin_staging hands out a pool of 4 buffers round robin, in use
// or not, and copies only at synchronize: a second load started while the
// first one's copies wait would get the first one's 4 buffers and read its
// pieces over the first one's (and the first would load the second's
// bytes, silently). The second load fails naming the rule; the first loads
// its own bytes; once both are done the pool's buffers serve a third.
TEST_F(PipelineLoad, GivenStagingHandedOutAgainWhileInUse_WhenASecondLoadStartsDuringTheFirst_ThenTheSecondFailsAndTheFirstLoadsRight) {
  const uint64_t before = DeviceBuffer::live_count();
  const auto runtime =
      Runtime::create(config_for("zoo_round_robin_staging", "staging = 16384\nthreads = 1\n"));
  std::optional<Result<std::shared_ptr<LoadedProgram>>> second;
  const LoadProgress start_second = [&](uint64_t, uint64_t) {
    if (!second) second = runtime->load(plan_);
  };
  auto first = runtime->load(plan_, {.progress = start_second});
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(first.ok()) << first.status().message();
  expect_loaded_right(**first);
  ASSERT_FALSE(second->ok());
  EXPECT_EQ(second->status().code(), StatusCode::internal);
  EXPECT_THAT(second->status().message(),
              AllOf(HasSubstr("allocating 4096 bytes of staging memory: plugin zoo broke "
                              "PLUGIN-18: allocate_host(nbytes 4096) returned [0x"),
                    HasSubstr("which overlaps staging memory still in use: [0x"),
                    HasSubstr("which plugin zoo gave earlier and the host has not freed")));
  first = Status(StatusCode::internal, "dropped");
  second.reset();
  EXPECT_EQ(DeviceBuffer::live_count(), before);

  auto third = runtime->load(plan_);
  ASSERT_TRUE(third.ok()) << third.status().message();
  expect_loaded_right(**third);
}

// PLUGIN-14: a copy that fails is released too. One that is not ends the
// load with the copy's own error and then the breach, after release_timeout.
TEST_F(PipelineLoad, GivenPluginThatDoesNotReleaseAFailedCopy_WhenLoading_ThenTheErrorNamesTheCopyAndThenTheBreach) {
  const uint64_t before = DeviceBuffer::live_count();
  const uint64_t kept = DeviceBuffer::kept_count();
  auto program =
      Runtime::create(config_for("zoo_failed_copy_unreleased",
                                 "staging = 16384\nthreads = 1\nrelease_timeout = \"100ms\"\n"))
          ->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("copying tensor \"t1001\" (bytes 4096..8192 of buffer 0)"),
                    HasSubstr("zoo: copy 2 fails"),
                    HasSubstr("; then plugin zoo broke PLUGIN-14 (PLUGIN-21 release "
                              "accounting): copy of tensor \"t1001\" (bytes 4096..8192 of "
                              "buffer 0)"),
                    HasSubstr("failed and was not released 100 ms after synchronize"),
                    HasSubstr("buffer 0 stays allocated until the plugin is closed")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
  // The copy may still run: its buffer is not handed back to the plugin.
  EXPECT_EQ(DeviceBuffer::kept_count(), kept + 1);
}

// PLUGIN-20: copies never released may still be running when the load
// gives up on them, so the buffers they copy into are not handed back to
// the plugin (a later allocation could get that memory and have it
// overwritten); the staging memory they read is kept too. Buffers without
// such a copy are freed as usual.
TEST_F(PipelineLoad, GivenPluginThatNeverReleases_WhenTheLoadGivesUp_ThenTheBuffersItCopiesIntoStayAllocated) {
  const uint64_t before = DeviceBuffer::live_count();
  const uint64_t kept = DeviceBuffer::kept_count();
  auto runtime = Runtime::create(config_for("zoo_never_releases",
                                            "threads = 1\ndirect = false\n"
                                            "release_timeout = \"100ms\"\n"));
  auto program = runtime->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("plugin zoo broke PLUGIN-20"),
                    HasSubstr("stays allocated until the plugin is closed")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
  EXPECT_EQ(DeviceBuffer::kept_count(), kept + 2) << "both buffers had copies in flight";

  // Only the tensors of buffer 1 (the lone one): buffer 0 is allocated but
  // never copied into, and is freed.
  Plan lone = plan_;
  lone.methods[0].tensors = {name(kTensors)};
  auto second = runtime->load(lone);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("buffer 1 stays allocated"));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
  EXPECT_EQ(DeviceBuffer::kept_count(), kept + 3);
}

// PLUGIN-14: a release's user_data is looked up among the load's copies,
// never followed blindly, even without the validation layer.
TEST_F(PipelineLoad, GivenPluginReleasingWithAMadeUpUserData_WhenLoading_ThenTheLoadFailsNamingTheBreach) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = Runtime::create(config_for("zoo_stray_release",
                                            "staging = 16384\nrelease_timeout = \"100ms\"\n"))
                     ->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::device_error);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("plugin zoo (or a plugin closed before) broke PLUGIN-14 "
                              "(PLUGIN-21 release accounting): on_release came with "
                              "user_data 0x"),
                    HasSubstr("which no copy was given")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// A failed copy is named by the tensor the failing piece holds, not by the
// whole coalesced range it was cut from.
TEST_F(PipelineLoad, GivenTheFifthCopyFails_WhenLoading_ThenTheErrorNamesThatPiecesTensorAndBytes) {
  RuntimeConfig c = config_for("host", "staging = 16384\ndirect = false\nthreads = 1\n");
  c.plugins["host"].layers.faults.fail_copy_at = 5;
  auto program = Runtime::create(c)->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("copying tensor \"t1004\" (bytes 16384..20480 of buffer 0)"),
                    HasSubstr("fault injection (fail_copy_at = 5)")));
}

// PLUGIN-21: a failed copy released twice is a breach said after the copy's
// own error, not lost behind it.
TEST_F(PipelineLoad, GivenAFailedCopyReleasedTwice_WhenLoading_ThenTheBreachFollowsTheCopysError) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program =
      Runtime::create(config_for("host_faulty", "staging = 16384\ndirect = false\nthreads = 1\n",
                                 "release_twice_failed_copy_at = \"5\", async = true"))
          ->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::device_error);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("copying tensor \"t1004\""),
                    HasSubstr("injected by release_twice_failed_copy_at = 5"),
                    HasSubstr("; then plugin host_faulty broke PLUGIN-14 (PLUGIN-21 release "
                              "accounting): copy of tensor \"t1004\""),
                    HasSubstr("was released twice")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// The copies still in flight when a failed copy is released twice are
// waited for: their releases come late (400 ms after each call, past
// synchronize, within release_timeout), and the load returns only after
// them, never with the plugin still holding its sources. Ending every
// release wait at the double release returned at once.
TEST_F(PipelineLoad, GivenAFailedCopyReleasedTwiceWhileOthersReleaseLate_WhenLoading_ThenTheLoadWaitsForThem) {
  const uint64_t before = DeviceBuffer::live_count();
  constexpr auto kLate = std::chrono::milliseconds(400);
  auto runtime = Runtime::create(config_for(
      "host_faulty", "staging = 65536\ndirect = false\nthreads = 1\n",
      "release_twice_failed_copy_at = \"3\", release_late_ms = \"" +
          std::to_string(kLate.count()) + "\""));
  const auto start = std::chrono::steady_clock::now();
  auto program = runtime->load(plan_);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("injected by release_twice_failed_copy_at = 3"),
                    HasSubstr("was released twice")));
  EXPECT_GE(took, kLate) << "the load returned before the releases of the copies before the "
                            "failed one came";
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Releases that come after synchronize returned (PLUGIN-20), within
// release_timeout: the load succeeds and counts them, with the time it
// waited; a plugin that releases in time is never counted.
TEST_F(PipelineLoad, GivenReleasesAfterSynchronize_WhenLoading_ThenTheReportCountsThem) {
  LoadReport report;
  auto program = Runtime::create(config_for("host_faulty",
                                            "staging = 16384\ndirect = false\nthreads = 1\n",
                                            "release_late_ms = \"50\""))
                     ->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_GE(report.devices[0].late_releases, 1u);
  EXPECT_LE(report.devices[0].late_releases, report.devices[0].copies);
  EXPECT_GT(report.devices[0].late_release_seconds, 0.0);

  // A plugin that releases only inside synchronize (PLUGIN-20 allows it),
  // four threads and a ring of four slots: threads waiting for a slot call
  // synchronize while others are inside their copy calls. A copy whose call
  // had not returned when a synchronize began is released by a later one,
  // and is not late.
  auto runtime = Runtime::create(
      config_for("host_release_on_sync", "staging = 16384\ndirect = false\nthreads = 4\n"));
  uint64_t forced = 0;
  for (int i = 0; i < 20; ++i) {
    LoadReport in_time;
    ASSERT_TRUE(runtime->load(plan_, {.report = &in_time}).ok());
    ASSERT_EQ(in_time.devices.size(), 1u);
    EXPECT_GT(in_time.devices[0].copies, 0u);
    EXPECT_EQ(in_time.devices[0].late_releases, 0u);
    EXPECT_EQ(in_time.devices[0].late_release_seconds, 0.0);
    forced += in_time.pipeline.forced_synchronizes;
  }
  EXPECT_GT(forced, 0u) << "no synchronize while waiting for a slot: the case is not exercised";
}

// Four threads, each waiting for a slot of four, call synchronize and wait
// for the same late releases at once: each late copy is counted once, and
// the time is how long the load waited, not the sum of the threads' waits
// (counted per thread, a load of 65 copies reported about 200 late ones and
// twice its own duration waited).
TEST_F(PipelineLoad, GivenFourThreadsWaitingForTheSameLateReleases_ThenEachIsCountedOnce) {
  LoadReport report;
  const auto start = std::chrono::steady_clock::now();
  auto program = Runtime::create(config_for("host_faulty",
                                            "staging = 16384\ndirect = false\nthreads = 4\n",
                                            "release_late_ms = \"50\""))
                     ->load(plan_, {.report = &report});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_GT(report.pipeline.forced_synchronizes, 1u);
  EXPECT_GE(report.devices[0].late_releases, 1u);
  EXPECT_LE(report.devices[0].late_releases, report.devices[0].copies);
  EXPECT_GT(report.devices[0].late_release_seconds, 0.0);
  EXPECT_LE(report.devices[0].late_release_seconds, took);
}

// Another program truncates the model while it loads through the mapping
// (read = "mmap"): the pages it lost raise SIGBUS, which must become the
// load's error naming the file, not the end of the process. Staged and
// direct (reads straight into host-addressable device memory).
TEST_F(PipelineLoad, GivenTheFileTruncatedWhileLoadingThroughTheMapping_ThenTheLoadFailsNamingIt) {
  const std::filesystem::path model = dir_ / "model.safetensors";
  const uint64_t keep = std::filesystem::file_size(model) - kModelBytes + 8192;
  for (const bool direct : {false, true}) {
    ASSERT_TRUE(write_safetensors(model, written()).ok());
    const uint64_t before = DeviceBuffer::live_count();
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = 16384\nthreads = 1\nread = \"mmap\"\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    bool truncated = false;
    runtime->set_progress([&](uint64_t, uint64_t) {
      if (!truncated) truncated = ::truncate(model.c_str(), static_cast<off_t>(keep)) == 0;
    });
    auto program = runtime->load(plan_);
    ASSERT_TRUE(truncated);
    ASSERT_FALSE(program.ok()) << "direct = " << direct;
    EXPECT_EQ(program.status().code(), StatusCode::data_loss);
    EXPECT_THAT(program.status().message(),
                AllOf(HasSubstr("tensor \"t10"), HasSubstr("model.safetensors: the page at offset "),
                      HasSubstr("could not be read (SIGBUS): the file was truncated")))
        << "direct = " << direct;
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

// Truncated after every copy was issued: the copies are done, the file
// they came from is not the one opened any more, and the load fails when
// it ends (before its verify pass), saying so.
TEST_F(PipelineLoad, GivenTheFileTruncatedAfterTheLastCopyWasIssued_ThenTheLoadFailsSayingItWasModifiedWhileLoading) {
  const std::filesystem::path model = dir_ / "model.safetensors";
  const uint64_t size = std::filesystem::file_size(model);
  const uint64_t keep = size - kModelBytes + 8192;
  const uint64_t before = DeviceBuffer::live_count();
  auto runtime = Runtime::create(config_for(
      "host", "staging = 16384\nthreads = 1\nread = \"pread\"\ndirect = false\nverify = true\n"));
  bool truncated = false;
  runtime->set_progress([&](uint64_t done, uint64_t total) {
    if (done == total && !truncated) {
      truncated = ::truncate(model.c_str(), static_cast<off_t>(keep)) == 0;
    }
  });
  auto program = runtime->load(plan_);
  ASSERT_TRUE(truncated);
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("model.safetensors: modified in place while it was being loaded "
                              "(its size went from " +
                              std::to_string(size) + " to " + std::to_string(keep) + " bytes"),
                    HasSubstr("renaming it over the old one")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// The verify pass hashes the file through its mapping, guarded: a file
// truncated after the copies, before the pass reads it, fails the pass
// naming the file and the page, instead of ending the process.
TEST_F(PipelineLoad, GivenTheFileTruncatedBeforeVerifyReadsIt_ThenVerifyFailsNamingItInsteadOfCrashing) {
  const std::filesystem::path model = dir_ / "model.safetensors";
  const uint64_t keep = std::filesystem::file_size(model) - kModelBytes + 8192;
  auto runtime = Runtime::create(config_for("host", "direct = false\n"));
  auto file = SafetensorsFile::open(model);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto device = runtime->registry().resolve("host", std::nullopt);
  ASSERT_TRUE(device.ok()) << device.status().message();
  auto buffer = DeviceBuffer::allocate(*device, 0, (kTensors + 1) * kTensorBytes, 4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status().message();
  const CopySchedule schedule = CopySchedule::build(requests_for(**file, *buffer));
  std::vector<DeviceLoadStats> stats;
  ASSERT_TRUE(schedule.execute(PipelineOptions{}, &stats).ok());
  ASSERT_EQ(::truncate(model.c_str(), static_cast<off_t>(keep)), 0);
  const Status verified = verify_copies(schedule.requests(), 4096);
  ASSERT_FALSE(verified.ok());
  EXPECT_THAT(verified.message(),
              AllOf(HasSubstr("verify: reading tensor \"t10"),
                    HasSubstr("model.safetensors: the page at offset "),
                    HasSubstr("the file was truncated after it was opened")));
}

// The verify pass compares the device with the file as it was opened (the
// offsets are from its header then). Rewritten in place after the copies
// (the old tensors in reverse order: every hash differs): the pass says the
// file changed, not that the device is wrong. Rewritten with the same
// bytes (every hash agrees): it says the file changed, rather than vouch
// for copies from a file that is not the one opened.
TEST_F(PipelineLoad, GivenTheFileRewrittenInPlaceAfterTheCopies_WhenVerified_ThenVerifySaysSoInsteadOfPassingOrBlamingTheDevice) {
  auto runtime = Runtime::create(config_for("host", "direct = false\n"));
  std::vector<std::vector<std::byte>> reversed(data_.rbegin(), data_.rend());
  for (const bool same_bytes : {false, true}) {
    SCOPED_TRACE(same_bytes ? "the same bytes" : "other bytes");
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", written()).ok());
    auto file = SafetensorsFile::open(dir_ / "model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto device = runtime->registry().resolve("host", std::nullopt);
    ASSERT_TRUE(device.ok()) << device.status().message();
    auto buffer = DeviceBuffer::allocate(*device, 0, (kTensors + 1) * kTensorBytes, 4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    const CopySchedule schedule = CopySchedule::build(requests_for(**file, *buffer));
    std::vector<DeviceLoadStats> stats;
    ASSERT_TRUE(schedule.execute(PipelineOptions{}, &stats).ok());
    ASSERT_TRUE(verify_copies(schedule.requests(), 4096).ok()) << "the copies are right";
    rewrite_in_place(same_bytes ? data_ : reversed);
    const Status verified = verify_copies(schedule.requests(), 4096);
    ASSERT_FALSE(verified.ok());
    EXPECT_EQ(verified.code(), StatusCode::data_loss);
    EXPECT_THAT(verified.message(),
                AllOf(HasSubstr(same_bytes ? "verify: the copies cannot be compared with the file "
                                             "they came from: "
                                           : "verify: tensor \"t1000\" cannot be compared with "
                                             "its file: "),
                      HasSubstr("model.safetensors: modified in place since it was opened"),
                      HasSubstr("renaming it over the old one")));
    EXPECT_THAT(verified.message(), ::testing::Not(HasSubstr("differs from")));
  }
}

// A caller that blocks every signal (to leave them to sigwait, say): the
// loading threads inherit its mask, and the kernel ends the process for a
// SIGBUS it raises while SIGBUS is blocked, whatever the handler. The
// load's mmap reads and the verify pass unblock it while they read: the
// truncation fails the load (or the verify pass, of a file truncated after
// its copies), and the caller's mask is as it was.
TEST_F(PipelineLoad, GivenACallerThatBlocksEverySignal_WhenTheFileIsTruncatedWhileRead_ThenTheLoadFailsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::filesystem::path model = dir_ / "model.safetensors";
  const uint64_t keep = std::filesystem::file_size(model) - kModelBytes + 8192;
  for (const bool verify : {false, true}) {
    EXPECT_EXIT(
        {
          sigset_t all;
          sigfillset(&all);
          ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
          bool truncated = false;
          Status failed;
          if (!verify) {
            auto runtime = Runtime::create(config_for(
                // Staged (direct = false): 4 KiB pieces in claims of 16, so
                // whichever thread reports first truncates while claims are
                // left to read. Read directly, the model was two pieces, and
                // both could be read before the first report (the load then
                // succeeded: seen once under a busy machine).
                "host", "staging = 16384\nthreads = 2\nread = \"mmap\"\ndirect = false\n"));
            runtime->set_progress([&](uint64_t, uint64_t) {
              if (!truncated) truncated = ::truncate(model.c_str(), static_cast<off_t>(keep)) == 0;
            });
            auto program = runtime->load(plan_);
            failed = program.ok() ? Status() : program.status();
          } else {
            // The copies done, then the file cut, then the verify pass.
            auto runtime = Runtime::create(config_for("host", "direct = false\n"));
            auto file = SafetensorsFile::open(model);
            auto device = runtime->registry().resolve("host", std::nullopt);
            if (!file.ok() || !device.ok()) std::_Exit(6);
            auto buffer = DeviceBuffer::allocate(*device, 0, (kTensors + 1) * kTensorBytes, 4096);
            if (!buffer.ok()) std::_Exit(6);
            const CopySchedule schedule = CopySchedule::build(requests_for(**file, *buffer));
            std::vector<DeviceLoadStats> stats;
            if (!schedule.execute(PipelineOptions{}, &stats).ok()) std::_Exit(6);
            truncated = ::truncate(model.c_str(), static_cast<off_t>(keep)) == 0;
            failed = verify_copies(schedule.requests(), 4096);
          }
          sigset_t after;
          ::pthread_sigmask(SIG_BLOCK, nullptr, &after);
          if (!truncated) std::_Exit(3);
          if (failed.ok() || failed.message().find("could not be read (SIGBUS)") == std::string::npos) {
            std::fprintf(stderr, "%s\n", failed.ok() ? "it succeeded" : failed.message().c_str());
            std::_Exit(4);
          }
          std::_Exit(sigismember(&after, SIGBUS) == 1 ? 0 : 5);
        },
        ::testing::ExitedWithCode(0), "")
        << "verify = " << verify;
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// The system starts no more threads (a process limit, or no address space
// for a thread's stack: here RLIMIT_AS just above what the process maps):
// the load asked for four goes on with the caller's thread alone, and loads
// every byte, instead of ending the process (std::terminate, as it did) or
// letting std::system_error out of Runtime::load.
TEST_F(PipelineLoad, GivenTheSystemStartsNoMoreThreads_WhenLoadingWithFour_ThenTheCallersThreadLoadsItAll) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit under RLIMIT_AS";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Run in a child process; its exit code says where it stopped.
  const auto child = [this]() -> int {
    // The sync host plugin: the async one starts a thread of its own.
    auto parsed = parse_config(
        "[plugins.host]\noptions = { async = false }\n"
        "[load]\nstaging = 16384\nthreads = 4\ndirect = false\nverify = true\n",
        (dir_ / "devalloc.toml").string());
    if (!parsed.ok()) return 2;
    auto runtime = Runtime::create(*parsed);
    // The plugin opened before the limit, and no thread started yet (the
    // C library would keep a finished thread's stack for the next one).
    if (!runtime->registry().plugin("host").ok()) return 3;
    uint64_t mapped_kib = 0;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmSize:", 0) == 0) mapped_kib = std::stoull(line.substr(7));
    }
    if (mapped_kib == 0) return 4;
    rlimit limit{};
    limit.rlim_cur = (mapped_kib + 2048) << 10;
    limit.rlim_max = RLIM_INFINITY;
    if (::setrlimit(RLIMIT_AS, &limit) != 0) return 5;
    try {
      std::thread probe([] {});
      probe.join();
      return 6;  // threads still start: the test would show nothing
    } catch (const std::system_error&) {
    }
    LoadReport report;
    auto program = runtime->load(plan_, {.report = &report});
    if (!program.ok()) {
      std::fprintf(stderr, "%s\n", program.status().message().c_str());
      return 7;
    }
    if (report.pipeline.threads != 1) return 8;
    for (uint64_t i = 0; i <= kTensors; ++i) {
      const std::optional<LoadedTensor> t = (*program)->find(name(i));
      std::vector<std::byte> back(kTensorBytes);
      if (!t ||
          !t->device().plugin->copy_to_host(0, back.data(), t->address(), kTensorBytes).ok() ||
          back != data_[i]) {
        return 9;
      }
    }
    return 0;
  };
  EXPECT_EXIT(std::_Exit(child()), ::testing::ExitedWithCode(0), "");
}

// Four threads add their bytes in one order and would report them in
// another: the callback sees one call at a time, `done` rising, and the
// last call says everything was issued.
TEST_F(PipelineLoad, GivenFourThreadsAndManyPieces_ThenProgressOnlyRisesAndEndsAtTheTotal) {
  for (const bool direct : {false, true}) {
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = 16384\nthreads = 4\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    std::atomic<int> inside{0};
    bool overlapped = false;
    runtime->set_progress([&](uint64_t done, uint64_t total) {
      if (++inside > 1) overlapped = true;
      calls.emplace_back(done, total);
      std::this_thread::yield();
      --inside;
    });
    auto program = runtime->load(plan_);
    ASSERT_TRUE(program.ok()) << program.status().message();
    EXPECT_FALSE(overlapped);
    ASSERT_FALSE(calls.empty());
    for (size_t i = 1; i < calls.size(); ++i) {
      EXPECT_GT(calls[i].first, calls[i - 1].first) << "call " << i;
    }
    EXPECT_EQ(calls.back().first, kModelBytes + kTensorBytes);
    EXPECT_EQ(calls.back().second, kModelBytes + kTensorBytes);
  }
}

// The callback is the caller's code on a loading thread: what it throws
// ends the load with a status, not the thread (and the process).
TEST_F(PipelineLoad, GivenAProgressCallbackThatThrows_WhenLoading_ThenTheLoadFailsWithAStatusAndNothingIsLeft) {
  const uint64_t before = DeviceBuffer::live_count();
  for (const bool direct : {false, true}) {
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = 16384\nthreads = 4\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    // The first call throws: with four threads one report may cover every
    // claim (a later report skips what an earlier one said), so a load may
    // make a single call, never none.
    runtime->set_progress(
        [&](uint64_t, uint64_t) { throw std::runtime_error("stop at the first report"); });
    auto program = runtime->load(plan_);
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), StatusCode::internal);
    EXPECT_EQ(program.status().message(),
              "the load's progress callback threw an exception: stop at the first report; the "
              "load stopped");
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

// Thousands of tiny tensors, each at its own aligned place in the buffer:
// each is a piece of its own, and threads claim them in runs. Every byte
// must arrive, each piece must be counted once, and the staged path must
// stay within its ring while runs of pieces wait for slots. Progress is
// reported once per run, not once per tensor.
TEST_F(PipelineLoad, GivenThousandsOfTinyTensors_WhenLoadedByFourThreads_ThenEveryPieceArrivesAndIsCountedOnce) {
  constexpr uint64_t kTiny = 3000;
  std::vector<std::vector<std::byte>> tiny(kTiny);
  std::vector<SafetensorsWriteTensor> out;
  Plan plan;
  plan.path = dir_ / "tiny.json";
  plan.buffers = {{0, "host", kTiny * 256, 256, std::nullopt}};
  PlanMethod method{"main", {0}, {}};
  for (uint64_t i = 0; i < kTiny; ++i) {
    tiny[i].resize(48);
    for (uint64_t b = 0; b < 48; ++b) tiny[i][b] = static_cast<std::byte>((i * 31 + b) & 0xff);
    out.push_back({"x" + std::to_string(i), DType::u8, {48}, tiny[i]});
    plan.tensors.push_back(PlanTensor{"x" + std::to_string(i), DType::u8, {48}, 0, i * 256,
                                      PlanSource{"tiny.safetensors", "x" + std::to_string(i), std::nullopt}});
    method.tensors.push_back("x" + std::to_string(i));
  }
  plan.methods = {method};
  ASSERT_TRUE(write_safetensors(dir_ / "tiny.safetensors", out).ok());
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).message();

  for (const bool direct : {false, true}) {
    LoadReport report;
    auto runtime =
        Runtime::create(config_for("host", std::string("staging = 16384\nthreads = 4\n") +
                                               "direct = " + (direct ? "true" : "false") + "\n"));
    std::vector<uint64_t> progress;
    runtime->set_progress([&](uint64_t done, uint64_t) { progress.push_back(done); });
    auto program = runtime->load(plan, {.report = &report});
    ASSERT_TRUE(program.ok()) << program.status().message();
    ASSERT_FALSE(progress.empty());
    EXPECT_LE(progress.size(), 3u) << direct;  // one call per claim at most
    EXPECT_EQ(progress.back(), kTiny * 48) << direct;
    EXPECT_EQ(direct ? report.direct_reads : report.copies, kTiny) << direct;
    EXPECT_EQ(direct ? report.copies : report.direct_reads, 0u) << direct;
    EXPECT_EQ(report.constants, kTiny);
    EXPECT_GT(report.pipeline.threads, 1u);  // 3000 pieces of 48 bytes: three claims
    EXPECT_LE(report.pipeline.max_in_flight_bytes, kStaging);
    for (uint64_t i = 0; i < kTiny; i += 7) {
      const std::optional<LoadedTensor> t = (*program)->find("x" + std::to_string(i));
      ASSERT_TRUE(t.has_value());
      std::vector<std::byte> back(48);
      ASSERT_TRUE(
          t->device().plugin->copy_to_host(t->device().device, back.data(), t->address(), 48).ok());
      ASSERT_EQ(back, tiny[i]) << i << (direct ? " direct" : " staged");
    }
  }
}

// Direct reads go in pieces of up to 8 MiB: a range above that is read in
// several, each into its own place in the buffer, not all onto the first.
TEST_F(PipelineLoad, GivenARangeAboveTheDirectPieceSize_WhenReadDirectly_ThenEachPieceLandsAtItsOwnOffset) {
  constexpr uint64_t kBig = (uint64_t{9} << 20) + 4096;  // two direct pieces
  std::vector<std::byte> big(kBig);
  for (uint64_t b = 0; b < kBig; ++b) {
    big[b] = static_cast<std::byte>((b * 2654435761u) >> 13);
  }
  const std::vector<SafetensorsWriteTensor> out = {{"big", DType::u8, {kBig}, big}};
  ASSERT_TRUE(write_safetensors(dir_ / "big.safetensors", out).ok());
  Plan plan;
  plan.path = dir_ / "big-plan.json";
  plan.buffers = {{0, "host", kBig, 4096, std::nullopt}};
  plan.tensors = {PlanTensor{"big", DType::u8, {kBig}, 0, 0, PlanSource{"big.safetensors", "big", std::nullopt}}};
  plan.methods = {PlanMethod{"main", {0}, {"big"}}};
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).message();
  LoadReport report;
  auto program = Runtime::create(config_for("host", "direct = true\nthreads = 2\n"))
                     ->load(plan, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(report.direct_reads, 2u);
  EXPECT_EQ(report.copies, 0u);
  const std::optional<LoadedTensor> t = (*program)->find("big");
  ASSERT_TRUE(t.has_value());
  std::vector<std::byte> back(kBig);
  ASSERT_TRUE(t->device().plugin->copy_to_host(0, back.data(), t->address(), kBig).ok());
  EXPECT_TRUE(back == big) << "the bytes of the second direct piece are not at their offset";
}

// Tensors back to back in the file and at matching offsets, but in two
// buffers, are two ranges: one copy must not run on from the end of the
// first buffer's tensor into the second tensor's place.
TEST_F(PipelineLoad, GivenFileNeighboursInTwoBuffersAtContinuingOffsets_WhenStaged_ThenEachLandsInItsOwnBuffer) {
  Plan plan;
  plan.path = dir_ / "split.json";
  // t1000 at bytes [0, 4096) of buffer 0; t1001, next in the file, at
  // [4096, 8192) of buffer 1: merged, it would land in buffer 0.
  plan.buffers = {{0, "host", 2 * kTensorBytes, 4096, std::nullopt}, {1, "host", 2 * kTensorBytes, 4096, std::nullopt}};
  plan.tensors = {
      PlanTensor{name(0), DType::u8, {kTensorBytes}, 0, 0, PlanSource{"model.safetensors", name(0), std::nullopt}},
      PlanTensor{name(1), DType::u8, {kTensorBytes}, 1, kTensorBytes,
                 PlanSource{"model.safetensors", name(1), std::nullopt}}};
  plan.methods = {PlanMethod{"main", {0, 1}, {name(0), name(1)}}};
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).message();
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    LoadReport report;
    auto program = Runtime::create(config_for("host", std::string("staging = 16384\ndirect = ") +
                                                          (direct ? "true" : "false") + "\n"))
                       ->load(plan, {.report = &report});
    ASSERT_TRUE(program.ok()) << program.status().message();
    EXPECT_EQ(report.copies + report.direct_reads, 2u);
    for (uint64_t i : {0, 1}) {
      const std::optional<LoadedTensor> t = (*program)->find(name(i));
      ASSERT_TRUE(t.has_value());
      EXPECT_EQ(t->planned.memory_id, i);
      std::vector<std::byte> back(kTensorBytes);
      ASSERT_TRUE(t->device()
                      .plugin->copy_to_host(t->device().device, back.data(), t->address(),
                                            kTensorBytes)
                      .ok());
      EXPECT_EQ(back, data_[i]) << name(i);
    }
  }
}

// One staging budget for the whole load: with two plugins, each ring gets
// its share, and all the slots together stay within [load] staging.
TEST_F(PipelineLoad, GivenTwoPluginsStaging_WhenLoading_ThenTheirRingsTogetherStayWithinTheOneBudget) {
  plan_.buffers[1].device = "other";  // "lone", on a second plugin
  const std::string text = "[plugins.host]\noptions = { async = true }\n"
                           "[plugins.f]\nlibrary = \"" +
                           (kZooDir / "libdevalloc_host_faulty.so").string() +
                           "\"\noptions = { async = true }\n"
                           "[devices.other]\nuse = [\"f\", { index = 0 }]\n"
                           "[load]\nstaging = 16384\ndirect = false\n";
  auto config = parse_config(text, (dir_ / "devalloc.toml").string());
  ASSERT_TRUE(config.ok()) << config.status().message();
  LoadReport report;
  auto program = Runtime::create(*config)->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  EXPECT_EQ((*program)->find(name(kTensors))->device().plugin_name, "f");
  EXPECT_EQ(report.pipeline.slot_bytes, 4096u);
  // host: 8 KiB of the budget, two slots; f: one slot for its one piece.
  EXPECT_EQ(report.pipeline.staging_slots, 3u);
  EXPECT_LE(report.pipeline.staging_slots * report.pipeline.slot_bytes, kStaging);
  EXPECT_LE(report.pipeline.max_in_flight_bytes, kStaging);
}

// A progress callback that throws ends the load: no further piece is read
// and the callback is not called again, also on the direct path, where no
// staging slot is waited for.
TEST_F(PipelineLoad, GivenAProgressCallbackThatThrows_WhenLoadingWithOneThread_ThenItIsNotCalledAgain) {
  ASSERT_NO_FATAL_FAILURE(space_tensors_apart());
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = 16384\nthreads = 1\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    int calls = 0;
    runtime->set_progress([&](uint64_t, uint64_t) {
      if (++calls == 2) throw std::runtime_error("stop at 2");
    });
    auto program = runtime->load(plan_);
    ASSERT_FALSE(program.ok());
    EXPECT_THAT(program.status().message(), HasSubstr("stop at 2"));
    EXPECT_EQ(calls, 2);
  }
}

// The same with four loading threads: the other threads that finished a
// claim while the callback ran (and wait to report it) must not call it
// again once it threw; the load stopped.
TEST_F(PipelineLoad, GivenAProgressCallbackThatThrows_WhenLoadingWithFourThreads_ThenItIsNotCalledAgain) {
  ASSERT_NO_FATAL_FAILURE(space_tensors_apart());
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = \"1MiB\"\nthreads = 4\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    std::atomic<int> calls{0};
    runtime->set_progress([&](uint64_t, uint64_t) {
      if (++calls > 1) return;
      // Time for the other threads to finish their claims and queue up to
      // report them (not a bound: the test holds however long it takes).
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      throw std::runtime_error("stop at 1");
    });
    auto program = runtime->load(plan_);
    ASSERT_FALSE(program.ok());
    EXPECT_THAT(program.status().message(), HasSubstr("stop at 1"));
    EXPECT_EQ(calls.load(), 1);
  }
}

// PLUGIN-20: a synchronize that fails while the load waits for a staging
// slot ends the load there, with that synchronize named; the load does not
// go on copying after a failed synchronize.
TEST_F(PipelineLoad, GivenSynchronizeFailsWhileWaitingForAStagingSlot_WhenLoading_ThenTheLoadStopsNamingThatWait) {
  const uint64_t before = DeviceBuffer::live_count();
  // zoo_unknown_status releases its copies only in synchronize, which then
  // returns status 42: the fifth piece waits for a slot and forces it.
  auto program = Runtime::create(config_for("zoo_unknown_status",
                                            "staging = 16384\nthreads = 1\ndirect = false\n"
                                            "release_timeout = \"100ms\"\n"))
                     ->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("synchronizing host"),
                    HasSubstr("while waiting for staging memory")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// verify reads a tensor back in chunks of the staging size: every chunk
// from its own offset. A right load of a tensor three chunks long verifies;
// a byte wrong in its last chunk is found.
TEST_F(PipelineLoad, GivenATensorOfSeveralVerifyChunks_WhenVerified_ThenEachChunkIsReadFromItsOwnOffset) {
  constexpr uint64_t kWide = 3 * kTensorBytes;
  std::vector<std::byte> wide(kWide);
  for (uint64_t b = 0; b < kWide; ++b) wide[b] = static_cast<std::byte>((b * 11 + (b >> 12)) & 0xff);
  const std::vector<SafetensorsWriteTensor> out = {{"wide", DType::u8, {kWide}, wide}};
  ASSERT_TRUE(write_safetensors(dir_ / "wide.safetensors", out).ok());
  Plan plan;
  plan.path = dir_ / "wide.json";
  plan.buffers = {{0, "host", kWide, 4096, std::nullopt}};
  plan.tensors = {PlanTensor{"wide", DType::u8, {kWide}, 0, 0, PlanSource{"wide.safetensors", "wide", std::nullopt}}};
  plan.methods = {PlanMethod{"main", {0}, {"wide"}}};
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).message();
  const auto load = [&](const std::string& options, LoadReport* report) {
    return Runtime::create(
               config_for("host_faulty",
                          "staging = 4096\ndirect = false\nthreads = 1\nverify = true\n", options))
        ->load(plan, {.report = report});
  };
  LoadReport report;
  auto right = load("async = true", &report);
  ASSERT_TRUE(right.ok()) << right.status().message();
  EXPECT_TRUE(report.verified);
  EXPECT_EQ(report.copies, 3u);
  // The third copy (bytes 8192..12288) lands with its first byte flipped.
  auto wrong = load("async = true, flip_byte_at_copy = \"3\"", nullptr);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(),
              AllOf(HasSubstr("verify: tensor \"wide\""), HasSubstr("differs from")));
}


// A source file cut short while it loads: a read that comes back short
// fails the load naming the file, never copies what the slot or the buffer
// held before. (read = pread: an mmap read of the lost pages would fault
// instead.)
TEST_F(PipelineLoad, GivenASourceTruncatedWhileLoading_WhenReadWithPread_ThenTheLoadFailsSayingSo) {
  const uint64_t before = DeviceBuffer::live_count();
  const std::filesystem::path model = std::filesystem::canonical(dir_ / "model.safetensors");
  const uint64_t size = std::filesystem::file_size(model);
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    ASSERT_TRUE(write_safetensors(model, written()).ok());
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = 16384\nread = \"pread\"\nthreads = 1\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    // After the first claim (64 KiB staged, the 256 KiB range read
    // directly): half of t1064, the last tensor, gone.
    bool truncated = false;
    runtime->set_progress([&](uint64_t, uint64_t) {
      if (!truncated) {
        std::filesystem::resize_file(model, size - kTensorBytes / 2);
        truncated = true;
      }
    });
    auto program = runtime->load(plan_);
    ASSERT_TRUE(truncated);
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), StatusCode::data_loss);
    EXPECT_THAT(program.status().message(),
                AllOf(HasSubstr("model.safetensors: ends before offset " + std::to_string(size)),
                      HasSubstr("was it truncated?")));
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

// The file rewritten in place after it was opened, before the schedule
// runs: its header's offsets no longer describe its bytes. Nothing is
// copied; the error names the file and says it was modified since it was
// opened.
TEST_F(PipelineLoad, GivenAFileRewrittenInPlaceAfterItWasOpened_WhenTheScheduleRuns_ThenNothingIsCopiedAndTheErrorSaysSo) {
  auto runtime = Runtime::create(config_for("host", "staging = 16384\n"));
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", written()).ok());
    auto file = SafetensorsFile::open(dir_ / "model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status().message();
    rewrite_in_place(flipped());
    auto device = runtime->registry().resolve("host", std::nullopt);
    ASSERT_TRUE(device.ok()) << device.status().message();
    auto buffer = DeviceBuffer::allocate(*device, 0, (kTensors + 1) * kTensorBytes, 4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().message();
    const CopySchedule schedule = CopySchedule::build(requests_for(**file, *buffer));
    PipelineOptions options;
    options.direct = direct;
    std::vector<DeviceLoadStats> stats;
    const Status copied = schedule.execute(options, &stats);
    ASSERT_FALSE(copied.ok());
    EXPECT_EQ(copied.code(), StatusCode::data_loss);
    EXPECT_THAT(copied.message(),
                AllOf(HasSubstr("model.safetensors: modified in place since it was opened (its "
                                "modification time went from "),
                      HasSubstr("renaming it over the old one")));
    ASSERT_EQ(stats.size(), 1u);
    EXPECT_EQ(stats[0].copies, 0u);
    EXPECT_EQ(stats[0].direct_reads, 0u);
  }
}

// The file rewritten in place while it loads (here after the first claim
// of pieces was issued: the load has read some of the old bytes, and reads
// the rest from the new ones). The load must not succeed: it fails naming
// the file, and leaves nothing allocated. With verify on too: the load
// fails before its verify pass, which would hash the same mixed mapping.
TEST_F(PipelineLoad, GivenTheFileRewrittenInPlaceWhileLoading_ThenTheLoadFailsAndNothingIsLeft) {
  const uint64_t before = DeviceBuffer::live_count();
  for (const char* load :
       {"staging = 16384\nthreads = 1\ndirect = false\nread = \"mmap\"\n",
        "staging = 16384\nthreads = 1\ndirect = false\nread = \"pread\"\n",
        "threads = 1\ndirect = true\n",
        "staging = 16384\nthreads = 1\ndirect = false\nverify = true\n"}) {
    SCOPED_TRACE(load);
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", written()).ok());
    auto runtime = Runtime::create(config_for("host", load));
    int calls = 0;
    runtime->set_progress([&](uint64_t, uint64_t) {
      if (++calls == 1) rewrite_in_place(flipped());
    });
    auto program = runtime->load(plan_);
    ASSERT_GE(calls, 1);
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), StatusCode::data_loss);
    EXPECT_THAT(program.status().message(),
                AllOf(HasSubstr("model.safetensors: modified in place while it was being loaded "
                                "(its modification time went from "),
                      HasSubstr("replace a file by writing a new one and renaming it over the "
                                "old one")));
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

// A server keeps one SafetensorsCache for its loads (validate_plan and
// the load share it). The model is rewritten in place between two loads,
// its tensors stored in the opposite order: the cache's entry would give
// every tensor another tensor's bytes (and verify, hashing the same mapping
// at the same offsets, agreed). The next load opens the file again and
// loads each tensor's new bytes.
TEST_F(PipelineLoad, GivenAKeptCache_WhenTheFileIsRewrittenInPlaceBetweenLoads_ThenTheNextLoadGetsEachTensorsNewBytes) {
  auto runtime = Runtime::create(config_for("host", "staging = 16384\nverify = true\n"));
  SafetensorsCache files;
  PlanValidationOptions checks;
  checks.cache = &files;
  ASSERT_TRUE(validate_plan(plan_, checks).ok());
  auto first = runtime->load(plan_, {.files = &files});
  ASSERT_TRUE(first.ok()) << first.status().message();
  expect_loaded_right(**first);

  const std::vector<std::vector<std::byte>> other = flipped();
  rewrite_in_place(other, /*reversed=*/true);
  ASSERT_TRUE(validate_plan(plan_, checks).ok());
  auto second = runtime->load(plan_, {.files = &files});
  ASSERT_TRUE(second.ok()) << second.status().message();
  expect_loaded(**second, other);
  expect_loaded_right(**first);  // the first program is as it was

  // And without validate_plan in between: the load's own open.
  rewrite_in_place(data_);
  auto third = runtime->load(plan_, {.files = &files});
  ASSERT_TRUE(third.ok()) << third.status().message();
  expect_loaded_right(**third);
}

// The plan validated through a cache, then the file rewritten in place
// before the load (the window between validate_plan and the copies of
// `devalloc load` and Python's runtime.load): the load opens it again and
// checks the plan against that header, as validate_plan did against the
// old one. The same tensors in another order load right; a tensor whose
// dtype changed (same byte count) is refused, naming both.
TEST_F(PipelineLoad, GivenAPlanValidatedThroughACache_WhenTheFileIsRewrittenInPlaceBeforeTheLoad_ThenTheLoadChecksAndLoadsTheNewHeader) {
  auto runtime = Runtime::create(config_for("host", "staging = 16384\nverify = true\n"));
  {
    SafetensorsCache files;
    PlanValidationOptions checks;
    checks.cache = &files;
    ASSERT_TRUE(validate_plan(plan_, checks).ok());
    const std::vector<std::vector<std::byte>> other = flipped();
    rewrite_in_place(other, /*reversed=*/true);
    auto program = runtime->load(plan_, {.files = &files});
    ASSERT_TRUE(program.ok()) << program.status().message();
    expect_loaded(**program, other);
  }
  {
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", written()).ok());
    SafetensorsCache files;
    PlanValidationOptions checks;
    checks.cache = &files;
    ASSERT_TRUE(validate_plan(plan_, checks).ok());
    std::vector<SafetensorsWriteTensor> out = written();
    out[3].dtype = DType::i16;
    out[3].shape = {kTensorBytes / 2};
    write_in_place(out);
    const uint64_t before = DeviceBuffer::live_count();
    auto program = runtime->load(plan_, {.files = &files});
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
    EXPECT_THAT(program.status().message(),
                AllOf(HasSubstr("tensor \"t1003\""),
                      HasSubstr("the plan says U8 [4096], "),
                      HasSubstr("model.safetensors has I16 [2048] for \"t1003\"")));
    EXPECT_EQ(DeviceBuffer::live_count(), before);
  }
}

// Replaced by rename while it loads (the safe way to update a model): the
// load reads the file it opened, and succeeds with its bytes.
TEST_F(PipelineLoad, GivenTheFileReplacedByRenameWhileLoading_ThenTheLoadSucceedsWithTheBytesOpened) {
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct reads" : "staged");
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", written()).ok());
    auto runtime = Runtime::create(config_for(
        "host", std::string("staging = 16384\nthreads = 1\ndirect = ") +
                    (direct ? "true" : "false") + "\n"));
    const std::vector<std::vector<std::byte>> other = flipped();
    int calls = 0;
    runtime->set_progress([&](uint64_t, uint64_t) {
      if (++calls != 1) return;
      std::vector<SafetensorsWriteTensor> out;
      for (uint64_t i = 0; i <= kTensors; ++i) out.push_back({name(i), DType::u8, {kTensorBytes}, other[i]});
      ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", out).ok());
    });
    auto program = runtime->load(plan_);
    ASSERT_GE(calls, 1);
    ASSERT_TRUE(program.ok()) << program.status().message();
    expect_loaded_right(**program);
  }
}

// read = direct_io opens the source again with O_DIRECT, through the
// descriptor of its mapping (/proc/self/fd): when the path now names
// another file (renamed over since it was opened and checked), the load
// still reads the file it opened with O_DIRECT, never the new one.
TEST_F(PipelineLoad, GivenASourceRenamedOverAfterOpening_WhenReadWithDirectIo_ThenTheOpenedFilesBytesLoad) {
  const std::filesystem::path model = std::filesystem::canonical(dir_ / "model.safetensors");
  SafetensorsCache files;
  ASSERT_TRUE(files.open(model).ok());
  // Same names, shapes and layout; other bytes; a new inode at the path.
  std::vector<std::vector<std::byte>> other(data_.size());
  std::vector<SafetensorsWriteTensor> out;
  for (uint64_t i = 0; i <= kTensors; ++i) {
    other[i] = data_[i];
    for (std::byte& b : other[i]) b ^= std::byte{0x5a};
    out.push_back({name(i), DType::u8, {kTensorBytes}, other[i]});
  }
  ASSERT_TRUE(write_safetensors(model, out).ok());
  LoadReport report;
  auto program = Runtime::create(config_for("host", "staging = 65536\ndirect = false\n"
                                                    "read = \"direct_io\"\n"))
                     ->load(plan_, {.report = &report, .files = &files});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);  // data_: the bytes of the file opened
  EXPECT_EQ(report.pipeline.direct_io_fallback, !direct_io_works(dir_))
      << "O_DIRECT works here, on the file opened, whatever its path names now";
}


// The same, with a FIFO renamed over the source: opening it again for
// O_DIRECT must not wait for a writer that never comes (open(2) of a FIFO
// blocks without O_NONBLOCK); the load reads the file it opened.
TEST_F(PipelineLoad, GivenAFifoRenamedOverTheSource_WhenReadWithDirectIo_ThenTheLoadNeitherBlocksNorReadsIt) {
  const std::filesystem::path model = std::filesystem::canonical(dir_ / "model.safetensors");
  SafetensorsCache files;
  ASSERT_TRUE(files.open(model).ok());
  const std::filesystem::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::rename(fifo.c_str(), model.c_str()), 0);
  auto runtime = Runtime::create(config_for("host", "staging = 65536\ndirect = false\n"
                                                    "read = \"direct_io\"\n"));
  LoadReport report;
  std::atomic<bool> done{false};
  Result<std::shared_ptr<LoadedProgram>> program = Status(StatusCode::internal, "not run");
  std::thread load([&] {
    program = runtime->load(plan_, {.report = &report, .files = &files});
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool blocked = !done;
  // Free a load that waits in open(2): a writer comes and goes.
  while (!done) {
    const int writer = ::open(model.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (writer >= 0) ::close(writer);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  load.join();
  ASSERT_FALSE(blocked) << "the load waited for a writer of the FIFO";
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  EXPECT_EQ(report.pipeline.direct_io_fallback, !direct_io_works(dir_));
}

// PLUGIN-14: a release whose user_data points inside a copy's ticket but
// not at its start (host_stray_release releases each copy, then calls
// on_release with user_data + 1) is no copy's: a stray release, not a
// second release of the copy whose ticket it points into.
TEST_F(PipelineLoad, GivenAReleaseWithUserDataOneByteIntoATicket_WhenLoading_ThenItIsAStrayReleaseNotASecondOne) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = Runtime::create(config_for("host_stray_release",
                                            "staging = 16384\ndirect = false\nthreads = 1\n"
                                            "release_timeout = \"100ms\"\n"))
                     ->load(plan_);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::device_error);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("broke PLUGIN-14 (PLUGIN-21 release accounting): on_release came "
                              "with user_data 0x"),
                    HasSubstr("which no copy was given")));
  EXPECT_THAT(program.status().message(), ::testing::Not(HasSubstr("released twice")));
  // The first breach is said, the rest counted: one message, not one per copy.
  EXPECT_LT(program.status().message().size(), 1000u);
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// set_progress may replace the runtime-wide callback at any time, here from
// inside it: the load that called it keeps calling the callback it started
// with, to its last call (done == total), which stays alive to then; the
// next load calls the new one.
TEST_F(PipelineLoad, GivenTheRuntimeCallbackReplacedWhileALoadCallsIt_ThenThatLoadKeepsItAndTheNextLoadCallsTheNewOne) {
  auto runtime = Runtime::create(
      config_for("host", "staging = 16384\nthreads = 1\ndirect = false\n"));
  std::vector<uint64_t> old_done, new_done;
  auto token = std::make_shared<int>(0);
  const std::weak_ptr<int> old_alive = token;
  bool alive_in_every_call = true;
  runtime->set_progress([&, token = std::move(token)](uint64_t done, uint64_t) {
    old_done.push_back(done);
    alive_in_every_call = alive_in_every_call && !old_alive.expired();
    if (old_done.size() == 1) {
      runtime->set_progress([&](uint64_t d, uint64_t) { new_done.push_back(d); });
    }
  });
  auto first = runtime->load(plan_);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(new_done.empty()) << "the load called the replacement " << new_done.size() << " times";
  ASSERT_GE(old_done.size(), 2u);
  EXPECT_EQ(old_done.back(), kModelBytes + kTensorBytes);
  EXPECT_TRUE(alive_in_every_call);
  EXPECT_TRUE(old_alive.expired()) << "the runtime still holds the replaced callback";

  auto second = runtime->load(plan_);
  ASSERT_TRUE(second.ok()) << second.status().message();
  ASSERT_FALSE(new_done.empty());
  EXPECT_EQ(new_done.back(), kModelBytes + kTensorBytes);
}

// set_progress from another thread while loads run (TSan: no data race);
// the loads succeed and call the callbacks set.
TEST_F(PipelineLoad, GivenSetProgressCalledFromAnotherThreadDuringLoads_ThenNoDataRaceAndEveryLoadSucceeds) {
  auto runtime = Runtime::create(config_for("host", "staging = 16384\ndirect = false\n"));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::thread setter([&] {
    while (!stop) runtime->set_progress([&](uint64_t, uint64_t) { ++calls; });
  });
  for (int i = 0; i < 20; ++i) {
    auto program = runtime->load(plan_);
    ASSERT_TRUE(program.ok()) << program.status().message();
  }
  stop = true;
  setter.join();
  EXPECT_GT(calls.load(), 0u);
}

// PLUGIN-20 lets a plugin release only in synchronize, and a synchronize
// covers the copies whose call returned before it. A thread waiting for a
// slot synchronized and then waited release_timeout for every unreleased
// copy, also one still in its call on another thread: when that was the
// other thread's last piece, nobody synchronized again, and the load failed
// blaming a conformant plugin for PLUGIN-20 and leaked its staging. 256 KiB
// + 4 KiB in 4 slots of 64 KiB, 5 pieces; the plugin's 4th copy call takes
// 300 ms, the timeout is 1 s.
TEST_F(PipelineLoad, GivenPluginReleasingInSynchronize_WhenACopyIsInItsCallDuringAForcedSynchronize_ThenTheLoadSucceeds) {
  LoadReport report;
  auto program = Runtime::create(config_for("zoo_slow_fourth_copy",
                                            "staging = 262144\ndirect = false\nthreads = 2\n"
                                            "release_timeout = \"1s\"\n"))
                     ->load(plan_, {.report = &report});
  ASSERT_TRUE(program.ok()) << program.status().message();
  expect_loaded_right(**program);
  EXPECT_EQ(report.pipeline.staging_slots, 4u);
  EXPECT_GE(report.pipeline.forced_synchronizes, 1u);
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_EQ(report.devices[0].late_releases, 0u);
}

// read = "direct_io" reads with O_DIRECT straight into a staging slot, which
// must start on a block; memory from allocate_host carries no alignment in
// the ABI. With a plugin whose staging is 16 bytes past a page, every
// direct_io load failed with EINVAL; the slots now start on a block.
TEST_F(PipelineLoad, GivenStagingMemoryAlignedTo16Bytes_WhenReadWithDirectIo_ThenTheLoadSucceeds) {
  const int probe = ::open((dir_ / "model.safetensors").c_str(), O_RDONLY | O_DIRECT);
  const bool file_system_takes_direct_io = probe >= 0;
  if (probe >= 0) ::close(probe);
  for (const char* mode : {"pread", "direct_io"}) {
    LoadReport report;
    auto program = Runtime::create(config_for("zoo_staging_16",
                                              std::string("staging = 16384\nread = \"") + mode +
                                                  "\"\n"))
                       ->load(plan_, {.report = &report});
    ASSERT_TRUE(program.ok()) << mode << ": " << program.status().message();
    expect_loaded_right(**program);
    EXPECT_TRUE(report.pipeline.pinned) << mode;
    if (std::string(mode) == "direct_io" && file_system_takes_direct_io) {
      EXPECT_EQ(report.pipeline.read, ReadMode::direct_io);
      EXPECT_FALSE(report.pipeline.direct_io_fallback);
    }
  }
}

}  // namespace
}  // namespace devalloc::testing
