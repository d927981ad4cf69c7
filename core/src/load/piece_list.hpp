// The pieces of a load: each coalesced step cut into pieces of at most one
// staging slot (or kDirectPieceBytes for direct reads), the devices'
// pieces interleaved so that devices load in parallel, and grouped into
// claims that a loading thread takes at once.
#pragma once

#include "copy_schedule.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace devalloc::load {

constexpr uint64_t kDirectPieceBytes = uint64_t{8} << 20;

struct Piece {
  size_t queue;
  const CopyStep* step;
  uint64_t offset;  // into the step
  uint64_t nbytes;
};

class PieceList {
 public:
  // piece_bytes[q]: the most bytes of one piece of queue q.
  static PieceList build(const std::vector<DeviceCopyQueue>& queues,
                         const std::vector<uint64_t>& piece_bytes);

  size_t size() const { return pieces_.size(); }
  size_t claim_count() const { return claims_.size() - 1; }
  std::span<const Piece> claim(size_t c) const {
    return {pieces_.data() + claims_[c], claims_[c + 1] - claims_[c]};
  }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  // Threads take pieces in claims of at least kClaimBytes: one piece when
  // pieces are large, so that threads still read into the ring's slots side
  // by side, and many when they are small (100 000 tensors of 64 bytes are
  // not 100 000 trips through a shared counter).
  static constexpr uint64_t kClaimBytes = uint64_t{64} << 10;
  static constexpr size_t kClaimPieces = 1024;

  std::vector<Piece> pieces_;
  // Claim c is pieces_[claims_[c], claims_[c + 1]).
  std::vector<size_t> claims_;
  uint64_t total_bytes_ = 0;
};

}  // namespace devalloc::load
