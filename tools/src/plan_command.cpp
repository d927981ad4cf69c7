// `devalloc plan`: a plan for safetensors files, placed by name globs.
#include "commands.hpp"
#include "inputs.hpp"

#include <devalloc/core/config.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <map>

namespace devalloc::cli {

namespace {

struct PlanOptions {
  std::vector<std::string> files;
  std::vector<std::string> place;
  std::string output;
  std::string default_device = "host";
  uint64_t alignment = 256;
  std::vector<std::string> methods;
  std::vector<std::string> shards;
  std::vector<std::string> experts;
  uint32_t world_size = 0;
};

std::string shard_check(const std::string& text) {
  auto rule = parse_shard_rule(text);
  return rule.ok() ? std::string() : rule.status().message();
}

// The checks of the command line's values (a bad one exits 2, as every
// usage error does); each returns "" or what is wrong.
std::string place_check(const std::string& text) {
  auto rule = parse_placement_rule(text);
  return rule.ok() ? std::string() : rule.status().message();
}

std::string device_check(const std::string& text) {
  return parse_device_tag(text) ? std::string()
                                : quote(text) + " is not a device tag (\"name\" or "
                                                "\"name:index\" of at most 256 bytes, "
                                                "e.g. \"cuda:0\")";
}

// As text: "-1" would wrap to 2^64 - 1 and 2^64 saturate.
std::string alignment_check(const std::string& text) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
      value == 0 || (value & (value - 1)) != 0) {
    return "a power of two, not " + quote(text);
  }
  return {};
}

// load --methods splits at commas: a name with one could never be chosen.
std::string method_check(const std::string& text) {
  if (text.empty()) return "an empty method name";
  if (text.find(',') != std::string::npos) {
    return quote(text) + " has a ',', which `devalloc load --methods` separates names with";
  }
  return {};
}

std::string output_check(const std::string& text) {
  return text.empty() ? "an empty path" : std::string();
}

int run_plan(const PlanOptions& o) {
  PlanBuildOptions options;
  for (const auto& text : o.place) {
    auto rule = parse_placement_rule(text);  // checked by place_check already
    if (!rule.ok()) return report_failure("plan", rule.status().with_context("--place"));
    options.rules.push_back(*rule);
  }
  for (const auto& text : o.shards) {
    auto rule = parse_shard_rule(text);  // checked by shard_check already
    if (!rule.ok()) return report_failure("plan", rule.status().with_context("--shard"));
    options.shards.push_back(*rule);
  }
  options.experts = o.experts;
  options.world_size = o.world_size;
  options.default_device = o.default_device;
  options.alignment = o.alignment;
  if (!o.methods.empty()) options.methods = o.methods;
  std::vector<std::filesystem::path> files(o.files.begin(), o.files.end());
  // The headers are kept until exit (keep_until_exit), not freed one
  // tensor at a time after the plan is written.
  const auto cache = std::make_shared<SafetensorsCache>();
  keep_until_exit(cache);
  options.cache = cache.get();
  PlanBuildReport built;
  auto written = build_and_write_plan(files, o.output, options, &built);
  if (!written.ok()) return report_failure("plan", written.status());
  const Plan& plan = written->plan;  // its buffers and methods; no tensors
  // A rule that placed nothing is a warning, not a failure: the plan is
  // still what the rules say, but its tensors went to the default device.
  for (const std::string& line : built.unused_rules) {
    std::fprintf(stderr, "devalloc plan: warning: --place: %s\n", line.c_str());
  }
  for (const std::string& line : built.unused_shard_rules) {
    std::fprintf(stderr, "devalloc plan: warning: --shard: %s\n", line.c_str());
  }

  std::map<std::string, std::pair<uint64_t, uint64_t>> per_device;  // tensors, bytes
  for (size_t b = 0; b < plan.buffers.size(); ++b) {
    auto& [tensors, bytes] = per_device[plan.buffers[b].device];
    tensors += written->tensors_per_buffer[b];
    bytes += plan.buffers[b].size;
  }
  std::printf("wrote %s: %zu tensors in %zu buffers, %zu methods",
              path_for_message(o.output).c_str(), written->tensors, plan.buffers.size(),
              plan.methods.size());
  if (plan.world_size != 0) {
    std::printf(", for %u ranks (devalloc inspect --rank R shows one)", plan.world_size);
  }
  std::printf("\n");
  for (const auto& [device, counts] : per_device) {
    std::printf("  %-14s %6llu tensors  %s\n", escaped(device).c_str(),
                static_cast<unsigned long long>(counts.first), human_bytes(counts.second).c_str());
  }
  return kExitOk;
}

}  // namespace

void add_plan_command(CLI::App& app, Action* run) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "Write a plan for safetensors files");
  cmd->add_option("files", o->files, "Safetensors files")->required();
  cmd->add_option("--place", o->place,
                  "GLOB=DEVICE: tensors whose name matches GLOB go to DEVICE "
                  "(repeatable; the first match wins)")
      ->check(place_check);
  cmd->add_option("-o,--output", o->output, "The plan file to write")
      ->required()
      ->check(output_check);
  cmd->add_option("--default-device", o->default_device,
                  "Device of tensors no --place matches")
      ->check(device_check)
      ->capture_default_str();
  cmd->add_option("--alignment", o->alignment, "Alignment of each tensor in its buffer")
      ->check(alignment_check)
      ->capture_default_str();
  cmd->add_option("--method", o->methods,
                  "A method using every tensor (repeatable; default: main)")
      ->check(method_check);
  cmd->add_option("--world-size", o->world_size,
                  "A plan for a job of this many ranks (each rank loads its share)")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--shard", o->shards,
                  "GLOB=dim:D[:S0,S1,...]: cut matching tensors along dimension D, one part "
                  "per rank (even, or the sizes given; repeatable; needs --world-size)")
      ->check(shard_check);
  cmd->add_option("--expert", o->experts,
                  "GLOB: matching tensors go whole to one rank, the first number after the "
                  "glob's fixed prefix modulo the world size (repeatable)");
  cmd->callback([run, o] { *run = [o] { return run_plan(*o); }; });
}

}  // namespace devalloc::cli
