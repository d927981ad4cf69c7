#include "piece_list.hpp"

#include <algorithm>
#include <utility>

namespace devalloc::load {

PieceSource::PieceSource(const std::vector<DeviceCopyQueue>& queues,
                         std::vector<uint64_t> piece_bytes)
    : queues_(queues), piece_bytes_(std::move(piece_bytes)), cursors_(queues.size()) {
  for (size_t qi = 0; qi < queues_.size(); ++qi) {
    for (const CopyStep& s : queues_[qi].steps) {
      total_bytes_ += s.nbytes;
      piece_count_ += (s.nbytes + piece_bytes_[qi] - 1) / piece_bytes_[qi];
    }
  }
}

bool PieceSource::next_claim(std::vector<Piece>& out) {
  out.clear();
  std::lock_guard lock(mutex_);
  for (size_t tried = 0; tried < queues_.size(); ++tried) {
    const size_t qi = turn_;
    turn_ = (turn_ + 1) % queues_.size();
    Cursor& c = cursors_[qi];
    const std::vector<CopyStep>& steps = queues_[qi].steps;
    uint64_t claimed = 0;
    while (c.step < steps.size() && claimed < kClaimBytes && out.size() < kClaimPieces) {
      const CopyStep& s = steps[c.step];
      const uint64_t n = std::min(piece_bytes_[qi], s.nbytes - c.offset);
      out.push_back(Piece{qi, &s, c.offset, n});
      claimed += n;
      c.offset += n;
      if (c.offset >= s.nbytes) {
        ++c.step;
        c.offset = 0;
      }
    }
    if (!out.empty()) return true;
  }
  return false;
}

}  // namespace devalloc::load
