// The asynchronous half of the host plugin: a FIFO of copies performed by one
// worker thread, which releases each source once it has been read.
#pragma once

#include <devalloc/plugin_abi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace devalloc::host {

// The duty to call on_release(user_data) exactly once. Moving hands the duty
// on; destruction fulfils it, so that every path out of a copy (success,
// Failure, bad_alloc, destroy) releases the source once.
class Release {
 public:
  Release() = default;
  Release(devalloc_release_fn fn, void* user_data) : fn_(fn), user_data_(user_data) {}
  Release(Release&& other) noexcept;
  Release& operator=(Release&& other) noexcept;
  Release(const Release&) = delete;
  Release& operator=(const Release&) = delete;
  ~Release() { fire(); }

  void fire() noexcept;

 private:
  devalloc_release_fn fn_ = nullptr;
  void* user_data_ = nullptr;
};

struct CopyJob {
  uint64_t dst = 0;
  const void* src = nullptr;
  uint64_t nbytes = 0;
  // Nonzero only in the host_late_read test variant, which must read a
  // during-call source late enough for the conformance suite to notice.
  std::chrono::milliseconds read_delay{0};
  Release release;
};

class CopyQueue {
 public:
  // Performs a job's copy; throws Failure when it cannot (the message is
  // kept for the next take_error()).
  using Perform = std::function<void(const CopyJob&)>;

  explicit CopyQueue(Perform perform);
  // Performs and releases every pending job, then joins the worker.
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  void push(CopyJob job);
  // Returns once every job pushed before the call has been performed and
  // released.
  void wait_for_earlier();
  // The failures of performed jobs since the last call, if any.
  std::optional<std::string> take_error();

 private:
  void run();
  void record_failure(const char* message) noexcept;

  Perform perform_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<CopyJob> jobs_;
  uint64_t pushed_ = 0;
  uint64_t done_ = 0;
  bool stopping_ = false;
  uint64_t failures_ = 0;
  std::string first_failure_;
  std::thread worker_;
};

}  // namespace devalloc::host
