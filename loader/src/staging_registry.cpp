#include "staging_registry.hpp"

#include <devalloc/address_text.hpp>
#include <devalloc/plugin.hpp>

#include <iterator>
#include <map>
#include <mutex>

namespace devalloc::detail {

namespace {

struct HeldStaging {
  uintptr_t end = 0;
  std::string plugin;    // its name, for the message
  const Plugin* owner;   // the instance that gave it
};

std::mutex g_staging_mutex;
std::map<uintptr_t, HeldStaging>& held_staging() {  // by start
  static auto* held = new std::map<uintptr_t, HeldStaging>();
  return *held;
}

}  // namespace

std::string hold_staging(const void* at, uint64_t nbytes, const Plugin* plugin) {
  const auto begin = reinterpret_cast<uintptr_t>(at);
  // A range that would run past the address space overlaps what is at its
  // start: it is clamped, never wrapped.
  const uintptr_t end = nbytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + nbytes;
  std::lock_guard lock(g_staging_mutex);
  auto& held = held_staging();
  // Sorted by start: if any held buffer overlaps, the first one starting
  // at or after begin does, or the one before it.
  auto next = held.lower_bound(begin);
  auto overlapping = held.end();
  if (next != held.end() && next->first < end) {
    overlapping = next;
  } else if (next != held.begin() && std::prev(next)->second.end > begin) {
    overlapping = std::prev(next);
  }
  if (overlapping != held.end()) {
    return address_range(overlapping->first, overlapping->second.end) + ", which plugin " +
           overlapping->second.plugin + " gave";
  }
  held.emplace(begin, HeldStaging{end, plugin->name(), plugin});
  return std::string();
}

void let_go_of_staging(const void* at) {
  std::lock_guard lock(g_staging_mutex);
  held_staging().erase(reinterpret_cast<uintptr_t>(at));
}

void let_go_of_staging_of(const Plugin* plugin) {
  std::lock_guard lock(g_staging_mutex);
  auto& held = held_staging();
  for (auto it = held.begin(); it != held.end();) {
    it = it->second.owner == plugin ? held.erase(it) : std::next(it);
  }
}

}  // namespace devalloc::detail
