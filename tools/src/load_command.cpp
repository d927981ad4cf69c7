// `devalloc load`: the main job. Places every planned buffer and constant of
// the chosen methods on its device and reports what went where.
#include "commands.hpp"
#include "inputs.hpp"
#include "json_output.hpp"

#include <devalloc/core/placement.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/input_text.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

namespace devalloc::cli {

namespace {

struct LoadCommandOptions {
  std::string plan;
  std::string config;
  std::vector<std::string> trust_paths;
  std::string methods;  // comma-separated
  bool verify = false;
  bool json = false;
  RankOptions ranks;
};

// The names of --methods; checked by methods_check, so none is empty.
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// "--methods ''" or "a,,b" names an empty method: a usage error, not "all"
// (leaving the option out means all) and not a silently dropped name.
std::string methods_check(const std::string& text) {
  if (text.empty()) return "names no method; leave it out to load all methods";
  if (text.front() == ',' || text.back() == ',' || text.find(",,") != std::string::npos) {
    return "an empty method name in " + quote(text);
  }
  return {};
}

// A one-line progress bar on stderr, for loads long enough to need one.
class ProgressBar {
 public:
  void update(uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex_);
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 30;
    const int filled = total == 0 ? width : static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r[%.*s%*s] %3d%% %s / %s", filled,
                 "##############################", width - filled, "",
                 total == 0 ? 100 : static_cast<int>(100 * done / total),
                 human_bytes(done).c_str(), human_bytes(total).c_str());
    shown_ = true;
  }
  // Clears the line, so that what follows starts on a clean one.
  void finish() {
    std::lock_guard lock(mutex_);
    if (shown_) std::fprintf(stderr, "\r%70s\r", "");
    shown_ = false;
  }

 private:
  std::mutex mutex_;
  std::chrono::steady_clock::time_point last_{};
  bool shown_ = false;
};

double gb_per_s(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

// What the load tolerated but a user should know (late releases): on
// stderr, with or without --json.
void print_load_warnings(const LoadReport& report) {
  for (const std::string& w : load_warnings(report)) {
    std::fprintf(stderr, "devalloc load: warning: %s\n", w.c_str());
  }
}

// The buffers placed on a fallback, one line per fallback with why its
// primary failed (buffers that fell back the same way share a line: "memory
// ids 0, 1, 2: ..."): on stderr as a warning ([load] fallback = "warn"),
// else on stdout with the report ("allow"; "error" fails the load before
// this).
std::vector<std::string> fallback_lines(const LoadedProgram& program) {
  std::vector<std::pair<std::vector<uint32_t>, std::string>> groups;  // ids, the rest
  for (const auto& b : program.buffers()) {
    if (!b->device().is_fallback) continue;
    const std::string prefix = "memory id " + std::to_string(b->memory_id()) + ": ";
    std::string rest = fallback_line(b->memory_id(), b->device());
    if (rest.rfind(prefix, 0) == 0) rest.erase(0, prefix.size());
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.second == rest; });
    if (same == groups.end()) {
      groups.push_back({{b->memory_id()}, std::move(rest)});
    } else {
      same->first.push_back(b->memory_id());
    }
  }
  std::vector<std::string> lines;
  for (const auto& [ids, rest] : groups) {
    std::string line = ids.size() == 1 ? "memory id " : "memory ids ";
    for (size_t i = 0; i < ids.size(); ++i) line += (i > 0 ? ", " : "") + std::to_string(ids[i]);
    lines.push_back(line + ": " + rest);
  }
  return lines;
}

void print_fallbacks(const std::vector<std::string>& lines, FallbackPolicy policy, bool json) {
  for (const std::string& line : lines) {
    if (policy == FallbackPolicy::warn) {
      std::fprintf(stderr, "devalloc load: warning: fallback: %s\n", line.c_str());
    } else if (!json) {
      std::printf("  fallback: %s\n", line.c_str());
    }
  }
}

int run_load(const LoadCommandOptions& o) {
  auto config = config_from(o.config, o.trust_paths);
  if (!config.ok()) return report_failure("load", config.status());
  if (o.verify) config->load.verify = true;
  // The plan and the headers are kept until exit (keep_until_exit), not
  // freed one tensor at a time after the load.
  const auto cache = std::make_shared<SafetensorsCache>();
  keep_until_exit(cache);
  auto full = valid_plan_from(o.plan, *cache, *config);
  if (!full.ok()) return report_failure("load", full.status());
  // A plan for several ranks: this rank's share of it.
  auto rank = rank_for(*full, o.ranks);
  if (!rank.ok()) return report_failure("load", rank.status());
  auto plan = rank->has_value() ? plan_for_rank(*full, **rank) : std::move(full);
  if (!plan.ok()) return report_failure("load", plan.status());
  for (const std::string& line : unused_device_entries(*config, *plan)) {
    std::fprintf(stderr, "devalloc load: warning: %s\n", line.c_str());
  }

  auto runtime = Runtime::create(*config);
  ProgressBar bar;
  if (!o.json && isatty(STDERR_FILENO)) {
    runtime->set_progress([&bar](uint64_t done, uint64_t total) {
      if (total >= (uint64_t{256} << 20)) bar.update(done, total);
    });
  }
  LoadReport report;
  // The mappings opened to validate the plan serve the load too.
  auto shared_plan = std::make_shared<const Plan>(std::move(*plan));
  keep_until_exit(shared_plan);
  auto program = runtime->load(shared_plan, {.methods = split_commas(o.methods), .report = &report, .files = cache.get()});
  bar.finish();
  if (!program.ok()) return report_failure("load", program.status());
  const std::vector<std::string> fallbacks = fallback_lines(**program);

  // Per physical device: several tags may lead to one.
  auto buffers_on = [&](const ResolvedDevice& d) {
    uint64_t n = 0;
    for (const auto& b : (*program)->buffers()) n += b->device().same_device(d) ? 1 : 0;
    return n;
  };
  // True when the device serves a buffer as a fallback, whichever of the
  // tags that lead to it came first.
  auto fallback_on = [&](const ResolvedDevice& d) {
    for (const auto& b : (*program)->buffers()) {
      if (b->device().same_device(d) && b->device().is_fallback) return true;
    }
    return false;
  };

  if (o.json) {
    nlohmann::json out = {{"plan", o.plan},
                          {"methods", (*program)->methods()},
                          {"verified", report.verified},
                          {"seconds", report.seconds},
                          {"bytes", report.bytes},
                          {"allocations", report.allocations},
                          {"copies", report.copies},
                          {"constants", report.constants},
                          {"direct_reads", report.direct_reads},
                          {"pipeline",
                           {{"threads", report.pipeline.threads},
                            {"staging_slots", report.pipeline.staging_slots},
                            {"slot_bytes", report.pipeline.slot_bytes},
                            {"pinned", report.pipeline.pinned},
                            {"max_in_flight_bytes", report.pipeline.max_in_flight_bytes},
                            {"forced_synchronizes", report.pipeline.forced_synchronizes},
                            {"read", to_string(report.pipeline.read)},
                            {"read_measured", report.pipeline.read_measured},
                            {"direct_io_fallback", report.pipeline.direct_io_fallback},
                            {"realigned_pieces", report.pipeline.realigned_pieces}}},
                          {"fallbacks", fallbacks},
                          {"files", nlohmann::json::array()},
                          {"devices", nlohmann::json::array()}};
    if (rank->has_value()) {
      out["rank"] = (*rank)->rank;
      out["world_size"] = (*rank)->world_size;
    }
    for (const FileReadStats& f : report.files) {
      out["files"].push_back({{"path", f.path.string()}, {"bytes_read", f.bytes}});
    }
    for (const auto& d : report.devices) {
      out["devices"].push_back({{"plugin", d.device.plugin_name},
                                {"device", d.device.device},
                                {"device_name", d.device.info().name},
                                {"fallback", fallback_on(d.device)},
                                {"buffers", buffers_on(d.device)},
                                {"tensors", d.tensors},
                                {"bytes", d.bytes},
                                {"copies", d.copies},
                                {"direct_reads", d.direct_reads},
                                {"seconds", d.seconds},
                                {"gb_per_s", gb_per_s(d.bytes, d.seconds)},
                                {"late_releases", d.late_releases},
                                {"late_release_seconds", d.late_release_seconds}});
    }
    print_load_warnings(report);
    print_fallbacks(fallbacks, config->load.fallback, /*json=*/true);
    std::printf("%s\n", json_text(out).c_str());
    return kExitOk;
  }

  // Method names come from the plan file: escaped, as in messages.
  std::printf("loaded %s: methods", path_for_message(o.plan).c_str());
  for (const auto& m : (*program)->methods()) std::printf(" %s", escaped(m).c_str());
  std::printf("\n  %llu buffers allocated, %llu constants (%s) in %llu copies and %llu direct "
              "reads, %.3f s%s\n",
              static_cast<unsigned long long>(report.allocations),
              static_cast<unsigned long long>(report.constants),
              human_bytes(report.bytes).c_str(),
              static_cast<unsigned long long>(report.copies),
              static_cast<unsigned long long>(report.direct_reads), report.seconds,
              report.verified ? ", verified" : "");
  std::printf("  %-46s %7s %7s %10s %8s %8s\n", "device", "buffers", "tensors", "bytes",
              "seconds", "GB/s");
  for (const auto& d : report.devices) {
    std::printf("  %-46s %7llu %7llu %10s %8.3f %8.2f\n",
                (d.device.device_label() + (fallback_on(d.device) ? " [fallback]" : "")).c_str(),
                static_cast<unsigned long long>(buffers_on(d.device)),
                static_cast<unsigned long long>(d.tensors), human_bytes(d.bytes).c_str(),
                d.seconds, gb_per_s(d.bytes, d.seconds));
  }
  print_fallbacks(fallbacks, config->load.fallback, /*json=*/false);
  print_load_warnings(report);
  return kExitOk;
}

}  // namespace

void add_load_command(CLI::App& app, Action* run) {
  auto o = std::make_shared<LoadCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "load", "Load a plan's buffers and constants onto their devices");
  cmd->add_option("plan", o->plan, "The plan file")->required();
  add_config_option(cmd, &o->config, "The runtime config (TOML)");
  add_trust_plugin_path_option(cmd, &o->trust_paths);
  cmd->add_option("--methods", o->methods, "Comma-separated methods (default: all)")
      ->check(methods_check);
  cmd->add_flag("--verify", o->verify,
                "Read every constant back and compare hashes with the file");
  cmd->add_flag("--json", o->json, "Machine-readable summary");
  add_rank_options(cmd, &o->ranks);
  cmd->callback([run, o] { *run = [o] { return run_load(*o); }; });
}

}  // namespace devalloc::cli
