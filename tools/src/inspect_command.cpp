// `devalloc inspect`: what a plan holds and where each buffer would go,
// without allocating anything.
#include "commands.hpp"
#include "inputs.hpp"


#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/placement.hpp>
#include <devalloc/input_text.hpp>

#include <cstdio>
#include <map>
#include <optional>
#include <vector>

namespace devalloc::cli {

namespace {

struct InspectOptions {
  std::string plan;
  std::string config;
  std::vector<std::string> trust_paths;
  bool tensors = false;
  RankOptions ranks;
};

// A plan for several ranks, without a rank: each rank's share.
void print_ranks(const Plan& plan) {
  std::vector<uint64_t> bytes(plan.world_size, 0), tensors(plan.world_size, 0);
  uint64_t replicated = 0, replicated_tensors = 0;
  std::map<uint32_t, std::optional<uint32_t>> rank_of;
  for (const PlanBuffer& b : plan.buffers) rank_of[b.memory_id] = b.rank;
  for (const PlanTensor& t : plan.tensors) {
    const auto found = rank_of.find(t.memory_id);
    if (found == rank_of.end()) continue;
    const Result<uint64_t> size = byte_size(t.dtype, t.shape);
    const uint64_t n = size.ok() ? *size : 0;
    if (found->second) {
      bytes[*found->second] += n;
      ++tensors[*found->second];
    } else {
      replicated += n;
      ++replicated_tensors;
    }
  }
  std::printf("plan %s: for a job of %u ranks\n", path_for_message(plan.path.string()).c_str(),
              plan.world_size);
  std::printf("  every rank: %llu tensors, %s (replicated)\n",
              static_cast<unsigned long long>(replicated_tensors),
              human_bytes(replicated).c_str());
  for (uint32_t r = 0; r < plan.world_size && r < 64; ++r) {
    std::printf("  rank %u: %llu tensors, %s of its own\n", r,
                static_cast<unsigned long long>(tensors[r]), human_bytes(bytes[r]).c_str());
  }
  if (plan.world_size > 64) std::printf("  ... (%u ranks in all)\n", plan.world_size);
  std::printf("devalloc inspect --rank R shows one rank's buffers and devices\n");
}

int run_inspect(const InspectOptions& o) {
  auto config = config_from(o.config, o.trust_paths);
  if (!config.ok()) return report_failure("inspect", config.status());
  SafetensorsCache cache;
  auto full = valid_plan_from(o.plan, cache, *config);
  if (!full.ok()) return report_failure("inspect", full.status());
  Result<std::optional<JobRank>> rank = std::optional<JobRank>();
  if (o.ranks.rank || o.ranks.world_size) rank = rank_for(*full, o.ranks);
  if (!rank.ok()) return report_failure("inspect", rank.status());
  if (full->world_size != 0 && !rank->has_value()) {
    print_ranks(*full);
    return kExitOk;
  }
  auto plan = rank->has_value() ? plan_for_rank(*full, **rank) : std::move(full);
  if (!plan.ok()) return report_failure("inspect", plan.status());
  if (rank->has_value()) {
    std::printf("rank %u of %u\n", (*rank)->rank, (*rank)->world_size);
  }

  for (const std::string& line : unused_device_entries(*config, *plan)) {
    std::fprintf(stderr, "devalloc inspect: warning: %s\n", line.c_str());
  }

  DeviceRegistry registry(*config);
  // Names come from the plan file and its sources: escaped, as in messages.
  std::printf("plan %s: %zu buffers, %zu tensors, %zu methods\n",
              path_for_message(o.plan).c_str(),
              plan->buffers.size(), plan->tensors.size(), plan->methods.size());
  std::printf("\nbuffers:\n");
  std::vector<BufferPlacement> placements;
  Status first_failure;
  for (size_t i = 0; i < plan->buffers.size(); ++i) {
    const PlanBuffer& b = plan->buffers[i];
    PlannedBuffer pb{b.memory_id, b.size, b.alignment, b.device, i};
    auto placed = place_buffer(pb, registry);
    std::printf("  [%u] %s, alignment %llu, planned %s", b.memory_id,
                human_bytes(b.size).c_str(), static_cast<unsigned long long>(b.alignment),
                escaped(b.device).c_str());
    if (placed.ok()) {
      std::printf(" -> %s%s\n", placed->device.describe().c_str(),
                  placed->device.is_fallback ? " [fallback]" : "");
      // Why, whatever [load] fallback says: inspect is where one looks.
      if (placed->device.is_fallback) {
        std::printf("      fallback: %s\n",
                    fallback_line(b.memory_id, placed->device).c_str());
      }
      placements.push_back(std::move(*placed));
    } else {
      std::printf(" -> unresolved\n      %s\n", placed.status().message().c_str());
      if (first_failure.ok()) first_failure = placed.status().with_context(buffer_place(*plan, pb));
    }
  }
  std::printf("\nmethods:\n");
  for (const PlanMethod& m : plan->methods) {
    std::printf("  %s: %zu tensors, buffers", escaped(m.name).c_str(), m.tensors.size());
    for (uint32_t id : m.memory_ids) std::printf(" %u", id);
    std::printf("\n");
  }
  if (o.tensors) {
    std::printf("\ntensors:\n");
    for (const PlanTensor& t : plan->tensors) {
      std::string source =
          t.source ? path_for_message(t.source->file) + ":" + escaped(t.source->key)
                   : "(scratch)";
      if (t.source && t.source->slice) source += " [" + slice_to_string(*t.source->slice) + "]";
      std::printf("  %-40s %-8s %-16s buffer %u + %llu  %s\n", escaped(t.name).c_str(),
                  std::string(to_string(t.dtype)).c_str(), shape_to_string(t.shape).c_str(),
                  t.memory_id, static_cast<unsigned long long>(t.offset), source.c_str());
    }
  }
  // What each physical device must hold, against what it has free now.
  const std::vector<DeviceDemand> demands = device_demands(placements);
  std::printf("\ndevices:\n");
  for (const DeviceDemand& d : demands) {
    std::printf("  %s: %s%s\n", d.label().c_str(), d.summary().c_str(),
                d.fits() ? "" : " [does not fit]");
  }
  if (first_failure.ok() && config->load.check_free_memory) {
    first_failure = check_fit(demands);
    if (!first_failure.ok()) first_failure = first_failure.with_context(path_for_message(o.plan));
  }
  if (!first_failure.ok()) return report_failure("inspect", first_failure);
  return kExitOk;
}

}  // namespace

void add_inspect_command(CLI::App& app, Action* run) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show a plan's buffers, methods and the devices they resolve to");
  cmd->add_option("plan", o->plan, "The plan file")->required();
  add_config_option(cmd, &o->config, "The runtime config (TOML)");
  add_trust_plugin_path_option(cmd, &o->trust_paths);
  cmd->add_flag("--tensors", o->tensors, "Also list every tensor");
  add_rank_options(cmd, &o->ranks);
  cmd->callback([run, o] { *run = [o] { return run_inspect(*o); }; });
}

}  // namespace devalloc::cli
