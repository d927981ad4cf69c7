// One worker thread that completes queued work in order and then fires its
// release: for runtimes without completion callbacks, whose completion is
// observed by waiting on (or polling) an event, and for plugins that perform
// copies themselves later. Failures are kept for the next take_error(), so
// that synchronize reports them once and clears them.
#pragma once

#include <devalloc/plugin_kit/release.hpp>
#include <devalloc/plugin_kit/unique_function.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace devalloc::plugin {

class CompletionThread {
 public:
  // Waits until one piece of work is over (an event signalled, a copy
  // performed); throws Failure when it failed. Runs on the worker thread,
  // once; move-only, so that it may own what the work needs (a Release, a
  // promise), and destroyed on the worker once it has run.
  using Complete = UniqueFunction<void()>;

  CompletionThread();
  // Completes and releases every pending job, then joins the worker.
  ~CompletionThread();
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  // Queues complete; release fires after it returned or threw. Throws
  // bad_alloc, firing the release: call before submitting the work, or
  // wait for the work before letting the exception go.
  void push(Complete complete, Release release);
  // Returns once every job pushed before the call has completed and
  // released.
  void wait_for_earlier() noexcept;
  // The failures of completed jobs since the last call, if any.
  std::optional<std::string> take_error();

 private:
  struct Job {
    Complete complete;
    Release release;
  };
  void run() noexcept;
  void record_failure(const char* message) noexcept;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<Job> jobs_;
  uint64_t pushed_ = 0;
  uint64_t done_ = 0;
  bool stopping_ = false;
  uint64_t failures_ = 0;
  std::string first_failure_;
  std::thread worker_;
};

}  // namespace devalloc::plugin
