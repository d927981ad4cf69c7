// The pieces of a load, made as the loading threads ask for them: each
// coalesced step cut into pieces of at most one staging slot (or
// kDirectPieceBytes for direct reads), handed out in claims that a loading
// thread takes at once, the devices taking turns so that they load in
// parallel. Nothing is kept per piece: the bookkeeping is a cursor per
// device, whatever the model's size and the slot's.
#pragma once

#include "copy_schedule.hpp"

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace devalloc::load {

constexpr uint64_t kDirectPieceBytes = uint64_t{8} << 20;

struct Piece {
  size_t queue;
  const CopyStep* step;
  uint64_t offset;  // into the step
  uint64_t nbytes;
};

class PieceSource {
 public:
  // A claim is pieces of one device adding up to at least kClaimBytes, or
  // kClaimPieces of them: one piece when pieces are large, so that threads
  // still read into the ring's slots side by side, and many when they are
  // small (100 000 tensors of 64 bytes are not 100 000 trips through a
  // shared lock).
  static constexpr uint64_t kClaimBytes = uint64_t{64} << 10;
  static constexpr size_t kClaimPieces = 1024;

  // piece_bytes[q]: the most bytes of one piece of queue q (at least 1).
  PieceSource(const std::vector<DeviceCopyQueue>& queues, std::vector<uint64_t> piece_bytes);

  // The next claim, into `out` (cleared first; at most kClaimPieces); false
  // when every piece was handed out. Thread-safe.
  bool next_claim(std::vector<Piece>& out);

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t piece_count() const { return piece_count_; }

 private:
  struct Cursor {
    size_t step = 0;
    uint64_t offset = 0;  // into the step
  };
  const std::vector<DeviceCopyQueue>& queues_;
  const std::vector<uint64_t> piece_bytes_;
  std::mutex mutex_;
  std::vector<Cursor> cursors_;  // under mutex_
  size_t turn_ = 0;              // the queue the next claim comes from
  uint64_t total_bytes_ = 0;
  uint64_t piece_count_ = 0;
};

}  // namespace devalloc::load
