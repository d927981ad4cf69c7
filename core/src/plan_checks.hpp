// Checks of a plan that both validate_plan and every load make: a load
// must not depend on its caller having validated the plan for the bytes
// it places to be right.
#pragma once

#include <devalloc/core/plan.hpp>

namespace devalloc::detail {

// invalid_argument naming the first constant whose bytes overlap another
// constant's in the same buffer, over the whole plan (not one method's
// tensors: a method loaded later must not overwrite an earlier one's):
// "plan.json: /tensors/1 \"b\": bytes [32, 96) of buffer 0 overlap
// /tensors/0 \"a\" at [0, 64)". Linear when each buffer's constants are
// listed in offset order, n log n otherwise.
Status check_constant_overlaps(const Plan& plan);

}  // namespace devalloc::detail
