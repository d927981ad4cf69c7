#include "mapping_guard.hpp"

#include <devalloc/input_text.hpp>

#include <pthread.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <string>

namespace devalloc::detail {
namespace {

// The guarded read a thread is in, innermost first.
struct Frame {
  sigjmp_buf resume;
  uintptr_t begin = 0;
  uintptr_t end = 0;
  uintptr_t fault = 0;
  Frame* outer = nullptr;
};

// Read in the signal handler: initial-exec, so that the first read on a
// thread never allocates (as a dynamic TLS access in a dlopened module may).
__attribute__((tls_model("initial-exec"))) thread_local Frame* t_frame = nullptr;
// SigbusUnblocked scopes this thread is in.
__attribute__((tls_model("initial-exec"))) thread_local int t_unblocked = 0;

struct sigaction g_replaced {};
std::once_flag g_installed;
// The replaced action had SA_RESETHAND and ran once: the default from now.
std::atomic<bool> g_replaced_reset{false};

// Not ours: what the replaced action would have done with it.
void pass_on(int signal, siginfo_t* info, void* context) {
  struct sigaction replaced = g_replaced;
  // The kernel would have reset a SA_RESETHAND action to the default as it
  // delivered the first signal.
  if ((replaced.sa_flags & SA_RESETHAND) != 0 && g_replaced_reset.exchange(true)) {
    replaced.sa_handler = SIG_DFL;
    replaced.sa_flags = 0;
  }
  // SIG_DFL and SIG_IGN mean themselves with SA_SIGINFO too.
  if (replaced.sa_handler != SIG_DFL && replaced.sa_handler != SIG_IGN) {
    // With the mask the kernel would have run it with: this handler's
    // (the interrupted one and SIGBUS), its sa_mask added, and SIGBUS
    // unblocked again under SA_NODEFER.
    ::pthread_sigmask(SIG_BLOCK, &replaced.sa_mask, nullptr);
    if ((replaced.sa_flags & SA_NODEFER) != 0) {
      sigset_t own;
      sigemptyset(&own);
      sigaddset(&own, signal);
      ::pthread_sigmask(SIG_UNBLOCK, &own, nullptr);
    }
    if ((replaced.sa_flags & SA_SIGINFO) != 0) {
      replaced.sa_sigaction(signal, info, context);
    } else {
      replaced.sa_handler(signal);
    }
    return;
  }
  // Ignored: a SIGBUS a process sent (kill, raise, sigqueue: si_code <= 0)
  // is dropped; one the kernel raised for a fault cannot be ignored.
  if (replaced.sa_handler == SIG_IGN && info != nullptr && info->si_code <= 0) return;
  // Default action: restore it and raise again, delivered when this handler
  // returns (or at once).
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(signal, &fallback, nullptr);
  ::raise(signal);
}

extern "C" void on_sigbus(int signal, siginfo_t* info, void* context) {
  Frame* frame = t_frame;
  // A fault the kernel raised (si_code > 0) inside the range this thread's
  // guarded read covers.
  if (frame != nullptr && info != nullptr && info->si_code > 0) {
    const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Frame* f = frame; f != nullptr; f = f->outer) {
      if (at >= f->begin && at < f->end) {
        f->fault = at;
        // The jump skips the kernel's return from the handler, which would
        // restore the interrupted code's signal mask: restore it here (the
        // mask the handler runs with blocks SIGBUS, and under a sanitizer
        // perhaps every signal), rather than have sigsetjmp save it
        // (sigsetjmp(..., 1)): a system call on every read.
        if (context != nullptr) {
          ::pthread_sigmask(SIG_SETMASK, &static_cast<ucontext_t*>(context)->uc_sigmask, nullptr);
        }
        siglongjmp(f->resume, 1);
      }
    }
  }
  pass_on(signal, info, context);
}

// Unblocks SIGBUS on this thread: true when it was blocked.
bool unblock_sigbus() {
  sigset_t bus;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  sigset_t before;
  return ::pthread_sigmask(SIG_UNBLOCK, &bus, &before) == 0 && sigismember(&before, SIGBUS) == 1;
}

void block_sigbus() {
  sigset_t bus;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  ::pthread_sigmask(SIG_BLOCK, &bus, nullptr);
}

void install() {
  struct sigaction guard {};
  guard.sa_sigaction = on_sigbus;
  guard.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&guard.sa_mask);
  // The action to pass signals on to is known before the guard is: one
  // sigaction call that installs and reports the old action writes that
  // report after the guard is live, and a SIGBUS another thread takes in
  // between would find no replaced action and take the default one.
  ::sigaction(SIGBUS, nullptr, &g_replaced);
  struct sigaction replaced {};
  ::sigaction(SIGBUS, &guard, &replaced);
  // Changed by another thread in between (racing sigaction calls have no
  // order anyway): the one replaced counts.
  if (replaced.sa_handler != g_replaced.sa_handler || replaced.sa_flags != g_replaced.sa_flags) {
    g_replaced = replaced;
  }
}

}  // namespace

bool run_mapping_guarded(const void* begin, uint64_t nbytes, void (*work)(void*) noexcept,
                         void* context, uint64_t* fault_offset) {
  std::call_once(g_installed, install);
  Frame frame;
  frame.begin = reinterpret_cast<uintptr_t>(begin);
  frame.end = frame.begin + nbytes;
  frame.outer = t_frame;
  // Outside a SigbusUnblocked scope: the read unblocks SIGBUS itself.
  const bool reblock = t_unblocked == 0 && unblock_sigbus();
  bool read = true;
  if (sigsetjmp(frame.resume, 0) != 0) {
    read = false;
    if (fault_offset != nullptr) *fault_offset = frame.fault - frame.begin;
  } else {
    t_frame = &frame;
    work(context);
  }
  t_frame = frame.outer;
  if (reblock) block_sigbus();
  return read;
}

SigbusUnblocked::SigbusUnblocked() : reblock_(t_unblocked++ == 0 && unblock_sigbus()) {}

SigbusUnblocked::~SigbusUnblocked() {
  --t_unblocked;
  if (reblock_) block_sigbus();
}

Status lost_to_truncation(const MappedFile& file, uint64_t at) {
  // The mapping starts at file offset 0, page-aligned: the page that
  // faulted starts at `at` rounded down.
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t size = page > 0 ? static_cast<uint64_t>(page) : 4096;
  return Status(StatusCode::data_loss,
                path_for_message(file.path().string()) + ": the page at offset " +
                    std::to_string(at / size * size) +
                    " could not be read (SIGBUS): the file was truncated after it was "
                    "opened, while it was being read");
}

}  // namespace devalloc::detail
