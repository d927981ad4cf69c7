#include <devalloc/huge_pages.hpp>

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace devalloc {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// The VmFlags of the mapping of /proc/self/smaps that holds `address`.
std::string vm_flags_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    // A mapping's first line: "7f12...-7f13... rw-p ..."; the others are
    // "Name: value", which never read as two hex numbers joined by '-'.
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = at >= begin && at < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return {};
}

bool huge_pages_on_advice() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(enabled, modes);
  return modes.find("[madvise]") != std::string::npos ||
         modes.find("[always]") != std::string::npos;
}

class HugePages : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!huge_pages_on_advice()) GTEST_SKIP() << "transparent huge pages are off here";
    memory_ = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(memory_, MAP_FAILED);
  }
  void TearDown() override {
    if (memory_ != nullptr && memory_ != MAP_FAILED) ::munmap(memory_, kBytes);
  }
  char* at(size_t offset) const { return static_cast<char*>(memory_) + offset; }

  static constexpr size_t kBytes = 4 * kHugePage;
  void* memory_ = nullptr;
};

TEST_F(HugePages, GivenARangeHoldingWholeHugePages_ThenTheyAreAdvisedAndTheEdgesAreNot) {
  // From 1 MiB in to 1 MiB before the end: the whole 2 MiB pages inside.
  advise_huge_pages(at(kHugePage / 2), kBytes - kHugePage);
  const uintptr_t first =
      (reinterpret_cast<uintptr_t>(at(kHugePage / 2)) + kHugePage - 1) & ~(kHugePage - 1);
  EXPECT_NE(vm_flags_at(reinterpret_cast<void*>(first)).find(" hg"), std::string::npos)
      << vm_flags_at(reinterpret_cast<void*>(first));
  EXPECT_EQ(vm_flags_at(at(0)).find(" hg"), std::string::npos) << vm_flags_at(at(0));
  EXPECT_EQ(vm_flags_at(at(kBytes - 1)).find(" hg"), std::string::npos);
}

TEST_F(HugePages, GivenARangeHoldingNoWholeHugePage_ThenNothingIsAdvised) {
  advise_huge_pages(at(4096), kHugePage - 8192);
  advise_huge_pages(at(0), 0);
  advise_huge_pages(at(kHugePage), SIZE_MAX);  // wraps: refused before any advice
  for (size_t offset = 0; offset < kBytes; offset += kHugePage / 2) {
    EXPECT_EQ(vm_flags_at(at(offset)).find(" hg"), std::string::npos) << offset;
  }
}

// A vector about to be filled: reserved, and its whole 2 MiB pages advised.
TEST_F(HugePages, GivenAVectorReservedOnHugePages_ThenItHoldsTheRoomAndItsInsideIsAdvised) {
  std::vector<uint64_t> values;
  reserve_on_huge_pages(values, kBytes / sizeof(uint64_t));
  EXPECT_GE(values.capacity(), kBytes / sizeof(uint64_t));
  const uintptr_t inside =
      (reinterpret_cast<uintptr_t>(values.data()) + 2 * kHugePage - 1) & ~(kHugePage - 1);
  EXPECT_NE(vm_flags_at(reinterpret_cast<void*>(inside)).find(" hg"), std::string::npos)
      << vm_flags_at(reinterpret_cast<void*>(inside));
}

}  // namespace
}  // namespace devalloc
