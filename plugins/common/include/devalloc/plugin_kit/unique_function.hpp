// The kit's move-only callable is devalloc's own (devalloc/unique_function.hpp,
// header-only, installed with the kit's headers): work that owns what cannot
// be copied (a Release, a promise), which std::function cannot hold.
#pragma once

#include <devalloc/unique_function.hpp>

namespace devalloc::plugin {
using devalloc::UniqueFunction;
}  // namespace devalloc::plugin
