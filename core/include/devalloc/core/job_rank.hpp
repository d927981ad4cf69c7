// Plans for jobs of many ranks (docs/distributed.md): which rank this
// process is, from the launcher's environment or given explicitly, and a
// rank's view of a plan made for the whole job. devalloc has no
// communication library inside: every rank reads its own bytes from
// storage it can see.
#pragma once

#include <devalloc/core/plan.hpp>
#include <devalloc/status.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace devalloc {

// A process's place in a job.
struct JobRank {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t local_rank = 0;  // its index among the ranks of its machine
  // Where it came from, for messages: "torchrun (RANK, WORLD_SIZE)", ...
  std::string source = "given";
};

// The rank a launcher gave this process, from its environment, the first
// launcher whose variables are set: torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
// OMPI_COMM_WORLD_LOCAL_RANK), MPICH and other PMI launchers (PMI_RANK,
// PMI_SIZE, MPI_LOCALRANKID), Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID). nullopt when none is set; an error naming the variable
// when one is not a number, or the rank is not below the size. Without a
// local rank variable the local rank is the rank.
Result<std::optional<JobRank>> rank_from_environment();

// Checks an explicit rank (CLI --rank/--world-size, Python, C++).
Status check_rank(const JobRank& rank);

// Rank r's view of a plan made for plan.world_size ranks: the buffers of
// rank r and the replicated ones (no rank), their tensors, each method cut
// to them, "local" device indices resolved with the local rank. The view
// is a plan for one process (world_size 0). A plan for W ranks refuses a
// job of another size; a plan without ranks is its own view.
Result<Plan> plan_for_rank(const Plan& plan, const JobRank& rank);

}  // namespace devalloc
