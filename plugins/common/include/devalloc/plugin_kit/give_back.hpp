// Runtime calls whose failure no one can be told of: those on destroy paths
// and in scope guards, which give back what the plugin took (free memory,
// destroy a stream or an event, release a context, pop a context or restore
// the caller's device). One failure there may be transient, and giving up
// at once leaks the object, or leaves the caller's thread changed, for
// good; so such a call is tried again, a few times. Only one that keeps
// failing leaves its object to the runtime.
#pragma once

namespace devalloc::plugin {

inline constexpr int kGiveBackAttempts = 3;

// Calls call() until it returns the runtime's success (0: CUDA_SUCCESS,
// hipSuccess, ZE_RESULT_SUCCESS), at most kGiveBackAttempts times; returns
// the last result.
template <class Call>
auto give_back(Call&& call) {
  auto result = call();
  for (int attempt = 1; attempt < kGiveBackAttempts && result != decltype(result){};
       ++attempt) {
    result = call();
  }
  return result;
}

}  // namespace devalloc::plugin
