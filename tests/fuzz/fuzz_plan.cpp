// A plan file from the fuzz input: read, then validated without sources.
#include <devalloc/core/plan.hpp>

#include "memory_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto plan = devalloc::read_plan(file.path());
  if (!plan.ok()) {
    devalloc::fuzz::check_names_file(plan.status().message(), file.path());
    return 0;
  }
  devalloc::PlanValidationOptions options;
  options.check_sources = false;
  if (devalloc::Status s = devalloc::validate_plan(*plan, options); !s.ok()) {
    devalloc::fuzz::check_names_file(s.message(), file.path());
  }
  return 0;
}
