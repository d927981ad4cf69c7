#include "host_device.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace devalloc::host {
namespace {

using plugin::Failure;

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t page_size() {
  const long size = sysconf(_SC_PAGE_SIZE);
  return size > 0 ? static_cast<uint64_t>(size) : 4096;
}

// posix_memalign rather than aligned_alloc: no size-multiple rule, and the
// reason for a failure comes back as a code.
void* aligned_memory(uint64_t nbytes, uint64_t alignment) {
  void* p = nullptr;
  return posix_memalign(&p, alignment, nbytes) == 0 ? p : nullptr;
}

std::byte* pointer(uint64_t address) {
  return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address));
}

}  // namespace

HostDevice::HostDevice(bool async) : total_memory_(physical_memory()) {
  if (async) {
    queue_ = std::make_unique<CopyQueue>([this](const CopyJob& job) { perform(job); });
  }
}

HostDevice::~HostDevice() {
  queue_.reset();
  for (const auto& [address, nbytes] : allocations_.all()) std::free(pointer(address));
  for (const auto& [address, nbytes] : host_buffers_.all()) std::free(pointer(address));
}

uint64_t HostDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  if (alignment == 0) alignment = natural_alignment;
  if (!plugin::is_power_of_two(alignment)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "alignment is not a power of two"};
  }
  if (alignment > max_alignment) {
    throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                  "alignment above the largest supported, " +
                      std::to_string(max_alignment)};
  }
  if (nbytes == 0) return 0;
  // Checked before asking malloc: with overcommit a huge request could
  // succeed and fail only when touched.
  if (nbytes > total_memory_) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  "out of device memory (the host has " +
                      std::to_string(total_memory_) + " bytes)"};
  }
  void* p = aligned_memory(nbytes, std::max(alignment, natural_alignment));
  if (p == nullptr) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "out of device memory"};
  }
  const auto address = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  try {
    allocations_.insert(address, nbytes);
  } catch (...) {
    std::free(p);
    throw;
  }
  return address;
}

void HostDevice::deallocate(uint64_t address) {
  if (address == 0) return;
  std::unique_lock lock(memory_lifetime_);
  if (!allocations_.erase(address, nullptr)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "not a live allocation"};
  }
  std::free(pointer(address));
}

void HostDevice::check_range(uint64_t address, uint64_t nbytes) const {
  if (!allocations_.contains(address, nbytes)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "range is not inside a live allocation"};
  }
}

void HostDevice::copy_now(uint64_t dst, const void* src, uint64_t nbytes) {
  if (nbytes == 0) return;
  // Waiting keeps FIFO order with earlier queued copies to overlapping
  // bytes without holding a second copy of src; the caller could not reuse
  // src any sooner if it were staged instead.
  if (queue_) queue_->wait_for_earlier();
  std::shared_lock lock(memory_lifetime_);
  check_range(dst, nbytes);
  std::memcpy(pointer(dst), src, nbytes);
}

void HostDevice::copy_later(uint64_t dst, const void* src, uint64_t nbytes,
                            Release release,
                            std::chrono::milliseconds read_delay) {
  if (nbytes == 0) return;
  if (!queue_) {
    copy_now(dst, src, nbytes);
    return;
  }
  {
    std::shared_lock lock(memory_lifetime_);
    check_range(dst, nbytes);
  }
  queue_->push(CopyJob{dst, src, nbytes, read_delay, std::move(release)});
}

void HostDevice::perform(const CopyJob& job) {
  std::shared_lock lock(memory_lifetime_);
  if (!allocations_.contains(job.dst, job.nbytes)) {
    throw Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                  "queued copy of " + std::to_string(job.nbytes) +
                      " bytes: its destination was freed before it ran"};
  }
  std::memcpy(pointer(job.dst), job.src, job.nbytes);
}

void HostDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  if (nbytes == 0) return;
  if (queue_) queue_->wait_for_earlier();
  std::shared_lock lock(memory_lifetime_);
  check_range(src, nbytes);
  std::memcpy(dst, pointer(src), nbytes);
}

void HostDevice::synchronize() {
  if (!queue_) return;
  queue_->wait_for_earlier();
  if (auto failure = queue_->take_error()) {
    throw Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                  "an earlier queued copy failed: " + *failure};
  }
}

void* HostDevice::allocate_host(uint64_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* p = nbytes > total_memory_ ? nullptr : aligned_memory(nbytes, page_size());
  if (p == nullptr) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "out of host memory"};
  }
  try {
    host_buffers_.insert(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)), nbytes);
  } catch (...) {
    std::free(p);
    throw;
  }
  return p;
}

void HostDevice::free_host(void* host) {
  if (host == nullptr) return;
  if (!host_buffers_.erase(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(host)),
                           nullptr)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "not a pointer from allocate_host"};
  }
  std::free(host);
}

}  // namespace devalloc::host
