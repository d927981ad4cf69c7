#include <devalloc/core/copy_schedule.hpp>

#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "address_text.hpp"
#include "mapping_guard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

namespace devalloc {

namespace {

constexpr uint64_t kMaxSlotBytes = uint64_t{8} << 20;
constexpr uint64_t kMinSlotBytes = uint64_t{4} << 10;
constexpr uint64_t kDirectPieceBytes = uint64_t{8} << 20;
// O_DIRECT wants offsets, sizes and addresses aligned to the block size;
// 4 KiB covers the file systems in use.
constexpr uint64_t kDirectIoAlign = 4096;

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// The most source alignment honoured (PLUGIN-23 makes it a preference): a
// plugin's 1 GiB would put a gigabyte of slack into every slot.
constexpr uint64_t kMaxSourceAlignment = uint64_t{64} << 10;

// The alignment copy sources of a plugin need (ABI 1.2, PLUGIN-23): 1 when
// it states none, or more than kMaxSourceAlignment.
uint64_t source_alignment(const Capabilities& caps) {
  const uint64_t a = caps.copy_src_alignment;
  return a == 0 || a > kMaxSourceAlignment ? 1 : a;
}

std::string tensors_text(const CopyStep& s) {
  if (s.first_tensor == s.last_tensor) return quote(s.first_tensor);
  return quote(s.first_tensor) + " .. " + quote(s.last_tensor);
}

std::string range_text(const CopyStep& s) {
  return "bytes " + std::to_string(s.buffer_offset) + ".." +
         std::to_string(s.buffer_offset + s.nbytes) + " of buffer " +
         std::to_string(s.buffer->memory_id());
}

// Bytes [offset, offset + nbytes) of step s as a step of their own, named
// by the tensors of `requests` that hold them (a step of many small
// tensors is cut into pieces; an error names the piece's tensors, not the
// whole run). Only for error texts: it scans every request.
CopyStep piece_of(const CopyStep& s, uint64_t offset, uint64_t nbytes,
                  const std::vector<CopyRequest>& requests) {
  CopyStep piece = s;
  piece.buffer_offset += offset;
  piece.file_offset += offset;
  piece.nbytes = nbytes;
  const uint64_t begin = piece.file_offset;
  const uint64_t end = begin + std::max<uint64_t>(nbytes, 1);
  const CopyRequest* first = nullptr;
  const CopyRequest* last = nullptr;
  for (const CopyRequest& r : requests) {
    if (r.file.get() != s.file || r.buffer.get() != s.buffer || r.nbytes == 0 ||
        r.file_offset >= end || r.file_offset + r.nbytes <= begin) {
      continue;
    }
    if (first == nullptr || r.file_offset < first->file_offset) first = &r;
    if (last == nullptr || r.file_offset > last->file_offset) last = &r;
  }
  if (first != nullptr) {
    piece.first_tensor = first->tensor;
    piece.last_tensor = last->tensor;
  }
  return piece;
}

std::string copy_text(const CopyStep& s, const ResolvedDevice& device) {
  return "copy of tensor " + tensors_text(s) + " (" + range_text(s) + ") to " +
         device.describe();
}

std::string errno_text(int error) { return std::system_category().message(error); }

// Reads n bytes at offset of fd into dst; pread may return less than asked.
Status pread_all(int fd, void* dst, uint64_t n, uint64_t offset,
                 const MappedFile& file, uint64_t* got = nullptr) {
  auto* out = static_cast<std::byte*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(n - done),
                              static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return Status(StatusCode::invalid_argument,
                    path_for_message(file.path().string()) + ": cannot read " + std::to_string(n) +
                        " bytes at offset " + std::to_string(offset) + ": " +
                        errno_text(errno));
    }
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
  }
  if (got != nullptr) {
    *got = done;
    return Status();
  }
  if (done < n) {
    return Status(StatusCode::invalid_argument,
                  path_for_message(file.path().string()) + ": ends before offset " +
                      std::to_string(offset + n) + " (was it truncated?)");
  }
  return Status();
}

// PLUGIN-18: staging memory from a plugin's allocate_host is the host's
// until it calls free_host. A plugin that hands out memory it gave before
// and the host still holds (a pool that reuses a buffer in use) would have
// the host read a piece over another one a copy still reads: wrong bytes on
// the device, silently. Every load checks each staging buffer against
// those held, process-wide: loads run side by side, and instances of one
// library may share a pool.
struct HeldStaging {
  uintptr_t end = 0;
  std::string plugin;                  // its name, for the message
  std::weak_ptr<const Plugin> owner;  // the instance that gave it
};
std::mutex g_staging_mutex;
std::map<uintptr_t, HeldStaging>& held_staging() {  // by start
  static auto* held = new std::map<uintptr_t, HeldStaging>();
  return *held;
}

// Records [at, at + nbytes) as held, or says which held buffer it overlaps
// ("" when none, and recorded). Throws (an allocation) with nothing
// recorded.
std::string hold_staging(const void* at, uint64_t nbytes, const std::shared_ptr<Plugin>& plugin) {
  const auto begin = reinterpret_cast<uintptr_t>(at);
  // A range that would run past the address space overlaps what is at its
  // start: it is clamped, never wrapped.
  const uintptr_t end = nbytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + nbytes;
  std::lock_guard lock(g_staging_mutex);
  auto& held = held_staging();
  for (;;) {
    // Sorted by start: if any held buffer overlaps, the first one starting
    // at or after begin does, or the one before it.
    auto next = held.lower_bound(begin);
    auto overlapping = held.end();
    if (next != held.end() && next->first < end) {
      overlapping = next;
    } else if (next != held.begin() && std::prev(next)->second.end > begin) {
      overlapping = std::prev(next);
    }
    if (overlapping == held.end()) break;
    // The staging kept by a load that a plugin's breach ended (never freed
    // by the host) was freed by its instance's destroy (PLUGIN-9), once
    // the instance was dropped: no longer held, and free to come again.
    if (overlapping->second.owner.expired()) {
      held.erase(overlapping);
      continue;
    }
    return detail::address_range(overlapping->first, overlapping->second.end) +
           ", which plugin " + overlapping->second.plugin + " gave";
  }
  held.emplace(begin, HeldStaging{end, plugin->name(), plugin});
  return std::string();
}

void let_go_of_staging(const void* at) {
  std::lock_guard lock(g_staging_mutex);
  held_staging().erase(reinterpret_cast<uintptr_t>(at));
}

// One slot of a staging ring.
struct Slot {
  std::byte* memory = nullptr;      // capacity bytes; aligned for O_DIRECT
  std::byte* allocation = nullptr;  // what to free (memory, or a little before)
  uint64_t capacity = 0;
  bool from_plugin = false;
};

// A fixed set of staging buffers for the devices of one plugin.
struct Ring {
  Plugin* plugin = nullptr;  // not owned: a leaked ring never calls it
  uint64_t payload = 0;      // bytes of file a slot carries
  std::vector<Slot> slots;
  std::vector<size_t> free;  // indices into slots
  std::vector<size_t> queues;  // the device queues it serves

  // Frees the slots; only once nothing may read them. A ring that is never
  // freed (its ledger abandoned) keeps its staging held.
  void free_slots() {
    for (Slot& s : slots) {
      if (s.from_plugin) {
        // Let go of first: the plugin may hand the buffer out again as soon
        // as free_host frees it, to another load.
        let_go_of_staging(s.allocation);
        (void)plugin->free_host(s.allocation);
      } else {
        std::free(s.allocation);
      }
    }
    slots.clear();
  }
};

// A copy issued from a slot, until its release. Lives in the ledger's
// ticket array; the plugin gets its address as user_data.
struct Ticket {
  uint64_t id = 0;
  size_t queue = 0;
  size_t ring = 0;
  size_t slot = 0;
  uint64_t nbytes = 0;
  const CopyStep* step = nullptr;  // the range the piece belongs to
  uint64_t offset = 0;             // of the piece in the step
  bool released = false;           // under the ledger's mutex
  bool copy_failed = false;        // its copy call returned an error
  bool released_twice = false;     // said once
  bool in_call = true;             // its copy call has not returned yet
  // Unreleased when a synchronize that covered it returned: its release is
  // late (PLUGIN-20), and counted when it comes.
  bool late = false;
  uint64_t returned = 0;           // Ledger::calls_returned when it did
  // A breach of this copy during its call: said after the call's own error
  // when the call fails (PLUGIN-21), else as soon as the call returns.
  std::string breach_in_call;
};

// The release accounting of one execute(): slots, tickets, and the first
// failure. Shared with the plugins through the tickets; leaked, never
// freed, when a release may still come (see abandon()).
struct Ledger {
  ~Ledger();

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Ring> rings;
  // Reserved once, for every piece, before the first copy: a ticket's
  // address never moves, and a release's user_data can be checked against
  // the array (holds) instead of being followed blindly.
  std::vector<Ticket> tickets;
  const std::vector<CopyRequest>* requests = nullptr;  // the schedule's, for texts
  bool running = false;  // between register_ledger and the end of run()
  std::vector<std::set<uint64_t>> unreleased;  // per queue: ticket ids
  // Per queue: releases that came after the synchronize covering them
  // returned, and the time spent waiting for them: while at least one
  // thread waited (several may wait for the same copies at once).
  std::vector<uint64_t> late_releases;
  std::vector<std::chrono::steady_clock::duration> late_wait;
  std::vector<uint32_t> late_waiters;
  std::vector<std::chrono::steady_clock::time_point> late_wait_since;
  std::vector<const ResolvedDevice*> devices;  // per queue
  uint64_t releases_seen = 0;
  uint64_t calls_returned = 0;  // copy calls that returned, counted in order
  uint64_t in_flight = 0;
  uint64_t max_in_flight = 0;
  uint64_t forced_synchronizes = 0;
  Status failure;  // the first one; stops every thread
  bool breach = false;  // a release rule was broken: never free the ledger
  // A release did not come within release_timeout: the other queues' waits
  // end at once instead of each taking the timeout again. Other breaches
  // (a release twice, a stray one) do not end the waits: the copies still
  // in flight are waited for, so their buffers are not freed before.
  bool gave_up = false;

  void fail(Status s) {
    if (failure.ok()) failure = std::move(s);
  }
  // A broken release rule found after the load failed already: both are
  // said, the first failure first.
  void fail_also(const Status& s) {
    if (failure.ok()) {
      failure = s;
    } else {
      failure = Status(failure.code(), failure.message() + "; then " + s.message());
    }
  }

  // True when user_data is the address of one of the ticket slots.
  bool holds(const void* user_data) const {
    const auto at = reinterpret_cast<uintptr_t>(user_data);
    const auto base = reinterpret_cast<uintptr_t>(tickets.data());
    return at >= base && at - base < tickets.capacity() * sizeof(Ticket) &&
           (at - base) % sizeof(Ticket) == 0;
  }

  // "copy of tensor "a" .. "b" (bytes 0..4096 of buffer 3) to host:0 (...)"
  std::string copy_of(const Ticket& t) const {
    return copy_text(piece_of(*t.step, t.offset, t.nbytes, *requests), *devices[t.queue]);
  }
  std::string plugin_of(const Ticket& t) const {
    return devices[t.queue]->plugin->name();
  }
  // "plugin a" or "plugins a, b": those this load hands until-released
  // copies to (the staged queues; a direct read gets no release).
  std::string plugins() const {
    std::set<std::string> names;
    for (const Ring& r : rings) {
      for (size_t qi : r.queues) names.insert(devices[qi]->plugin->name());
    }
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
    return (names.size() == 1 ? "plugin " : "plugins ") + text;
  }
};

// The ledgers a release may be for: each load's while it runs, and the
// abandoned ones for ever. on_piece_released looks its user_data up here,
// with g_ledgers_mutex held throughout (then a ledger's mutex; never the
// other way round), so a made-up user_data, or a release that comes after
// its load ended and its ledger was freed, is never followed.
std::mutex g_ledgers_mutex;
std::vector<Ledger*>& registered_ledgers() {
  static auto* list = new std::vector<Ledger*>();
  return *list;
}

void register_ledger(Ledger& ledger) {
  std::lock_guard lock(g_ledgers_mutex);
  ledger.running = true;
  registered_ledgers().push_back(&ledger);
}

Ledger::~Ledger() {
  std::lock_guard lock(g_ledgers_mutex);
  auto& list = registered_ledgers();
  list.erase(std::remove(list.begin(), list.end(), this), list.end());
}

// A ledger whose plugin broke the release rules is never freed: a late
// release writes into memory that is still ours, and no slot is freed
// under a copy that may still read it. It stays in registered_ledgers()
// (it was registered before any copy), which keeps it reachable and found
// by later releases.
void abandon(std::unique_ptr<Ledger> ledger) { static_cast<void>(ledger.release()); }

// read = auto: mmap or pread, whichever reads faster on this machine, as
// measured on the load's own first pieces. Until each mode has read
// kSamples pieces of at least kMinBytes, such pieces alternate between the
// two (smaller ones use mmap); then the mode with more bytes per second
// serves the rest of the load. Both read the same page cache into the same
// kind of destination, so the figures compare like with like.
class ReadChooser {
 public:
  static constexpr uint64_t kMinBytes = uint64_t{1} << 20;
  static constexpr int kSamples = 2;

  // A fixed mode (anything but automatic), or automatic to measure.
  void start(ReadMode mode) {
    probing_ = mode == ReadMode::automatic;
    mode_ = probing_ ? ReadMode::mmap : mode;
  }
  ReadMode current() const { return mode_.load(); }
  // True once automatic chose by measurement.
  bool measured() const { return measured_.load(); }

  // The mode for a piece of nbytes; *timed says to report it to record().
  ReadMode pick(uint64_t nbytes, bool* timed) {
    *timed = false;
    if (!probing_ || nbytes < kMinBytes) return mode_;
    std::lock_guard lock(mutex_);
    if (!probing_) return mode_;
    const int i = turn_++ % 2;
    if (taken_[i] >= kSamples) return mode_;
    ++taken_[i];
    *timed = true;
    return kModes[i];
  }

  void record(ReadMode mode, uint64_t nbytes, double seconds) {
    std::lock_guard lock(mutex_);
    const int i = mode == kModes[0] ? 0 : 1;
    bytes_[i] += nbytes;
    seconds_[i] += seconds;
    ++done_[i];
    if (done_[0] >= kSamples && done_[1] >= kSamples) {
      // bytes / seconds, compared without dividing by a zero time.
      mode_ = bytes_[0] * seconds_[1] >= bytes_[1] * seconds_[0] ? kModes[0] : kModes[1];
      probing_ = false;
      measured_ = true;
    }
  }

 private:
  static constexpr ReadMode kModes[2] = {ReadMode::mmap, ReadMode::pread};
  std::mutex mutex_;
  std::atomic<bool> probing_{false};
  std::atomic<bool> measured_{false};
  std::atomic<ReadMode> mode_{ReadMode::mmap};
  uint64_t turn_ = 0;
  int taken_[2] = {0, 0};
  int done_[2] = {0, 0};
  double bytes_[2] = {0, 0};
  double seconds_[2] = {0, 0};
};

// Reads nbytes at offset of a step's file into dst, with mmap (memcpy from
// the mapping) or pread, timing it for the chooser when it asks.
Status read_piece(ReadChooser& chooser, const MappedFile& file, std::byte* dst,
                  uint64_t offset, uint64_t nbytes);

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

Status read_piece(ReadChooser& chooser, const MappedFile& file, std::byte* dst,
                  uint64_t offset, uint64_t nbytes) {
  bool timed = false;
  const ReadMode mode = chooser.pick(nbytes, &timed);
  const auto start = timed ? std::chrono::steady_clock::now()
                           : std::chrono::steady_clock::time_point{};
  Status read;
  if (mode == ReadMode::mmap) {
    // Guarded: another program may truncate the file under the mapping.
    read = file.copy_to(offset, nbytes, dst);
  } else {
    read = pread_all(file.fd(), dst, nbytes, offset, file);
  }
  if (timed && read.ok()) {
    chooser.record(mode, nbytes,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                       .count());
  }
  return read;
}

extern "C" void on_piece_released(void* user_data);

class Pipeline {
 public:
  Pipeline(const std::vector<CopyRequest>& requests, const std::vector<DeviceCopyQueue>& queues,
           const PipelineOptions& options, const LoadProgress& progress)
      : requests_(requests), queues_(queues), options_(options), progress_(progress),
        ledger_(std::make_unique<Ledger>()) {
    ledger_->requests = &requests_;
  }

  ~Pipeline() {
    if (ledger_ != nullptr) {
      // However run() ended (an exception included): a ledger that a
      // release may still reach (a breach: a release may still come, and a
      // copy may still read its slot) is kept, never freed; otherwise its
      // slots are freed.
      {
        std::lock_guard lock(g_ledgers_mutex);
        ledger_->running = false;
      }
      if (ledger_->breach) {
        // A copy never released may still be running: the buffers it
        // copies into must not be freed under it either.
        {
          std::lock_guard lock(ledger_->mutex);
          for (const std::set<uint64_t>& ids : ledger_->unreleased) {
            for (uint64_t id : ids) ledger_->tickets[id].step->buffer->keep_allocated();
          }
        }
        abandon(std::move(ledger_));
      } else {
        for (Ring& r : ledger_->rings) r.free_slots();
      }
    }
    try {
      (void)unmap_buffers();
    } catch (...) {
      // Out of memory for a message: the mapping it was ending was taken
      // out first, so none is ended twice.
    }
    for (int fd : direct_fds_) ::close(fd);
  }

  Status run(std::vector<DeviceLoadStats>* stats, PipelineStats* pipeline);

 private:
  struct Piece {
    size_t queue;
    const CopyStep* step;
    uint64_t offset;  // into the step
    uint64_t nbytes;
  };

  Status set_up();
  // Maps the span of each buffer that a mapped queue's steps cover
  // (PLUGIN-22); unmap_buffers ends every mapping made, once, and returns
  // the first failure: until it returned, the writes need not be on the
  // device.
  Status map_buffers();
  Status unmap_buffers();
  Status make_ring(Ring& ring, uint64_t budget);
  void open_direct_io();
  void work();
  Status direct_piece(const Piece& p);
  Status staged_piece(const Piece& p);
  Result<size_t> take_slot(size_t ring);
  Status force_progress(std::unique_lock<std::mutex>& lock, size_t ring);
  Status wait_released(std::unique_lock<std::mutex>& lock, size_t queue, uint64_t covered,
                       uint64_t up_to_id);
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
  std::unique_ptr<Ledger> ledger_;
  std::vector<QueueContext> contexts_;
  std::vector<const MappedFile*> files_;  // the steps' files, each once
  std::vector<Piece> pieces_;
  // Claim c is pieces_[claims_[c], claims_[c + 1]); next_ counts claims.
  std::vector<size_t> claims_;
  static constexpr uint64_t kClaimBytes = uint64_t{64} << 10;
  static constexpr size_t kClaimPieces = 1024;
  std::vector<DeviceLoadStats> per_device_;
  std::vector<std::chrono::steady_clock::time_point> started_;
  std::vector<std::once_flag> start_once_;
  std::map<const MappedFile*, int> direct_io_fd_;
  std::vector<int> direct_fds_;
  struct Mapping {
    const ResolvedDevice* device = nullptr;
    const DeviceBuffer* buffer = nullptr;
    uint64_t offset = 0;  // of the span in the buffer
    uint64_t nbytes = 0;
    std::byte* host = nullptr;
  };
  std::vector<Mapping> mappings_;
  std::map<const DeviceBuffer*, size_t> mapping_of_;  // index into mappings_
  // Pieces whose O_DIRECT read left them off the plugin's source alignment,
  // moved to the slot's start before the copy (PLUGIN-23).
  std::atomic<uint64_t> realigned_pieces_{0};
  ReadMode read_ = ReadMode::mmap;  // as configured (automatic resolved by chooser_)
  ReadChooser chooser_;
  bool direct_io_fallback_ = false;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> issued_{0};
  // Progress calls, one at a time and never going back: threads add their
  // bytes in one order and would call in another.
  std::mutex progress_mutex_;
  uint64_t reported_ = 0;  // under progress_mutex_
  bool progress_threw_ = false;  // under progress_mutex_: never called again
  uint64_t total_ = 0;
  std::mutex stats_mutex_;
  std::mutex exception_mutex_;
  std::exception_ptr exception_;  // the first, under exception_mutex_
};

// A release whose user_data is no ticket of any ledger (PLUGIN-14): made
// up, or for a load that ended. While exactly one load runs it is the
// likely recipient, and fails; otherwise the release is dropped (a copy it
// should have released is then missing, and PLUGIN-21 ends that load).
// g_ledgers_mutex held.
void stray_release(const void* user_data) {
  Ledger* running = nullptr;
  int count = 0;
  for (Ledger* l : registered_ledgers()) {
    if (l->running) {
      running = l;
      ++count;
    }
  }
  if (count != 1) return;
  {
    std::lock_guard lock(running->mutex);
    running->breach = true;
    char address[32];
    std::snprintf(address, sizeof address, "%p", user_data);
    // The callback went only to plugins of loads: this one's, or an
    // earlier one's that releases after its load ended.
    const std::string who = running->rings.empty()
                                ? std::string("a plugin of an earlier load")
                                : running->plugins() + " (or a plugin of an earlier load)";
    running->fail(Status(StatusCode::device_error,
                         who + " broke PLUGIN-14 (PLUGIN-21 release accounting): on_release "
                               "came with user_data " +
                             address + ", which no copy of this load was given"));
  }
  running->changed.notify_all();
}

extern "C" void on_piece_released(void* user_data) {
  std::lock_guard registry(g_ledgers_mutex);
  Ledger* found = nullptr;
  for (Ledger* l : registered_ledgers()) {
    if (l->holds(user_data)) {
      found = l;
      break;
    }
  }
  if (found == nullptr) {
    stray_release(user_data);
    return;
  }
  Ledger& ledger = *found;
  {
    std::lock_guard lock(ledger.mutex);
    const size_t index = (reinterpret_cast<uintptr_t>(user_data) -
                          reinterpret_cast<uintptr_t>(ledger.tickets.data())) /
                         sizeof(Ticket);
    // Texts name the schedule's steps and devices: only while the load
    // runs (an abandoned ledger outlives its schedule).
    if (index >= ledger.tickets.size()) {
      // A slot no copy was issued from yet.
      ledger.breach = true;
      if (ledger.running) {
        ledger.fail(Status(StatusCode::device_error,
                           ledger.plugins() +
                               " broke PLUGIN-14 (PLUGIN-21 release accounting): on_release "
                               "came for a copy that was never issued"));
      }
      ledger.changed.notify_all();
      return;
    }
    Ticket* t = &ledger.tickets[index];
    if (t->released) {
      // The first release gave the slot back already; giving it again would
      // corrupt the ring. The load ends instead.
      ledger.breach = true;
      // After the copy's own error when it failed (PLUGIN-21), once.
      if (ledger.running && !t->released_twice) {
        std::string breach = "plugin " + ledger.plugin_of(*t) +
                             " broke PLUGIN-14 (PLUGIN-21 release accounting): " +
                             ledger.copy_of(*t) + " was released twice";
        if (t->in_call) {
          t->breach_in_call = std::move(breach);
        } else {
          ledger.fail_also(Status(StatusCode::device_error, breach));
        }
      }
      t->released_twice = true;
    } else {
      t->released = true;
      if (t->late) ++ledger.late_releases[t->queue];
      ledger.unreleased[t->queue].erase(t->id);
      ledger.in_flight -= t->nbytes;
      ledger.rings[t->ring].free.push_back(t->slot);
      ++ledger.releases_seen;
    }
  }
  ledger.changed.notify_all();
}

Status Pipeline::make_ring(Ring& ring, uint64_t budget) {
  // What the ring's queues stage: no slot is larger than the largest step
  // needs, and there are no more slots than pieces, so a budget far above
  // the model ("1TiB") costs what the model needs, not the budget.
  uint64_t largest_step = 0;
  for (size_t qi : ring.queues) {
    for (const CopyStep& s : queues_[qi].steps) largest_step = std::max(largest_step, s.nbytes);
  }
  // Four slots or more, so that reading and copying overlap, of 4 KiB to
  // 8 MiB (a size pread and the copy engines run at full speed with).
  uint64_t payload =
      std::min({budget, std::clamp(budget / 4, kMinSlotBytes, kMaxSlotBytes),
                std::max(kMinSlotBytes, round_up(largest_step, kMinSlotBytes))});
  // The plugin's DMA constraints (ABI 1.2, PLUGIN-23): no piece larger than
  // one transfer, pieces a multiple of the preferred transfer and of the
  // source alignment, so that every piece of a step starts aligned.
  const Capabilities& caps = ring.plugin->capabilities();
  const uint64_t alignment = source_alignment(caps);
  // A largest transfer below one slot's minimum is not honoured: the plugin
  // splits larger copies itself, and smaller pieces would make the
  // bookkeeping outgrow the model.
  if (caps.copy_max_bytes != 0) {
    payload = std::min(payload, std::max(caps.copy_max_bytes, kMinSlotBytes));
  }
  if (caps.copy_preferred_bytes != 0 && payload >= caps.copy_preferred_bytes) {
    payload -= payload % caps.copy_preferred_bytes;
  }
  if (payload >= alignment) payload -= payload % alignment;
  uint64_t pieces = 0;
  for (size_t qi : ring.queues) {
    for (const CopyStep& s : queues_[qi].steps) pieces += (s.nbytes + payload - 1) / payload;
  }
  const bool pinned = ring.plugin->capabilities().host_staging;
  uint64_t capacity = payload;
  // Pinned memory from allocate_host has no alignment the ABI promises, and
  // O_DIRECT reads into it must start on a block: a slot of it is taken
  // from a block's length more and starts at the first aligned byte.
  // A slot starts on the plugin's source alignment too.
  uint64_t slot_alignment = alignment;
  uint64_t slack = pinned && alignment > 1 ? alignment : 0;
  if (read_ == ReadMode::direct_io) {
    // Room to read whole aligned blocks around any range.
    capacity = round_up(payload, kDirectIoAlign) + 2 * kDirectIoAlign;
    slot_alignment = std::max(alignment, kDirectIoAlign);
    slack = pinned ? slot_alignment : 0;
    if (capacity + slack > budget) {
      read_ = ReadMode::pread;
      direct_io_fallback_ = true;
      capacity = payload;
      slot_alignment = alignment;
      slack = pinned && alignment > 1 ? alignment : 0;
    }
  }
  const uint64_t count = std::max<uint64_t>(1, std::min(budget / (capacity + slack), pieces));
  ring.payload = payload;
  // Room first: a staging buffer is held from allocate_host on, and is in
  // the slots (which let go of it) without another allocation.
  ring.slots.reserve(count);
  ring.free.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    Slot slot;
    slot.capacity = capacity;
    if (pinned) {
      auto memory = ring.plugin->allocate_host(capacity + slack);
      if (!memory.ok()) {
        return memory.status().with_context("allocating " + std::to_string(capacity + slack) +
                                            " bytes of staging memory");
      }
      std::string overlaps;
      try {
        overlaps = hold_staging(*memory, capacity + slack,
                                queues_[ring.queues.front()].device.plugin);
      } catch (...) {
        (void)ring.plugin->free_host(*memory);
        throw;
      }
      if (!overlaps.empty()) {
        // Not handed back: freeing it could free the buffer it overlaps,
        // which a copy may still read. The plugin frees it at destroy
        // (PLUGIN-9).
        const uint64_t n = capacity + slack;
        return Status(StatusCode::internal,
                      "allocating " + std::to_string(n) + " bytes of staging memory: plugin " +
                          ring.plugin->name() + " broke PLUGIN-18: allocate_host(nbytes " +
                          std::to_string(n) + ") returned " +
                          detail::address_range(reinterpret_cast<uintptr_t>(*memory),
                                                reinterpret_cast<uintptr_t>(*memory) + n) +
                          ", which overlaps staging memory still in use: " + overlaps +
                          " earlier and the host has not freed; the load would read one "
                          "piece over another still being copied");
      }
      slot.allocation = static_cast<std::byte*>(*memory);
      slot.memory = slot.allocation;
      if (slack > 0) {
        const auto at = reinterpret_cast<uintptr_t>(slot.allocation);
        slot.memory += round_up(at, slot_alignment) - at;
      }
      slot.from_plugin = true;
    } else {
      const uint64_t heap_alignment = std::max(kDirectIoAlign, slot_alignment);
      slot.allocation = static_cast<std::byte*>(
          std::aligned_alloc(heap_alignment, round_up(capacity, heap_alignment)));
      slot.memory = slot.allocation;
      if (slot.memory == nullptr) {
        return Status(StatusCode::out_of_host_memory,
                      "allocating " + std::to_string(capacity) +
                          " bytes of staging memory: out of host memory");
      }
    }
    ring.slots.push_back(slot);
    ring.free.push_back(ring.slots.size() - 1);
  }
  return Status();
}

void Pipeline::open_direct_io() {
  for (const QueueContext& c : contexts_) {
    if (c.direct) continue;
    for (const CopyStep& s : c.queue->steps) {
      if (direct_io_fd_.count(s.file) != 0) continue;
      // The file the load mapped, opened again through its own descriptor:
      // whatever its path names by now (renamed over, replaced by a FIFO),
      // this is the same inode. Only without /proc, by its path:
      // O_NONBLOCK and O_NOCTTY as open_regular_file, since the path may
      // name a FIFO or a device by now, whose open(2) would wait for a
      // writer; then checked to be the same inode.
      const std::string own = "/proc/self/fd/" + std::to_string(s.file->fd());
      int fd = ::open(own.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NOCTTY);
      if (fd < 0 && errno == ENOENT) {
        fd = ::open(s.file->path().c_str(),
                    O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK | O_NOCTTY);
      }
      struct stat a {}, b {};
      if (fd >= 0 && (::fstat(fd, &a) != 0 || ::fstat(s.file->fd(), &b) != 0 ||
                      a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
        // Not the file that was mapped (renamed over since): do not use it.
        ::close(fd);
        fd = -1;
      }
      if (fd >= 0) {
        // The mapped regular file: its reads never block; clear the flag.
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      }
      if (fd < 0) direct_io_fallback_ = true;
      if (fd >= 0) direct_fds_.push_back(fd);
      direct_io_fd_[s.file] = fd;
    }
  }
}

Status Pipeline::map_buffers() {
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    if (!contexts_[qi].mapped) continue;
    // The span of each buffer the queue's steps write.
    std::map<const DeviceBuffer*, std::pair<uint64_t, uint64_t>> spans;
    for (const CopyStep& s : queues_[qi].steps) {
      auto [it, fresh] = spans.try_emplace(s.buffer, s.buffer_offset, s.buffer_offset + s.nbytes);
      if (!fresh) {
        it->second.first = std::min(it->second.first, s.buffer_offset);
        it->second.second = std::max(it->second.second, s.buffer_offset + s.nbytes);
      }
    }
    const ResolvedDevice& device = queues_[qi].device;
    mappings_.reserve(mappings_.size() + spans.size());
    for (const auto& [buffer, span] : spans) {
      const uint64_t nbytes = span.second - span.first;
      Result<void*> host =
          device.plugin->map_to_host(device.device, buffer->address() + span.first, nbytes);
      if (!host.ok()) {
        return host.status().with_context(
            "mapping bytes " + std::to_string(span.first) + ".." + std::to_string(span.second) +
            " of buffer " + std::to_string(buffer->memory_id()) + " on " + device.describe() +
            " into the host ([load] direct = false reads through staging instead)");
      }
      mappings_.push_back(
          Mapping{&device, buffer, span.first, nbytes, static_cast<std::byte*>(*host)});
      mapping_of_[buffer] = mappings_.size() - 1;
    }
  }
  return Status();
}

Status Pipeline::unmap_buffers() {
  mapping_of_.clear();
  Status first;
  // Each mapping is taken out before it is ended: if a message cannot be
  // made (bad_alloc), no mapping is ended twice, and those left are ended
  // by the destructor's call.
  while (!mappings_.empty()) {
    const Mapping m = mappings_.back();
    mappings_.pop_back();
    Status s = m.device->plugin->unmap_from_host(m.device->device, m.host);
    if (!s.ok() && first.ok()) {
      first = s.with_context("unmapping bytes " + std::to_string(m.offset) + ".." +
                             std::to_string(m.offset + m.nbytes) + " of buffer " +
                             std::to_string(m.buffer->memory_id()) + " on " +
                             m.device->describe() + " (its bytes may not be on the device)");
    }
  }
  return first;
}

Status Pipeline::set_up() {
  read_ = options_.read;
  Ledger& ledger = *ledger_;
  ledger.unreleased.resize(queues_.size());
  ledger.late_releases.resize(queues_.size());
  ledger.late_wait.resize(queues_.size());
  ledger.late_waiters.resize(queues_.size());
  ledger.late_wait_since.resize(queues_.size());
  std::map<Plugin*, size_t> ring_of;
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    const DeviceCopyQueue& q = queues_[qi];
    ledger.devices.push_back(&q.device);
    QueueContext c;
    c.queue = &q;
    const Capabilities& caps = q.device.plugin->capabilities();
    c.direct = options_.direct && (caps.host_addressable || caps.host_mappable);
    c.mapped = c.direct && !caps.host_addressable;
    if (!c.direct) {
      c.synchronize_mark = q.device.plugin->synchronize_failures(q.device.device);
      Plugin* plugin = q.device.plugin.get();
      auto [it, fresh] = ring_of.emplace(plugin, ledger.rings.size());
      if (fresh) {
        ledger.rings.emplace_back();
        ledger.rings.back().plugin = plugin;
      }
      c.ring = it->second;
      ledger.rings[c.ring].queues.push_back(qi);
    }
    contexts_.push_back(c);
  }
  if (Status s = map_buffers(); !s.ok()) return s;
  if (read_ == ReadMode::direct_io) open_direct_io();
  // direct_io reads staged pieces only; direct reads use pread.
  chooser_.start(read_ == ReadMode::direct_io ? ReadMode::pread : read_);
  // One budget, shared by the rings.
  // At least one slot of kMinSlotBytes per ring, whatever [load] staging
  // says: pieces are at most one slot, and each costs a piece and a ticket
  // of bookkeeping (about 140 bytes), so a smaller slot would make the
  // bookkeeping outgrow the model (docs/config.md).
  const uint64_t budget =
      ledger.rings.empty()
          ? 0
          : std::max<uint64_t>(kMinSlotBytes, options_.staging_bytes / ledger.rings.size());
  for (Ring& ring : ledger.rings) {
    if (Status s = make_ring(ring, budget); !s.ok()) return s;
  }

  // Pieces, devices interleaved so that they load in parallel.
  std::vector<std::vector<Piece>> per_queue(queues_.size());
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    const uint64_t piece_bytes = contexts_[qi].direct
                                     ? kDirectPieceBytes
                                     : ledger.rings[contexts_[qi].ring].payload;
    per_queue[qi].reserve(queues_[qi].steps.size());
    for (const CopyStep& s : queues_[qi].steps) {
      total_ += s.nbytes;
      for (uint64_t done = 0; done < s.nbytes; done += piece_bytes) {
        per_queue[qi].push_back(
            Piece{qi, &s, done, std::min(piece_bytes, s.nbytes - done)});
      }
    }
  }
  if (per_queue.size() == 1) {
    pieces_ = std::move(per_queue.front());
  } else {
    size_t piece_count = 0;
    for (const auto& list : per_queue) piece_count += list.size();
    pieces_.reserve(piece_count);
    for (size_t round = 0;; ++round) {
      bool any = false;
      for (const auto& list : per_queue) {
        if (round < list.size()) {
          pieces_.push_back(list[round]);
          any = true;
        }
      }
      if (!any) break;
    }
  }
  // Threads take pieces in claims of at least kClaimBytes: one piece when
  // pieces are large, so that threads still read into the ring's slots side
  // by side, and many when they are small (100 000 tensors of 64 bytes are
  // not 100 000 trips through a shared counter).
  uint64_t claimed = 0;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (claimed == 0) claims_.push_back(i);
    claimed += pieces_[i].nbytes;
    if (claimed >= kClaimBytes || i + 1 - claims_.back() >= kClaimPieces) claimed = 0;
  }
  claims_.push_back(pieces_.size());
  // A ticket per staged piece at most; never reallocated from here on.
  ledger.tickets.reserve(pieces_.size());

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

Result<size_t> Pipeline::take_slot(size_t ring_index) {
  Ledger& ledger = *ledger_;
  std::unique_lock lock(ledger.mutex);
  Ring& ring = ledger.rings[ring_index];
  for (;;) {
    if (!ledger.failure.ok() || stop_) {
      return Status(StatusCode::internal, "stopped");
    }
    if (!ring.free.empty()) {
      const size_t slot = ring.free.back();
      ring.free.pop_back();
      return slot;
    }
    const uint64_t seen = ledger.releases_seen;
    if (ledger.changed.wait_for(lock, options_.sync_after, [&] {
          return !ledger.failure.ok() || stop_ || !ring.free.empty() ||
                 ledger.releases_seen != seen;
        })) {
      continue;
    }
    // PLUGIN-20: no release for a while; the plugin may be waiting for us.
    if (Status s = force_progress(lock, ring_index); !s.ok()) {
      ledger.fail(s);
      stop_ = true;
      ledger.changed.notify_all();
    }
  }
}

// Synchronizes each device that holds a slot of the ring, then gives its
// releases release_timeout to arrive. Called and returns with lock held.
Status Pipeline::force_progress(std::unique_lock<std::mutex>& lock, size_t ring_index) {
  Ledger& ledger = *ledger_;
  std::vector<std::pair<size_t, uint64_t>> waits;  // queue, last ticket before sync
  for (size_t qi : ledger.rings[ring_index].queues) {
    if (!ledger.unreleased[qi].empty()) waits.emplace_back(qi, *ledger.unreleased[qi].rbegin());
  }
  // Every slot may be with a thread still reading: nothing to wait for.
  if (waits.empty()) return Status();
  ++ledger.forced_synchronizes;
  // The synchronize covers the copies whose call returned before it.
  const uint64_t covered = ledger.calls_returned;
  lock.unlock();
  Status synced;
  for (const auto& [qi, last] : waits) {
    const ResolvedDevice& device = queues_[qi].device;
    Status s = device.plugin->synchronize(device.device);
    if (!s.ok() && synced.ok()) {
      synced = s.with_context("synchronizing " + device.describe() +
                              " while waiting for staging memory");
    }
  }
  lock.lock();
  if (!synced.ok()) return synced;
  for (const auto& [qi, last] : waits) {
    if (Status s = wait_released(lock, qi, covered, last); !s.ok()) return s;
  }
  return Status();
}

// After synchronize(queue's device) returned: every ticket up to up_to_id
// that it covered must be released within release_timeout (PLUGIN-20,
// PLUGIN-21). The synchronize covered the copies whose call returned before
// it (returned count at most `covered`); those released only now are
// counted late.
Status Pipeline::wait_released(std::unique_lock<std::mutex>& lock, size_t qi,
                               uint64_t covered, uint64_t up_to_id) {
  Ledger& ledger = *ledger_;
  auto& pending = ledger.unreleased[qi];
  // Set through the C++ API it may be anything; a deadline past the clock's
  // range would overflow (the config refuses more than a day).
  const std::chrono::milliseconds timeout =
      std::clamp(options_.release_timeout, std::chrono::milliseconds(0), kMaxReleaseTimeout);
  // A copy whose call returned before the synchronize (its returned count
  // at most `covered`) and that is still unreleased now is late (PLUGIN-20),
  // counted once when its release comes, however many threads wait for it.
  // One still in its call then, on another thread, is not.
  // Only those are waited for: PLUGIN-20 lets a plugin keep the release of
  // a copy whose call was still running until a later synchronize, which
  // the caller's next wait for a slot makes (a copy call may take longer
  // than release_timeout, and its thread may have no piece after it).
  const auto covered_by_the_synchronize = [&](const Ticket& t) {
    return !t.in_call && t.returned <= covered;
  };
  // The oldest ticket up to up_to_id that the synchronize covered and that
  // is still unreleased, or nullptr.
  const auto first_owed = [&]() -> const Ticket* {
    for (auto it = pending.begin(); it != pending.end() && *it <= up_to_id; ++it) {
      if (covered_by_the_synchronize(ledger.tickets[*it])) return &ledger.tickets[*it];
    }
    return nullptr;
  };
  bool late = false;
  for (auto it = pending.begin(); it != pending.end() && *it <= up_to_id; ++it) {
    Ticket& t = ledger.tickets[*it];
    if (covered_by_the_synchronize(t)) t.late = late = true;
  }
  if (late && ledger.late_waiters[qi]++ == 0) {
    ledger.late_wait_since[qi] = std::chrono::steady_clock::now();
  }
  const bool done = !late || ledger.changed.wait_for(lock, timeout, [&] {
    return ledger.gave_up || first_owed() == nullptr;
  });
  if (late && --ledger.late_waiters[qi] == 0) {
    ledger.late_wait[qi] += std::chrono::steady_clock::now() - ledger.late_wait_since[qi];
  }
  const Ticket* owed = first_owed();
  if (done || owed == nullptr) return Status();
  ledger.breach = true;
  ledger.gave_up = true;
  const Ticket& t = *owed;
  // A failed copy is released too (PLUGIN-14); a copy that went through
  // is released by the synchronize that covers it at the latest (PLUGIN-20).
  const std::string rule = t.copy_failed ? "PLUGIN-14" : "PLUGIN-20";
  return Status(StatusCode::device_error,
                "plugin " + ledger.plugin_of(t) + " broke " + rule +
                    " (PLUGIN-21 release accounting): " + ledger.copy_of(t) +
                    (t.copy_failed ? " failed and" : "") + " was not released " +
                    std::to_string(timeout.count()) +
                    " ms after synchronize returned ([load] release_timeout); "
                    "its staging memory is kept, never freed, and buffer " +
                    std::to_string(t.step->buffer->memory_id()) +
                    " stays allocated until the plugin is closed");
}

Status Pipeline::direct_piece(const Piece& p) {
  const CopyStep& s = *p.step;
  std::byte* dst = nullptr;
  if (contexts_[p.queue].mapped) {
    const Mapping& m = mappings_[mapping_of_.at(s.buffer)];
    dst = m.host + (s.buffer_offset - m.offset) + p.offset;
  } else {
    dst = reinterpret_cast<std::byte*>(
        static_cast<uintptr_t>(s.buffer->address() + s.buffer_offset + p.offset));
  }
  // O_DIRECT wants aligned destinations the device memory need not have:
  // direct_io reads direct pieces with pread.
  return read_piece(chooser_, *s.file, dst, s.file_offset + p.offset, p.nbytes);
}

Status Pipeline::staged_piece(const Piece& p) {
  const CopyStep& s = *p.step;
  const QueueContext& c = contexts_[p.queue];
  auto taken = take_slot(c.ring);
  if (!taken.ok()) return taken.status();
  Ledger& ledger = *ledger_;
  const Slot slot = ledger.rings[c.ring].slots[*taken];
  const uint64_t offset = s.file_offset + p.offset;

  const std::byte* payload = slot.memory;
  Status read;
  if (read_ != ReadMode::direct_io || direct_io_fd_.at(s.file) < 0) {
    read = read_piece(chooser_, *s.file, slot.memory, offset, p.nbytes);
  } else {
    const uint64_t start = offset / kDirectIoAlign * kDirectIoAlign;
    const uint64_t length = round_up(offset + p.nbytes, kDirectIoAlign) - start;
    uint64_t got = 0;
    read = pread_all(direct_io_fd_.at(s.file), slot.memory, length, start, *s.file, &got);
    if (read.ok() && got < offset + p.nbytes - start) {
      read = Status(StatusCode::invalid_argument,
                    path_for_message(s.file->path().string()) + ": ends before offset " +
                        std::to_string(offset + p.nbytes) + " (was it truncated?)");
    }
    payload = slot.memory + (offset - start);
    // The block read left the piece where the plugin would bounce it
    // (PLUGIN-23): one move within the slot puts it on the slot's start,
    // which is aligned for it.
    const uint64_t alignment = source_alignment(ledger.rings[c.ring].plugin->capabilities());
    if (read.ok() && reinterpret_cast<uintptr_t>(payload) % alignment != 0) {
      std::memmove(slot.memory, payload, p.nbytes);
      payload = slot.memory;
      ++realigned_pieces_;
    }
  }
  Ticket* ticket = nullptr;
  {
    std::lock_guard lock(ledger.mutex);
    if (read.ok()) {
      // The one allocation here, first: if it fails, nothing is
      // registered and the slot goes back (free never outgrows its
      // capacity, all the ring's slots).
      try {
        ledger.unreleased[p.queue].insert(ledger.tickets.size());
      } catch (...) {
        ledger.rings[c.ring].free.push_back(*taken);
        throw;
      }
    }
    if (!read.ok()) {
      ledger.rings[c.ring].free.push_back(*taken);
    } else {
      Ticket fresh;
      fresh.id = ledger.tickets.size();
      fresh.queue = p.queue;
      fresh.ring = c.ring;
      fresh.slot = *taken;
      fresh.nbytes = p.nbytes;
      fresh.step = &s;
      fresh.offset = p.offset;
      ledger.tickets.push_back(std::move(fresh));  // reserved: does not throw
      ticket = &ledger.tickets.back();
      ledger.in_flight += p.nbytes;
      ledger.max_in_flight = std::max(ledger.max_in_flight, ledger.in_flight);
    }
  }
  if (!read.ok()) {
    ledger.changed.notify_all();
    return read.with_context("reading tensor " +
                             tensors_text(piece_of(s, p.offset, p.nbytes, requests_)));
  }
  const ResolvedDevice& device = queues_[p.queue].device;
  // The plugin releases the ticket exactly once, also when this fails.
  Status copied = device.plugin->copy_to_device_until_released(
      device.device, s.buffer->address() + s.buffer_offset + p.offset, payload,
      p.nbytes, on_piece_released, ticket);
  bool failed = false;  // waiting threads must see the new failure
  {
    std::lock_guard lock(ledger.mutex);
    ticket->in_call = false;
    ticket->returned = ++ledger.calls_returned;
    if (!copied.ok()) {
      ticket->copy_failed = true;
      if (!ticket->breach_in_call.empty()) {
        copied = Status(copied.code(), copied.message() + "; then " + ticket->breach_in_call);
      }
    } else if (!ticket->breach_in_call.empty()) {
      ledger.fail_also(Status(StatusCode::device_error, ticket->breach_in_call));
      failed = true;
    }
  }
  if (failed) ledger.changed.notify_all();
  return copied;
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
  { std::lock_guard lock(ledger_->mutex); }
  ledger_->changed.notify_all();
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
  const auto add_counts = [&] {
    std::lock_guard lock(stats_mutex_);
    for (size_t qi = 0; qi < queues_.size(); ++qi) {
      (contexts_[qi].direct ? per_device_[qi].direct_reads : per_device_[qi].copies) +=
          issued[qi];
    }
  };
  for (size_t c = next_++; c + 1 < claims_.size() && !stop_; c = next_++) {
    // Progress is counted once per claim: a shared counter touched for
    // every 64-byte piece costs more than the piece's copy.
    uint64_t claim_bytes = 0;
    for (size_t i = claims_[c]; i < claims_[c + 1] && !stop_; ++i) {
      const Piece& p = pieces_[i];
      std::call_once(start_once_[p.queue],
                     [&] { started_[p.queue] = std::chrono::steady_clock::now(); });
      Status s = contexts_[p.queue].direct ? direct_piece(p) : staged_piece(p);
      ++issued[p.queue];
      if (s.ok()) {
        claim_bytes += p.nbytes;
        continue;
      }
      if (s.code() == StatusCode::internal && s.message() == "stopped") {
        add_counts();
        return;
      }
      const CopyStep piece = piece_of(*p.step, p.offset, p.nbytes, requests_);
      std::lock_guard lock(ledger_->mutex);
      ledger_->fail(s.with_context("copying tensor " + tensors_text(piece) + " (" +
                                   range_text(piece) + ") from " +
                                   path_for_message(piece.file->path().string()) + " to " +
                                   queues_[p.queue].device.describe()));
      stop_ = true;
      ledger_->changed.notify_all();
    }
    if (claim_bytes == 0 || stop_) continue;
    if (Status reported = report_progress(claim_bytes); !reported.ok()) {
      std::lock_guard lock(ledger_->mutex);
      ledger_->fail(std::move(reported));
      stop_ = true;
      ledger_->changed.notify_all();
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
  Ledger& ledger = *ledger_;
  // Every loading thread is done writing through the mappings.
  if (Status s = unmap_buffers(); !s.ok()) {
    std::lock_guard lock(ledger.mutex);
    ledger.fail(std::move(s));
  }
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    const ResolvedDevice& device = queues_[qi].device;
    uint64_t last = 0;
    bool any = false;
    {
      std::lock_guard lock(ledger.mutex);
      if (!ledger.unreleased[qi].empty()) {
        last = *ledger.unreleased[qi].rbegin();
        any = true;
      }
    }
    Status synced = device.plugin->synchronize(device.device);
    std::unique_lock lock(ledger.mutex);
    if (!synced.ok()) {
      ledger.fail(synced.with_context("synchronizing " + device.describe()));
    }
    if (any) {
      // Every loading thread has finished: every copy call returned.
      if (Status s = wait_released(lock, qi, ledger.calls_returned, last); !s.ok()) {
        ledger.fail_also(s);
      }
    }
    const bool copied_ok = ledger.failure.ok() && per_device_[qi].copies > 0;
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
        std::lock_guard relock(ledger.mutex);
        ledger.fail(Status(
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
    register_ledger(*ledger_);
    const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
    threads = options_.threads != 0
                  ? options_.threads
                  : std::max<uint32_t>(static_cast<uint32_t>(queues_.size()),
                                       std::min(cores, 4u));
    threads = static_cast<uint32_t>(std::min<size_t>(threads, claims_.size() - 1));
    // A staged piece holds a slot from its read to its release: threads
    // beyond the slots would only wait for one ([load] threads = 1024 with
    // one slot made millions of context switches). Direct reads need none.
    bool any_direct = false;
    for (const QueueContext& c : contexts_) any_direct |= c.direct;
    uint64_t slots = 0;
    for (const Ring& r : ledger_->rings) slots += r.slots.size();
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
        std::lock_guard lock(ledger_->mutex);
        ledger_->fail(std::move(failed));
      }
    };
    fail_for_exception();
    try {
      finish();
    } catch (...) {
      // Part of the devices synchronized: a release may still come, so the
      // ledger and its slots are kept, never freed (as for a breach).
      stop_for_exception();
      {
        std::lock_guard lock(ledger_->mutex);
        ledger_->breach = true;
      }
      fail_for_exception();
    }
    // Every copy landed and was released: a file written in place during
    // the copies (a piece read before the write, another after, or a
    // header that no longer matches) fails the load here, before success
    // is reported; its buffers are freed with it.
    bool copied = false;
    {
      std::lock_guard lock(ledger_->mutex);
      copied = ledger_->failure.ok();
    }
    if (copied) {
      if (Status s = check_files("while it was being loaded"); !s.ok()) {
        std::lock_guard lock(ledger_->mutex);
        ledger_->fail(std::move(s));
      }
    }
  }

  Ledger& ledger = *ledger_;
  {
    // From here no release makes a text: texts name the schedule, which
    // may be gone once run() returns (an abandoned ledger stays).
    std::lock_guard lock(g_ledgers_mutex);
    ledger.running = false;
  }
  if (pipeline != nullptr) {
    std::lock_guard lock(ledger.mutex);
    *pipeline = PipelineStats{};
    pipeline->threads = threads;
    for (const Ring& r : ledger.rings) {
      pipeline->staging_slots += r.slots.size();
      pipeline->slot_bytes = std::max(pipeline->slot_bytes, r.payload);
      for (const Slot& s : r.slots) pipeline->pinned |= s.from_plugin;
    }
    pipeline->max_in_flight_bytes = ledger.max_in_flight;
    pipeline->forced_synchronizes = ledger.forced_synchronizes;
    // direct_io when some staged pieces were read with O_DIRECT.
    pipeline->read = read_ == ReadMode::direct_io && !direct_fds_.empty() ? ReadMode::direct_io
                                                                          : chooser_.current();
    pipeline->read_measured = chooser_.measured();
    pipeline->direct_io_fallback = direct_io_fallback_;
    pipeline->realigned_pieces = realigned_pieces_;
  }
  if (stats != nullptr) {
    {
      std::lock_guard lock(ledger.mutex);
      for (size_t qi = 0; qi < per_device_.size() && qi < ledger.late_releases.size(); ++qi) {
        per_device_[qi].late_releases = ledger.late_releases[qi];
        per_device_[qi].late_release_seconds =
            std::chrono::duration<double>(ledger.late_wait[qi]).count();
      }
    }
    *stats = per_device_;
  }
  // The slots are freed, or the ledger kept after a breach, by ~Pipeline.
  if (!status.ok()) return status;
  std::lock_guard lock(ledger.mutex);
  return ledger.failure;
}

}  // namespace

PipelineOptions PipelineOptions::from(const LoadOptions& load) {
  PipelineOptions o;
  o.staging_bytes = load.staging_bytes;
  o.threads = load.threads;
  o.release_timeout = load.release_timeout;
  o.read = load.read;
  o.direct = load.direct;
  return o;
}

CopySchedule CopySchedule::build(std::vector<CopyRequest> requests) {
  CopySchedule schedule;
  // The schedule owns what its steps point at: buffers and mappings.
  schedule.requests_ = std::move(requests);
  std::map<std::pair<const Plugin*, uint32_t>, std::vector<const CopyRequest*>> by_device;
  for (const CopyRequest& r : schedule.requests_) {
    if (r.nbytes == 0) continue;
    auto& list = by_device[{r.buffer->device().plugin.get(), r.buffer->device().device}];
    // Most loads go to one device: room for all at once, not log2(N) copies.
    if (list.empty()) list.reserve(schedule.requests_.size());
    list.push_back(&r);
  }
  for (auto& [key, list] : by_device) {
    // File order gives sequential reads. Files are told apart by their
    // mapping, not by comparing paths N log N times.
    const auto in_file_order = [](const CopyRequest* a, const CopyRequest* b) {
      if (a->file != b->file) return std::less<>()(a->file.get(), b->file.get());
      return a->file_offset < b->file_offset;
    };
    // Plans mostly list a file's tensors in file order already.
    if (!std::is_sorted(list.begin(), list.end(), in_file_order)) {
      std::sort(list.begin(), list.end(), in_file_order);
    }
    DeviceCopyQueue queue;
    queue.device = list.front()->buffer->device();
    queue.steps.reserve(list.size());
    for (const CopyRequest* request : list) {
      const CopyRequest& r = *request;
      ++queue.tensors;
      queue.bytes += r.nbytes;
      if (!queue.steps.empty()) {
        CopyStep& m = queue.steps.back();
        if (m.file == r.file.get() && m.buffer == r.buffer.get() &&
            m.file_offset + m.nbytes == r.file_offset &&
            m.buffer_offset + m.nbytes == r.buffer_offset) {
          m.nbytes += r.nbytes;
          m.last_tensor = r.tensor;
          continue;
        }
      }
      queue.steps.push_back(CopyStep{r.buffer.get(), r.buffer_offset, r.file.get(),
                                     r.file_offset, r.nbytes, r.tensor, r.tensor});
    }
    schedule.queues_.push_back(std::move(queue));
  }
  return schedule;
}

uint64_t CopySchedule::range_count() const {
  uint64_t n = 0;
  for (const auto& q : queues_) n += q.steps.size();
  return n;
}

Status CopySchedule::execute(const PipelineOptions& options,
                             std::vector<DeviceLoadStats>* stats,
                             PipelineStats* pipeline,
                             const LoadProgress& progress) const {
  return detail::without_exceptions("copying", [&] {
    Pipeline run(requests_, queues_, options, progress);
    return run.run(stats, pipeline);
  });
}

}  // namespace devalloc
