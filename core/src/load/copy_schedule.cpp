#include "copy_schedule.hpp"

#include "pipeline.hpp"

#include <devalloc/huge_pages.hpp>
#include <devalloc/no_exceptions.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

namespace devalloc {

PipelineOptions PipelineOptions::from(const LoadOptions& load) {
  PipelineOptions o;
  o.staging_bytes = load.staging_bytes;
  o.threads = load.threads;
  o.release_timeout = load.release_timeout;
  o.read = load.read;
  o.direct = load.direct;
  return o;
}

CopySchedule CopySchedule::build(std::vector<CopyRequest> requests) {
  CopySchedule schedule;
  // The schedule owns what its steps point at: buffers and mappings.
  schedule.requests_ = std::move(requests);
  std::map<std::pair<const Plugin*, uint32_t>, std::vector<const CopyRequest*>> by_device;
  for (const CopyRequest& r : schedule.requests_) {
    if (r.nbytes == 0) continue;
    auto& list = by_device[{r.buffer->device().plugin.get(), r.buffer->device().device}];
    // Most loads go to one device: room for all at once, not log2(N) copies.
    if (list.empty()) list.reserve(schedule.requests_.size());
    list.push_back(&r);
  }
  for (auto& [key, list] : by_device) {
    // File order gives sequential reads. Files are told apart by their
    // mapping, not by comparing paths N log N times.
    const auto in_file_order = [](const CopyRequest* a, const CopyRequest* b) {
      if (a->file != b->file) return std::less<>()(a->file.get(), b->file.get());
      return a->file_offset < b->file_offset;
    };
    // Plans mostly list a file's tensors in file order already.
    if (!std::is_sorted(list.begin(), list.end(), in_file_order)) {
      std::sort(list.begin(), list.end(), in_file_order);
    }
    DeviceCopyQueue queue;
    queue.device = list.front()->buffer->device();
    reserve_on_huge_pages(queue.steps, list.size());
    for (const CopyRequest* request : list) {
      const CopyRequest& r = *request;
      ++queue.tensors;
      queue.bytes += r.nbytes;
      if (!queue.steps.empty() && r.run_bytes == 0) {
        CopyStep& m = queue.steps.back();
        if (m.run_bytes == 0 && m.file == r.file.get() && m.buffer == r.buffer.get() &&
            m.file_offset + m.nbytes == r.file_offset &&
            m.buffer_offset + m.nbytes == r.buffer_offset) {
          m.nbytes += r.nbytes;
          m.last_tensor = r.tensor;
          continue;
        }
      }
      queue.steps.push_back(CopyStep{r.buffer.get(), r.buffer_offset, r.file.get(),
                                     r.file_offset, r.nbytes, r.tensor, r.tensor, r.run_bytes,
                                     r.file_stride});
    }
    schedule.queues_.push_back(std::move(queue));
  }
  return schedule;
}

uint64_t CopySchedule::range_count() const {
  uint64_t n = 0;
  for (const auto& q : queues_) n += q.steps.size();
  return n;
}

Status CopySchedule::execute(const PipelineOptions& options,
                             std::vector<DeviceLoadStats>* stats,
                             PipelineStats* pipeline,
                             const LoadProgress& progress) const {
  return detail::without_exceptions("copying", [&] {
    load::Pipeline run(requests_, queues_, options, progress);
    return run.run(stats, pipeline);
  });
}

}  // namespace devalloc
