// The load pipeline: a pool of loading threads takes claims of pieces,
// reads each (into a staging slot, or straight into device memory) and
// issues its copy; then every device is synchronized and every release
// waited for. One Pipeline runs one CopySchedule::execute.
#pragma once

#include "buffer_mappings.hpp"
#include "copy_schedule.hpp"
#include "file_reader.hpp"
#include "piece_list.hpp"
#include "staged_copies.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace devalloc::load {

struct QueueContext {
  const DeviceCopyQueue* queue = nullptr;
  // Read straight into device memory: at its address (HOST_ADDRESSABLE) or
  // through a mapping of the buffer (HOST_MAPPABLE, `mapped`).
  bool direct = false;
  bool mapped = false;
  size_t ring = 0;
  // Plugin::synchronize_failures of the device before the first copy: a
  // failure reported to another caller's synchronize meanwhile may have
  // been one of this load's copies (finish()).
  uint64_t synchronize_mark = 0;
};

class Pipeline {
 public:
  Pipeline(const std::vector<CopyRequest>& requests, const std::vector<DeviceCopyQueue>& queues,
           const PipelineOptions& options, const LoadProgress& progress);
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  // Lets go of the staged copies' state (freed now, or by the completion of
  // the last copy still in flight) and keeps the buffers such a copy writes
  // allocated; ends the mappings left.
  ~Pipeline();

  Status run(std::vector<DeviceLoadStats>* stats, PipelineStats* pipeline);

 private:
  Status set_up();
  void work();
  Status direct_piece(const Piece& p);
  Status staged_piece(const Piece& p);
  void work_claims();
  void finish();
  // Each file of the load still the version it was when opened
  // (MappedFile::check_unchanged), `when` saying since when.
  Status check_files(std::string_view when) const;
  // Adds nbytes to the bytes issued and tells the progress callback; an
  // exception out of the callback comes back as a failure.
  Status report_progress(uint64_t nbytes);
  // An exception out of a loading thread's work (an allocation that
  // failed): kept, and the load stops; run() turns it into the failure.
  void stop_for_exception() noexcept;
  Status exception_status();

  const std::vector<CopyRequest>& requests_;
  const std::vector<DeviceCopyQueue>& queues_;
  const PipelineOptions& options_;
  const LoadProgress& progress_;
  std::shared_ptr<StagedCopies> staged_;
  std::vector<QueueContext> contexts_;
  BufferMappings mappings_;
  std::vector<const MappedFile*> files_;  // the steps' files, each once
  std::optional<PieceSource> pieces_;  // made by set_up
  std::vector<DeviceLoadStats> per_device_;
  std::vector<std::chrono::steady_clock::time_point> started_;
  std::vector<std::once_flag> start_once_;
  DirectIoFiles direct_io_;
  // Pieces whose O_DIRECT read left them off the plugin's source alignment,
  // moved to the slot's start before the copy (PLUGIN-23).
  std::atomic<uint64_t> realigned_pieces_{0};
  ReadMode read_ = ReadMode::mmap;  // as configured (automatic resolved by chooser_)
  ReadChooser chooser_;
  bool direct_io_fallback_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> issued_{0};
  // Progress calls, one at a time and never going back: threads add their
  // bytes in one order and would call in another.
  std::mutex progress_mutex_;
  uint64_t reported_ = 0;  // under progress_mutex_
  bool progress_threw_ = false;  // under progress_mutex_: never called again
  uint64_t total_ = 0;
  std::mutex stats_mutex_;
  std::map<const MappedFile*, uint64_t> file_bytes_;  // under stats_mutex_
  std::mutex exception_mutex_;
  std::exception_ptr exception_;  // the first, under exception_mutex_
};

}  // namespace devalloc::load
