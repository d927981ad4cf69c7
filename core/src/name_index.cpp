#include <devalloc/core/name_index.hpp>

#include <functional>

namespace devalloc {

namespace {

size_t capacity_for(size_t count) {
  size_t capacity = 16;
  while (capacity / 2 < count) capacity *= 2;
  return capacity;
}

uint64_t hash_of(std::string_view name) { return std::hash<std::string_view>{}(name); }

}  // namespace

void NameIndex::reserve(size_t count) {
  names_.reserve(count);
  values_.reserve(count);
  if (capacity_for(count) > slots_.size()) rehash(capacity_for(count));
}

void NameIndex::clear() {
  names_.clear();
  values_.clear();
  slots_.clear();
}

size_t NameIndex::probe(std::string_view name, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  const uint32_t tag = static_cast<uint32_t>(hash >> 32);
  for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
    const uint64_t slot = slots_[i];
    const uint32_t entry = static_cast<uint32_t>(slot);
    if (entry == 0) return i;
    if (static_cast<uint32_t>(slot >> 32) == tag && names_[entry - 1] == name) return i;
  }
}

void NameIndex::rehash(size_t capacity) {
  slots_.assign(capacity, 0);
  for (size_t e = 0; e < names_.size(); ++e) {
    const uint64_t hash = hash_of(names_[e]);
    slots_[probe(names_[e], hash)] = (hash >> 32 << 32) | (e + 1);
  }
}

bool NameIndex::insert(std::string_view name, size_t value) {
  if ((names_.size() + 1) * 2 > slots_.size()) rehash(capacity_for(names_.size() + 1));
  const uint64_t hash = hash_of(name);
  uint64_t& slot = slots_[probe(name, hash)];
  if (slot != 0) return false;
  names_.push_back(name);
  values_.push_back(value);
  slot = (hash >> 32 << 32) | names_.size();
  return true;
}

std::optional<size_t> NameIndex::find(std::string_view name) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t slot = slots_[probe(name, hash_of(name))];
  if (slot == 0) return std::nullopt;
  return values_[static_cast<uint32_t>(slot) - 1];
}

}  // namespace devalloc
