// A plan's tensors by name, for lookups that mostly come in plan order (a
// method lists its tensors as the plan does): each name is first compared
// with the tensor at `guess`, the one after the last found, and only a miss
// builds the name index. With names repeated (which validate_plan
// refuses), the guess may pick a later tensor of the name, the index the
// first.
#pragma once

#include <devalloc/core/name_index.hpp>
#include <devalloc/core/plan.hpp>

#include <cstddef>
#include <optional>
#include <string_view>

namespace devalloc::detail {

class TensorsByName {
 public:
  explicit TensorsByName(const Plan& plan) : plan_(plan) {}

  std::optional<size_t> find(std::string_view name, size_t guess) {
    if (guess < plan_.tensors.size() && plan_.tensors[guess].name == name) return guess;
    if (index_.empty() && !plan_.tensors.empty()) {
      index_.reserve(plan_.tensors.size());
      for (size_t i = 0; i < plan_.tensors.size(); ++i) index_.insert(plan_.tensors[i].name, i);
    }
    return index_.find(name);
  }

 private:
  const Plan& plan_;
  NameIndex index_;  // built at the first miss
};

}  // namespace devalloc::detail
