#include <devalloc/core/copy_schedule.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace devalloc {

namespace {

// Host bytes that plugins may still read, across all devices.
class InFlightBudget {
 public:
  explicit InFlightBudget(uint64_t limit) : limit_(limit) {}

  void acquire(uint64_t n) {
    std::unique_lock lock(mutex_);
    // A step larger than the budget runs alone rather than never.
    cv_.wait(lock, [&] { return used_ == 0 || used_ + n <= limit_; });
    used_ += n;
    ++outstanding_;
  }
  void release(uint64_t n) {
    {
      std::lock_guard lock(mutex_);
      used_ -= n;
      --outstanding_;
    }
    cv_.notify_all();
  }
  void wait_all_released() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return outstanding_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t limit_;
  uint64_t used_ = 0;
  uint64_t outstanding_ = 0;
};

struct Release {
  InFlightBudget* budget;
  uint64_t nbytes;
};

extern "C" void on_step_released(void* user_data) {
  auto* r = static_cast<Release*>(user_data);
  r->budget->release(r->nbytes);
}

std::string tensors_text(const CopyStep& s) {
  if (s.first_tensor == s.last_tensor) return "\"" + s.first_tensor + "\"";
  return "\"" + s.first_tensor + "\" .. \"" + s.last_tensor + "\"";
}

std::string range_text(const CopyStep& s) {
  return "bytes " + std::to_string(s.buffer_offset) + ".." +
         std::to_string(s.buffer_offset + s.nbytes) + " of buffer " +
         std::to_string(s.buffer->memory_id());
}

}  // namespace

CopySchedule CopySchedule::build(std::vector<CopyRequest> requests,
                                 uint64_t max_step_bytes) {
  max_step_bytes = std::max<uint64_t>(max_step_bytes, 1);
  CopySchedule schedule;
  // The schedule owns what its steps point at: buffers and mappings.
  schedule.requests_ = std::move(requests);
  std::map<std::pair<const Plugin*, uint32_t>, std::vector<const CopyRequest*>> by_device;
  for (const CopyRequest& r : schedule.requests_) {
    if (r.nbytes == 0) continue;
    by_device[{r.buffer->device().plugin.get(), r.buffer->device().device}].push_back(&r);
  }
  for (auto& [key, list] : by_device) {
    // File order gives sequential reads.
    std::sort(list.begin(), list.end(), [](const CopyRequest* a, const CopyRequest* b) {
      if (a->file != b->file) return a->file->path() < b->file->path();
      return a->file_offset < b->file_offset;
    });
    DeviceCopyQueue queue;
    queue.device = list.front()->buffer->device();
    std::vector<CopyStep> merged;
    for (const CopyRequest* request : list) {
      const CopyRequest& r = *request;
      ++queue.tensors;
      queue.bytes += r.nbytes;
      if (!merged.empty()) {
        CopyStep& m = merged.back();
        if (m.file == r.file.get() && m.buffer == r.buffer.get() &&
            m.file_offset + m.nbytes == r.file_offset &&
            m.buffer_offset + m.nbytes == r.buffer_offset) {
          m.nbytes += r.nbytes;
          m.last_tensor = r.tensor;
          continue;
        }
      }
      merged.push_back(CopyStep{r.buffer.get(), r.buffer_offset, r.file.get(),
                                r.file_offset, r.nbytes, r.tensor, r.tensor});
    }
    for (const CopyStep& m : merged) {
      for (uint64_t done = 0; done < m.nbytes; done += max_step_bytes) {
        CopyStep chunk = m;
        chunk.buffer_offset += done;
        chunk.file_offset += done;
        chunk.nbytes = std::min(max_step_bytes, m.nbytes - done);
        queue.steps.push_back(std::move(chunk));
      }
    }
    schedule.queues_.push_back(std::move(queue));
  }
  return schedule;
}

uint64_t CopySchedule::step_count() const {
  uint64_t n = 0;
  for (const auto& q : queues_) n += q.steps.size();
  return n;
}

Status CopySchedule::execute(uint64_t staging_bytes, uint32_t threads,
                             std::vector<DeviceLoadStats>* stats,
                             const LoadProgress& progress) const {
  InFlightBudget budget(std::max<uint64_t>(staging_bytes, 1));
  uint64_t total = 0;
  for (const auto& q : queues_) total += q.bytes;
  std::atomic<uint64_t> issued{0};
  std::atomic<bool> stop{false};
  std::vector<Status> results(queues_.size());
  std::vector<DeviceLoadStats> per_device(queues_.size());
  // One Release per step, stable for the plugins' callbacks.
  std::vector<std::vector<Release>> releases(queues_.size());

  auto load_device = [&](size_t qi) {
    const DeviceCopyQueue& q = queues_[qi];
    Plugin& plugin = *q.device.plugin;
    const uint32_t device = q.device.device;
    DeviceLoadStats& st = per_device[qi];
    st.device = q.device;
    st.tensors = q.tensors;
    st.bytes = q.bytes;
    releases[qi].reserve(q.steps.size());
    const auto start = std::chrono::steady_clock::now();
    Status failure;
    for (const CopyStep& s : q.steps) {
      if (stop.load()) break;
      budget.acquire(s.nbytes);
      releases[qi].push_back(Release{&budget, s.nbytes});
      Status status = plugin.copy_to_device_until_released(
          device, s.buffer->address() + s.buffer_offset,
          s.file->data() + s.file_offset, s.nbytes, on_step_released,
          &releases[qi].back());
      ++st.copies;
      if (progress) progress(issued += s.nbytes, total);
      if (!status.ok()) {
        failure = status.with_context("copying tensor " + tensors_text(s) + " (" +
                                      range_text(s) + ") from " +
                                      s.file->path().string() + " to " +
                                      q.device.describe());
        stop = true;
        break;
      }
    }
    Status synced = plugin.synchronize(device);
    if (failure.ok() && !synced.ok()) {
      failure = synced.with_context("synchronizing " + q.device.describe());
      stop = true;
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                     .count();
    results[qi] = failure;
  };

  const size_t n = queues_.size();
  const size_t workers = threads == 0 ? n : std::min<size_t>(threads, n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t qi = next++; qi < n; qi = next++) load_device(qi);
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < workers; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  // Every step was released by its plugin (PLUGIN-14, PLUGIN-17) before the
  // mappings may go.
  budget.wait_all_released();

  if (stats != nullptr) *stats = per_device;
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return Status();
}

}  // namespace devalloc
