#include "commands.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include <devalloc/huge_pages.hpp>
#include <devalloc/plugin_abi.h>

#include <malloc.h>
#include <unistd.h>

namespace {

int run(int argc, char** argv) {
  CLI::App app{"devalloc: put the planned constants of a model into device "
               "memory through vendor plugins"};
  app.require_subcommand(1);
  // The project's version (CMakeLists.txt, which pyproject.toml must match)
  // and the newest plugin ABI this program speaks.
  app.set_version_flag("--version", "devalloc " DEVALLOC_VERSION " (plugin ABI " +
                                        std::to_string(DEVALLOC_ABI_VERSION_MAJOR) + "." +
                                        std::to_string(DEVALLOC_ABI_VERSION_MINOR) + ")");
  devalloc::cli::Action action;
  devalloc::cli::add_plugins_command(app, &action);
  devalloc::cli::add_conformance_command(app, &action);
  devalloc::cli::add_plan_command(app, &action);
  devalloc::cli::add_inspect_command(app, &action);
  devalloc::cli::add_load_command(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return devalloc::cli::kExitUsage;
  }
  return action();
}

// A plan of 100 000 tensors is 300 000 small allocations (names, shapes,
// paths) on top of the large buffers that already ask for huge pages
// (huge_pages.hpp): the heap's first 64 MiB of growth is taken in one step
// and advised onto transparent huge pages too, so that it faults in 2 MiB
// at a time instead of 4 KiB. Growth past it is the kernel's default; where
// huge pages are off nothing changes. Untouched, it costs no memory.
void heap_on_huge_pages() {
#if defined(M_TOP_PAD)  // glibc
  constexpr int kDefaultTopPad = 128 << 10;
  mallopt(M_TOP_PAD, 64 << 20);
  void* const start = sbrk(0);
  // More than the heap has left: glibc grows it by this and the pad.
  void* const block = std::malloc(256 << 10);
  void* const end = sbrk(0);
  if (block != nullptr && start != reinterpret_cast<void*>(-1) && end > start) {
    devalloc::advise_huge_pages(start, static_cast<size_t>(static_cast<char*>(end) -
                                                           static_cast<char*>(start)));
  }
  std::free(block);
  mallopt(M_TOP_PAD, kDefaultTopPad);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // A write past RLIMIT_FSIZE then fails with EFBIG, an error that names the
  // file, instead of SIGXFSZ ending the process with a temporary file left.
  std::signal(SIGXFSZ, SIG_IGN);
  // One command, then exit: what a stage frees (the plan's text once read,
  // a header's copy once parsed) serves the next stage's allocations from
  // the heap, instead of going back to the kernel and coming back as fresh
  // pages to fault in and clear. Blocks above 32 MiB (the most glibc
  // allows here) are still mapped and unmapped on their own.
#if defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)  // glibc
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
  heap_on_huge_pages();
  int code = devalloc::cli::kExitFailure;
  try {
    code = run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fputs("devalloc: out of host memory\n", stderr);
    return devalloc::cli::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "devalloc: internal error: %s\n", e.what());
    return devalloc::cli::kExitFailure;
  }
  // What was printed must have arrived: a full disk, a closed or full
  // standard output (--json > /dev/full) is a failure, not success with
  // nothing or half a document written.
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (!flushed || std::ferror(stdout) != 0) {
    // errno tells why only for the flush; an earlier write failed alike.
    std::fprintf(stderr, "devalloc: cannot write to standard output: %s\n",
                 !flushed && error != 0 ? std::strerror(error) : "a write failed");
    return code == devalloc::cli::kExitOk ? devalloc::cli::kExitFailure : code;
  }
  return code;
}
