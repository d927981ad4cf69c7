#include "copy_queue.hpp"

#include <plugin_support.hpp>

#include <exception>
#include <new>
#include <utility>

namespace devalloc::host {

Release::Release(Release&& other) noexcept
    : fn_(std::exchange(other.fn_, nullptr)),
      user_data_(std::exchange(other.user_data_, nullptr)) {}

Release& Release::operator=(Release&& other) noexcept {
  if (this != &other) {
    fire();
    fn_ = std::exchange(other.fn_, nullptr);
    user_data_ = std::exchange(other.user_data_, nullptr);
  }
  return *this;
}

void Release::fire() noexcept {
  if (auto fn = std::exchange(fn_, nullptr)) fn(user_data_);
}

CopyQueue::CopyQueue(Perform perform)
    : perform_(std::move(perform)), worker_([this] { run(); }) {}

CopyQueue::~CopyQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  worker_.join();
}

void CopyQueue::push(CopyJob job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    ++pushed_;
  }
  work_ready_.notify_one();
}

void CopyQueue::wait_for_earlier() {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = pushed_;
  work_done_.wait(lock, [&] { return done_ >= ticket; });
}

std::optional<std::string> CopyQueue::take_error() {
  std::lock_guard lock(mutex_);
  if (failures_ == 0) return std::nullopt;
  std::string message = failures_ == 1
                            ? std::move(first_failure_)
                            : std::to_string(failures_) +
                                  " queued copies failed; the first: " +
                                  first_failure_;
  failures_ = 0;
  first_failure_.clear();
  return message;
}

void CopyQueue::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // Pending jobs are still performed once stopping: destroy() promises
    // that every copy lands before its source is released.
    work_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    CopyJob job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    if (job.read_delay.count() > 0) std::this_thread::sleep_for(job.read_delay);
    try {
      perform_(job);
    } catch (const plugin::Failure& f) {
      record_failure(f.message.c_str());
    } catch (const std::exception& e) {
      record_failure(e.what());
    } catch (...) {
      record_failure("unknown exception");
    }
    job.release.fire();
    lock.lock();
    ++done_;
    work_done_.notify_all();
  }
}

void CopyQueue::record_failure(const char* message) noexcept {
  std::lock_guard lock(mutex_);
  if (failures_++ == 0) {
    try {
      first_failure_ = message;
    } catch (const std::bad_alloc&) {
      first_failure_.clear();
    }
  }
}

}  // namespace devalloc::host
