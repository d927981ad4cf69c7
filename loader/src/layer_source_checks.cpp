#include "layer_source_checks.hpp"

#include <devalloc/plugin_layer.hpp>

#include <iterator>

namespace devalloc::detail {

uint64_t source_hash_more(uint64_t hash, const void* data, uint64_t nbytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (uint64_t i = 0; i < nbytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

void poison_source(const void* src, uint64_t nbytes) {
  static constexpr unsigned char kPoison[8] = {0xde, 0xad, 0xbe, 0xef, 0x0b, 0xad, 0xf0, 0x0d};
  auto* p = static_cast<unsigned char*>(const_cast<void*>(src));
  for (uint64_t i = 0; i < nbytes; ++i) p[i] = kPoison[i % sizeof kPoison];
}

void LayerSourceChecks::add_staging(const void* host, uint64_t nbytes) {
  staging_[reinterpret_cast<uintptr_t>(host)] = nbytes;
}

void LayerSourceChecks::remove_staging(const void* host) {
  staging_.erase(reinterpret_cast<uintptr_t>(host));
}

bool LayerSourceChecks::in_staging(const void* src, uint64_t nbytes) const {
  const auto address = reinterpret_cast<uintptr_t>(src);
  auto buffer = staging_.upper_bound(address);
  if (buffer == staging_.begin()) return false;
  --buffer;
  const uint64_t offset = address - buffer->first;
  return offset < buffer->second && nbytes <= buffer->second - offset;
}

void LayerSourceChecks::remember(uint64_t copy, SourceCheck check) {
  checks_[copy] = std::move(check);
}

void LayerSourceChecks::call_returned(uint64_t copy, bool succeeded) {
  const auto it = checks_.find(copy);
  if (it == checks_.end()) return;
  if (succeeded) {
    it->second.issued = true;
  } else {
    checks_.erase(it);
  }
}

SourceCheck* LayerSourceChecks::find(uint64_t copy) {
  const auto it = checks_.find(copy);
  return it == checks_.end() ? nullptr : &it->second;
}

void LayerSourceChecks::forget_range(uint32_t device, uint64_t address, uint64_t nbytes) {
  for (auto it = checks_.begin(); it != checks_.end();) {
    SourceCheck& c = it->second;
    if (c.device != device || c.dst >= address + nbytes || address >= c.dst + c.nbytes) {
      ++it;
    } else if (c.reading) {
      c.stale = true;  // its reader drops it
      ++it;
    } else {
      it = checks_.erase(it);
    }
  }
}

void LayerSourceChecks::forget(const std::vector<uint64_t>& ids) noexcept {
  for (uint64_t id : ids) {
    const auto it = checks_.find(id);
    if (it != checks_.end() && !it->second.reading) checks_.erase(it);
  }
}

std::vector<uint64_t> LayerSourceChecks::issued_on(uint32_t device) const {
  std::vector<uint64_t> ids;
  for (const auto& [id, check] : checks_) {
    if (check.device == device && check.issued) ids.push_back(id);
  }
  return ids;
}

bool LayerSourceChecks::reading(uint32_t device, uint64_t address, uint64_t nbytes) const {
  for (const auto& [id, c] : checks_) {
    if (c.reading && c.device == device && c.dst < address + nbytes &&
        address < c.dst + c.nbytes) {
      return true;
    }
  }
  return false;
}

std::optional<SourceCheck> LayerSourceChecks::begin_read(uint64_t id) {
  const auto it = checks_.find(id);
  if (it == checks_.end() || it->second.reading) return std::nullopt;
  if (!it->second.released) {
    checks_.erase(it);
    return std::nullopt;
  }
  std::optional<SourceCheck> copy(it->second);  // may throw: nothing is marked yet
  it->second.reading = true;
  return copy;
}

bool LayerSourceChecks::end_read(uint64_t id, bool abandoned) {
  const auto it = checks_.find(id);
  if (it == checks_.end()) return false;
  const bool counts = !it->second.stale && !abandoned;
  checks_.erase(it);
  read_back_ended_.notify_all();
  if (counts) ++done_;
  return counts;
}

bool LayerSourceChecks::full() const { return checks_.size() >= kLayerSourceChecksKept; }

void LayerSourceChecks::make_room() {
  for (auto it = checks_.begin(); it != checks_.end() && full();) {
    it = it->second.reading ? std::next(it) : checks_.erase(it);  // readers drop theirs
  }
}

}  // namespace devalloc::detail
