// A fake stream (or queue): one thread that runs its work in order, later
// than it was issued, so that asynchronous work really finishes after the
// call that queued it. All queues of a fake pause together, so that a test
// can hold work back and look at what the plugin did meanwhile.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace devalloc::fake {

// The pause switch shared by every queue of one fake.
class PauseSwitch {
 public:
  bool paused() const { return paused_.load(); }
  void set(bool paused) { paused_ = paused; }

 private:
  std::atomic<bool> paused_{false};
};

class WorkQueue {
 public:
  explicit WorkQueue(const PauseSwitch& pause);
  // stop(), if not done yet.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues op; returns its ticket for wait_for.
  uint64_t enqueue(std::function<void()> op);
  // Returns once the work with this ticket (and all before it) has run.
  void wait_for(uint64_t ticket);
  // Returns once everything queued before the call has run.
  void wait_idle();
  // True while queued work has not run yet.
  bool busy();
  // Wakes the worker after the pause switch turned off.
  void wake();
  // Runs what is queued (even when paused: the switch is ignored from now
  // on), then joins the worker.
  void stop();

 private:
  void run();

  const PauseSwitch& pause_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// Word-wise FNV-1a: fast enough to hash every source twice.
uint64_t hash_bytes(const void* data, size_t n);

// The source-lifetime checker: a source's hash when its copy was issued,
// compared with its hash when the copy reads it.
class SourceSnapshot {
 public:
  SourceSnapshot(const void* src, size_t n);
  // False when the bytes changed since the snapshot.
  bool unchanged() const;
  double issued_at_ms() const { return issued_at_ms_; }

 private:
  const void* src_;
  size_t n_;
  uint64_t hash_;
  double issued_at_ms_;
};

// Milliseconds since the fake was loaded, for messages.
double milliseconds_since_start();

}  // namespace devalloc::fake
