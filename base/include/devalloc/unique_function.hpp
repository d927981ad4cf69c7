// A move-only callable: what std::move_only_function (C++23) is, for C++20.
// It holds callables that cannot be copied (one that owns a unique_ptr or
// another UniqueFunction), and keeps small ones (up to kInlineBytes, nothrow
// movable) in place, so that a completion handed over per copy allocates
// nothing.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace devalloc {

template <class Signature>
class UniqueFunction;

template <class R, class... Args>
class UniqueFunction<R(Args...)> {
 public:
  static constexpr size_t kInlineBytes = 48;

  UniqueFunction() noexcept = default;
  UniqueFunction(std::nullptr_t) noexcept {}

  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, UniqueFunction> &&
                                              std::is_invocable_r_v<R, std::decay_t<F>&, Args...>>>
  UniqueFunction(F&& f) {  // NOLINT(google-explicit-constructor): a callable converts
    using Stored = std::decay_t<F>;
    if constexpr (fits_inline<Stored>()) {
      ::new (static_cast<void*>(storage_)) Stored(std::forward<F>(f));
      ops_ = &kInlineOps<Stored>;
    } else {
      *reinterpret_cast<Stored**>(storage_) = new Stored(std::forward<F>(f));
      ops_ = &kHeapOps<Stored>;
    }
  }

  UniqueFunction(UniqueFunction&& other) noexcept { take(other); }
  UniqueFunction& operator=(UniqueFunction&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  UniqueFunction(const UniqueFunction&) = delete;
  UniqueFunction& operator=(const UniqueFunction&) = delete;
  ~UniqueFunction() { reset(); }
  // Destroys the target (and what it owns) now.
  UniqueFunction& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  // Calling an empty one is the caller's bug: it is checked before.
  R operator()(Args... args) { return ops_->call(storage_, std::forward<Args>(args)...); }

  void reset() noexcept {
    if (ops_ != nullptr) {
      ops_->destroy(storage_);
      ops_ = nullptr;
    }
  }

 private:
  struct Ops {
    R (*call)(void* storage, Args&&... args);
    void (*move)(void* from, void* to) noexcept;  // construct at `to`, destroy `from`
    void (*destroy)(void* storage) noexcept;
  };

  template <class Stored>
  static constexpr bool fits_inline() {
    return sizeof(Stored) <= kInlineBytes && alignof(Stored) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<Stored>;
  }

  template <class Stored>
  static constexpr Ops kInlineOps = {
      [](void* s, Args&&... args) -> R {
        return (*std::launder(static_cast<Stored*>(s)))(std::forward<Args>(args)...);
      },
      [](void* from, void* to) noexcept {
        Stored* f = std::launder(static_cast<Stored*>(from));
        ::new (to) Stored(std::move(*f));
        f->~Stored();
      },
      [](void* s) noexcept { std::launder(static_cast<Stored*>(s))->~Stored(); }};

  template <class Stored>
  static constexpr Ops kHeapOps = {
      [](void* s, Args&&... args) -> R {
        return (**static_cast<Stored**>(s))(std::forward<Args>(args)...);
      },
      [](void* from, void* to) noexcept {
        *static_cast<Stored**>(to) = *static_cast<Stored**>(from);
      },
      [](void* s) noexcept { delete *static_cast<Stored**>(s); }};

  void take(UniqueFunction& other) noexcept {
    if (other.ops_ != nullptr) {
      other.ops_->move(other.storage_, storage_);
      ops_ = other.ops_;
      other.ops_ = nullptr;
    }
  }

  alignas(std::max_align_t) unsigned char storage_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

}  // namespace devalloc
