// A move-only callable, for work that owns what cannot be copied (a
// Release, a promise): std::function requires a copyable target, and C++20
// has no std::move_only_function.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace devalloc::plugin {

template <class Signature>
class UniqueFunction;

template <class Result, class... Args>
class UniqueFunction<Result(Args...)> {
 public:
  UniqueFunction() noexcept = default;
  UniqueFunction(std::nullptr_t) noexcept {}
  // Takes f by move (or copy); throws bad_alloc, with f's copy untouched.
  template <class F>
  requires(!std::same_as<std::remove_cvref_t<F>, UniqueFunction> &&
           std::is_invocable_r_v<Result, std::decay_t<F>&, Args...>) UniqueFunction(F&& f)
      : target_(std::make_unique<Target<std::decay_t<F>>>(std::forward<F>(f))) {}

  UniqueFunction(UniqueFunction&&) noexcept = default;
  UniqueFunction& operator=(UniqueFunction&&) noexcept = default;
  UniqueFunction(const UniqueFunction&) = delete;
  UniqueFunction& operator=(const UniqueFunction&) = delete;
  // Destroys the target (and what it owns) now.
  UniqueFunction& operator=(std::nullptr_t) noexcept {
    target_.reset();
    return *this;
  }

  explicit operator bool() const noexcept { return target_ != nullptr; }

  // Not on an empty UniqueFunction.
  Result operator()(Args... args) { return target_->call(std::forward<Args>(args)...); }

 private:
  struct Callable {
    virtual ~Callable() = default;
    virtual Result call(Args&&... args) = 0;
  };
  template <class F>
  struct Target final : Callable {
    template <class G>
    explicit Target(G&& g) : f(std::forward<G>(g)) {}
    Result call(Args&&... args) override {
      if constexpr (std::is_void_v<Result>) {
        std::invoke(f, std::forward<Args>(args)...);
      } else {
        return std::invoke(f, std::forward<Args>(args)...);
      }
    }
    F f;
  };

  std::unique_ptr<Callable> target_;
};

}  // namespace devalloc::plugin
