// One load_methods call up to its commit, as named steps:
//   resolve   the methods' buffers, tensors and files; every tensor's id and
//             extent inside its buffer (a plan built in code skipped
//             validate_plan)
//   place     the buffers not yet live onto devices; the fit check
//   allocate  them (the plugin handle refuses overlapping ones, PLUGIN-11/12)
//   gather    the copy requests of constants not yet on their device,
//             each checked against the header the copies take offsets from
//   execute   the copy schedule (every device synchronized), then verify
// Any failure returns before the commit, and the buffers it allocated are
// freed with the transaction. LoadedProgram commits the result under its
// lock (runtime.cpp).
#pragma once

#include "copy_schedule.hpp"

#include "../file_check.hpp"

#include <devalloc/core/config.hpp>
#include <devalloc/core/load_report.hpp>
#include <devalloc/core/placement.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/status.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace devalloc::load {

using BufferMap = std::map<uint32_t, std::shared_ptr<DeviceBuffer>>;

class LoadTransaction {
 public:
  // `live`: the program's buffers; `filled(i)`: plan tensor i's constant is
  // on its device already. Both outlive the transaction and do not change
  // during it (the program's load lock is held).
  LoadTransaction(const Plan& plan, const LoadOptions& options, DeviceRegistry& registry,
                  const BufferMap& live, std::function<bool(size_t)> filled);

  Status resolve(const std::vector<std::string>& methods);
  Status place();
  Status allocate();
  Status gather(SafetensorsCache& sources);
  Status execute(const LoadProgress& progress, bool verify);

  // For the commit and the report.
  MethodNeeds& needs() { return *needs_; }
  BufferMap& fresh() { return fresh_; }
  // Plan index of each constant copied.
  const std::vector<size_t>& copied_tensors() const { return request_tensor_; }
  // The report's figures, without the time and the allocations.
  LoadReport report() const;

 private:
  const Plan& plan_;
  const LoadOptions& options_;
  DeviceRegistry& registry_;
  const BufferMap& live_;
  std::function<bool(size_t)> filled_;
  std::optional<MethodNeeds> needs_;
  std::vector<BufferPlacement> placements_;
  BufferMap fresh_;
  std::vector<std::shared_ptr<const SafetensorsFile>> opened_;  // by needs_->files index
  // A source file whose plan check held (file_check.hpp): mapped, its
  // header not read. By needs_->files index; none for the others.
  std::vector<detail::PlannedFile> planned_;
  std::optional<CopySchedule> schedule_;
  std::vector<size_t> request_tensor_;
  std::vector<DeviceLoadStats> stats_;
  PipelineStats pipeline_;
  bool verified_ = false;
};

}  // namespace devalloc::load
