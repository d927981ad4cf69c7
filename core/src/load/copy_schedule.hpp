// The copy schedule: what is read, copied and in which order, on which
// thread. One place of its own, so that the streaming strategy can change
// without touching placement or allocation.
//
// The strategy (docs/performance.md has the measurements behind it):
// - Contiguous ranges (same file, same buffer, adjacent on both sides) are
//   coalesced into one range, then cut into pieces of at most one staging
//   slot (or 8 MiB for direct reads).
// - A pool of loading threads takes the pieces of every device interleaved,
//   so devices load in parallel.
// - A device whose plugin says its memory is host-addressable (ABI 1.1), or
//   maps it into the host (ABI 1.2 HOST_MAPPABLE: each buffer's span is
//   mapped for the load and unmapped before the device is synchronized),
//   is read into directly: no staging, no copy call ([load] direct).
// - Staged pieces honour the plugin's DMA constraints (ABI 1.2): at most
//   copy_max_bytes, a multiple of copy_preferred_bytes, and sources on
//   copy_src_alignment.
// - Otherwise a piece is read (memcpy from the mapping, pread, or O_DIRECT
//   pread; [load] read) into a slot of a fixed ring of staging buffers,
//   taken from the plugin's allocate_host when it offers HOST_STAGING, and
//   goes out as a DEVALLOC_SRC_UNTIL_RELEASED copy; the slot comes back to
//   the ring on release. Reading and copying overlap, and the bytes in
//   flight never exceed the ring, which fits in [load] staging whatever the
//   model size.
// - Forward progress (PLUGIN-20): a thread that waits for a slot and sees no
//   release for a short while calls synchronize on the devices holding the
//   ring's slots.
// - Release accounting (PLUGIN-21): a second release of one copy, or a
//   release still missing [load] release_timeout after synchronize
//   returned, ends the load with an error naming the plugin, the rule and
//   the copy. The slots of a copy that was never released are kept
//   (deliberately leaked), never freed under a plugin that may still read
//   them.
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/load_report.hpp>
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/status.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace devalloc {

// One constant to place: nbytes of file at file_offset go to
// buffer->address() + buffer_offset. A slice along a later dimension of its
// source (PlanSlice) is strided: its nbytes are runs of run_bytes, each
// file_stride bytes after the one before in the file, gathered contiguous
// on the device (run_bytes 0: one contiguous range).
struct CopyRequest {
  std::shared_ptr<DeviceBuffer> buffer;
  uint64_t buffer_offset = 0;
  std::shared_ptr<const MappedFile> file;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
  // Named in errors. Points into the caller's plan, which outlives the
  // schedule built from the request.
  std::string_view tensor;
  uint64_t run_bytes = 0;
  uint64_t file_stride = 0;
};

// One coalesced range (or a piece of it); points into the schedule's own
// requests. A strided request is a step of its own, never coalesced.
struct CopyStep {
  DeviceBuffer* buffer = nullptr;
  uint64_t buffer_offset = 0;
  const MappedFile* file = nullptr;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
  std::string_view first_tensor;  // the tensors it covers, for errors
  std::string_view last_tensor;
  uint64_t run_bytes = 0;  // as CopyRequest's
  uint64_t file_stride = 0;
};

// Calls fn(file_position, at, length) for the file ranges that hold bytes
// [from, from + n) of a request or step `r` (at: from `from`), in order.
template <class Ranged, class Fn>
void for_each_run(const Ranged& r, uint64_t from, uint64_t n, Fn&& fn) {
  if (r.run_bytes == 0) {
    fn(r.file_offset + from, uint64_t{0}, n);
    return;
  }
  for (uint64_t done = 0; done < n;) {
    const uint64_t at = from + done;
    const uint64_t row = at / r.run_bytes;
    const uint64_t column = at % r.run_bytes;
    const uint64_t length = std::min(r.run_bytes - column, n - done);
    fn(r.file_offset + row * r.file_stride + column, done, length);
    done += length;
  }
}

struct DeviceCopyQueue {
  ResolvedDevice device;
  std::vector<CopyStep> steps;  // coalesced ranges in file order
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

struct PipelineOptions {
  uint64_t staging_bytes = uint64_t{64} << 20;
  uint32_t threads = 0;  // 0: max(devices, min(cores, 4))
  std::chrono::milliseconds release_timeout{5000};
  // A wait for a slot that sees no release this long calls synchronize.
  std::chrono::milliseconds sync_after{15};
  ReadMode read = ReadMode::automatic;
  bool direct = true;

  static PipelineOptions from(const LoadOptions& load);
};

class CopySchedule {
 public:
  // Groups requests by device and coalesces them. Requests of 0 bytes need
  // no copy and are dropped.
  static CopySchedule build(std::vector<CopyRequest> requests);

  const std::vector<DeviceCopyQueue>& queues() const { return queues_; }
  // The requests as given, 0-byte ones included.
  const std::vector<CopyRequest>& requests() const { return requests_; }
  uint64_t range_count() const;

  // Reads and copies every range and synchronizes every device that got
  // one. On failure it stops everywhere, waits for what is in flight, and
  // returns the first error, naming the tensors, buffer, device and plugin.
  // Never returns while a plugin may still read memory that is then freed.
  Status execute(const PipelineOptions& options,
                 std::vector<DeviceLoadStats>* stats,
                 PipelineStats* pipeline = nullptr,
                 const LoadProgress& progress = {}) const;

 private:
  std::vector<CopyRequest> requests_;  // keeps buffers and files alive
  std::vector<DeviceCopyQueue> queues_;
};

}  // namespace devalloc
