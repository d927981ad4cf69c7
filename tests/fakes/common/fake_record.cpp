#include "fake_record.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace devalloc::fake {
namespace {

// text into buf, truncated to cap bytes including the NUL (buf may be NULL
// when cap is 0).
void write_text(const std::string& text, char* buf, size_t cap) {
  if (buf == nullptr || cap == 0) return;
  const size_t n = std::min(text.size(), cap - 1);
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

}  // namespace

void FakeRecord::violation(const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  std::lock_guard lock(mutex_);
  violations_.emplace_back(text);
}

std::optional<int> FakeRecord::enter(const char* name) {
  std::lock_guard lock(mutex_);
  ++calls_[name];
  auto it = fail_.find(name);
  if (it == fail_.end()) return std::nullopt;
  if (it->second.skip > 0) {
    --it->second.skip;
    return std::nullopt;
  }
  const int result = it->second.result;
  if (--it->second.remaining <= 0) fail_.erase(it);
  return result;
}

void FakeRecord::fail_calls(const char* entry_point, int result, int count, int skip) {
  std::lock_guard lock(mutex_);
  if (count <= 0) {
    fail_.erase(entry_point);
  } else {
    fail_[entry_point] = Injected{result, count, skip > 0 ? skip : 0};
  }
}

void FakeRecord::null_result_next(const char* entry_point) {
  std::lock_guard lock(mutex_);
  ++null_results_[entry_point];
}

bool FakeRecord::take_null_result(const char* name) { return take_one(null_results_, name); }

void FakeRecord::ignore_alignment_next(const char* entry_point) {
  std::lock_guard lock(mutex_);
  ++ignored_alignments_[entry_point];
}

bool FakeRecord::take_ignore_alignment(const char* name) {
  return take_one(ignored_alignments_, name);
}

bool FakeRecord::take_one(std::map<std::string, int>& armed, const char* name) {
  std::lock_guard lock(mutex_);
  auto it = armed.find(name);
  if (it == armed.end()) return false;
  if (--it->second <= 0) armed.erase(it);
  return true;
}

void FakeRecord::created(const char* kind) {
  std::lock_guard lock(mutex_);
  ++live_[kind];
}

void FakeRecord::gone(const char* kind, uint64_t n) {
  std::lock_guard lock(mutex_);
  uint64_t& live = live_[kind];
  live = n > live ? 0 : live - n;
}

int FakeRecord::live_objects(char* buf, size_t cap) const {
  std::lock_guard lock(mutex_);
  std::string text;
  int kinds = 0;
  for (const auto& [kind, n] : live_) {
    if (n == 0) continue;
    ++kinds;
    text += std::to_string(n) + " " + kind + "(s)\n";
  }
  write_text(text, buf, cap);
  return kinds;
}

int FakeRecord::violations(char* buf, size_t cap) const {
  std::lock_guard lock(mutex_);
  std::string text;
  for (const auto& v : violations_) text += v + "\n";
  write_text(text, buf, cap);
  return static_cast<int>(violations_.size());
}

uint64_t FakeRecord::calls(const char* entry_point) const {
  std::lock_guard lock(mutex_);
  auto it = calls_.find(entry_point);
  return it == calls_.end() ? 0 : it->second;
}

void FakeRecord::reset() {
  std::lock_guard lock(mutex_);
  violations_.clear();
  calls_.clear();
  fail_.clear();
  null_results_.clear();
  ignored_alignments_.clear();
}

void FakeRecord::closing() {
  std::lock_guard lock(mutex_);
  violations_of_calls_ = violations_.size();
}

void FakeRecord::strict_verdict() const {
  const char* strict = std::getenv(strict_variable_);
  if (strict == nullptr) return;
  const bool all = std::strcmp(strict, "1") == 0;
  if (!all && std::strcmp(strict, "calls") != 0) return;
  std::lock_guard lock(mutex_);
  const size_t n = all ? violations_.size() : std::min(violations_.size(), violations_of_calls_);
  if (n == 0) return;
  std::fprintf(stderr, "%s: %zu violation(s):\n", label_, n);
  for (size_t i = 0; i < n; ++i) std::fprintf(stderr, "  %s\n", violations_[i].c_str());
  std::fflush(stderr);
  ::_exit(3);
}

bool read_env_u64(const char* label, const char* name, uint64_t fallback, uint64_t* value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    *value = fallback;
    return true;
  }
  char* end = nullptr;
  *value = std::strtoull(text, &end, 10);
  if (*end != '\0' || *text == '-') {
    std::fprintf(stderr, "%s: %s=\"%s\" is not a non-negative integer\n", label, name, text);
    return false;
  }
  return true;
}

}  // namespace devalloc::fake
