// Large buffers about to be filled once (a plan's text, a header's copy,
// the tensors read from them, a host plugin's allocations): on Linux each
// fresh 4 KiB page costs a fault, an allocation and a clear, about a
// microsecond on a VM; a 2 MiB transparent huge page costs about that once
// for 512 of them. Header-only: the plugin kit's plugins use it too.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace devalloc {

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes)
// with transparent huge pages (madvise MADV_HUGEPAGE), for memory not yet
// touched. Where huge pages are off, the range holds no whole one (any
// buffer under 2 MiB), or the kernel refuses, nothing changes: advice only.
inline void advise_huge_pages(void* data, size_t bytes) noexcept {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  uintptr_t end = 0;
  if (__builtin_add_overflow(begin, bytes, &end)) return;
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = end & ~(kHugePage - 1);
  if (first >= last || first < begin) return;
  // A kernel without transparent huge pages says EINVAL; the pages stay small.
  (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// c.reserve(n), then the advice over all of c's capacity: for a vector or a
// string about to be filled.
template <class Container>
void reserve_on_huge_pages(Container& c, size_t n) {
  c.reserve(n);
  advise_huge_pages(c.data(), c.capacity() * sizeof(typename Container::value_type));
}

}  // namespace devalloc
