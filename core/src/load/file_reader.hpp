// Reading a load's source files: pread, memcpy from the mapping, or
// O_DIRECT pread, and the chooser that picks mmap or pread ([load] read =
// auto) by measuring the load's own first pieces.
#pragma once

#include "copy_schedule.hpp"

#include <devalloc/core/config.hpp>
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/status.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace devalloc::load {

// O_DIRECT wants offsets, sizes and addresses aligned to the block size;
// 4 KiB covers the file systems in use.
constexpr uint64_t kDirectIoAlign = 4096;

inline uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Reads n bytes at offset of fd (a descriptor of `file`, named in errors)
// into dst; pread may return less than asked. With `got`, a short read is
// no error and *got says how much was read.
Status pread_all(int fd, void* dst, uint64_t n, uint64_t offset, const MappedFile& file,
                 uint64_t* got = nullptr);

// read = auto: mmap or pread, whichever reads faster on this machine, as
// measured on the load's own first pieces. Until each mode has read
// kSamples pieces of at least kMinBytes, such pieces alternate between the
// two (smaller ones use mmap); then the mode with more bytes per second
// serves the rest of the load. Both read the same page cache into the same
// kind of destination, so the figures compare like with like. Four pieces
// each: with two, loads onto huge-page memory, where pread is about 8 %
// faster than mmap, kept mmap in two model sizes out of three.
class ReadChooser {
 public:
  static constexpr uint64_t kMinBytes = uint64_t{1} << 20;
  static constexpr int kSamples = 4;

  // A fixed mode (anything but automatic), or automatic to measure.
  void start(ReadMode mode) {
    probing_ = mode == ReadMode::automatic;
    mode_ = probing_ ? ReadMode::mmap : mode;
  }
  ReadMode current() const { return mode_.load(); }
  // True once automatic chose by measurement.
  bool measured() const { return measured_.load(); }

  // The mode for a piece of nbytes; *timed says to report it to record().
  ReadMode pick(uint64_t nbytes, bool* timed);
  void record(ReadMode mode, uint64_t nbytes, double seconds);

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

// Reads nbytes at offset of file into dst, with mmap (memcpy from the
// mapping, guarded against truncation) or pread, as the chooser says,
// timing it for the chooser when it asks.
Status read_piece(ReadChooser& chooser, const MappedFile& file, std::byte* dst, uint64_t offset,
                  uint64_t nbytes);

// Reads bytes [offset, offset + nbytes) of step s into dst: one read, or
// for a strided step (a slice along a later dimension) one per run, so
// that dst gets them contiguous.
Status read_step(ReadChooser& chooser, const CopyStep& s, uint64_t offset, uint64_t nbytes,
                 std::byte* dst);

// The O_DIRECT descriptors of a load's files, each the inode that was
// mapped; closed with this object.
class DirectIoFiles {
 public:
  DirectIoFiles() = default;
  DirectIoFiles(const DirectIoFiles&) = delete;
  DirectIoFiles& operator=(const DirectIoFiles&) = delete;
  ~DirectIoFiles();

  // Opens file for O_DIRECT once; a file that cannot be (the file system
  // refuses O_DIRECT, or the path names another file by now) gets -1, and
  // fell_back() says so.
  void open(const MappedFile* file);
  // Its descriptor, or -1: read it with pread then.
  int fd(const MappedFile* file) const;
  bool any_open() const { return !fds_.empty(); }
  bool fell_back() const { return fell_back_; }

 private:
  std::map<const MappedFile*, int> fd_of_;
  std::vector<int> fds_;
  bool fell_back_ = false;
};

}  // namespace devalloc::load
