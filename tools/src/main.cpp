#include "commands.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include <devalloc/plugin_abi.h>

#include <malloc.h>

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
