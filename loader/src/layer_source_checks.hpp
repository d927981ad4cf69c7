// The validation layer's source checker (LayerSettings::check_sources):
// the until-released copies whose destinations the next synchronize of
// their device reads back, and the staging buffers whose released sources
// the layer may overwrite. Not locked: the layer's mutex guards it, and
// read_back_ended() is waited on with that mutex.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace devalloc::detail {

// 64-bit FNV-1a: the source check only needs to see a change.
inline constexpr uint64_t kSourceHashStart = 1469598103934665603ull;
uint64_t source_hash_more(uint64_t hash, const void* data, uint64_t nbytes);
inline uint64_t source_hash(const void* data, uint64_t nbytes) {
  return source_hash_more(kSourceHashStart, data, nbytes);
}
// Writes a poison pattern over a released source in staging memory: a
// plugin that reads it after the release lands these bytes on the device.
void poison_source(const void* src, uint64_t nbytes);

// One until-released copy whose destination is read back once it is
// released and its device synchronized.
struct SourceCheck {
  uint32_t device = 0;
  uint64_t dst = 0;
  uint64_t nbytes = 0;
  uint64_t source_hash = 0;  // of src at issue
  std::string call;
  bool issued = false;    // the plugin's copy call returned OK
  bool released = false;
  bool poisoned = false;  // the layer overwrote the released source
  // Being read back (outside the mutex); stale once the range was
  // written, mapped or freed meanwhile, and its result is dropped.
  bool reading = false;
  bool stale = false;
};

class LayerSourceChecks {
 public:
  // Staging buffers from the instance's allocate_host (host memory the
  // layer may write).
  void add_staging(const void* host, uint64_t nbytes);
  void remove_staging(const void* host);
  bool in_staging(const void* src, uint64_t nbytes) const;

  // Copy `copy` (the tracker's number) is checked; may throw bad_alloc.
  void remember(uint64_t copy, SourceCheck check);
  // Its call returned: due for a read-back when it succeeded, forgotten
  // when it failed (a failed copy lands nothing).
  void call_returned(uint64_t copy, bool succeeded);
  // The check of `copy`, or nullptr.
  SourceCheck* find(uint64_t copy);

  // Forgets the checks whose destination overlaps [address, address +
  // nbytes) of device (written again, mapped, or about to be freed), or
  // marks them stale while they are read back.
  void forget_range(uint32_t device, uint64_t address, uint64_t nbytes);
  // Forgets the checks `ids` but those being read back (their readers
  // drop them).
  void forget(const std::vector<uint64_t>& ids) noexcept;
  // The checks of device whose calls returned OK.
  std::vector<uint64_t> issued_on(uint32_t device) const;
  // Whether a read-back of [address, address + nbytes) of device runs.
  bool reading(uint32_t device, uint64_t address, uint64_t nbytes) const;

  // A read-back of check id begins: a copy of it, marked as being read;
  // nullopt when it is gone, read already, or not released (then it is
  // forgotten: a missing release is PLUGIN-20's breach). May throw with
  // nothing marked.
  std::optional<SourceCheck> begin_read(uint64_t id);
  // It ends: forgotten, and true when its result counts (it was not made
  // stale meanwhile). `abandoned`: it was never read.
  bool end_read(uint64_t id, bool abandoned = false);
  std::condition_variable& read_back_ended() { return read_back_ended_; }

  // kLayerSourceChecksKept or more are remembered.
  bool full() const;
  // The device of the oldest check (full() true).
  uint32_t oldest_device() const { return checks_.begin()->second.device; }
  // Forgets the oldest checks not being read until there is room.
  void make_room();

  uint64_t size() const { return checks_.size(); }
  uint64_t done() const { return done_; }

 private:
  std::map<uintptr_t, uint64_t> staging_;  // base -> size
  std::map<uint64_t, SourceCheck> checks_;  // by copy number, oldest first
  uint64_t done_ = 0;
  std::condition_variable read_back_ended_;
};

}  // namespace devalloc::detail
