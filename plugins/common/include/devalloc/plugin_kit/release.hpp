// The duty to call one copy's on_release(user_data) exactly once (PLUGIN-14).
#pragma once

#include <devalloc/plugin_abi.h>

#include <utility>

namespace devalloc::plugin {

// Moving hands the duty on; destruction fulfils it, so that every path out
// of a copy (success, Failure, bad_alloc, destroy) releases the source once.
// An empty Release (no function) does nothing.
class Release {
 public:
  Release() = default;
  Release(devalloc_release_fn fn, void* user_data) noexcept : fn_(fn), user_data_(user_data) {}
  Release(Release&& other) noexcept
      : fn_(std::exchange(other.fn_, nullptr)), user_data_(std::exchange(other.user_data_, nullptr)) {}
  Release& operator=(Release&& other) noexcept {
    if (this != &other) {
      fire();
      fn_ = std::exchange(other.fn_, nullptr);
      user_data_ = std::exchange(other.user_data_, nullptr);
    }
    return *this;
  }
  Release(const Release&) = delete;
  Release& operator=(const Release&) = delete;
  ~Release() { fire(); }

  explicit operator bool() const noexcept { return fn_ != nullptr; }

  void fire() noexcept {
    if (auto fn = std::exchange(fn_, nullptr)) fn(user_data_);
  }

 private:
  devalloc_release_fn fn_ = nullptr;
  void* user_data_ = nullptr;
};

}  // namespace devalloc::plugin
