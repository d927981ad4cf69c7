#include "layer_allocations.hpp"

#include <iterator>

namespace devalloc::detail {

bool LayerAllocations::inside(uint32_t device, uint64_t address, uint64_t nbytes) const {
  const auto d = allocations_.find(device);
  if (d == allocations_.end()) return false;
  auto it = d->second.upper_bound(address);
  if (it == d->second.begin()) return false;
  --it;
  const uint64_t offset = address - it->first;
  return offset < it->second && nbytes <= it->second - offset;
}

bool LayerAllocations::add(uint32_t device, uint64_t address, uint64_t nbytes) {
  auto& live = allocations_[device];
  const auto next = live.lower_bound(address);
  const bool overlaps_next = next != live.end() && next->first - address < nbytes;
  const bool overlaps_prev =
      next != live.begin() && address - std::prev(next)->first < std::prev(next)->second;
  if (overlaps_next || overlaps_prev) return false;
  live.emplace_hint(next, address, nbytes);
  live_bytes_ += nbytes;
  return true;
}

std::optional<uint64_t> LayerAllocations::take(uint32_t device, uint64_t base) {
  const auto d = allocations_.find(device);
  if (d == allocations_.end()) return std::nullopt;
  const auto it = d->second.find(base);
  if (it == d->second.end()) return std::nullopt;
  const uint64_t nbytes = it->second;
  d->second.erase(it);
  return nbytes;
}

void LayerAllocations::put_back(uint32_t device, uint64_t base, uint64_t nbytes) {
  allocations_[device].emplace(base, nbytes);
}

void LayerAllocations::freed(uint32_t device, uint64_t base, uint64_t nbytes) {
  if (const auto m = mappings_.find(device); m != mappings_.end()) {
    std::erase_if(m->second,
                  [&](const auto& mapping) { return mapping.second.first - base < nbytes; });
  }
  live_bytes_ -= nbytes;
}

uint64_t LayerAllocations::count() const {
  uint64_t n = 0;
  for (const auto& [device, allocations] : allocations_) n += allocations.size();
  return n;
}

void LayerAllocations::add_mapping(uint32_t device, const void* host, uint64_t address,
                                   uint64_t nbytes) {
  mappings_[device].emplace(host, std::make_pair(address, nbytes));
}

bool LayerAllocations::is_mapped(uint32_t device, const void* host) const {
  const auto m = mappings_.find(device);
  return m != mappings_.end() && m->second.count(host) != 0;
}

void LayerAllocations::remove_mapping(uint32_t device, const void* host) {
  const auto m = mappings_.find(device);
  if (m == mappings_.end()) return;
  if (const auto it = m->second.find(host); it != m->second.end()) m->second.erase(it);
}

bool LayerAllocations::overlaps_mapping(uint32_t device, uint64_t address,
                                        uint64_t nbytes) const {
  const auto m = mappings_.find(device);
  if (m == mappings_.end()) return false;
  for (const auto& [host, range] : m->second) {
    if (range.first < address + nbytes && address < range.first + range.second) return true;
  }
  return false;
}

}  // namespace devalloc::detail
