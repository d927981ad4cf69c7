// PLUGIN-1, PLUGIN-2, PLUGIN-3: the entry point, as the loader and as hosts
// of other ABI versions call it.
#include "suite.hpp"

#include <devalloc/input_text.hpp>
#include <devalloc/plugin_loader.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace devalloc::conformance {
namespace {

constexpr uint32_t kFutureMajor = DEVALLOC_ABI_VERSION_MAJOR + 1;
// Far beyond any major a plugin will speak: its refusal tells the highest
// major the plugin has.
constexpr uint32_t kFarFutureMajor = 1000;
constexpr uint32_t kUnwritten = 0xdeadbeef;
constexpr uint8_t kCanary = 0xab;

// What one negotiation answered, with a copy of the table it handed out as
// it was right then (the fields the table's struct_size covers).
struct Answer {
  devalloc_status status = DEVALLOC_STATUS_OK;
  uint32_t plugin_major = 0;
  uint32_t plugin_minor = 0;
  uint32_t plugin_min_major = 0;
  const void* api = nullptr;
  devalloc_plugin_api_v1 table{};
  size_t table_bytes = 0;  // of `table` copied from the plugin's
};

// `answer` with its table copied from `table` as it is now.
Answer with_table(Answer answer, const devalloc_plugin_api_v1* table) {
  answer.table = devalloc_plugin_api_v1{};
  answer.table_bytes = 0;
  if (table != nullptr) {
    answer.table_bytes = std::min(table->struct_size, sizeof answer.table);
    std::memcpy(&answer.table, table, answer.table_bytes);
  }
  return answer;
}

Answer answer_of(devalloc_status status, const devalloc_negotiation& n) {
  Answer a;
  a.status = status;
  a.plugin_major = n.plugin_major;
  a.plugin_minor = n.plugin_minor;
  a.plugin_min_major = n.plugin_min_major;
  a.api = n.api;
  return with_table(a, status == DEVALLOC_STATUS_OK
                           ? static_cast<const devalloc_plugin_api_v1*>(n.api)
                           : nullptr);
}

std::string hex(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

std::string string_field(const char* text) {
  return text == nullptr ? "NULL" : quote(text);
}

// The fields of two copies of a table that differ ("plugin_name (\"b\", the
// first \"a\")", "synchronize"), comma-separated; "" when none does.
std::string differing_fields(const Answer& first, const Answer& other) {
  struct Field {
    const char* name;
    size_t offset;
    size_t size;
  };
#define DEVALLOC_TABLE_FIELD(f) \
  Field { #f, offsetof(devalloc_plugin_api_v1, f), sizeof(devalloc_plugin_api_v1::f) }
  static const Field kFields[] = {
      DEVALLOC_TABLE_FIELD(struct_size),      DEVALLOC_TABLE_FIELD(abi_major),
      DEVALLOC_TABLE_FIELD(abi_minor),        DEVALLOC_TABLE_FIELD(plugin_name),
      DEVALLOC_TABLE_FIELD(plugin_version),   DEVALLOC_TABLE_FIELD(create),
      DEVALLOC_TABLE_FIELD(destroy),          DEVALLOC_TABLE_FIELD(get_capabilities),
      DEVALLOC_TABLE_FIELD(get_device_count), DEVALLOC_TABLE_FIELD(get_device_properties),
      DEVALLOC_TABLE_FIELD(allocate),         DEVALLOC_TABLE_FIELD(deallocate),
      DEVALLOC_TABLE_FIELD(copy_host_to_device),
      DEVALLOC_TABLE_FIELD(copy_device_to_host),
      DEVALLOC_TABLE_FIELD(synchronize),      DEVALLOC_TABLE_FIELD(allocate_host),
      DEVALLOC_TABLE_FIELD(free_host),        DEVALLOC_TABLE_FIELD(get_memory_info),
  };
#undef DEVALLOC_TABLE_FIELD
  const size_t covered = std::max(first.table_bytes, other.table_bytes);
  const auto* a = reinterpret_cast<const unsigned char*>(&first.table);
  const auto* b = reinterpret_cast<const unsigned char*>(&other.table);
  std::string fields;
  for (const Field& field : kFields) {
    if (field.offset + field.size > covered) break;
    if (std::memcmp(a + field.offset, b + field.offset, field.size) == 0) continue;
    if (!fields.empty()) fields += ", ";
    fields += field.name;
    if (field.offset == offsetof(devalloc_plugin_api_v1, plugin_name)) {
      fields += " (" + string_field(other.table.plugin_name) + ", the first " +
                string_field(first.table.plugin_name) + ")";
    } else if (field.offset == offsetof(devalloc_plugin_api_v1, plugin_version)) {
      fields += " (" + string_field(other.table.plugin_version) + ", the first " +
                string_field(first.table.plugin_version) + ")";
    } else if (field.offset < offsetof(devalloc_plugin_api_v1, plugin_name)) {
      // struct_size, abi_major, abi_minor: numbers (little-endian, at most 8 bytes).
      uint64_t value_a = 0;
      uint64_t value_b = 0;
      std::memcpy(&value_a, a + field.offset, field.size);
      std::memcpy(&value_b, b + field.offset, field.size);
      fields += " (" + std::to_string(value_b) + ", the first " + std::to_string(value_a) + ")";
    }
  }
  return fields;
}

constexpr const char* kOneTable =
    "PLUGIN-3: the plugin hands out one static function table, unchanged for as long as "
    "the library is loaded, so negotiating again in the same process (the loader does on "
    "every open of a library that is already loaded, and so does every other host in the "
    "process) gives the same table and the same answers";

// Why `again` (the negotiation called `which`) breaks PLUGIN-3 against the
// first answer; success when it answers the same.
::testing::AssertionResult SameAnswer(const Answer& first, const Answer& again,
                                      const std::string& which) {
  std::string differences;
  auto add = [&](const std::string& text) {
    differences += (differences.empty() ? "" : "; ") + text;
  };
  if (again.status != first.status) {
    add("status " + std::to_string(again.status) + ", the first " +
        std::to_string(first.status));
  }
  if (again.plugin_major != first.plugin_major || again.plugin_minor != first.plugin_minor ||
      again.plugin_min_major != first.plugin_min_major) {
    add("ABI " + std::to_string(again.plugin_major) + "." + std::to_string(again.plugin_minor) +
        " (lowest major " + std::to_string(again.plugin_min_major) + "), the first " +
        std::to_string(first.plugin_major) + "." + std::to_string(first.plugin_minor) +
        " (lowest major " + std::to_string(first.plugin_min_major) + ")");
  }
  if (again.api != first.api) {
    add("function table at " + hex(again.api) + ", the first at " + hex(first.api));
  }
  if (const std::string fields = differing_fields(first, again); !fields.empty()) {
    add("table fields that differ: " + fields);
  }
  if (differences.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << which << " answered differently from the first: " << differences << ". "
         << kOneTable;
}

// The plugin opened by hand, as a host of another ABI version would: nothing
// but the entry point and the negotiation struct, whose layout every major
// version shares.
class Negotiation : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [path, error] = PluginLoader().resolve(target().plugin);
    ASSERT_TRUE(error.status.ok() && !path.empty())
        << "cannot resolve " << target().plugin << ": "
        << error.status.message();
    path_ = path;
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    negotiate_ = reinterpret_cast<devalloc_plugin_negotiate_fn>(
        dlsym(handle_, DEVALLOC_PLUGIN_ENTRY_POINT_NAME));
    ASSERT_NE(negotiate_, nullptr)
        << path_ << " does not export " DEVALLOC_PLUGIN_ENTRY_POINT_NAME;
  }
  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }

  // The output fields start as values no plugin answers, so that one left
  // unwritten is seen. With slack after it: a plugin that writes past the
  // struct (PLUGIN-4) is reported by LargerStructThanItKnows_* alone.
  static WithSlack<devalloc_negotiation> request(uint32_t min_major,
                                                 uint32_t max_major) {
    WithSlack<devalloc_negotiation> slack;
    devalloc_negotiation& n = slack.value;
    n.struct_size = sizeof n;
    n.host_min_major = min_major;
    n.host_max_major = max_major;
    n.host_max_minor =
        max_major == DEVALLOC_ABI_VERSION_MAJOR ? DEVALLOC_ABI_VERSION_MINOR : 0;
    n.plugin_major = kUnwritten;
    n.plugin_minor = kUnwritten;
    n.plugin_min_major = kUnwritten;
    n.api = &n;
    return slack;
  }

  // The highest major the plugin speaks, from its refusal of a host that
  // speaks only a far-future major.
  uint32_t highest_major() {
    auto request_buffer = request(kFarFutureMajor, kFarFutureMajor);
    devalloc_negotiation& n = *request_buffer;
    RawError error;
    EXPECT_TRUE(RawFailure(negotiate_(&n, error.get()),
                           DEVALLOC_STATUS_UNSUPPORTED, error));
    return n.plugin_major;
  }

  std::filesystem::path path_;
  void* handle_ = nullptr;
  devalloc_plugin_negotiate_fn negotiate_ = nullptr;
};
DEVALLOC_CONFORMANCE_RULES(Negotiation, "PLUGIN-1, PLUGIN-2, PLUGIN-3");

TEST_F(Negotiation, LoaderOpensTheLibrary_AgreeingOnMajor1) {
  auto [library, error] = PluginLibrary::open(path_);
  ASSERT_TRUE(library) << to_string(error.outcome) << ": "
                       << error.status.message();
  EXPECT_EQ(library->abi_major(), 1u);
  EXPECT_FALSE(library->name().empty());
  EXPECT_GE(library->api().struct_size, DEVALLOC_PLUGIN_API_V1_MIN_SIZE);
}

TEST_F(Negotiation, HostSpeakingOnlyAFutureMajor_IsRefusedWithoutATable) {
  auto request_buffer = request(kFutureMajor, kFutureMajor);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  EXPECT_TRUE(RawFailure(negotiate_(&n, error.get()),
                         DEVALLOC_STATUS_UNSUPPORTED, error));
  EXPECT_EQ(n.api, nullptr) << "a refusal hands out no table";
  EXPECT_NE(n.plugin_major, kUnwritten) << "plugin_major was not reported";
  EXPECT_NE(n.plugin_min_major, kUnwritten)
      << "plugin_min_major was not reported";
  EXPECT_GE(n.plugin_major, 1u);
  EXPECT_NE(n.plugin_major, kFutureMajor)
      << "reports speaking the major it refused";
  EXPECT_LE(n.plugin_min_major, n.plugin_major);
}

// A range that ends below the plugin's majors holds none of them either:
// PLUGIN-2 has the plugin refuse it, not answer its own major.
TEST_F(Negotiation, HostSpeakingOnlyAnOlderMajor_IsRefusedWithoutATable) {
  auto request_buffer = request(0, 0);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  EXPECT_TRUE(RawFailure(negotiate_(&n, error.get()),
                         DEVALLOC_STATUS_UNSUPPORTED, error));
  EXPECT_EQ(n.api, nullptr) << "a refusal hands out no table";
  EXPECT_NE(n.plugin_major, kUnwritten) << "plugin_major was not reported";
  EXPECT_GE(n.plugin_min_major, 1u);
}

TEST_F(Negotiation, RefusalWithoutAnErrorBuffer_StillRefuses) {
  auto request_buffer = request(kFutureMajor, kFutureMajor);
  devalloc_negotiation& n = *request_buffer;
  EXPECT_NE(negotiate_(&n, nullptr), DEVALLOC_STATUS_OK);
  EXPECT_EQ(n.api, nullptr);
}

TEST_F(Negotiation, HostSpeakingMajor1_GetsACompleteVersion1Table) {
  auto request_buffer = request(1, 1);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  ASSERT_EQ(negotiate_(&n, error.get()), DEVALLOC_STATUS_OK) << error.text();
  EXPECT_TRUE(error.untouched()) << "success wrote the error message";
  EXPECT_EQ(n.plugin_major, 1u);
  EXPECT_LE(n.plugin_min_major, 1u);
  ASSERT_NE(n.api, nullptr);
  const auto& api = *static_cast<const devalloc_plugin_api_v1*>(n.api);
  EXPECT_GE(api.struct_size, DEVALLOC_PLUGIN_API_V1_MIN_SIZE);
  EXPECT_EQ(api.abi_major, 1u);
  EXPECT_EQ(api.abi_minor, n.plugin_minor)
      << "the function table's abi_minor and the plugin_minor that negotiation answered "
         "must be equal (PLUGIN-3): both say which minor of ABI 1 the plugin implements, "
         "a host reports the negotiated one while a reader holding only the table sees "
         "the table's, and which functions exist follows from struct_size alone";
  ASSERT_NE(api.plugin_name, nullptr);
  EXPECT_STRNE(api.plugin_name, "");
  ASSERT_NE(api.plugin_version, nullptr);
  EXPECT_STRNE(api.plugin_version, "");
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.get_capabilities, nullptr);
  EXPECT_NE(api.get_device_count, nullptr);
  EXPECT_NE(api.get_device_properties, nullptr);
  EXPECT_NE(api.allocate, nullptr);
  EXPECT_NE(api.deallocate, nullptr);
  EXPECT_NE(api.copy_host_to_device, nullptr);
  EXPECT_NE(api.copy_device_to_host, nullptr);
  EXPECT_NE(api.synchronize, nullptr);
}

// PLUGIN-3 over time: a plugin whose later negotiations hand out another
// table (or change the first) would pass every test above, which negotiate
// once each, and fail elsewhere, under another rule, in whichever test
// happens to load it a second time.
TEST_F(Negotiation, NegotiatingAgain_GivesTheSameTableAndTheSameAnswers) {
  auto negotiate_once = [&] {
    auto request_buffer = request(1, 1);
    RawError error;
    const devalloc_status status = negotiate_(request_buffer.get(), error.get());
    return answer_of(status, *request_buffer);
  };
  const Answer first = negotiate_once();
  ASSERT_EQ(first.status, DEVALLOC_STATUS_OK);
  ASSERT_NE(first.api, nullptr);
  const Answer second = negotiate_once();
  EXPECT_TRUE(SameAnswer(first, second, "the second negotiation"));
  // The first table as it is now: a plugin that rewrites its table when it
  // negotiates again changes what a host that negotiated before holds.
  EXPECT_TRUE(SameAnswer(
      first, with_table(first, static_cast<const devalloc_plugin_api_v1*>(first.api)),
      "the first table, read again after the second negotiation,"));
  const Answer third = negotiate_once();
  EXPECT_TRUE(SameAnswer(first, third, "the third negotiation"));

  // And the loader, negotiating on its own while this test holds the
  // library, sees the same plugin.
  auto [library, error] = PluginLibrary::open(path_);
  ASSERT_TRUE(library) << "the loader, negotiating again while the library is loaded, "
                          "refused the plugin ("
                       << to_string(error.outcome) << ": " << error.status.message()
                       << "), though the first negotiation's table was complete. "
                       << kOneTable;
  EXPECT_EQ(library->abi_major(), first.plugin_major) << kOneTable;
  EXPECT_EQ(library->abi_minor(), first.plugin_minor) << kOneTable;
  // The loader may keep a copy of the table: its contents are compared.
  EXPECT_TRUE(SameAnswer(first, with_table(first, &library->api()),
                         "the loader's negotiation"));
}

TEST_F(Negotiation, HostSpeakingMajors1To3_AgreesOnTheHighestMajorInCommon) {
  const uint32_t highest = highest_major();
  auto request_buffer = request(1, 3);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  ASSERT_EQ(negotiate_(&n, error.get()), DEVALLOC_STATUS_OK) << error.text();
  EXPECT_EQ(n.plugin_major, std::min<uint32_t>(highest, 3));
  ASSERT_NE(n.api, nullptr);
  if (n.plugin_major == 1) {
    EXPECT_EQ(static_cast<const devalloc_plugin_api_v1*>(n.api)->abi_major, 1u);
  }
}

TEST_F(Negotiation, LargerStructThanItKnows_IsAcceptedAndItsTailLeftAlone) {
  constexpr size_t kTail = 64;
  const size_t grown_size = sizeof(devalloc_negotiation) + kTail;
  // Slack after the grown struct too: a plugin that writes even further is
  // reported here, not by the heap.
  std::vector<uint8_t> bytes(grown_size + kSlackBytes, kCanary);
  const devalloc_negotiation n = *request(1, 1);
  std::memcpy(bytes.data(), &n, sizeof n);
  auto* grown = reinterpret_cast<devalloc_negotiation*>(bytes.data());
  grown->struct_size = grown_size;
  RawError error;
  ASSERT_EQ(negotiate_(grown, error.get()), DEVALLOC_STATUS_OK) << error.text();
  EXPECT_NE(grown->api, nullptr);
  for (size_t i = sizeof n; i < bytes.size(); ++i) {
    ASSERT_EQ(bytes[i], kCanary)
        << "wrote byte " << i
        << (i < grown_size ? " it does not know" : ", beyond the struct_size it was given");
  }
}

TEST_F(Negotiation, StructTooSmallForVersion1_IsRefusedWithoutWritingBeyondIt) {
  for (size_t size : {size_t{0}, sizeof(size_t),
                      DEVALLOC_STRUCT_SIZE(devalloc_negotiation, plugin_min_major)}) {
    SCOPED_TRACE("struct_size = " + std::to_string(size));
    std::vector<uint8_t> bytes(sizeof(devalloc_negotiation) + kSlackBytes, kCanary);
    const devalloc_negotiation n = *request(1, 1);
    std::memcpy(bytes.data(), &n, size);
    std::memcpy(bytes.data(), &size, sizeof size);
    RawError error;
    EXPECT_TRUE(RawFailure(
        negotiate_(reinterpret_cast<devalloc_negotiation*>(bytes.data()),
                   error.get()),
        DEVALLOC_STATUS_INVALID_ARGUMENT, error));
    for (size_t i = std::max(size, sizeof(size_t)); i < bytes.size(); ++i) {
      ASSERT_EQ(bytes[i], kCanary) << "wrote byte " << i << " beyond struct_size";
    }
  }
}

TEST_F(Negotiation, NullStruct_IsRefused) {
  RawError error;
  EXPECT_TRUE(RawFailure(negotiate_(nullptr, error.get()),
                         DEVALLOC_STATUS_INVALID_ARGUMENT, error));
}

}  // namespace
}  // namespace devalloc::conformance
