#include "piece_list.hpp"

#include <algorithm>
#include <utility>

namespace devalloc::load {

PieceList PieceList::build(const std::vector<DeviceCopyQueue>& queues,
                           const std::vector<uint64_t>& piece_bytes) {
  PieceList list;
  std::vector<std::vector<Piece>> per_queue(queues.size());
  for (size_t qi = 0; qi < queues.size(); ++qi) {
    per_queue[qi].reserve(queues[qi].steps.size());
    for (const CopyStep& s : queues[qi].steps) {
      list.total_bytes_ += s.nbytes;
      for (uint64_t done = 0; done < s.nbytes; done += piece_bytes[qi]) {
        per_queue[qi].push_back(Piece{qi, &s, done, std::min(piece_bytes[qi], s.nbytes - done)});
      }
    }
  }
  std::vector<Piece>& pieces = list.pieces_;
  if (per_queue.size() == 1) {
    pieces = std::move(per_queue.front());
  } else {
    size_t piece_count = 0;
    for (const auto& one : per_queue) piece_count += one.size();
    pieces.reserve(piece_count);
    for (size_t round = 0;; ++round) {
      bool any = false;
      for (const auto& one : per_queue) {
        if (round < one.size()) {
          pieces.push_back(one[round]);
          any = true;
        }
      }
      if (!any) break;
    }
  }
  uint64_t claimed = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (claimed == 0) list.claims_.push_back(i);
    claimed += pieces[i].nbytes;
    if (claimed >= kClaimBytes || i + 1 - list.claims_.back() >= kClaimPieces) claimed = 0;
  }
  list.claims_.push_back(pieces.size());
  return list;
}

}  // namespace devalloc::load
