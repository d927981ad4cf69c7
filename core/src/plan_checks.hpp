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

// invalid_argument naming the first name, device tag or source path longer
// than the plan format allows (kMaxPlanNameBytes, kMaxPlanPathBytes,
// kMaxDeviceTagBytes), in file order, repeating only its first bytes:
// "plan.json: /tensors/0 \"w\": source file \"././...\" (10485760 bytes)
// is longer than a path may be (4095 bytes)". Linear in the plan; made
// before anything resolves a path or looks a tag up.
Status check_plan_limits(const Plan& plan);

}  // namespace devalloc::detail
