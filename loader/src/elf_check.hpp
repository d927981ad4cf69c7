// Whether a file is an ELF shared object that this process could map, read
// before dlopen sees it: glibc maps a plugin's segments as the program
// headers say, and touching a page past the end of a truncated file raises
// SIGBUS in dlopen, which no error return can catch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace devalloc::detail {

// Reads the ELF header and the program headers of the regular file open at
// fd (size bytes, from fstat) with pread, and returns what makes it unfit, or
// nothing: "not an ELF file", "an ELF file for AArch64 (e_machine 183), this
// is x86-64", "truncated: segment 2 (PT_LOAD) ends at byte 123456, the file
// has 5000 bytes". Checks the class, byte order, version and machine of this
// build, the type (ET_DYN), and that the program header table and every
// segment's file range lie inside the file. Reads at most the header and the
// program header table (under 4 MiB whatever the file says).
std::optional<std::string> elf_shared_object_problem(int fd, uint64_t size);

}  // namespace devalloc::detail
