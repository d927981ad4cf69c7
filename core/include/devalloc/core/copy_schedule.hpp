// The copy schedule: what is read, copied and in which order, on which
// thread. One place of its own, so that the streaming strategy can change
// without touching placement or allocation.
//
// Today's strategy: constants are copied straight from the mapped file with
// DEVALLOC_SRC_UNTIL_RELEASED (no host copy at all); the mapping is kept
// alive until the plugin released each copy. Contiguous ranges (same file,
// same buffer, adjacent on both sides) are coalesced, then cut into chunks.
// The bytes in flight across all devices stay under the staging budget.
// Devices are loaded in parallel, one thread each (at most `threads`), and
// each is synchronized once, at the end.
#pragma once

#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/status.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace devalloc {

// One constant to place: nbytes of file at file_offset go to
// buffer->address() + buffer_offset.
struct CopyRequest {
  std::shared_ptr<DeviceBuffer> buffer;
  uint64_t buffer_offset = 0;
  std::shared_ptr<const MappedFile> file;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
  std::string tensor;  // named in errors
};

// One copy call after coalescing and chunking; points into the schedule's
// own requests.
struct CopyStep {
  DeviceBuffer* buffer = nullptr;
  uint64_t buffer_offset = 0;
  const MappedFile* file = nullptr;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
  std::string first_tensor;  // the tensors it covers, for errors
  std::string last_tensor;
};

struct DeviceCopyQueue {
  ResolvedDevice device;
  std::vector<CopyStep> steps;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

struct DeviceLoadStats {
  ResolvedDevice device;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t copies = 0;
  double seconds = 0;  // first copy issued to synchronize returned
};

// Called from the loading threads with the bytes issued so far, of `total`.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

class CopySchedule {
 public:
  // Groups requests by device, coalesces and chunks them (a step is at most
  // max_step_bytes). Requests of 0 bytes need no copy and are dropped.
  static CopySchedule build(std::vector<CopyRequest> requests,
                            uint64_t max_step_bytes);

  const std::vector<DeviceCopyQueue>& queues() const { return queues_; }
  uint64_t step_count() const;

  // Issues every step and synchronizes every device that got one. On
  // failure it stops issuing everywhere, waits for what is in flight, and
  // returns the first error, naming the tensors, buffer, device and plugin.
  // Never returns while a plugin may still read a mapping.
  Status execute(uint64_t staging_bytes, uint32_t threads,
                 std::vector<DeviceLoadStats>* stats,
                 const LoadProgress& progress = {}) const;

 private:
  std::vector<CopyRequest> requests_;  // keeps buffers and files alive
  std::vector<DeviceCopyQueue> queues_;
};

}  // namespace devalloc
