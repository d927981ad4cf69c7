// PLUGIN-18: staging memory from a plugin's allocate_host is the host's
// until it calls free_host. A plugin that hands out memory it gave before
// and the host still holds (a pool that reuses a buffer in use) would have
// the host write one piece over another that a copy still reads: wrong
// bytes on the device, silently. Plugin::allocate_host checks every buffer
// against those held, process-wide: callers run side by side, and
// instances of one library may share a pool.
#pragma once

#include <cstdint>
#include <string>

namespace devalloc {
class Plugin;
}

namespace devalloc::detail {

// Records [at, at + nbytes) as held by `plugin`, or says which held buffer
// it overlaps ("[0x.., 0x..), which plugin NAME gave"; "" when none, and
// recorded). Throws (an allocation) with nothing recorded.
std::string hold_staging(const void* at, uint64_t nbytes, const Plugin* plugin);
// The buffer that starts at `at` is no longer held.
void let_go_of_staging(const void* at);
// Every buffer `plugin` gave is no longer held (its instance was destroyed).
void let_go_of_staging_of(const Plugin* plugin);

}  // namespace devalloc::detail
