// What a fake vendor runtime records for its tests: violations (misuse it
// saw), calls per entry point, failures a test asked it to inject, and the
// objects a user must free or destroy that are live now. One
// per fake, never destroyed (stream threads and unload hooks use it to the
// end). Thread-safe; a leaf lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace devalloc::fake {

class FakeRecord {
 public:
  // `label` prefixes the strict report ("fake libcuda"), `strict_variable`
  // names the environment variable that makes violations fatal at exit.
  FakeRecord(const char* label, const char* strict_variable)
      : label_(label), strict_variable_(strict_variable) {}

  void violation(const char* format, ...) __attribute__((format(printf, 2, 3)));

  // Counts the call of entry point `name`; returns the result a test asked
  // the next call(s) of it to fail with, if any.
  std::optional<int> enter(const char* name);
  // After `skip` more calls of entry_point that run as usual, the next
  // `count` calls return result (count <= 0: cancels what was asked).
  void fail_calls(const char* entry_point, int result, int count, int skip = 0);
  // The next call of entry_point (an allocation) that would succeed answers
  // success with a null result instead, and allocates nothing: what a
  // broken runtime might do. take_null_result(name) says, once, that the
  // call of `name` under way is to answer so.
  void null_result_next(const char* entry_point);
  bool take_null_result(const char* name);
  // The same for an allocation call that takes an alignment: its next call
  // that would succeed ignores the alignment asked (the memory has only the
  // runtime's own alignment, and no more bytes than asked for).
  void ignore_alignment_next(const char* entry_point);
  bool take_ignore_alignment(const char* name);

  // Objects a user of the runtime must free or destroy ("stream", "pinned
  // host block"): created() when one is handed out, gone() when it is freed,
  // destroyed or reclaimed with its owner. Not forgotten by reset(): they
  // are the runtime's state, not the test's record.
  void created(const char* kind);
  void gone(const char* kind, uint64_t n = 1);
  // Writes "<n> <kind>(s)" for every kind with live objects, one a line, into
  // buf (as violations()) and returns how many kinds have live objects.
  int live_objects(char* buf, size_t cap) const;

  // Writes the violations, one a line, into buf (truncated to cap bytes
  // including the NUL) and returns how many there are.
  int violations(char* buf, size_t cap) const;
  uint64_t calls(const char* entry_point) const;
  // Forgets violations, call counts and injected failures.
  void reset();

  // At exit or unload, before the fake records what the process left behind
  // (contexts still retained, blocks never freed): the violations so far are
  // those of the calls the process made.
  void closing();

  // At exit or unload: with the strict variable set to 1, prints every
  // violation to stderr and ends the process with status 3. Set to "calls",
  // only the violations recorded before closing(): for a process that may
  // keep a runtime's objects for its whole life (a registry that never lets
  // an allocator go), yet must never misuse a call.
  void strict_verdict() const;

 private:
  struct Injected {
    int result;
    int remaining;
    int skip;  // calls still to run as usual first
  };
  const char* label_;
  const char* strict_variable_;
  mutable std::mutex mutex_;
  std::vector<std::string> violations_;
  // How many violations closing() found; SIZE_MAX until it runs.
  size_t violations_of_calls_ = SIZE_MAX;
  std::map<std::string, uint64_t> calls_;
  std::map<std::string, Injected> fail_;
  std::map<std::string, int> null_results_;
  std::map<std::string, int> ignored_alignments_;
  // Disarms one of `armed`'s for `name`; false when none was armed.
  bool take_one(std::map<std::string, int>& armed, const char* name);
  std::map<std::string, uint64_t> live_;
};

// Reads a non-negative decimal environment variable; fallback when unset or
// empty. False (and a line on stderr naming `label`) when malformed.
bool read_env_u64(const char* label, const char* name, uint64_t fallback, uint64_t* value);

}  // namespace devalloc::fake
