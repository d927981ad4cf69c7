// What a load did: per device, per pipeline, in all (LoadReport), and the
// progress callback a load calls. The load's own machinery (the copy
// schedule, the staging ring, the reader) is private to the core
// (core/src/load/).
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/core/device.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace devalloc {

// Bytes a load read from one source file: the data of its pieces (for a
// slice, the slice's bytes alone) and, in LoadReport, the file's header.
struct FileReadStats {
  std::filesystem::path path;
  uint64_t bytes = 0;
};

struct DeviceLoadStats {
  ResolvedDevice device;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t copies = 0;        // copy calls issued to the plugin (staged)
  uint64_t direct_reads = 0;  // pieces read straight into device memory
  double seconds = 0;         // first piece started to synchronize returned
  // Copies whose release came only after the synchronize that covered them
  // returned (PLUGIN-20 forbids it; tolerated within [load]
  // release_timeout), each counted once, and how long the load waited for
  // them (while one loading thread or more waited, not the sum of their
  // waits).
  uint64_t late_releases = 0;
  double late_release_seconds = 0;
};

// What the pipeline did, for tests, the bench and `devalloc load`.
struct PipelineStats {
  uint32_t threads = 0;
  uint64_t staging_slots = 0;  // slots of all rings; fixed during the load
  uint64_t slot_bytes = 0;     // payload of one slot
  bool pinned = false;         // some ring came from the plugin's allocate_host
  uint64_t max_in_flight_bytes = 0;  // most staged bytes issued and not
                                     // yet released at any moment
  uint64_t forced_synchronizes = 0;  // waits that called synchronize
  // As resolved: mmap or pread for auto; direct_io when staged pieces were
  // read with O_DIRECT (direct_io_fallback: not all of them).
  ReadMode read = ReadMode::automatic;
  // read = auto, and the load was large enough to measure both modes: read
  // is the faster of them. False: auto fell back to mmap unmeasured.
  bool read_measured = false;
  bool direct_io_fallback = false;  // O_DIRECT refused; plain pread used
  // Staged pieces that an O_DIRECT block read left off the plugin's source
  // alignment (ABI 1.2, PLUGIN-23) and that were moved within their slot,
  // so that the plugin got aligned sources only.
  uint64_t realigned_pieces = 0;
  // Data bytes read from each file, in the order the load first used them.
  std::vector<FileReadStats> files;
};

// Called from the loading threads of one load with the bytes that load
// issued so far, of its `total`: within the load one call at a time, `done`
// rising from call to call, the last call of a load that issued everything
// with done == total; after each large piece or run of small pieces a
// thread issued, not after every tensor. The promise is per load: one
// callback that several loads share (Runtime::set_progress) is called by
// them at once. An exception out of it stops the load, which fails with a
// status that says so (internal), and no thread of the load calls the
// callback again.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

// What one load_methods call did.
struct LoadReport {
  // One per device this call copied to or allocated on (a device with
  // only scratch buffers: nothing copied), in the order the copies ran.
  std::vector<DeviceLoadStats> devices;
  uint64_t allocations = 0;  // buffers allocated by this call
  uint64_t copies = 0;       // copy calls issued (staged pieces)
  uint64_t direct_reads = 0; // pieces read straight into device memory (host-addressable or mapped)
  uint64_t constants = 0;    // constant tensors copied
  uint64_t bytes = 0;        // constant bytes copied
  double seconds = 0;        // placement to the last synchronize (and verify)
  bool verified = false;
  PipelineStats pipeline;    // how the load pipeline ran
  // Bytes this call read from each source file: its header and the data
  // of its constants (for a rank of a sharded plan, its share).
  std::vector<FileReadStats> files;
};

// What a caller should tell its user about a load that succeeded, one line
// each, without a prefix: for now, a plugin that released copies after the
// synchronize covering them returned (PLUGIN-20, tolerated up to [load]
// release_timeout), which makes a load slow with no error to say why.
// `devalloc load` prints them on stderr; Python raises RuntimeWarning.
std::vector<std::string> load_warnings(const LoadReport& report);

}  // namespace devalloc
