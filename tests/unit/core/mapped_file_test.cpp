#include <devalloc/core/mapped_file.hpp>
#include <devalloc/regular_file.hpp>

#include "core_test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace devalloc {
namespace {

using ::testing::HasSubstr;
using test::ScratchDir;

TEST(MappedFile, GivenFile_WhenOpened_ThenBytesAreItsContent) {
  ScratchDir dir;
  test::write_file(dir / "a.bin", "hello, mapping");
  auto file = MappedFile::open(dir / "a.bin");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->size(), 14u);
  EXPECT_EQ((*file)->path(), dir / "a.bin");
  ASSERT_NE((*file)->data(), nullptr);
  EXPECT_EQ(std::memcmp((*file)->data(), "hello, mapping", 14), 0);
  EXPECT_EQ((*file)->bytes().size(), 14u);
}

TEST(MappedFile, GivenEmptyFile_WhenOpened_ThenEmptyWithoutMapping) {
  ScratchDir dir;
  test::write_file(dir / "empty", "");
  auto file = MappedFile::open(dir / "empty");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_EQ((*file)->data(), nullptr);
  EXPECT_TRUE((*file)->bytes().empty());
}

// One descriptor left under RLIMIT_NOFILE: the file opens, and the
// descriptor kept for pread is the one it was opened with (a duplicate,
// which the limit refused, left -1 and a later pread failed with "Bad file
// descriptor").
TEST(MappedFile, GivenOneDescriptorLeft_WhenOpened_ThenItsDescriptorReads) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // UBSan's checks (run with ASan here) open descriptors of their own to
  // probe memory, and report a false "invalid vptr" when none is left.
  GTEST_SKIP() << "the sanitizers need descriptors of their own";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScratchDir dir;
  test::write_file(dir / "a.bin", "hello, descriptor");
  const auto child = [&]() -> int {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 2;
    limit.rlim_cur = 64;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return 2;
    std::vector<int> held;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held.push_back(fd);
    if (held.empty()) return 3;
    ::close(held.back());  // the one left
    auto file = MappedFile::open(dir / "a.bin");
    if (!file.ok()) return 4;
    char out[8] = {};
    if ((*file)->fd() < 0 || ::pread((*file)->fd(), out, 5, 7) != 5) return 5;
    return std::string(out, 5) == "descr" ? 0 : 6;
  };
  EXPECT_EXIT(std::_Exit(child()), ::testing::ExitedWithCode(0), "");
}

TEST(MappedFile, GivenMissingFile_ThenErrorNamesFileAndErrno) {
  ScratchDir dir;
  auto file = MappedFile::open(dir / "missing.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::not_found);
  EXPECT_EQ(file.status().message(),
            (dir / "missing.safetensors").string() + ": cannot open: No such file or directory");
}

TEST(MappedFile, GivenDirectory_ThenNotARegularFile) {
  ScratchDir dir;
  auto file = MappedFile::open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(), dir.path().string() + ": not a regular file (a directory)");
}

// Issue 9: opening a FIFO blocked until a writer came, which may be never.
TEST(MappedFile, GivenFifo_ThenRefusedAtOnce) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
  ::alarm(30);  // a hang fails instead of stalling the suite
  auto file = MappedFile::open(dir / "model.safetensors");
  ::alarm(0);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(),
            (dir / "model.safetensors").string() + ": not a regular file (a FIFO)");
}

TEST(MappedFile, GivenFileReplacedByRename_ThenExistingMappingKeepsOldBytes) {
  ScratchDir dir;
  test::write_file(dir / "w", "old bytes");
  auto file = MappedFile::open(dir / "w");
  ASSERT_TRUE(file.ok()) << file.status().message();
  test::write_file(dir / "w.new", "new bytes");
  std::filesystem::rename(dir / "w.new", dir / "w");
  EXPECT_EQ(std::memcmp((*file)->data(), "old bytes", 9), 0);
}

// Rewrites `path` in place (the same inode, as `cp` onto it does) with
// `bytes`, then sets its modification time to one of its own in 2001, never
// the same twice: the kernel stamps times at its clock tick, and a write in
// the tick of the open might otherwise leave them as they were.
void rewrite_in_place(const std::filesystem::path& path, std::string_view bytes) {
  static int rewrites = 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  const timespec times[2] = {{0, UTIME_OMIT}, {1'000'000'000 + ++rewrites, 0}};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
}

TEST(MappedFile, GivenFile_WhenOpened_ThenItsVersionIsWhatFstatSaid) {
  ScratchDir dir;
  test::write_file(dir / "a.bin", "hello, version");
  auto file = MappedFile::open(dir / "a.bin");
  ASSERT_TRUE(file.ok()) << file.status().message();
  struct stat st {};
  ASSERT_EQ(::stat((dir / "a.bin").c_str(), &st), 0);
  const FileVersion& v = (*file)->version();
  EXPECT_EQ(v.device, static_cast<uint64_t>(st.st_dev));
  EXPECT_EQ(v.inode, static_cast<uint64_t>(st.st_ino));
  EXPECT_EQ(v.size, 14u);
  EXPECT_EQ(v.links, 1u);
  EXPECT_EQ(v.modified_seconds, st.st_mtim.tv_sec);
  EXPECT_EQ(v.modified_nanoseconds, st.st_mtim.tv_nsec);
  EXPECT_EQ(v.changed_seconds, st.st_ctim.tv_sec);
  EXPECT_EQ(v.changed_nanoseconds, st.st_ctim.tv_nsec);
  EXPECT_TRUE((*file)->check_unchanged("since it was opened").ok());
}

// The same inode, new bytes: the mapping shows them under whatever was
// read before. The check says so, naming the file and how it changed.
TEST(MappedFile, GivenFileRewrittenInPlace_WhenChecked_ThenModifiedInPlaceNamingFileAndChange) {
  ScratchDir dir;
  test::write_file(dir / "w", "old bytes");
  auto file = MappedFile::open(dir / "w");
  ASSERT_TRUE(file.ok()) << file.status().message();
  rewrite_in_place(dir / "w", "new bytes");
  EXPECT_EQ(std::memcmp((*file)->data(), "new bytes", 9), 0);  // why it matters
  const Status changed = (*file)->check_unchanged("while it was being loaded");
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.code(), StatusCode::data_loss);
  EXPECT_THAT(changed.message(),
              ::testing::AllOf(
                  ::testing::StartsWith((dir / "w").string() +
                                        ": modified in place while it was being loaded (its "
                                        "modification time went from "),
                  HasSubstr(" UTC to "),
                  HasSubstr("replace a file by writing a new one and renaming it over the old "
                            "one")));
  // Another size is named as such.
  rewrite_in_place(dir / "w", "newer, longer bytes");
  EXPECT_THAT((*file)->check_unchanged("since it was opened").message(),
              HasSubstr(": modified in place since it was opened (its size went from 9 to 19 "
                        "bytes, its modification time from "));
}

// A rename over the file unlinks it, which moves its status change time;
// its bytes are the ones opened, so it is not a change.
TEST(MappedFile, GivenFileReplacedByRename_WhenChecked_ThenUnchanged) {
  ScratchDir dir;
  test::write_file(dir / "w", "old bytes");
  auto file = MappedFile::open(dir / "w");
  ASSERT_TRUE(file.ok()) << file.status().message();
  test::write_file(dir / "w.new", "new bytes");
  std::filesystem::rename(dir / "w.new", dir / "w");
  EXPECT_TRUE((*file)->check_unchanged("since it was opened").ok())
      << (*file)->check_unchanged("since it was opened").message();
}

// A hard link made after the open moves the link count, and so the status
// change time no longer counts (as after a rename over the file): the
// modification time and the size still tell a write in place, each on its
// own.
TEST(MappedFile, GivenAHardLinkMade_WhenTheFileIsThenWrittenInPlace_ThenModifiedInPlace) {
  ScratchDir dir;
  test::write_file(dir / "w", "old bytes");
  auto file = MappedFile::open(dir / "w");
  ASSERT_TRUE(file.ok()) << file.status().message();
  std::filesystem::create_hard_link(dir / "w", dir / "w.link");
  // The same size, another modification time.
  rewrite_in_place(dir / "w.link", "new bytes");
  EXPECT_THAT((*file)->check_unchanged("since it was opened").message(),
              HasSubstr("modified in place since it was opened (its modification time went "
                        "from "));
  // Another size, the modification time set back to the one opened.
  rewrite_in_place(dir / "w.link", "newer, longer bytes");
  const FileVersion& opened = (*file)->version();
  const timespec times[2] = {{0, UTIME_OMIT},
                             {static_cast<time_t>(opened.modified_seconds),
                              static_cast<long>(opened.modified_nanoseconds)}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir / "w").c_str(), times, 0), 0);
  EXPECT_THAT((*file)->check_unchanged("since it was opened").message(),
              HasSubstr("modified in place since it was opened (its size went from 9 to 19 "
                        "bytes"));
}

// Only the status change time moved (a chmod here; a writer that set the
// modification time back looks the same): taken for a change, the safe
// side, and said as what it is.
TEST(MappedFile, GivenOnlyItsStatusChangeTimeMoved_WhenChecked_ThenTakenForAChange) {
  ScratchDir dir;
  test::write_file(dir / "w", "old bytes");
  auto file = MappedFile::open(dir / "w");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const FileVersion& opened = (*file)->version();
  // Until the clock ticks past the open (at most a few milliseconds).
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(::chmod((dir / "w").c_str(), (i % 2) != 0 ? 0600 : 0640), 0);
    struct stat st {};
    ASSERT_EQ(::stat((dir / "w").c_str(), &st), 0);
    if (st.st_ctim.tv_sec != opened.changed_seconds ||
        st.st_ctim.tv_nsec != opened.changed_nanoseconds) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_THAT((*file)->check_unchanged("since it was opened").message(),
              HasSubstr("modified in place since it was opened (its status change time went "
                        "from "));
}

TEST(MappedFile, GivenEmptyFile_WhenWrittenAfterOpening_ThenTheCheckSeesIt) {
  ScratchDir dir;
  test::write_file(dir / "empty", "");
  auto file = MappedFile::open(dir / "empty");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_GE((*file)->fd(), 0);
  EXPECT_TRUE((*file)->check_unchanged("since it was opened").ok());
  rewrite_in_place(dir / "empty", "grown");
  EXPECT_THAT((*file)->check_unchanged("since it was opened").message(),
              HasSubstr("its size went from 0 to 5 bytes"));
}

// A mapping of 4 pages whose file is then cut to its first 100 bytes: page
// 0 still reads (zeros past the end), pages 1 to 3 raise SIGBUS.
class TruncatedMapping : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_file(dir_ / "model.bin", std::string(4 * kPage, 'x'));
    auto opened = MappedFile::open(dir_ / "model.bin");
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    file_ = *opened;
    ASSERT_EQ(::truncate((dir_ / "model.bin").c_str(), 100), 0);
  }
  static constexpr uint64_t kPage = 4096;
  ScratchDir dir_;
  std::shared_ptr<const MappedFile> file_;
};

TEST(MappedFile, GivenIntactFile_WhenCopiedOut_ThenTheBytesArrive) {
  ScratchDir dir;
  test::write_file(dir / "a.bin", "hello, mapping");
  auto file = MappedFile::open(dir / "a.bin");
  ASSERT_TRUE(file.ok()) << file.status().message();
  char out[8] = {};
  ASSERT_TRUE((*file)->copy_to(7, 7, out).ok());
  EXPECT_STREQ(out, "mapping");
  // A range past the end is refused, not read; an empty one is nothing.
  const Status past = (*file)->copy_to(10, 5, out);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.message(),
            (dir / "a.bin").string() + ": 5 bytes from offset 10 are not inside its 14 bytes");
  EXPECT_FALSE((*file)->copy_to(UINT64_MAX, 2, out).ok());
  EXPECT_TRUE((*file)->copy_to(14, 0, nullptr).ok());
  EXPECT_STREQ(out, "mapping");
}

TEST_F(TruncatedMapping, WhenCopiedOut_ThenTheLostBytesAreAnErrorNamingFileAndOffset) {
  std::vector<char> out(4 * kPage);
  ASSERT_TRUE(file_->copy_to(0, 100, out.data()).ok());  // what the file still has
  const Status lost = file_->copy_to(10, 3 * kPage, out.data());
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.code(), StatusCode::data_loss);
  EXPECT_EQ(lost.message(), (dir_ / "model.bin").string() +
                                ": the page at offset 4096 could not be read (SIGBUS): the file "
                                "was truncated after it was opened, while it was being read");
  // The guard is left as it was found: the next read faults and is caught
  // again.
  const Status again = file_->copy_to(2 * kPage + 5, 10, out.data());
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.message(), HasSubstr("the page at offset 8192 could not be read"));
}

TEST_F(TruncatedMapping, WhenSeveralThreadsCopyOut_ThenEachGetsItsOwnError) {
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> out(kPage);
      for (int i = 0; i < 50; ++i) {
        const uint64_t at = (1 + (t + i) % 3) * kPage;
        const Status s = file_->copy_to(at, kPage, out.data());
        if (!s.ok() && s.message().find("offset " + std::to_string(at) + " ") != std::string::npos) {
          ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 4 * 50);
}

// A thread that blocks every signal (to leave them to sigwait, say), and
// the loading threads it starts, which inherit its mask: a SIGBUS the
// kernel raises while it is blocked ends the process whatever the handler.
// A guarded read unblocks it while it reads, and leaves the mask as it
// found it.
TEST_F(TruncatedMapping, GivenAThreadThatBlocksSigbus_WhenCopiedOut_ThenTheLostBytesAreAnError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        sigset_t all;
        sigfillset(&all);
        ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
        std::vector<char> out(kPage);
        const Status lost = file_->copy_to(kPage, kPage, out.data());
        const bool intact = file_->copy_to(0, 100, out.data()).ok();
        sigset_t after;
        ::pthread_sigmask(SIG_BLOCK, nullptr, &after);
        if (lost.ok() || lost.message().find("offset 4096") == std::string::npos) std::_Exit(3);
        if (!intact) std::_Exit(4);
        std::_Exit(sigismember(&after, SIGBUS) == 1 ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "");
}

// A SIGBUS outside a guarded read still ends the process, as it would have
// without devalloc: the guard does not swallow faults that are not its own.
TEST_F(TruncatedMapping, GivenAFaultOutsideAGuardedRead_ThenTheProcessStillDiesOfSigbus) {
  // A fresh process, whose SIGBUS takes the default action (a sanitizer
  // build has its own handler there, which would report and exit 1).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::signal(SIGBUS, SIG_DFL);
        std::vector<char> out(kPage);
        if (file_->copy_to(kPage, kPage, out.data()).ok()) std::_Exit(3);
        volatile char lost = static_cast<char>(file_->data()[kPage]);
        (void)lost;
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// The program's own SIGBUS handler, installed before devalloc's, still gets
// every fault that is not devalloc's.
volatile std::sig_atomic_t g_stage = 0;
extern "C" void programs_own_handler(int) { std::_Exit(g_stage == 1 ? 42 : 43); }

TEST_F(TruncatedMapping, GivenTheProgramsOwnHandler_ThenFaultsNotOursStillReachIt) {
  // A fresh process: devalloc's handler is installed after the program's.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction own {};
        own.sa_handler = programs_own_handler;
        sigemptyset(&own.sa_mask);
        ::sigaction(SIGBUS, &own, nullptr);
        std::vector<char> out(kPage);
        // Caught by devalloc (the program's handler would exit 43).
        if (file_->copy_to(kPage, kPage, out.data()).ok()) std::_Exit(3);
        g_stage = 1;
        volatile char lost = static_cast<char>(file_->data()[2 * kPage]);
        (void)lost;
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(42), "");
}

// A program that ignores SIGBUS: one that a process sends (kill, raise,
// sigqueue), during a guarded read or not, is still ignored, also when
// the ignoring action has SA_SIGINFO (which the guard once called as a
// handler at address 1); a fault the kernel raises outside a guarded read
// still ends the process, as it would have without devalloc.
TEST_F(TruncatedMapping, GivenSigbusIgnored_WhenAProcessSendsIt_ThenItIsStillIgnored) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const int flags : {0, SA_SIGINFO}) {
    EXPECT_EXIT(
        {
          struct sigaction ignore {};
          ignore.sa_handler = SIG_IGN;
          ignore.sa_flags = flags;
          sigemptyset(&ignore.sa_mask);
          ::sigaction(SIGBUS, &ignore, nullptr);
          std::vector<char> out(kPage);
          if (file_->copy_to(kPage, kPage, out.data()).ok()) std::_Exit(3);
          ::kill(::getpid(), SIGBUS);
          ::raise(SIGBUS);
          ::sigqueue(::getpid(), SIGBUS, sigval{});
          const char said[] = "sent ones ignored\n";
          (void)!::write(2, said, sizeof said - 1);
          volatile char lost = static_cast<char>(file_->data()[kPage]);
          (void)lost;
          std::_Exit(0);
        },
        ::testing::KilledBySignal(SIGBUS), "sent ones ignored")
        << "sa_flags " << flags;
  }
}

// The replaced action's flags are kept when a SIGBUS is passed on to it:
// SA_RESETHAND runs it once, then the default action ends the process.
volatile std::sig_atomic_t g_handled = 0;
extern "C" void count_handled(int) { g_handled = g_handled + 1; }

TEST_F(TruncatedMapping, GivenTheProgramsHandlerHasResetHand_ThenItRunsOnceThenTheDefault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction once {};
        once.sa_handler = count_handled;
        once.sa_flags = SA_RESETHAND;
        sigemptyset(&once.sa_mask);
        ::sigaction(SIGBUS, &once, nullptr);
        std::vector<char> out(kPage);
        if (file_->copy_to(kPage, kPage, out.data()).ok()) std::_Exit(3);
        ::raise(SIGBUS);
        if (g_handled != 1) std::_Exit(4);
        const char said[] = "handled once\n";
        (void)!::write(2, said, sizeof said - 1);
        ::raise(SIGBUS);
        std::_Exit(5);
      },
      ::testing::KilledBySignal(SIGBUS), "handled once");
}

// ... and the handler runs with the mask the kernel would have given it:
// its sa_mask blocked, and SIGBUS itself not blocked under SA_NODEFER.
volatile std::sig_atomic_t g_mask_seen = -1;
extern "C" void see_mask(int) {
  sigset_t now;
  ::pthread_sigmask(SIG_BLOCK, nullptr, &now);
  g_mask_seen = (sigismember(&now, SIGBUS) == 1 ? 1 : 0) + (sigismember(&now, SIGUSR1) == 1 ? 2 : 0);
}

TEST_F(TruncatedMapping, GivenTheProgramsHandlerHasNodeferAndAMask_ThenItRunsWithThem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction own {};
        own.sa_handler = see_mask;
        own.sa_flags = SA_NODEFER;
        sigemptyset(&own.sa_mask);
        sigaddset(&own.sa_mask, SIGUSR1);
        ::sigaction(SIGBUS, &own, nullptr);
        std::vector<char> out(kPage);
        if (file_->copy_to(kPage, kPage, out.data()).ok()) std::_Exit(3);
        ::raise(SIGBUS);
        std::_Exit(10 + g_mask_seen);  // 12: SIGUSR1 blocked, SIGBUS not
      },
      ::testing::ExitedWithCode(12), "");
}

// Opening beneath a folder (a plan's source that must lie in the plan's
// folder): whatever was checked of the path before, the open itself never
// leaves the folder. Each case runs with the kernel's openat2 and with the
// walk of one component at a time that serves kernels without it.
class OpenBeneath : public ::testing::TestWithParam<detail::BeneathResolution> {
 protected:
  void SetUp() override {
    folder_ = std::filesystem::weakly_canonical(inside_.path());
    outside_file_ = std::filesystem::weakly_canonical(outside_.path()) / "outside.bin";
    test::write_file(folder_ / "real.bin", "inside bytes");
    test::write_file(outside_file_, "OUTSIDE BYTES");
    std::filesystem::create_directory(folder_ / "sub");
  }
  Result<RegularFile> open(const std::filesystem::path& relative) {
    return detail::open_regular_file_beneath(folder_, relative, GetParam());
  }
  std::string leads_out(const std::filesystem::path& relative) {
    return (folder_ / relative).string() + ": refused: it leads out of the folder " +
           folder_.string() +
           " (through a symbolic link or \"..\"); only files inside it may be opened";
  }
  static std::string content(const RegularFile& file) {
    std::string out(file.size(), '\0');
    EXPECT_EQ(::pread(file.fd(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }

  ScratchDir inside_{"beneath"};
  ScratchDir outside_{"outside"};
  std::filesystem::path folder_;
  std::filesystem::path outside_file_;
};

TEST_P(OpenBeneath, GivenALinkToAFileOutsideTheFolder_WhenOpened_ThenRefusedNamingTheFileAndTheFolder) {
  std::filesystem::create_symlink(outside_file_, folder_ / "model.bin");
  Result<RegularFile> file = open("model.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(file.status().message(), leads_out("model.bin"));
}

TEST_P(OpenBeneath, GivenARelativeLinkOrDotDotThatClimbsOut_WhenOpened_ThenRefused) {
  const std::filesystem::path up =
      std::filesystem::relative(outside_file_, folder_ / "sub");  // ../../outside-X/outside.bin
  std::filesystem::create_symlink(up, folder_ / "sub" / "model.bin");
  std::filesystem::create_symlink("..", folder_ / "sub" / "parent");
  EXPECT_EQ(open("sub/model.bin").status().message(), leads_out("sub/model.bin"));
  EXPECT_EQ(open("sub/parent/../x").status().message(), leads_out("sub/parent/../x"));
  EXPECT_EQ(open("../real.bin").status().message(), leads_out("../real.bin"));
}

// An absolute link is refused even when it names a file inside: what it
// names depends on the root, not on the folder (RESOLVE_BENEATH's rule).
TEST_P(OpenBeneath, GivenAnAbsoluteLinkIntoTheFolder_WhenOpened_ThenRefused) {
  std::filesystem::create_symlink(folder_ / "real.bin", folder_ / "model.bin");
  EXPECT_EQ(open("model.bin").status().message(), leads_out("model.bin"));
}

TEST_P(OpenBeneath, GivenLinksAndDotDotThatStayInside_WhenOpened_ThenTheFileTheyLeadTo) {
  std::filesystem::create_symlink("../real.bin", folder_ / "sub" / "model.bin");
  std::filesystem::create_symlink("sub/model.bin", folder_ / "chain.bin");
  std::filesystem::create_symlink("sub", folder_ / "dir");
  for (const char* relative : {"real.bin", "sub/../real.bin", "sub/model.bin", "chain.bin",
                               "dir/model.bin", "./dir/../real.bin"}) {
    Result<RegularFile> file = open(relative);
    ASSERT_TRUE(file.ok()) << relative << ": " << file.status().message();
    EXPECT_EQ(content(*file), "inside bytes") << relative;
  }
}

TEST_P(OpenBeneath, GivenAFolderAFifoOrNothing_WhenOpened_ThenRefusedAsOpenRegularFileWould) {
  ASSERT_EQ(::mkfifo((folder_ / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(open("sub").status().message(),
            (folder_ / "sub").string() + ": not a regular file (a directory)");
  EXPECT_EQ(open("fifo").status().message(),
            (folder_ / "fifo").string() + ": not a regular file (a FIFO)");
  EXPECT_THAT(open("missing.bin").status().message(),
              HasSubstr((folder_ / "missing.bin").string() + ": cannot open: "));
  std::filesystem::create_symlink("loop", folder_ / "loop");
  EXPECT_THAT(open("loop").status().message(),
              HasSubstr((folder_ / "loop").string() + ": cannot open: "));
}

// A process that can write the folder swaps the name between a hard link
// to a file inside and a symbolic link to one outside while it is opened:
// no open ever reads the outside file. (Resolving the path, checking it and
// then opening it by name again let the link in between.)
TEST_P(OpenBeneath, GivenTheNameSwappedBetweenAHardLinkAndALinkOutside_WhenOpenedRepeatedly_ThenNeverTheOutsideFile) {
  std::filesystem::create_hard_link(folder_ / "real.bin", folder_ / "model.bin");
  std::filesystem::create_symlink(outside_file_, folder_ / "swap-link");
  // One rename(2) per swap: the name and the link beside it trade places.
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const std::string name = (folder_ / "model.bin").string();
    const std::string link = (folder_ / "swap-link").string();
    while (!stop.load()) {
      ::renameat2(AT_FDCWD, name.c_str(), AT_FDCWD, link.c_str(), RENAME_EXCHANGE);
    }
  });
  for (int i = 0; i < 300; ++i) {
    Result<RegularFile> file = open("model.bin");
    if (file.ok()) {
      EXPECT_EQ(content(*file), "inside bytes") << "open " << i;
    } else {
      EXPECT_EQ(file.status().message(), leads_out("model.bin")) << "open " << i;
    }
  }
  stop.store(true);
  swapper.join();
}

INSTANTIATE_TEST_SUITE_P(Resolutions, OpenBeneath,
                         ::testing::Values(detail::BeneathResolution::kernel,
                                           detail::BeneathResolution::walk),
                         [](const ::testing::TestParamInfo<detail::BeneathResolution>& resolution) {
                           return resolution.param == detail::BeneathResolution::kernel
                                      ? std::string("openat2")
                                      : std::string("walk");
                         });

// MappedFile::open beneath the folder: the mapping is of the descriptor
// opened beneath it.
TEST(MappedFile, GivenALinkOutsideTheFolderItMustBeOpenedBeneath_WhenOpened_ThenRefusedNamingFileAndFolder) {
  ScratchDir dir;
  ScratchDir elsewhere;
  const std::filesystem::path folder = std::filesystem::weakly_canonical(dir.path());
  test::write_file(elsewhere / "secret", "not for the plan");
  std::filesystem::create_symlink(elsewhere / "secret", folder / "model.safetensors");
  auto file = MappedFile::open(folder / "model.safetensors", folder);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(),
            (folder / "model.safetensors").string() + ": refused: it leads out of the folder " +
                folder.string() +
                " (through a symbolic link or \"..\"); only files inside it may be opened");
  // Without a folder to stay in (external files allowed), as before.
  auto external = MappedFile::open(folder / "model.safetensors");
  ASSERT_TRUE(external.ok()) << external.status().message();
  EXPECT_EQ((*external)->size(), 16u);
}

}  // namespace
}  // namespace devalloc
