#include "work_queue.hpp"

#include <chrono>
#include <cstring>

namespace devalloc::fake {

WorkQueue::WorkQueue(const PauseSwitch& pause) : pause_(pause), worker_([this] { run(); }) {}

WorkQueue::~WorkQueue() { stop(); }

uint64_t WorkQueue::enqueue(std::function<void()> op) {
  std::lock_guard lock(mutex_);
  queue_.push_back(std::move(op));
  wake_.notify_one();
  return ++enqueued_;
}

void WorkQueue::wait_for(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return completed_ >= ticket; });
}

void WorkQueue::wait_idle() {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    ticket = enqueued_;
  }
  wait_for(ticket);
}

bool WorkQueue::busy() {
  std::lock_guard lock(mutex_);
  return completed_ != enqueued_;
}

void WorkQueue::wake() {
  std::lock_guard lock(mutex_);
  wake_.notify_one();
}

void WorkQueue::stop() {
  {
    std::lock_guard lock(mutex_);
    if (!worker_.joinable()) return;
    stopping_ = true;
    wake_.notify_one();
  }
  worker_.join();
}

void WorkQueue::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || (!queue_.empty() && !pause_.paused()); });
    if (queue_.empty()) return;
    auto op = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    op();
    lock.lock();
    ++completed_;
    idle_.notify_all();
  }
}

uint64_t hash_bytes(const void* data, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ word) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

namespace {
const auto kStart = std::chrono::steady_clock::now();
}

double milliseconds_since_start() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - kStart)
      .count();
}

SourceSnapshot::SourceSnapshot(const void* src, size_t n)
    : src_(src), n_(n), hash_(hash_bytes(src, n)), issued_at_ms_(milliseconds_since_start()) {}

bool SourceSnapshot::unchanged() const { return hash_bytes(src_, n_) == hash_; }

}  // namespace devalloc::fake
