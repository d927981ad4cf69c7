// Opening only regular files, at once, and reading them within a limit
// (issue 9: FIFOs hung every reader; /dev/zero filled memory).
#include <devalloc/regular_file.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "scratch_dir.hpp"

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::EndsWith;

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A hang fails the test instead of stalling the suite.
    ::alarm(30);
  }
  void TearDown() override { ::alarm(0); }
  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }

  test::ScratchDir scratch_{"file"};
  const fs::path dir_ = scratch_.path();
};

TEST_F(RegularFileTest, GivenFile_ThenOpenedWithItsSizeAndRead) {
  const fs::path path = write("a.toml", "hello");
  Result<RegularFile> file = open_regular_file(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_GE(file->fd(), 0);
  EXPECT_EQ(file->size(), 5u);
  Result<std::string> text = read_regular_file(path, 5, "config");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "hello");
}

TEST_F(RegularFileTest, GivenFifo_ThenRefusedAtOnce) {
  const fs::path fifo = dir_ / "plan.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result<std::string> text = read_regular_file(fifo, 1024, "plan");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(text.status().message(), fifo.string() + ": not a regular file (a FIFO)");
}

// Opening what is not a regular file acts on it, even when nothing is read:
// a device's driver runs its open (a watchdog starts counting down, a serial
// line raises DTR), and a FIFO's writer that waits in open(2) is let through
// (its next write, once the reader closed again, fails with EPIPE). A FIFO
// is the case a test can watch: the writer must still be waiting after the
// refusal. (A writer that had not yet reached its open when the file was
// refused makes this pass without proving anything; it never fails wrongly.)
TEST_F(RegularFileTest, GivenFifoWithAWriterWaiting_ThenRefusedWithoutLettingTheWriterThrough) {
  const fs::path fifo = dir_ / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> writer_through{false};
  std::thread writer([&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    writer_through = true;
    if (fd >= 0) ::close(fd);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // into its open
  EXPECT_EQ(open_regular_file(fifo).status().message(),
            fifo.string() + ": not a regular file (a FIFO)");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(writer_through) << "the FIFO was opened for reading";
  // Let the writer go.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  writer.join();
  if (reader >= 0) ::close(reader);
}

TEST_F(RegularFileTest, GivenDevices_ThenRefusedBeforeReading) {
  EXPECT_EQ(read_regular_file("/dev/zero", 1024, "config").status().message(),
            "/dev/zero: not a regular file (a character device)");
  EXPECT_EQ(open_regular_file(dir_).status().message(),
            dir_.string() + ": not a regular file (a directory)");
}

TEST_F(RegularFileTest, GivenFileAboveTheLimit_ThenRefusedWithoutReadingIt) {
  // Sparse: a size above the limit costs no disk.
  const fs::path path = write("big.toml", "");
  fs::resize_file(path, 5'000'000'000ull);
  EXPECT_EQ(read_regular_file(path, 1 << 20, "config").status().message(),
            path.string() + ": the config is 5000000000 bytes, above the limit of 1048576 bytes");
  const fs::path exact = write("exact.toml", "12345");
  EXPECT_EQ(read_regular_file(exact, 4, "plan").status().message(),
            exact.string() + ": the plan is 5 bytes, above the limit of 4 bytes");
}

TEST_F(RegularFileTest, GivenMissingFileOrNulInPath_ThenReason) {
  EXPECT_EQ(open_regular_file(dir_ / "absent").status().message(),
            (dir_ / "absent").string() + ": cannot open: No such file or directory");
  EXPECT_THAT(open_regular_file(std::string("a\0b", 3)).status().message(),
              EndsWith(": path contains a NUL byte"));
}

// Out of descriptors is a resource limit, not a bad file: the CLI maps it
// to exit 1, not 3 (bad input). The soft limit is set to the lowest free
// descriptor, so that every open fails with EMFILE, then restored.
TEST_F(RegularFileTest, GivenNoFreeDescriptor_ThenOutOfHostMemoryNamingTheFile) {
  const fs::path path = write("w.safetensors", "x");
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  struct rlimit none = saved;
  none.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &none), 0);
  Result<RegularFile> file = open_regular_file(path);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::out_of_host_memory);
  EXPECT_EQ(file.status().message(), path.string() + ": cannot open: Too many open files");
}

}  // namespace
}  // namespace devalloc
