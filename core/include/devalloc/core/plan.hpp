// The memory plan: program-level buffers, the tensors placed in them, and the
// methods that use them. docs/plan-format.md specifies the JSON file.
//
// Reading and checking are separate steps: read_plan() checks the structure
// (types, required and unknown fields, format and version); validate_plan()
// checks what the plan means (ids, bounds, overlaps, names, sources). Errors
// of both read "<plan file>: <JSON pointer> ...: <reason>", the pointer being
// where the offending value is (or would be) written in the file.
#pragma once

#include <devalloc/core/dtype.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/status.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc {

inline constexpr std::string_view kPlanFormat = "devalloc-plan";
// The newest version this build reads and the one write_plan writes; every
// older version is read too.
inline constexpr uint32_t kPlanVersion = 2;
// A plan nests at most this deep (the root object, an array of it, an entry
// (a row or an object), and a shape, memory_ids, tensors or source inside
// the entry); deeper nesting is refused where it starts, before it is read.
inline constexpr size_t kMaxPlanDepth = 4;
// A plan file above this size is refused before it is read: 256 MiB holds
// well over a million tensors.
inline constexpr uint64_t kMaxPlanBytes = 256ull << 20;

// Longest names and paths a plan may hold, in bytes: read_plan and
// validate_plan refuse a longer one as bad input before anything is done
// with it. Names (a tensor's, a method's, a source key) of 4 KiB: real
// names are a few hundred bytes at most. A source file of 4095 bytes: the
// longest path the system takes (PATH_MAX, 4096, counts the closing NUL).
// A buffer's device tag: kMaxDeviceTagBytes (config.hpp).
inline constexpr size_t kMaxPlanNameBytes = 4096;
inline constexpr size_t kMaxPlanPathBytes = 4095;

// One device allocation, shared by every method that uses its memory id.
struct PlanBuffer {
  uint32_t memory_id = 0;
  std::string device;      // planned device tag: "cuda:0", "hip:1", "host"
  uint64_t size = 0;       // bytes
  uint64_t alignment = 1;  // a power of two
  // In a plan for several ranks (Plan::world_size): the rank that places
  // the buffer; none: every rank places it (replicated). A tag's device
  // index may be "local" ("cuda:local"), the rank's local index.
  std::optional<uint32_t> rank;
};

// Where a constant's initial bytes come from.
// Elements [start, start + length) of a source tensor along dimension
// `dim`: the planned tensor has the source's shape with shape[dim] =
// length, its bytes contiguous. Along dim 0 it is one range of the file;
// along a later one, one run per row of the leading dimensions.
struct PlanSlice {
  uint32_t dim = 0;
  uint64_t start = 0;
  uint64_t length = 0;
};

struct PlanSource {
  std::string file;  // relative to the plan's folder (Plan::source_path)
  std::string key;   // tensor name inside that safetensors file
  std::optional<PlanSlice> slice;  // none: the whole tensor
};

// Where a slice's bytes lie in its row-major source: `rows` runs of
// run_bytes, the first at first_byte from the tensor's start, each
// stride_bytes after the one before.
struct SliceLayout {
  uint64_t rows = 1;
  uint64_t run_bytes = 0;
  uint64_t stride_bytes = 0;
  uint64_t first_byte = 0;
};

// The layout of `slice` of a source of this dtype and shape, or why it is
// not a slice of it (a dimension past the shape, a range past the
// dimension, a packed dtype cut inside a byte). `sliced_shape`, when
// given, receives the slice's shape.
Result<SliceLayout> slice_layout(const PlanSlice& slice, DType dtype,
                                 std::span<const uint64_t> source_shape,
                                 std::vector<uint64_t>* sliced_shape = nullptr);
std::string slice_to_string(const PlanSlice& slice);  // "dim 1, start 0, length 512"

struct PlanTensor {
  std::string name;
  DType dtype = DType::u8;
  std::vector<uint64_t> shape;
  uint32_t memory_id = 0;
  uint64_t offset = 0;  // from the start of the buffer
  // Set for a constant; nullopt for planned scratch memory, which is only
  // placed, never filled.
  std::optional<PlanSource> source;

  bool is_constant() const { return source.has_value(); }
};

// A planned tensor as a load sees it: its source resolved to an absolute
// file, its size computed.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::u8;
  std::vector<uint64_t> shape;
  uint32_t memory_id = 0;
  uint64_t offset = 0;  // in its buffer
  uint64_t nbytes = 0;
  std::filesystem::path file;  // absolute; empty for scratch memory
  std::string key;             // tensor name in file

  bool is_constant() const { return !file.empty(); }
};

struct PlanMethod {
  std::string name;
  std::vector<uint32_t> memory_ids;  // every buffer the method uses
  std::vector<std::string> tensors;  // names of its tensors
};

// What a set of methods needs: each memory id and tensor once, however many
// of the methods share it.
struct PlanSelection {
  std::vector<uint32_t> memory_ids;  // ascending
  std::vector<size_t> tensors;       // indices into Plan::tensors, ascending
  std::vector<size_t> constants;     // the subset of `tensors` with a source
};

// What a plan records of a source file so that a load need not read its
// header again: the header's length and hash, and a digest of the plan's
// own rows naming the file. build_plan records it in a plan for one process
// (world_size 0); a load takes the file's tensors at the offsets its rows
// imply (each where the one before it ends) only while all three match —
// the file as planned, its rows as planned — and reads the header
// otherwise (docs/plan-format.md#file-checks).
struct PlanFileCheck {
  uint64_t header_bytes = 0;  // the header's length, the file's first 8 bytes
  uint64_t header_xxh3 = 0;   // XXH3-64 of the file's first 8 + header_bytes bytes
  uint64_t rows_xxh3 = 0;     // XXH3-64 of the rows naming the file: name, dtype, shape
  bool operator==(const PlanFileCheck&) const = default;
};

struct Plan {
  // The plan file: named in errors, and its folder is where relative source
  // files are found.
  std::filesystem::path path;
  // Lets source files lie outside the plan's folder or be absolute.
  bool allow_external_files = false;
  // A plan for a job of this many ranks (0: a plan for one process, no
  // ranks). Each rank loads its view (plan_for_rank).
  uint32_t world_size = 0;
  std::vector<PlanBuffer> buffers;
  std::vector<PlanTensor> tensors;
  std::vector<PlanMethod> methods;
  // By source file, as the tensors' sources name it.
  std::map<std::string, PlanFileCheck, std::less<>> file_checks;

  // The folder of `path` ("." when `path` has none).
  std::filesystem::path directory() const;

  // The source file as an absolute path with symlinks resolved
  // (weakly_canonical). Unless allow_external_files is set, fails
  // (invalid_argument) for an absolute path and for one that resolves outside
  // directory(). The file need not exist.
  Result<std::filesystem::path> source_path(const PlanSource& source) const;

  // The buffers and tensors that `method_names` use, deduplicated. Fails
  // (invalid_argument) naming the first unknown method or a method entry that
  // names no buffer or tensor of the plan.
  Result<PlanSelection> tensors_for_methods(
      std::span<const std::string> method_names) const;
};

// Reads and structurally checks a plan file; Plan::path is set to `path`.
// Errors are invalid_argument and name the file and the place: a JSON
// pointer ("/tensors/3/dtype") for a value that is wrong, a line and column
// for text that is not JSON or a key given twice.
Result<Plan> read_plan(const std::filesystem::path& path);

struct PlanValidationOptions {
  // Open each constant's safetensors file and compare key, dtype and shape.
  bool check_sources = true;
  // Where source files are opened (by their resolved path); a caller that
  // loads the plan afterwards passes its own to reuse the mappings. When
  // null, validate_plan uses one of its own.
  SafetensorsCache* cache = nullptr;
  // False: the plan's "allow_external_files" is not honoured, so its source
  // files must lie in its folder (pass [load] external_files of the
  // runtime config that will load it).
  bool external_files = true;
};

// Checks, reporting the first failure (invalid_argument):
//   buffers   duplicate memory id; alignment not a power of two; a device
//             tag that does not parse ("name" or "name:index");
//   tensors   duplicate name; memory id without a buffer; shape x dtype not a
//             whole number of bytes or overflowing; ending past the buffer;
//             two constants overlapping in one buffer (scratch tensors may
//             overlap anything: their lifetimes are the planner's business);
//   methods   duplicate name; unknown or repeated memory id or tensor; a
//             tensor whose memory id the method does not list;
//   sources   (check_sources) a path outside the plan's folder (see
//             Plan::source_path); a file that cannot be opened or is not
//             valid safetensors; a missing key; dtype or shape different
//             from the source tensor.
Status validate_plan(const Plan& plan, const PlanValidationOptions& options = {});

// Writes `plan` as JSON (version kPlanVersion), one line per buffer, tensor
// and method, tensors as rows naming their files by index in a "files"
// table, to a temporary file renamed over `path`. Source files are written
// as they are: they are relative to the folder of `path`. Does not
// validate.
Status write_plan(const Plan& plan, const std::filesystem::path& path);

// "GLOB=DEVICE" from the command line: tensors whose name matches GLOB
// (fnmatch(3) without flags: '*' also matches '.' and '/') go to DEVICE.
struct PlacementRule {
  std::string pattern;
  std::string device;
};

// Splits at the last '=' (device tags have none); fails (invalid_argument)
// for a missing '=', an empty glob, or a device that is not a device tag.
Result<PlacementRule> parse_placement_rule(std::string_view text);

// "GLOB=dim:D" (an even split of dimension D over the ranks) or
// "GLOB=dim:D:S0,S1,..." (rank r takes S_r elements, in order; one size per
// rank, summing to the dimension).
struct ShardRule {
  std::string pattern;
  uint32_t dim = 0;
  std::vector<uint64_t> sizes;  // empty: even
};
Result<ShardRule> parse_shard_rule(std::string_view text);

struct PlanBuildOptions {
  // A plan for a job of this many ranks (0: for one process). Tensors a
  // shard rule matches are cut, rank r placing its part; tensors an expert
  // glob matches go whole to one rank (the first number in the name after
  // the glob's fixed prefix, modulo the world size); the rest is replicated.
  uint32_t world_size = 0;
  std::vector<ShardRule> shards;     // the first match wins
  std::vector<std::string> experts;  // globs
  std::vector<PlacementRule> rules;       // the first match wins
  std::string default_device = "host";    // for tensors no rule matches
  uint64_t alignment = 256;               // of each tensor's offset; power of two
  std::vector<std::string> methods = {"main"};  // each uses every tensor
  // Where the files are opened, by their resolved path (the path a load of
  // the plan opens them by): a caller that loads the plan in the same
  // process passes the cache it will load with, and each header is read
  // once. When null, build_plan opens the files itself.
  SafetensorsCache* cache = nullptr;
};

// What build_plan says besides the plan: what a caller should warn about.
struct PlanBuildReport {
  // One line per rule that placed no tensor, in the order given, with why:
  //   placement rule "layers.*=cuda:0" placed no tensor: it matches none of
  //   the 12 tensors
  // or "...: every tensor it matches was placed by an earlier rule".
  std::vector<std::string> unused_rules;
  // The same for the shard rules taken together: they cut no tensor.
  std::vector<std::string> unused_shard_rules;
};

// A plan for every tensor of `files`: one buffer per device tag (memory ids
// 0, 1, ... in the order the devices first receive a tensor), tensors packed
// in file order at offsets aligned to options.alignment, every tensor a
// constant whose source file is written relative to the folder of
// `plan_path`. A file outside that folder is written as a relative path with
// ".." and the plan gets allow_external_files. Fails (invalid_argument) for
// a tensor name found in two files (naming both), an unreadable file, a bad
// rule or device, an alignment that is not a power of two, or no methods.
// `report`, when given, is filled on success.
Result<Plan> build_plan(std::span<const std::filesystem::path> files,
                        const std::filesystem::path& plan_path,
                        const PlanBuildOptions& options = {},
                        PlanBuildReport* report = nullptr);

// What build_and_write_plan wrote: the plan without its tensors (its
// buffers, methods without their tensor lists, world size, whether it
// allows external files), how many tensors it holds and how many in each
// buffer (by memory id, which is the buffer's index).
struct PlanWritten {
  Plan plan;
  size_t tensors = 0;
  std::vector<size_t> tensors_per_buffer;
};

// build_plan and write_plan in one: the same file, written as the tensors
// are placed, never held (a plan of 100 000 tensors builds no 18 MB of
// PlanTensors): what `devalloc plan` runs. Errors are build_plan's and
// write_plan's; on any, nothing is written.
Result<PlanWritten> build_and_write_plan(std::span<const std::filesystem::path> files,
                                         const std::filesystem::path& plan_path,
                                         const PlanBuildOptions& options = {},
                                         PlanBuildReport* report = nullptr);

}  // namespace devalloc
