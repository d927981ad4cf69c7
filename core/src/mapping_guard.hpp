// Reads from a file's mapping that survive the file being truncated under
// them. Another program may truncate a model while it loads; the first touch
// of a page the file lost raises SIGBUS, which ends the process unless
// handled. A guarded read turns that SIGBUS into a false return.
//
// How: the first guarded read installs a SIGBUS handler (SA_SIGINFO |
// SA_ONSTACK) that keeps the handler it replaced. A fault on a thread inside
// a guarded read, at an address inside the range that read covers, restores
// the signal mask of the interrupted read and jumps back out of it
// (siglongjmp); any other SIGBUS goes to
// the replaced action as the kernel would have taken it (its handler with
// its sa_mask, SA_NODEFER and SA_RESETHAND; ignored if it was ignored and a
// process sent it), or takes the default action (the process ends, as it
// would have without devalloc). A program that installs its own SIGBUS
// handler afterwards without calling the one it replaced loses the guard
// (a truncation then ends the process, as before); read = "pread" needs no
// guard at all.
//
// The kernel ends the process for a SIGBUS it raises on a thread that
// blocks SIGBUS, whatever the handler: a guarded read unblocks it while it
// reads (a thread may block every signal to leave them to sigwait, and the
// loading threads it starts inherit its mask), and blocks it again after.
//
// `work` must only read the range and write memory of its own: no locks, no
// allocation, nothing a jump out of the middle would leave half done. It is
// noexcept in its type: an exception thrown through a guarded read would
// leave this thread's guard pointing at a frame that is gone (and SIGBUS
// unblocked), so a read that could throw does not compile.
#pragma once

#include <devalloc/core/mapped_file.hpp>
#include <devalloc/status.hpp>

#include <cstdint>

namespace devalloc::detail {

// Runs work(context), which reads [begin, begin + nbytes). True when it
// returned; false when a read in that range raised SIGBUS, and then
// *fault_offset (if given) is the offset from begin of the byte it read.
bool run_mapping_guarded(const void* begin, uint64_t nbytes, void (*work)(void*) noexcept,
                         void* context, uint64_t* fault_offset = nullptr);

// run_mapping_guarded for a callable, run once on this thread: read() must
// keep to what `work` may do (above), noexcept included.
template <typename Read>
bool guarded_read(const void* begin, uint64_t nbytes, Read& read, uint64_t* fault_offset) {
  static_assert(noexcept(read()), "a guarded read must not throw: declare it noexcept");
  return run_mapping_guarded(
      begin, nbytes, [](void* r) noexcept { (*static_cast<Read*>(r))(); }, &read, fault_offset);
}

// Keeps SIGBUS unblocked on this thread while it lives, then blocks it
// again if it was: for a run of guarded reads, which then make no system
// call each to unblock it (a load of 100 000 small tensors makes 100 000).
class SigbusUnblocked {
 public:
  SigbusUnblocked();
  ~SigbusUnblocked();
  SigbusUnblocked(const SigbusUnblocked&) = delete;
  SigbusUnblocked& operator=(const SigbusUnblocked&) = delete;

 private:
  const bool reblock_;
};

// The error of a guarded read of `file` that faulted at file offset `at`.
Status lost_to_truncation(const MappedFile& file, uint64_t at);

}  // namespace devalloc::detail
