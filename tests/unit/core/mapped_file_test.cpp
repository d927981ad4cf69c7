#include <devalloc/core/mapped_file.hpp>

#include "core_test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace devalloc {
namespace {

using ::testing::HasSubstr;
using test::TempDir;

TEST(MappedFile, GivenFile_WhenOpened_ThenBytesAreItsContent) {
  TempDir dir;
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
  TempDir dir;
  test::write_file(dir / "empty", "");
  auto file = MappedFile::open(dir / "empty");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_EQ((*file)->data(), nullptr);
  EXPECT_TRUE((*file)->bytes().empty());
}

TEST(MappedFile, GivenMissingFile_ThenErrorNamesFileAndErrno) {
  TempDir dir;
  auto file = MappedFile::open(dir / "missing.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(file.status().message(),
            (dir / "missing.safetensors").string() + ": cannot open: No such file or directory");
}

TEST(MappedFile, GivenDirectory_ThenNotARegularFile) {
  TempDir dir;
  auto file = MappedFile::open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(), dir.path().string() + ": not a regular file (a directory)");
}

// Issue 9: opening a FIFO blocked until a writer came, which may be never.
TEST(MappedFile, GivenFifo_ThenRefusedAtOnce) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
  ::alarm(30);  // a hang fails instead of stalling the suite
  auto file = MappedFile::open(dir / "model.safetensors");
  ::alarm(0);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(),
            (dir / "model.safetensors").string() + ": not a regular file (a FIFO)");
}

TEST(MappedFile, GivenFileReplacedByRename_ThenExistingMappingKeepsOldBytes) {
  TempDir dir;
  test::write_file(dir / "w", "old bytes");
  auto file = MappedFile::open(dir / "w");
  ASSERT_TRUE(file.ok()) << file.status().message();
  test::write_file(dir / "w.new", "new bytes");
  std::filesystem::rename(dir / "w.new", dir / "w");
  EXPECT_EQ(std::memcmp((*file)->data(), "old bytes", 9), 0);
}

}  // namespace
}  // namespace devalloc
