#include "elf_check.hpp"

#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

namespace devalloc::detail {

namespace {

#ifndef EM_LOONGARCH
#define EM_LOONGARCH 258
#endif

// The machine this loader was built for, from the compiler's macros; 0
// (EM_NONE) on one not listed here, whose check is then dlopen's.
#if defined(__x86_64__)
constexpr unsigned kMachine = EM_X86_64;
#elif defined(__i386__)
constexpr unsigned kMachine = EM_386;
#elif defined(__aarch64__)
constexpr unsigned kMachine = EM_AARCH64;
#elif defined(__arm__)
constexpr unsigned kMachine = EM_ARM;
#elif defined(__powerpc64__)
constexpr unsigned kMachine = EM_PPC64;
#elif defined(__powerpc__)
constexpr unsigned kMachine = EM_PPC;
#elif defined(__riscv)
constexpr unsigned kMachine = EM_RISCV;
#elif defined(__s390__)
constexpr unsigned kMachine = EM_S390;
#elif defined(__loongarch__)
constexpr unsigned kMachine = EM_LOONGARCH;
#elif defined(__mips__)
constexpr unsigned kMachine = EM_MIPS;
#elif defined(__sparc__) && defined(__arch64__)
constexpr unsigned kMachine = EM_SPARCV9;
#else
constexpr unsigned kMachine = EM_NONE;
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr unsigned char kData = ELFDATA2LSB;
#else
constexpr unsigned char kData = ELFDATA2MSB;
#endif
constexpr unsigned char kClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;

std::string machine_name(unsigned machine) {
  switch (machine) {
    case EM_X86_64: return "x86-64";
    case EM_386: return "x86 (i386)";
    case EM_AARCH64: return "AArch64";
    case EM_ARM: return "ARM";
    case EM_PPC64: return "PowerPC64";
    case EM_PPC: return "PowerPC";
    case EM_RISCV: return "RISC-V";
    case EM_S390: return "S/390";
    case EM_LOONGARCH: return "LoongArch";
    case EM_MIPS: return "MIPS";
    case EM_SPARCV9: return "SPARC V9";
    case EM_IA_64: return "IA-64";
    default: return "machine " + std::to_string(machine);
  }
}

const char* class_name(unsigned char c) {
  return c == ELFCLASS32 ? "32-bit" : c == ELFCLASS64 ? "64-bit" : "unknown-class";
}

const char* type_name(unsigned type) {
  switch (type) {
    case ET_NONE: return "an ELF file of no type (ET_NONE)";
    case ET_REL: return "an ELF relocatable object (ET_REL), not a shared object";
    case ET_EXEC: return "an ELF executable (ET_EXEC), not a shared object";
    case ET_CORE: return "an ELF core dump (ET_CORE), not a shared object";
    default: return nullptr;
  }
}

const char* segment_type(uint32_t type) {
  switch (type) {
    case PT_LOAD: return "PT_LOAD";
    case PT_DYNAMIC: return "PT_DYNAMIC";
    case PT_INTERP: return "PT_INTERP";
    case PT_NOTE: return "PT_NOTE";
    case PT_PHDR: return "PT_PHDR";
    case PT_TLS: return "PT_TLS";
    case PT_GNU_EH_FRAME: return "PT_GNU_EH_FRAME";
    case PT_GNU_STACK: return "PT_GNU_STACK";
    case PT_GNU_RELRO: return "PT_GNU_RELRO";
#ifdef PT_GNU_PROPERTY
    case PT_GNU_PROPERTY: return "PT_GNU_PROPERTY";
#endif
    default: return nullptr;
  }
}

// Reads exactly n bytes at offset, or says why not (a file that shrank
// since fstat reads short).
std::optional<std::string> read_at(int fd, void* out, size_t n, uint64_t offset) {
  auto* bytes = static_cast<unsigned char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, bytes + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return "cannot read: " + std::system_category().message(errno);
    }
    if (got == 0) {
      return "truncated: it ended at byte " + std::to_string(offset + done) +
             " while it was read (it shrank since it was opened)";
    }
    done += static_cast<size_t>(got);
  }
  return std::nullopt;
}

std::string truncated(const std::string& what, uint64_t end, uint64_t size) {
  return "truncated: " + what + " ends at byte " + std::to_string(end) + ", the file has " +
         std::to_string(size) + " bytes";
}

}  // namespace

std::optional<std::string> elf_shared_object_problem(int fd, uint64_t size) {
  using Ehdr = ElfW(Ehdr);
  using Phdr = ElfW(Phdr);
  unsigned char ident[EI_NIDENT] = {};
  if (size < SELFMAG) return "not an ELF file (" + std::to_string(size) + " bytes)";
  if (auto e = read_at(fd, ident, size < EI_NIDENT ? SELFMAG : EI_NIDENT, 0)) return e;
  if (std::memcmp(ident, ELFMAG, SELFMAG) != 0) return std::string("not an ELF file");
  if (size < sizeof(Ehdr)) {
    return truncated("the ELF header", sizeof(Ehdr), size);
  }
  if (ident[EI_CLASS] != kClass) {
    return std::string("a ") + class_name(ident[EI_CLASS]) + " ELF file (EI_CLASS " +
           std::to_string(ident[EI_CLASS]) + "), this is a " + class_name(kClass) + " build";
  }
  if (ident[EI_DATA] != kData) {
    return std::string("an ELF file of the other byte order (EI_DATA ") +
           std::to_string(ident[EI_DATA]) + "), this is " +
           (kData == ELFDATA2LSB ? "little-endian" : "big-endian");
  }
  if (ident[EI_VERSION] != EV_CURRENT) {
    return "an ELF file of unknown version " + std::to_string(ident[EI_VERSION]);
  }
  Ehdr header{};
  if (auto e = read_at(fd, &header, sizeof header, 0)) return e;
  if (kMachine != EM_NONE && header.e_machine != kMachine) {
    return "an ELF file for " + machine_name(header.e_machine) + " (e_machine " +
           std::to_string(header.e_machine) + "), this is " + machine_name(kMachine);
  }
  if (header.e_type != ET_DYN) {
    if (const char* name = type_name(header.e_type)) return std::string(name);
    return "an ELF file of type " + std::to_string(header.e_type) + ", not a shared object";
  }
  if (header.e_phnum == 0) return std::string("an ELF file without program headers");
  if (header.e_phnum == PN_XNUM) {
    return std::string("an ELF file with 65535 or more program headers (PN_XNUM)");
  }
  if (header.e_phentsize != sizeof(Phdr)) {
    return "program headers of " + std::to_string(header.e_phentsize) + " bytes, not " +
           std::to_string(sizeof(Phdr));
  }
  // At most 65534 entries of 56 bytes: a bounded read.
  const uint64_t table_bytes = uint64_t{header.e_phnum} * sizeof(Phdr);
  if (header.e_phoff > size || table_bytes > size - header.e_phoff) {
    const uint64_t end = header.e_phoff > UINT64_MAX - table_bytes
                             ? UINT64_MAX
                             : header.e_phoff + table_bytes;
    return truncated("the program header table", end, size);
  }
  std::vector<Phdr> segments(header.e_phnum);
  if (auto e = read_at(fd, segments.data(), table_bytes, header.e_phoff)) return e;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Phdr& p = segments[i];
    if (p.p_offset <= size && p.p_filesz <= size - p.p_offset) continue;
    const char* type = segment_type(p.p_type);
    const std::string what = "segment " + std::to_string(i) + " (" +
                             (type != nullptr ? std::string(type)
                                              : "type " + std::to_string(p.p_type)) +
                             ")";
    const uint64_t end = p.p_offset > UINT64_MAX - p.p_filesz ? UINT64_MAX
                                                              : p.p_offset + p.p_filesz;
    return truncated(what, end, size);
  }
  return std::nullopt;
}

}  // namespace devalloc::detail
