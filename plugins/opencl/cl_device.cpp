#include "cl_device.hpp"

#include <CL/cl_ext.h>

#include <array>
#include <cinttypes>
#include <cstring>
#include <devalloc/plugin_kit/give_back.hpp>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

namespace devalloc::opencl {

namespace {

using plugin::CallKind;
using plugin::Failure;
using plugin::give_back;

constexpr CallKind kWork = CallKind::work;

template <class T>
T device_info(const Runtime& cl, cl_device_id device, cl_device_info param, const char* name,
              uint32_t index) {
  T value{};
  cl.check(cl.clGetDeviceInfo(device, param, sizeof value, &value, nullptr), kWork,
           "clGetDeviceInfo(device %u, %s)", index, name);
  return value;
}

std::string device_text(const Runtime& cl, cl_device_id device, cl_device_info param,
                        const char* name, uint32_t index) {
  size_t size = 0;
  cl.check(cl.clGetDeviceInfo(device, param, 0, nullptr, &size), kWork,
           "clGetDeviceInfo(device %u, %s, size)", index, name);
  std::string text(size, '\0');
  cl.check(cl.clGetDeviceInfo(device, param, size, text.data(), nullptr), kWork,
           "clGetDeviceInfo(device %u, %s)", index, name);
  // Without the terminating NUL, and without the padding some drivers add.
  text.resize(std::strlen(text.c_str()));
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

bool has_extension(const std::string& extensions, const char* name) {
  std::istringstream words(extensions);
  for (std::string word; words >> word;) {
    if (word == name) return true;
  }
  return false;
}

plugin::DeviceDescription describe(const Runtime& cl, cl_device_id device, uint32_t index,
                                   uint64_t* max_allocation) {
  plugin::DeviceDescription d;
  d.name = device_text(cl, device, CL_DEVICE_NAME, "CL_DEVICE_NAME", index);
  d.total_memory_bytes = device_info<cl_ulong>(cl, device, CL_DEVICE_GLOBAL_MEM_SIZE,
                                               "CL_DEVICE_GLOBAL_MEM_SIZE", index);
  *max_allocation = device_info<cl_ulong>(cl, device, CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                                          "CL_DEVICE_MAX_MEM_ALLOC_SIZE", index);
  const std::string extensions =
      device_text(cl, device, CL_DEVICE_EXTENSIONS, "CL_DEVICE_EXTENSIONS", index);
  // Both are extensions: a device without them has no UUID or bus id to
  // report (PLUGIN-10: zero and "").
  if (has_extension(extensions, "cl_khr_device_uuid")) {
    const auto uuid = device_info<std::array<cl_uchar, CL_UUID_SIZE_KHR>>(
        cl, device, CL_DEVICE_UUID_KHR, "CL_DEVICE_UUID_KHR", index);
    std::memcpy(d.uuid.data(), uuid.data(), d.uuid.size());
  }
  if (has_extension(extensions, "cl_khr_pci_bus_info")) {
    const auto pci = device_info<cl_device_pci_bus_info_khr>(cl, device, CL_DEVICE_PCI_BUS_INFO_KHR,
                                                             "CL_DEVICE_PCI_BUS_INFO_KHR", index);
    d.pci_bus_id = plugin::format("%04x:%02x:%02x.%x", pci.pci_domain, pci.pci_bus, pci.pci_device,
                                  pci.pci_function);
  }
  d.dlpack_device_type = DEVALLOC_DLPACK_OPENCL;
  d.dlpack_device_id = static_cast<int32_t>(index);
  return d;
}

}  // namespace

// What the callback of one "until released" copy needs: everything but
// the event, which the driver passes.
struct ClDevice::PendingWrite {
  ClDevice* device;
  uint64_t ticket;
  plugin::Release release;
  std::string what;  // the enqueue, for the message of a failed copy
};

ClDevice::ClDevice(const Runtime& cl, cl_device_id device, uint32_t index)
    : cl_(cl), index_(index), buffers_(cl) {
  try {
    description_ = describe(cl, device, index, &max_allocation_);
    cl_int r = CL_SUCCESS;
    context_ = cl.clCreateContext(nullptr, 1, &device, nullptr, nullptr, &r);
    cl.check(r, kWork, "clCreateContext(device %u)", index);
    plugin::require_memory(context_ != nullptr, plugin::format("clCreateContext(device %u)", index),
                           "CL_SUCCESS");
    // In order (no CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE): a read sees
    // every write enqueued before it (PLUGIN-16).
    queue_ = cl.clCreateCommandQueue(context_, device, 0, &r);
    cl.check(r, kWork, "clCreateCommandQueue(device %u, in order)", index);
    plugin::require_memory(queue_ != nullptr,
                           plugin::format("clCreateCommandQueue(device %u)", index), "CL_SUCCESS");
  } catch (...) {
    release_objects();
    throw;
  }
}

ClDevice::~ClDevice() {
  // Every release fires once its copy is over; then nothing reads or
  // writes the buffers any more.
  quiesce();
  buffers_.for_each([this](uint64_t address, cl_mem buffer) {
    try {
      unmap_all_of(address);
    } catch (...) {
      // The buffer goes anyway: the driver ends its mappings with it.
    }
    give_back([&] { return cl_.clReleaseMemObject(buffer); });
  });
  buffers_.clear();
  release_objects();
}

void ClDevice::release_objects() noexcept {
  if (queue_ != nullptr) give_back([&] { return cl_.clReleaseCommandQueue(queue_); });
  if (context_ != nullptr) give_back([&] { return cl_.clReleaseContext(context_); });
  queue_ = nullptr;
  context_ = nullptr;
}

plugin::MemoryInfo ClDevice::memory_info() const {
  throw Failure{DEVALLOC_STATUS_UNSUPPORTED, "OpenCL reports no free device memory"};
}

uint64_t ClDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  const std::string call = plugin::format(
      "clCreateBuffer(device %u, CL_MEM_READ_WRITE, size = %" PRIu64 ")", index_, nbytes);
  // OpenCL makes no buffer larger than this, however much memory is free.
  if (nbytes > max_allocation_) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  plugin::format("%s not tried: device %u makes no buffer larger than its "
                                 "CL_DEVICE_MAX_MEM_ALLOC_SIZE of %" PRIu64 " bytes",
                                 call.c_str(), index_, max_allocation_)};
  }
  cl_int r = CL_SUCCESS;
  cl_mem buffer = cl_.clCreateBuffer(context_, CL_MEM_READ_WRITE, nbytes, nullptr, &r);
  cl_.check(r, CallKind::device_allocation, "%s", call.c_str());
  plugin::require_memory(buffer != nullptr, call, "CL_SUCCESS");
  try {
    // Drivers allocate lazily, at the buffer's first use: a migration to
    // the device makes that use now, so that memory the device lacks is
    // OUT_OF_DEVICE_MEMORY here and not a failed copy later.
    cl_event migrated = nullptr;
    r = cl_.clEnqueueMigrateMemObjects(queue_, 1, &buffer, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED,
                                       0, nullptr, &migrated);
    if (r == CL_SUCCESS) {
      r = cl_.clWaitForEvents(1, &migrated);
      // A failed command says why in its execution status only: a lazily
      // allocating driver's CL_MEM_OBJECT_ALLOCATION_FAILURE is out of
      // memory (PLUGIN-11), not a device error.
      if (r == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) {
        cl_int status = CL_SUCCESS;
        if (cl_.clGetEventInfo(migrated, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status,
                               &status, nullptr) == CL_SUCCESS &&
            status < 0) {
          r = status;
        }
      }
      give_back([&] { return cl_.clReleaseEvent(migrated); });
    }
    cl_.check(r, CallKind::device_allocation,
              "clEnqueueMigrateMemObjects(device %u, buffer of %" PRIu64
              " bytes, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED) + clWaitForEvents",
              index_, nbytes);
    const uint64_t address = reserve_window(nbytes, alignment);
    buffers_.add(address, nbytes, buffer);
    return address;
  } catch (...) {
    give_back([&] { return cl_.clReleaseMemObject(buffer); });
    throw;
  }
}

void ClDevice::deallocate(uint64_t address) {
  buffers_.free(address, index_, [&](cl_mem buffer) {
    // PLUGIN-22: a mapping ends at the latest with its allocation.
    unmap_all_of(address);
    cl_.check(cl_.clReleaseMemObject(buffer), kWork, "clReleaseMemObject(buffer at 0x%" PRIx64 ")",
              address);
  });
}

void ClDevice::copy_during_call(uint64_t dst, const void* src, uint64_t nbytes) {
  const HeldRange range = buffers_.find(dst, nbytes, index_, "the destination", "PLUGIN-15");
  // Blocking: the driver has read src when the call returns (PLUGIN-13).
  cl_.check(cl_.clEnqueueWriteBuffer(queue_, range.buffer(), CL_TRUE, range.offset(), nbytes, src,
                                     0, nullptr, nullptr),
            kWork,
            "clEnqueueWriteBuffer(device %u, blocking, offset = %" PRIu64 ", size = %" PRIu64 ")",
            index_, range.offset(), nbytes);
}

void ClDevice::copy_until_released(uint64_t dst, const void* src, uint64_t nbytes,
                                   plugin::Release release) {
  const HeldRange range = buffers_.find(dst, nbytes, index_, "the destination", "PLUGIN-15");
  // Made before the ticket: if either throws, the release fires as the
  // exception leaves (nothing was enqueued), under none of the locks.
  auto pending = std::make_unique<PendingWrite>(
      PendingWrite{this, 0, std::move(release),
                   plugin::format("clEnqueueWriteBuffer(device %u, non-blocking, offset = %" PRIu64
                                  ", size = %" PRIu64 ")",
                                  index_, range.offset(), nbytes)});
  pending->ticket = expect_callback();
  cl_event event = nullptr;
  const cl_int written = cl_.clEnqueueWriteBuffer(queue_, range.buffer(), CL_FALSE, range.offset(),
                                                  nbytes, src, 0, nullptr, &event);
  if (written != CL_SUCCESS) {
    // Nothing was enqueued: released before the ticket goes, so that no
    // synchronize returns ahead of the release.
    pending->release.fire();
    callback_done(pending->ticket, CL_SUCCESS, nullptr);
    cl_.check(written, kWork, "%s", pending->what.c_str());
  }
  // The callback may run before clSetEventCallback returns, on this thread
  // or another; from then on it owns `pending`.
  PendingWrite* handed = pending.get();
  const cl_int callback =
      cl_.clSetEventCallback(event, CL_COMPLETE, &ClDevice::on_write_complete, handed);
  if (callback != CL_SUCCESS) {
    // The write is enqueued and may still read src: its release waits.
    wait_for(event);
    give_back([&] { return cl_.clReleaseEvent(event); });
    pending->release.fire();
    callback_done(pending->ticket, CL_SUCCESS, nullptr);
    cl_.check(callback, kWork, "clSetEventCallback(event of %s, CL_COMPLETE)",
              pending->what.c_str());
  }
  static_cast<void>(pending.release());
  // Submitted now, so that the copy completes and releases without any
  // further call of the host (PLUGIN-20).
  cl_.check(cl_.clFlush(queue_), kWork, "clFlush(device %u)", index_);
}

void CL_CALLBACK ClDevice::on_write_complete(cl_event event, cl_int status, void* user_data) {
  std::unique_ptr<PendingWrite> pending(static_cast<PendingWrite*>(user_data));
  ClDevice& device = *pending->device;
  give_back([&] { return device.cl_.clReleaseEvent(event); });
  // Complete, or ended with an error (a negative status): either way the
  // driver reads src no more.
  pending->release.fire();
  const uint64_t ticket = pending->ticket;
  std::string what = std::move(pending->what);
  pending.reset();
  // Last: once it returns, destroy may go on and free the device.
  device.callback_done(ticket, status, &what);
}

uint64_t ClDevice::expect_callback() {
  std::lock_guard lock(callbacks_mutex_);
  const uint64_t ticket = next_ticket_;
  owed_.insert(ticket);
  ++next_ticket_;
  return ticket;
}

void ClDevice::callback_done(uint64_t ticket, cl_int status, const std::string* what) noexcept {
  std::lock_guard lock(callbacks_mutex_);
  if (status < 0 && failures_++ == 0) {
    try {
      first_failure_ = (what != nullptr ? *what : std::string("a copy")) +
                       " completed with execution status " + error_name(status);
    } catch (...) {
      first_failure_.clear();
    }
  }
  owed_.erase(ticket);
  // Under the lock, so that a waiter that goes on (destroy) finds this
  // callback done with the device.
  callback_came_.notify_all();
}

void ClDevice::wait_for_callbacks(uint64_t last) noexcept {
  std::unique_lock lock(callbacks_mutex_);
  callback_came_.wait(lock, [&] { return owed_.empty() || *owed_.begin() > last; });
}

void ClDevice::wait_for(cl_event event) noexcept {
  if (cl_.clWaitForEvents(1, &event) == CL_SUCCESS) return;
  // A failed wait (the command itself failed, or the wait did) says
  // nothing of whether it still runs; the queue's end does.
  give_back([&] { return cl_.clFinish(queue_); });
}

void ClDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  const HeldRange range = buffers_.find(src, nbytes, index_, "the source", "PLUGIN-15");
  // In order and blocking: after every write enqueued before (PLUGIN-16),
  // dst written when it returns.
  cl_.check(cl_.clEnqueueReadBuffer(queue_, range.buffer(), CL_TRUE, range.offset(), nbytes, dst, 0,
                                    nullptr, nullptr),
            kWork,
            "clEnqueueReadBuffer(device %u, blocking, offset = %" PRIu64 ", size = %" PRIu64 ")",
            index_, range.offset(), nbytes);
}

void ClDevice::synchronize() {
  uint64_t last = 0;
  {
    std::lock_guard lock(callbacks_mutex_);
    last = next_ticket_ - 1;
  }
  const cl_int finished = cl_.clFinish(queue_);
  // clFinish returns once the commands are complete, which may be before
  // their callbacks have run (and fired the releases): those are waited
  // for too (PLUGIN-17).
  wait_for_callbacks(last);
  std::string failure;
  {
    std::lock_guard lock(callbacks_mutex_);
    if (failures_ == 1) failure = std::move(first_failure_);
    if (failures_ > 1) {
      failure = plugin::format("%" PRIu64 " copies failed; the first: %s", failures_,
                               first_failure_.c_str());
    }
    failures_ = 0;
    first_failure_.clear();
  }
  if (finished != CL_SUCCESS) {
    throw Failure{
        DEVALLOC_STATUS_DEVICE_ERROR,
        plugin::format("clFinish(device %u) failed: %s%s%s", index_, error_name(finished).c_str(),
                       failure.empty() ? "" : "; and an earlier copy failed: ", failure.c_str())};
  }
  if (!failure.empty()) {
    throw Failure{DEVALLOC_STATUS_DEVICE_ERROR, "an earlier copy failed: " + failure};
  }
}

void ClDevice::quiesce() noexcept {
  if (queue_ == nullptr) return;
  give_back([&] { return cl_.clFinish(queue_); });
  std::unique_lock lock(callbacks_mutex_);
  callback_came_.wait(lock, [&] { return owed_.empty(); });
}

void* ClDevice::map(uint64_t address, uint64_t nbytes) {
  const HeldRange range = buffers_.find(address, nbytes, index_, "the range", "PLUGIN-22");
  // Blocking and in order: the map waits for the copies enqueued before,
  // and its bytes are the range's (PLUGIN-22: the host may read them).
  cl_int r = CL_SUCCESS;
  void* host = cl_.clEnqueueMapBuffer(queue_, range.buffer(), CL_TRUE, CL_MAP_READ | CL_MAP_WRITE,
                                      range.offset(), nbytes, 0, nullptr, nullptr, &r);
  const std::string call = plugin::format(
      "clEnqueueMapBuffer(device %u, blocking, CL_MAP_READ | CL_MAP_WRITE, "
      "offset = %" PRIu64 ", size = %" PRIu64 ")",
      index_, range.offset(), nbytes);
  cl_.check(r, CallKind::host_allocation, "%s", call.c_str());
  plugin::require_memory(host != nullptr, call, "CL_SUCCESS");
  try {
    std::lock_guard lock(mappings_mutex_);
    mappings_.emplace(host, Mapping{range.buffer(), range.allocation()});
  } catch (...) {
    give_back([&] {
      return cl_.clEnqueueUnmapMemObject(queue_, range.buffer(), host, 0, nullptr, nullptr);
    });
    throw;
  }
  return host;
}

void ClDevice::unmap(void* host) {
  Mapping mapping{};
  {
    std::lock_guard lock(mappings_mutex_);
    auto it = mappings_.find(host);
    if (it == mappings_.end()) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    plugin::format("%p is not a live mapping of device %u from map_to_host "
                                   "(PLUGIN-22)",
                                   host, index_)};
    }
    mapping = it->second;
    mappings_.erase(it);
  }
  bool enqueued = false;
  try {
    unmap_and_wait(mapping.buffer, host, "unmap_from_host", &enqueued);
  } catch (...) {
    // Still mapped when the unmap was not enqueued: unmapping it again is
    // allowed. An enqueued one ends the mapping, whatever its wait said.
    if (!enqueued) {
      std::lock_guard lock(mappings_mutex_);
      mappings_.emplace(host, mapping);
    }
    throw;
  }
}

void ClDevice::unmap_and_wait(cl_mem buffer, void* host, const char* what, bool* enqueued) {
  cl_event unmapped = nullptr;
  cl_.check(cl_.clEnqueueUnmapMemObject(queue_, buffer, host, 0, nullptr, &unmapped), kWork,
            "clEnqueueUnmapMemObject(device %u, %p) for %s", index_, host, what);
  if (enqueued != nullptr) *enqueued = true;
  // The writes through the mapping are on the device once the unmap is
  // complete (PLUGIN-22).
  const cl_int waited = cl_.clWaitForEvents(1, &unmapped);
  give_back([&] { return cl_.clReleaseEvent(unmapped); });
  cl_.check(waited, kWork, "clWaitForEvents(unmap of %p on device %u) for %s", host, index_, what);
}

void ClDevice::unmap_all_of(uint64_t allocation) {
  std::vector<std::pair<void*, Mapping>> ended;
  {
    std::lock_guard lock(mappings_mutex_);
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      if (it->second.allocation == allocation) {
        ended.emplace_back(it->first, it->second);
        it = mappings_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (size_t i = 0; i < ended.size(); ++i) {
    bool enqueued = false;
    try {
      unmap_and_wait(ended[i].second.buffer, ended[i].first, "deallocate", &enqueued);
    } catch (...) {
      // The mappings not yet ended stay recorded (as unmap does), so that
      // the allocation, kept live by the failed free, is never released
      // while one of them is mapped.
      std::lock_guard lock(mappings_mutex_);
      for (size_t j = enqueued ? i + 1 : i; j < ended.size(); ++j) {
        mappings_.insert(ended[j]);
      }
      throw;
    }
  }
}

ClDevice::HostBuffer ClDevice::create_host_buffer(uint64_t nbytes) {
  const std::string call = plugin::format(
      "clCreateBuffer(device %u, CL_MEM_ALLOC_HOST_PTR, size = %" PRIu64 ")", index_, nbytes);
  if (nbytes > max_allocation_) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_HOST_MEMORY,
                  plugin::format("%s not tried: device %u makes no buffer larger than its "
                                 "CL_DEVICE_MAX_MEM_ALLOC_SIZE of %" PRIu64 " bytes",
                                 call.c_str(), index_, max_allocation_)};
  }
  cl_int r = CL_SUCCESS;
  HostBuffer staging;
  staging.buffer =
      cl_.clCreateBuffer(context_, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, nbytes, nullptr, &r);
  cl_.check(r, CallKind::host_allocation, "%s", call.c_str());
  plugin::require_memory(staging.buffer != nullptr, call, "CL_SUCCESS");
  staging.host = cl_.clEnqueueMapBuffer(queue_, staging.buffer, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE,
                                        0, nbytes, 0, nullptr, nullptr, &r);
  if (r != CL_SUCCESS || staging.host == nullptr) {
    give_back([&] { return cl_.clReleaseMemObject(staging.buffer); });
    const std::string map_call = plugin::format(
        "clEnqueueMapBuffer(device %u, staging buffer, blocking, size = %" PRIu64 ")", index_,
        nbytes);
    cl_.check(r, CallKind::host_allocation, "%s", map_call.c_str());
    plugin::require_memory(false, map_call, "CL_SUCCESS");
  }
  return staging;
}

void ClDevice::destroy_host_buffer(const HostBuffer& staging, bool* ended) {
  *ended = false;
  try {
    unmap_and_wait(staging.buffer, staging.host, "free_host", ended);
  } catch (...) {
    // Enqueued: the mapping ends whatever its wait said; the buffer goes.
    if (*ended) give_back([&] { return cl_.clReleaseMemObject(staging.buffer); });
    throw;
  }
  cl_.check(cl_.clReleaseMemObject(staging.buffer), kWork, "clReleaseMemObject(staging buffer %p)",
            staging.host);
}

void ClDevice::give_back_host_buffer(const HostBuffer& staging) noexcept {
  try {
    unmap_and_wait(staging.buffer, staging.host, "destroy");
  } catch (...) {
    // Released anyway: the driver ends its mapping with it.
  }
  give_back([&] { return cl_.clReleaseMemObject(staging.buffer); });
}

}  // namespace devalloc::opencl
