#include <devalloc/core/job_rank.hpp>

#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "plan_errors.hpp"

#include <charconv>
#include <cstdlib>
#include <set>
#include <string_view>
#include <utility>

namespace devalloc {

namespace {

struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local;  // may be unset
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

// The value of variable `name` as a number below 2^32, or an error.
Result<uint32_t> number_of(const char* name, const char* value) {
  const std::string_view text(value);
  uint32_t n = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return Status(StatusCode::invalid_argument,
                  std::string("environment variable ") + name + " is " + quote(text) +
                      ", not a rank or size (a whole number below 2^32)");
  }
  return n;
}

}  // namespace

Status check_rank(const JobRank& rank) {
  if (rank.world_size == 0) {
    return Status(StatusCode::invalid_argument, rank.source + ": the world size is 0");
  }
  if (rank.rank >= rank.world_size) {
    return Status(StatusCode::invalid_argument,
                  rank.source + ": rank " + std::to_string(rank.rank) +
                      " is not below the world size " + std::to_string(rank.world_size));
  }
  return Status();
}

Result<std::optional<JobRank>> rank_from_environment() {
  for (const Launcher& l : kLaunchers) {
    const char* rank = std::getenv(l.rank);
    const char* size = std::getenv(l.size);
    if (rank == nullptr && size == nullptr) continue;
    if (rank == nullptr || size == nullptr) {
      return Status(StatusCode::invalid_argument,
                    std::string(l.name) + ": " + (rank == nullptr ? l.size : l.rank) +
                        " is set but " + (rank == nullptr ? l.rank : l.size) + " is not");
    }
    JobRank job;
    job.source = std::string(l.name) + " (" + l.rank + ", " + l.size + ")";
    Result<uint32_t> r = number_of(l.rank, rank);
    if (!r.ok()) return r.status();
    Result<uint32_t> s = number_of(l.size, size);
    if (!s.ok()) return s.status();
    job.rank = *r;
    job.world_size = *s;
    job.local_rank = job.rank;
    if (const char* local = std::getenv(l.local)) {
      Result<uint32_t> lr = number_of(l.local, local);
      if (!lr.ok()) return lr.status();
      job.local_rank = *lr;
    }
    if (Status c = check_rank(job); !c.ok()) return c;
    return std::optional<JobRank>(std::move(job));
  }
  return std::optional<JobRank>();
}

Result<Plan> plan_for_rank(const Plan& plan, const JobRank& rank) {
  return detail::catch_as_status(
      [&]() -> Result<Plan> {
        if (Status c = check_rank(rank); !c.ok()) return c;
        if (plan.world_size == 0) return plan;
        if (plan.world_size != rank.world_size) {
          return detail::plan_error(
              plan, "",
              "the plan is for a job of " + std::to_string(plan.world_size) +
                  " ranks, this job has " + std::to_string(rank.world_size) + " (" +
                  rank.source + "); make the plan again with --world-size " +
                  std::to_string(rank.world_size));
        }
        Plan view;
        view.path = plan.path;
        view.allow_external_files = plan.allow_external_files;
        std::set<uint32_t> ids;
        const std::string local = std::to_string(rank.local_rank);
        for (const PlanBuffer& b : plan.buffers) {
          if (b.rank && *b.rank != rank.rank) continue;
          PlanBuffer mine = b;
          mine.rank.reset();
          // "cuda:local" -> "cuda:<local rank>"
          constexpr std::string_view kLocal = ":local";
          if (mine.device.size() > kLocal.size() &&
              std::string_view(mine.device).substr(mine.device.size() - kLocal.size()) ==
                  kLocal) {
            mine.device.replace(mine.device.size() - kLocal.size() + 1, kLocal.size() - 1,
                                local);
          }
          ids.insert(b.memory_id);
          view.buffers.push_back(std::move(mine));
        }
        std::set<std::string_view> names;
        for (const PlanTensor& t : plan.tensors) {
          if (ids.count(t.memory_id) == 0) continue;
          view.tensors.push_back(t);
          names.insert(t.name);
        }
        for (const PlanMethod& m : plan.methods) {
          PlanMethod mine;
          mine.name = m.name;
          for (uint32_t id : m.memory_ids) {
            if (ids.count(id) != 0) mine.memory_ids.push_back(id);
          }
          for (const std::string& n : m.tensors) {
            if (names.count(n) != 0) mine.tensors.push_back(n);
          }
          view.methods.push_back(std::move(mine));
        }
        return view;
      },
      detail::file_failure(plan.path, "taking a rank's view of the plan"));
}

}  // namespace devalloc
