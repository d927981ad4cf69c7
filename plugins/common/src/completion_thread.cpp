#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/error.hpp>

#include <exception>
#include <new>
#include <utility>

namespace devalloc::plugin {

CompletionThread::CompletionThread() : worker_([this] { run(); }) {}

CompletionThread::~CompletionThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  worker_.join();
}

void CompletionThread::push(Complete complete, Release release) {
  {
    std::lock_guard lock(mutex_);
    // Filled once it is in, as in ReleaseQueue::push: if making room
    // throws, the release fires with the parameter, outside the lock.
    jobs_.push_back(Job{});
    jobs_.back().complete = std::move(complete);
    jobs_.back().release = std::move(release);
    ++pushed_;
  }
  work_ready_.notify_one();
}

void CompletionThread::wait_for_earlier() noexcept {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = pushed_;
  work_done_.wait(lock, [&] { return done_ >= ticket; });
}

std::optional<std::string> CompletionThread::take_error() {
  std::lock_guard lock(mutex_);
  if (failures_ == 0) return std::nullopt;
  std::string message = failures_ == 1 ? std::move(first_failure_)
                                       : std::to_string(failures_) +
                                             " queued operations failed; the first: " +
                                             first_failure_;
  failures_ = 0;
  first_failure_.clear();
  return message;
}

void CompletionThread::run() noexcept {
  std::unique_lock lock(mutex_);
  for (;;) {
    // Pending jobs still complete once stopping: destroy() promises that
    // every copy is over before its source is released.
    work_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    try {
      job.complete();
    } catch (const Failure& f) {
      record_failure(f.message.c_str());
    } catch (const std::exception& e) {
      record_failure(e.what());
    } catch (...) {
      record_failure("unknown exception");
    }
    job.release.fire();
    job.complete = nullptr;
    lock.lock();
    ++done_;
    work_done_.notify_all();
  }
}

void CompletionThread::record_failure(const char* message) noexcept {
  std::lock_guard lock(mutex_);
  if (failures_++ == 0) {
    try {
      first_failure_ = message;
    } catch (const std::bad_alloc&) {
      first_failure_.clear();
    }
  }
}

}  // namespace devalloc::plugin
