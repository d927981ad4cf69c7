// A plugin file is read as an ELF shared object of this machine before
// dlopen maps it: a truncated copy (which dlopen would die of with SIGBUS)
// or another architecture's file is refused with what is wrong, and dlopen's
// own failures carry dlerror's text alone.
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "scratch_dir.hpp"

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const fs::path kHost = fs::path(DEVALLOC_PLUGIN_BUILD_DIR) / "libdevalloc_host.so";
const fs::path kZoo = DEVALLOC_BINARY_DIR "/tests/plugin_zoo";

std::vector<char> bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class PluginElfCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = bytes_of(kHost);
    ASSERT_GT(host_.size(), sizeof(ElfW(Ehdr)));
  }

  // The host plugin's bytes, changed by `edit`, as dir_/libdevalloc_NAME.so.
  template <class Edit>
  fs::path host_copy(const std::string& name, Edit edit) {
    std::vector<char> bytes = host_;
    edit(bytes);
    const fs::path path = dir_ / ("libdevalloc_" + name + ".so");
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  ElfW(Ehdr) header() const {
    ElfW(Ehdr) h{};
    std::memcpy(&h, host_.data(), sizeof h);
    return h;
  }

  PluginError open_error(const fs::path& path) {
    auto [library, error] = PluginLibrary::open(path);
    EXPECT_EQ(library, nullptr) << path << " was accepted";
    EXPECT_EQ(error.outcome, PluginOutcome::open_failed) << error.status.message();
    EXPECT_THAT(error.status.message(), StartsWith("plugin " + path.string() + ": cannot be opened: "));
    return error;
  }

  devalloc::test::ScratchDir scratch_{"elf"};
  const fs::path dir_ = scratch_.path();
  std::vector<char> host_;
};

TEST_F(PluginElfCheck, GivenTruncatedCopy_WhenOpening_ThenRefusedNamingTheSegmentAndTheFileSize) {
  const fs::path path = host_copy("cut", [](std::vector<char>& b) { b.resize(5000); });
  const PluginError e = open_error(path);
  EXPECT_THAT(e.status.message(), AllOf(HasSubstr("cannot be opened: truncated: segment "),
                                        EndsWith(", the file has 5000 bytes")));
}

TEST_F(PluginElfCheck, GivenZoosTruncatedPlugin_WhenLoadingAndDiscovering_ThenRefusedAndTheOthersListed) {
  const fs::path truncated = kZoo / "libdevalloc_zoo_truncated.so";
  ASSERT_TRUE(fs::exists(truncated));
  auto [plugin, error] = PluginLoader().load(truncated.string());
  EXPECT_EQ(plugin, nullptr);
  EXPECT_EQ(error.outcome, PluginOutcome::open_failed);
  EXPECT_THAT(error.status.message(), AllOf(HasSubstr(": cannot be opened: truncated: segment "),
                                            EndsWith(", the file has 5000 bytes")));
}

TEST_F(PluginElfCheck, GivenProgramHeadersPastTheEnd_WhenOpening_ThenRefusedNamingTheTable) {
  const auto h = header();
  const fs::path path = host_copy("no_table", [&](std::vector<char>& b) {
    b.resize(h.e_phoff + h.e_phentsize);  // the first program header only
  });
  const PluginError e = open_error(path);
  EXPECT_THAT(e.status.message(),
              EndsWith("cannot be opened: truncated: the program header table ends at byte " +
                       std::to_string(h.e_phoff + uint64_t{h.e_phnum} * h.e_phentsize) +
                       ", the file has " + std::to_string(h.e_phoff + h.e_phentsize) + " bytes"));
}

TEST_F(PluginElfCheck, GivenOnlyPartOfTheElfHeader_WhenOpening_ThenRefusedAsTruncated) {
  const fs::path path = host_copy("header", [](std::vector<char>& b) { b.resize(20); });
  EXPECT_THAT(open_error(path).status.message(),
              EndsWith("cannot be opened: truncated: the ELF header ends at byte " +
                       std::to_string(sizeof(ElfW(Ehdr))) + ", the file has 20 bytes"));
}

TEST_F(PluginElfCheck, GivenAnotherMachinesElfFile_WhenOpening_ThenRefusedNamingBothMachines) {
  const uint16_t native = header().e_machine;
  const uint16_t foreign = native == EM_AARCH64 ? EM_X86_64 : EM_AARCH64;
  const fs::path path = host_copy("foreign", [&](std::vector<char>& b) {
    std::memcpy(b.data() + offsetof(ElfW(Ehdr), e_machine), &foreign, sizeof foreign);
  });
  const std::string expected =
      foreign == EM_AARCH64
          ? "an ELF file for AArch64 (e_machine 183), this is "
          : "an ELF file for x86-64 (e_machine 62), this is ";
  EXPECT_THAT(open_error(path).status.message(), HasSubstr("cannot be opened: " + expected));
#if defined(__x86_64__)
  EXPECT_THAT(open_error(path).status.message(),
              EndsWith("cannot be opened: an ELF file for AArch64 (e_machine 183), this is x86-64"));
#endif
}

TEST_F(PluginElfCheck, GivenOtherClassByteOrderOrType_WhenOpening_ThenEachRefusedWithWhatIsWrong) {
  const fs::path other_class = host_copy("class", [](std::vector<char>& b) {
    b[EI_CLASS] = sizeof(void*) == 8 ? ELFCLASS32 : ELFCLASS64;
  });
  EXPECT_THAT(open_error(other_class).status.message(),
              HasSubstr(sizeof(void*) == 8 ? "cannot be opened: a 32-bit ELF file (EI_CLASS 1), "
                                             "this is a 64-bit build"
                                           : "cannot be opened: a 64-bit ELF file"));
  const fs::path other_order = host_copy("order", [](std::vector<char>& b) {
    b[EI_DATA] = b[EI_DATA] == ELFDATA2LSB ? ELFDATA2MSB : ELFDATA2LSB;
  });
  EXPECT_THAT(open_error(other_order).status.message(),
              HasSubstr("cannot be opened: an ELF file of the other byte order"));
  const fs::path executable = host_copy("exec", [](std::vector<char>& b) {
    const uint16_t type = ET_EXEC;
    std::memcpy(b.data() + offsetof(ElfW(Ehdr), e_type), &type, sizeof type);
  });
  EXPECT_THAT(open_error(executable).status.message(),
              EndsWith("cannot be opened: an ELF executable (ET_EXEC), not a shared object"));
}

TEST_F(PluginElfCheck, GivenTextOrEmptyFile_WhenOpening_ThenNotAnElfFile) {
  EXPECT_THAT(open_error(kZoo / "libdevalloc_zoo_not_a_library.so").status.message(),
              EndsWith("cannot be opened: not an ELF file"));
  const fs::path empty = dir_ / "libdevalloc_empty.so";
  std::ofstream{empty};
  EXPECT_THAT(open_error(empty).status.message(), EndsWith("cannot be opened: not an ELF file (0 bytes)"));
}

TEST_F(PluginElfCheck, GivenIntactCopy_WhenOpening_ThenItLoads) {
  const fs::path path = host_copy("intact", [](std::vector<char>&) {});
  auto [library, error] = PluginLibrary::open(path);
  ASSERT_NE(library, nullptr) << error.status.message();
  EXPECT_EQ(library->name(), "host");
}

}  // namespace
}  // namespace devalloc
