// The loader's check of a plugin file before dlopen (loader/src/elf_check.hpp)
// on any bytes: it must never crash, hang or read outside the file, and a
// file it accepts must have its program header table and every segment's
// file range inside the file, which is what keeps dlopen from faulting on a
// truncated plugin. Only the check runs: dlopen never sees these bytes.
#include "elf_check.hpp"

#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// The file the check reads: one memfd, rewritten for each input.
int input_file(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz_plugin_elf", 0);
  if (fd < 0 || ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  return fd;
}

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_plugin_elf: accepted a file whose %s\n", what);
  std::abort();
}

// The oracle, on the bytes themselves.
void check_accepted(const uint8_t* data, size_t size) {
  using Ehdr = ElfW(Ehdr);
  using Phdr = ElfW(Phdr);
  if (size < sizeof(Ehdr)) broken("ELF header is cut short");
  Ehdr header;
  std::memcpy(&header, data, sizeof header);
  if (header.e_type != ET_DYN) broken("type is not ET_DYN");
  if (header.e_phnum > 0 && header.e_phentsize != sizeof(Phdr)) broken("phentsize is wrong");
  const uint64_t table_end = uint64_t{header.e_phoff} + uint64_t{header.e_phnum} * sizeof(Phdr);
  if (table_end > size) broken("program header table ends past the file");
  for (uint64_t i = 0; i < header.e_phnum; ++i) {
    Phdr segment;
    std::memcpy(&segment, data + header.e_phoff + i * sizeof(Phdr), sizeof segment);
    if (segment.p_filesz > size || segment.p_offset > size - segment.p_filesz) {
      broken("segment ends past the file");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = input_file(data, size);
  const auto problem = devalloc::detail::elf_shared_object_problem(fd, size);
  if (!problem) {
    check_accepted(data, size);
  } else if (problem->empty()) {
    std::fprintf(stderr, "fuzz_plugin_elf: a refusal without a reason\n");
    std::abort();
  }
  return 0;
}
