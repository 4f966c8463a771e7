// Data-parallel ranks as processes (train.data_parallel = "nccl" or "processes"): which rank
// this process is, and the launcher that starts one process per rank when no other launcher did.
//
// Launchers, in the order their environment is read:
//   divlab itself:  DIVLAB_RANK, DIVLAB_WORLD_SIZE, DIVLAB_LOCAL_RANK, DIVLAB_RUN_NONCE
//   mpirun (Open MPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (nonce: PMIX_NAMESPACE)
//   srun (Slurm):   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (nonce: job and step id)
//   torchrun:       RANK, WORLD_SIZE, LOCAL_RANK (nonce: run id, endpoint, restart count)
// A world of one (a Slurm batch script's single task) is no launch: divlab starts the ranks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "kernels/communicator.h"

namespace divlab {

struct RankLaunch {
  World world;
  std::string nonce;       // shared by every rank of this launch (common/rendezvous.h)
  std::string launcher;    // "divlab", "mpirun", "srun", "torchrun": for messages
  bool lock_held = false;  // divlab's launcher holds the trace's writer lock for the ranks
};

// This process's place among launched ranks, or nothing when no launcher started it. Throws
// InputError naming the variable when one is malformed.
std::optional<RankLaunch> launched_rank();

// launched_rank() for a run whose ranks are processes (`transport` nccl or processes); nothing
// for simulated ranks, whose run never reads launcher variables.
std::optional<RankLaunch> launched_rank(RankTransport transport);

// Whether this process answers for the run's output: checks its path, prints the resolved
// config and takes the trace's writer lock. A run's only process, or rank 0 of ranks that
// mpirun, srun or torchrun started; ranks that divlab's launcher started leave all of it to the
// launcher, which holds the lock for them.
bool answers_for_output(const std::optional<RankLaunch>& launch);

// Throws InputError unless the launcher started as many ranks as the config asks for.
void check_world_size(const RankLaunch& launch, int ranks);

// Before CUDA starts in this process: narrows CUDA_VISIBLE_DEVICES to the GPU of `local_rank`
// (its entry in the inherited list, or that index when the list is unset; a list of one is
// already narrowed by the launcher, as srun --gpus-per-task=1 does), so that every thread of the
// rank, and NCCL, sees that GPU alone as device 0.
void use_local_gpu(int local_rank);

// Throws InputError unless this machine shows `ranks` GPUs, one per local rank.
void check_local_gpus(int ranks);

// The launcher: starts `ranks` processes of the command `args` (DIVLAB_RANK and the other
// variables above tell each its place), with `gpus` rank r on GPU r after checking that this
// machine shows `ranks` GPUs (InputError otherwise), else each with its share of the cores
// (OMP_NUM_THREADS), each in its own process group; forwards
// stop signals to them; stops the rest when one fails (SIGTERM, then SIGKILL: a rank blocked in a
// collective cannot poll); and records a rank's crash in `trace` (its writer lock is held here).
// Returns the command's exit status: rank 0's, or the first failed rank's.
int launch_local_ranks(int ranks, bool gpus, const std::string& trace,
                       const std::vector<std::string>& args);

// Where the ranks of a run writing `trace` meet (common/rendezvous.h).
std::string rendezvous_path(const std::string& trace);

}  // namespace divlab
