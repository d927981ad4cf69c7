// A name -> index table over names that are stored elsewhere (the strings
// of a vector that does not change while the table is used). One flat
// array with open addressing: no allocation per name, which for the
// 100 000 tensor names of a large checkpoint is most of what a node-based
// map costs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace devalloc {

class NameIndex {
 public:
  // Room for `count` names without growing.
  void reserve(size_t count);
  // Adds name -> index; false (and no change) when the name is already
  // there, so the first of equal names stays. `name` must outlive the table.
  bool insert(std::string_view name, size_t index);
  std::optional<size_t> find(std::string_view name) const;
  size_t size() const { return names_.size(); }
  bool empty() const { return names_.empty(); }
  void clear();

 private:
  // The slot of `name`, or the empty one where it would go.
  size_t probe(std::string_view name, uint64_t hash) const;
  void rehash(size_t capacity);

  // Entries in insertion order; a slot holds an entry number + 1 (0: empty)
  // in its low half and the top bits of the name's hash in its high half.
  // Fewer than 2^32 entries (a safetensors header of 100 MB holds about
  // 2.5 million).
  std::vector<std::string_view> names_;
  std::vector<size_t> values_;
  std::vector<uint64_t> slots_;  // a power of two in size, at most half full
};

}  // namespace devalloc
