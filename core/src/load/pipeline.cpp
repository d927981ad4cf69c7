#include "pipeline.hpp"

#include "copy_texts.hpp"
#include "staging_ring.hpp"

#include <devalloc/input_text.hpp>

#include "../mapping_guard.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace devalloc::load {

Pipeline::Pipeline(const std::vector<CopyRequest>& requests,
                   const std::vector<DeviceCopyQueue>& queues, const PipelineOptions& options,
                   const LoadProgress& progress)
    : requests_(requests), queues_(queues), options_(options), progress_(progress),
      staged_(std::make_shared<StagedCopies>()) {
  staged_->requests = &requests_;
  staged_->release_timeout = options.release_timeout;
  staged_->sync_after = options.sync_after;
}

Pipeline::~Pipeline() {
  // However run() ended (an exception included). A copy never released
  // may still be running: the buffers it copies into must not be freed
  // under it, nor the plugin's staging it reads; its completion holds the
  // rest until its release comes, or its plugin is closed.
  bool busy = false;
  {
    std::lock_guard lock(staged_->mutex);
    staged_->running = false;
    for (const SlotCopy& c : staged_->copies) {
      if (!c.busy) continue;
      c.step->buffer->keep_allocated();
      busy = true;
    }
  }
  // Every copy was released: the plugin's staging goes back now, from this
  // thread (the last completion may run on the plugin's, which must not
  // call into it, PLUGIN-14), and not under the mutex (a completion may
  // wait for it inside the plugin).
  if (!busy) {
    for (Ring& r : staged_->rings) r.free_slots();
  }
}

Status Pipeline::set_up() {
  read_ = options_.read;
  StagedCopies& staged = *staged_;
  staged.late_releases.resize(queues_.size());
  staged.late_wait.resize(queues_.size());
  staged.late_wait_until.resize(queues_.size());
  std::map<Plugin*, size_t> ring_of;
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    const DeviceCopyQueue& q = queues_[qi];
    staged.devices.push_back(&q.device);
    QueueContext c;
    c.queue = &q;
    const Capabilities& caps = q.device.plugin->capabilities();
    c.direct = options_.direct && (caps.host_addressable || caps.host_mappable);
    c.mapped = c.direct && !caps.host_addressable;
    if (!c.direct) {
      c.synchronize_mark = q.device.plugin->synchronize_failures(q.device.device);
      Plugin* plugin = q.device.plugin.get();
      auto [it, fresh] = ring_of.emplace(plugin, staged.rings.size());
      if (fresh) {
        staged.rings.emplace_back();
        staged.rings.back().plugin = plugin;
      }
      c.ring = it->second;
      staged.rings[c.ring].queues.push_back(qi);
    }
    contexts_.push_back(c);
  }
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    if (!contexts_[qi].mapped) continue;
    if (Status s = mappings_.map(queues_[qi]); !s.ok()) return s;
  }
  if (read_ == ReadMode::direct_io) {
    for (const QueueContext& c : contexts_) {
      if (c.direct) continue;
      for (const CopyStep& s : c.queue->steps) direct_io_.open(s.file);
    }
    direct_io_fallback_ = direct_io_.fell_back();
  }
  // direct_io reads staged pieces only; direct reads use pread.
  chooser_.start(read_ == ReadMode::direct_io ? ReadMode::pread : read_);
  // One budget, shared by the rings.
  // At least one slot of kMinSlotBytes per ring, whatever [load] staging
  // says: pieces are at most one slot, and each costs a copy call, so
  // smaller slots would make millions of calls of a few bytes.
  const uint64_t budget =
      staged.rings.empty()
          ? 0
          : std::max<uint64_t>(kMinSlotBytes, options_.staging_bytes / staged.rings.size());
  for (Ring& ring : staged.rings) {
    if (Status s = make_ring(ring, budget, queues_, &read_, &direct_io_fallback_); !s.ok()) return s;
  }

  std::vector<uint64_t> piece_bytes(queues_.size());
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    piece_bytes[qi] =
        contexts_[qi].direct ? kDirectPieceBytes : staged.rings[contexts_[qi].ring].payload;
  }
  pieces_.emplace(queues_, std::move(piece_bytes));
  total_ = pieces_->total_bytes();
  // A record per slot, never reallocated from here on.
  staged.make_slot_copies();

  // The files, each once (steps of one file mostly follow each other: one
  // comparison per step, a lookup per change of file), and the last thing
  // before the first copy: each is still the version it was when opened,
  // the one whose header gave the offsets (one fstat per file).
  std::set<const MappedFile*> seen;
  const MappedFile* last = nullptr;
  for (const DeviceCopyQueue& q : queues_) {
    for (const CopyStep& s : q.steps) {
      if (s.file == last) continue;
      last = s.file;
      if (seen.insert(s.file).second) files_.push_back(s.file);
    }
  }
  return check_files("since it was opened");
}

Status Pipeline::check_files(std::string_view when) const {
  for (const MappedFile* file : files_) {
    if (Status s = file->check_unchanged(when); !s.ok()) return s;
  }
  return Status();
}

void Pipeline::work() {
  // A loading thread lets no exception out (it would end the process), and
  // the caller's thread none while the others run.
  try {
    work_claims();
  } catch (...) {
    stop_for_exception();
  }
}

void Pipeline::stop_for_exception() noexcept {
  {
    std::lock_guard lock(exception_mutex_);
    if (!exception_) exception_ = std::current_exception();
  }
  stop_ = true;
  // Threads waiting for a slot look at stop_ when woken; the lock orders
  // the store before their check.
  { std::lock_guard lock(staged_->mutex); }
  staged_->changed.notify_all();
}

Status Pipeline::exception_status() {
  std::exception_ptr e;
  {
    std::lock_guard lock(exception_mutex_);
    e = exception_;
  }
  if (!e) return Status();
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_host_memory,
                  "copying: out of host memory on a loading thread; the load stopped");
  } catch (const std::exception& error) {
    return Status(StatusCode::internal, std::string("copying: internal error on a loading "
                                                    "thread: ") +
                                            escaped(error.what()) + "; the load stopped");
  } catch (...) {
    return Status(StatusCode::internal,
                  "copying: internal error on a loading thread; the load stopped");
  }
}

void Pipeline::work_claims() {
  // For the mmap reads (MappedFile::copy_to), once for all of them.
  const detail::SigbusUnblocked sigbus;
  // Pieces issued by this thread, per queue; added to the totals once.
  std::vector<uint64_t> issued(queues_.size(), 0);
  // Bytes this thread read from each file; pieces of one file mostly follow
  // each other: one lookup per change of file.
  std::map<const MappedFile*, uint64_t> read;
  const MappedFile* last_file = nullptr;
  uint64_t* last_count = nullptr;
  const auto add_counts = [&] {
    std::lock_guard lock(stats_mutex_);
    for (size_t qi = 0; qi < queues_.size(); ++qi) {
      (contexts_[qi].direct ? per_device_[qi].direct_reads : per_device_[qi].copies) +=
          issued[qi];
    }
    for (const auto& [file, n] : read) file_bytes_[file] += n;
  };
  std::vector<Piece> claim;
  claim.reserve(PieceSource::kClaimPieces);
  while (!stop_ && pieces_->next_claim(claim)) {
    // Progress is counted once per claim: a shared counter touched for
    // every 64-byte piece costs more than the piece's copy.
    uint64_t claim_bytes = 0;
    for (const Piece& p : claim) {
      if (stop_) break;
      std::call_once(start_once_[p.queue],
                     [&] { started_[p.queue] = std::chrono::steady_clock::now(); });
      Status s = contexts_[p.queue].direct ? direct_piece(p) : staged_piece(p);
      ++issued[p.queue];
      if (s.ok()) {
        if (p.step->file != last_file) {
          last_file = p.step->file;
          last_count = &read[last_file];
        }
        *last_count += p.nbytes;
        claim_bytes += p.nbytes;
        continue;
      }
      if (s.code() == StatusCode::internal && s.message() == "stopped") {
        add_counts();
        return;
      }
      const CopyStep piece = piece_of(*p.step, p.offset, p.nbytes, requests_);
      std::lock_guard lock(staged_->mutex);
      staged_->fail(s.with_context("copying tensor " + tensors_text(piece) + " (" +
                                   range_text(piece) + ") from " +
                                   path_for_message(piece.file->path().string()) + " to " +
                                   queues_[p.queue].device.describe()));
      stop_ = true;
      staged_->changed.notify_all();
    }
    if (claim_bytes == 0 || stop_) continue;
    if (Status reported = report_progress(claim_bytes); !reported.ok()) {
      std::lock_guard lock(staged_->mutex);
      staged_->fail(std::move(reported));
      stop_ = true;
      staged_->changed.notify_all();
    }
  }
  add_counts();
}

Status Pipeline::report_progress(uint64_t nbytes) {
  issued_ += nbytes;
  if (!progress_) return Status();
  // The value is read under the lock: whoever reports last reports every
  // byte added before, so the calls rise and the last says done == total.
  std::lock_guard lock(progress_mutex_);
  // Once the callback threw it is not called again: other threads may have
  // finished a claim and waited for this lock while it ran, or checked
  // stop_ before it threw. Nor once the load stopped for another failure.
  if (progress_threw_ || stop_) return Status();
  const uint64_t done = issued_.load();
  if (done <= reported_) return Status();
  reported_ = done;
  // The caller's code, on a loading thread: what it throws must not end
  // the thread (and the process) but the load.
  std::string what;
  try {
    progress_(done, total_);
    return Status();
  } catch (const std::exception& e) {
    progress_threw_ = true;
    what = std::string(": ") + e.what();
  } catch (...) {
    progress_threw_ = true;
  }
  return Status(StatusCode::internal,
                "the load's progress callback threw an exception" + what + "; the load stopped");
}

// Synchronizes every device, then waits for every release.
void Pipeline::finish() {
  StagedCopies& staged = *staged_;
  // Every loading thread is done writing through the mappings.
  if (Status s = mappings_.unmap_all(); !s.ok()) {
    std::lock_guard lock(staged.mutex);
    staged.fail(std::move(s));
  }
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    const ResolvedDevice& device = queues_[qi].device;
    // Every loading thread has finished: every copy call returned, and
    // this synchronize covers them all.
    Status synced = device.plugin->synchronize(device.device);
    if (!synced.ok()) {
      std::lock_guard lock(staged.mutex);
      staged.fail(synced.with_context("synchronizing " + device.describe()));
    }
    Status released = wait_released(staged, qi);
    std::unique_lock lock(staged.mutex);
    if (!released.ok()) staged.fail_also(released);
    staged.take_breaches();
    const bool copied_ok = staged.failure.ok() && per_device_[qi].copies > 0;
    lock.unlock();
    // The plugin reports a copy that failed asynchronously to the next
    // synchronize of the device (PLUGIN-17), which may have been another
    // caller's (a concurrent load, an allocator): then this load cannot tell
    // whether the failed copy was one of its own, and fails rather than
    // hand out bytes that may be wrong.
    if (copied_ok) {
      const Status other =
          device.plugin->synchronize_failure_since(device.device, contexts_[qi].synchronize_mark);
      if (!other.ok()) {
        std::lock_guard relock(staged.mutex);
        staged.fail(Status(
            StatusCode::device_error,
            "synchronizing " + device.describe() +
                ": while this load's copies were in flight, a synchronize of the device by "
                "another caller failed (" + other.message() +
                "); an asynchronous failure goes to whichever synchronize comes next "
                "(PLUGIN-17), so one of this load's copies may have failed"));
      }
    }
    per_device_[qi].seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_[qi])
            .count();
  }
}

Status Pipeline::run(std::vector<DeviceLoadStats>* stats, PipelineStats* pipeline) {
  per_device_.resize(queues_.size());
  started_.assign(queues_.size(), std::chrono::steady_clock::now());
  start_once_ = std::vector<std::once_flag>(queues_.size());
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    per_device_[qi].device = queues_[qi].device;
    per_device_[qi].tensors = queues_[qi].tensors;
    per_device_[qi].bytes = queues_[qi].bytes;
  }
  Status status = set_up();
  uint32_t threads = 0;
  if (status.ok()) {
    const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
    threads = options_.threads != 0
                  ? options_.threads
                  : std::max<uint32_t>(static_cast<uint32_t>(queues_.size()),
                                       std::min(cores, 4u));
    threads = static_cast<uint32_t>(std::min<uint64_t>(threads, pieces_->piece_count()));
    // A staged piece holds a slot from its read to its release: threads
    // beyond the slots would only wait for one ([load] threads = 1024 with
    // one slot made millions of context switches). Direct reads need none.
    bool any_direct = false;
    for (const QueueContext& c : contexts_) any_direct |= c.direct;
    uint64_t slots = 0;
    for (const Ring& r : staged_->rings) slots += r.slots.size();
    const uint64_t useful = slots + (any_direct ? std::max(cores, 4u) : 0);
    threads = static_cast<uint32_t>(std::min<uint64_t>(threads, std::max<uint64_t>(1, useful)));
    std::vector<std::thread> pool;
    if (threads > 1) {
      try {
        pool.reserve(threads - 1);
        for (uint32_t i = 1; i < threads; ++i) pool.emplace_back([this] { work(); });
      } catch (const std::exception&) {
        // The system would not start another thread (a process or memory
        // limit) or had no memory for it: the threads that started, and
        // this one, do the work.
      }
      threads = static_cast<uint32_t>(pool.size()) + 1;
    }
    work();
    for (auto& t : pool) t.join();
    // Must not throw itself: copies may be in flight until finish().
    const auto fail_for_exception = [this]() noexcept {
      Status failed;
      try {
        failed = exception_status();
      } catch (...) {
        failed = Status(StatusCode::out_of_host_memory, std::string());
      }
      if (!failed.ok()) {
        std::lock_guard lock(staged_->mutex);
        staged_->fail(std::move(failed));
      }
    };
    fail_for_exception();
    try {
      finish();
    } catch (...) {
      // Part of the devices synchronized: a copy still in flight keeps its
      // slot and buffer (~Pipeline).
      stop_for_exception();
      fail_for_exception();
    }
    // Every copy landed and was released: a file written in place during
    // the copies (a piece read before the write, another after, or a
    // header that no longer matches) fails the load here, before success
    // is reported; its buffers are freed with it.
    bool copied = false;
    {
      std::lock_guard lock(staged_->mutex);
      copied = staged_->failure.ok();
    }
    if (copied) {
      if (Status s = check_files("while it was being loaded"); !s.ok()) {
        std::lock_guard lock(staged_->mutex);
        staged_->fail(std::move(s));
      }
    }
  }

  StagedCopies& staged = *staged_;
  if (pipeline != nullptr) {
    std::lock_guard lock(staged.mutex);
    *pipeline = PipelineStats{};
    pipeline->threads = threads;
    for (const Ring& r : staged.rings) {
      pipeline->staging_slots += r.slots.size();
      pipeline->slot_bytes = std::max(pipeline->slot_bytes, r.payload);
      for (const Slot& s : r.slots) pipeline->pinned |= s.from_plugin;
    }
    pipeline->max_in_flight_bytes = staged.max_in_flight;
    pipeline->forced_synchronizes = staged.forced_synchronizes;
    // direct_io when some staged pieces were read with O_DIRECT.
    pipeline->read = read_ == ReadMode::direct_io && direct_io_.any_open() ? ReadMode::direct_io
                                                                          : chooser_.current();
    pipeline->read_measured = chooser_.measured();
    pipeline->direct_io_fallback = direct_io_fallback_;
    pipeline->realigned_pieces = realigned_pieces_;
    std::lock_guard stats_lock(stats_mutex_);
    for (const MappedFile* file : files_) {
      const auto n = file_bytes_.find(file);
      pipeline->files.push_back(
          FileReadStats{file->path(), n == file_bytes_.end() ? 0 : n->second});
    }
  }
  if (stats != nullptr) {
    {
      std::lock_guard lock(staged.mutex);
      for (size_t qi = 0; qi < per_device_.size() && qi < staged.late_releases.size(); ++qi) {
        per_device_[qi].late_releases = staged.late_releases[qi];
        per_device_[qi].late_release_seconds =
            std::chrono::duration<double>(staged.late_wait[qi]).count();
      }
    }
    *stats = per_device_;
  }
  // The slots are freed with staged_: by ~Pipeline, or by the completion
  // of the last copy still in flight.
  if (!status.ok()) return status;
  std::lock_guard lock(staged.mutex);
  return staged.failure;
}

}  // namespace devalloc::load
