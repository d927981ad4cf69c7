// A plan file from the fuzz input: read, then validated without sources,
// and for a plan for several ranks, a rank's view taken.
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/plan.hpp>

#include "memory_file.hpp"

#include <cstdlib>
#include <string>

namespace {

// The fast plan reader may take a text or leave it to the strict one, but
// what read_plan returns must be what the strict reader alone returns.
void check_same_as_strict(const devalloc::Result<devalloc::Plan>& plan, const std::string& path) {
  auto strict = devalloc::read_plan(path, devalloc::detail::PlanReading::strict);
  if (plan.ok() != strict.ok()) std::abort();
  if (!plan.ok()) {
    if (plan.status().message() != strict.status().message()) std::abort();
    return;
  }
  const devalloc::Plan& a = *plan;
  const devalloc::Plan& b = *strict;
  if (a.allow_external_files != b.allow_external_files || a.world_size != b.world_size ||
      a.buffers.size() != b.buffers.size() ||
      a.tensors.size() != b.tensors.size() || a.methods.size() != b.methods.size()) {
    std::abort();
  }
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    const auto& x = a.buffers[i];
    const auto& y = b.buffers[i];
    if (x.memory_id != y.memory_id || x.device != y.device || x.size != y.size ||
        x.alignment != y.alignment || x.rank != y.rank) {
      std::abort();
    }
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape ||
        x.memory_id != y.memory_id || x.offset != y.offset ||
        x.source.has_value() != y.source.has_value() ||
        (x.source && (x.source->file != y.source->file || x.source->key != y.source->key ||
                      x.source->slice.has_value() != y.source->slice.has_value() ||
                      (x.source->slice && (x.source->slice->dim != y.source->slice->dim ||
                                           x.source->slice->start != y.source->slice->start ||
                                           x.source->slice->length != y.source->slice->length))))) {
      std::abort();
    }
  }
  for (size_t i = 0; i < a.methods.size(); ++i) {
    const auto& x = a.methods[i];
    const auto& y = b.methods[i];
    if (x.name != y.name || x.memory_ids != y.memory_ids || x.tensors != y.tensors) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto plan = devalloc::read_plan(file.path());
  check_same_as_strict(plan, file.path());
  if (!plan.ok()) {
    devalloc::fuzz::check_names_file(plan.status().message(), file.path());
    return 0;
  }
  devalloc::PlanValidationOptions options;
  options.check_sources = false;
  if (devalloc::Status s = devalloc::validate_plan(*plan, options); !s.ok()) {
    devalloc::fuzz::check_names_file(s.message(), file.path());
  }
  // A rank's view of a plan for several ranks: refused or a plan.
  if (plan->world_size != 0) {
    (void)devalloc::plan_for_rank(*plan, devalloc::JobRank{plan->world_size - 1,
                                                           plan->world_size, 0, "fuzz"});
  }
  return 0;
}
