#include "experiments/ranks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "common/lock.h"
#include "common/process.h"
#include "common/signals.h"
#include "io/trace.h"
#include "kernels/backend.h"

namespace divlab {

namespace {

// The variables divlab's launcher gives each rank.
constexpr const char* kRank = "DIVLAB_RANK";
constexpr const char* kWorldSize = "DIVLAB_WORLD_SIZE";
constexpr const char* kLocalRank = "DIVLAB_LOCAL_RANK";
constexpr const char* kNonce = "DIVLAB_RUN_NONCE";

// How long ranks asked to stop after another failed get before they are killed: a rank blocked
// in a collective whose peer is gone never reaches its next stop check.
constexpr double kRankStopGraceSeconds = 10;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int env_int(const char* name, int lowest) {
  const std::string text = env(name);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lowest || v > (1 << 20))
    throw InputError("environment variable " + std::string(name) + "='" + text +
                     "': expected an integer >= " + std::to_string(lowest));
  return int(v);
}

struct Convention {
  const char* launcher;
  const char *rank, *size, *local_rank;
};
constexpr Convention kConventions[] = {
    {"divlab", kRank, kWorldSize, kLocalRank},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

std::string nonce_of(const std::string& launcher) {
  if (launcher == "divlab") return env(kNonce);
  if (launcher == "mpirun") return env("PMIX_NAMESPACE") + env("OMPI_MCA_ess_base_jobid");
  if (launcher == "srun") return env("SLURM_JOB_ID") + "." + env("SLURM_STEP_ID");
  // torchrun's run id is "none" unless given: its rendezvous endpoint and restart count tell
  // launches apart too.
  return env("TORCHELASTIC_RUN_ID") + "@" + env("MASTER_ADDR") + ":" + env("MASTER_PORT") + "#" +
         env("TORCHELASTIC_RESTART_COUNT");
}

std::string random_nonce() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device() << device() << device();
  return out.str();
}

}  // namespace

std::optional<RankLaunch> launched_rank() {
  for (const Convention& c : kConventions) {
    if (env(c.rank).empty() || env(c.size).empty()) continue;
    RankLaunch l;
    l.launcher = c.launcher;
    l.world.size = env_int(c.size, 1);
    if (l.world.size == 1) continue;  // one task: nothing was launched in parallel
    l.world.rank = env_int(c.rank, 0);
    l.world.local_rank = env(c.local_rank).empty() ? l.world.rank : env_int(c.local_rank, 0);
    if (l.world.rank >= l.world.size)
      throw InputError("environment variable " + std::string(c.rank) + "=" +
                       std::to_string(l.world.rank) + ": not below " + c.size + "=" +
                       std::to_string(l.world.size));
    l.nonce = nonce_of(l.launcher);
    for (char& ch : l.nonce)
      if (ch == '\n' || ch == '\r') ch = ' ';
    l.lock_held = l.launcher == std::string("divlab");
    return l;
  }
  return std::nullopt;
}

std::optional<RankLaunch> launched_rank(RankTransport transport) {
  return ranks_are_processes(transport) ? launched_rank() : std::nullopt;
}

bool answers_for_output(const std::optional<RankLaunch>& launch) {
  return !launch || (launch->world.rank == 0 && !launch->lock_held);
}

void check_world_size(const RankLaunch& launch, int ranks) {
  if (launch.world.size != ranks)
    throw InputError("config key 'train.ranks' = " + std::to_string(ranks) + ", but " +
                     launch.launcher + " started " + std::to_string(launch.world.size) + " ranks");
}

void use_local_gpu(int local_rank) {
  const std::string visible = env("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> list;
  std::istringstream entries(visible);
  for (std::string e; std::getline(entries, e, ',');) list.push_back(e);
  std::string mine;
  if (list.size() == 1) return;  // narrowed already (one GPU per task)
  if (list.empty()) {
    mine = std::to_string(local_rank);
  } else {
    if (local_rank >= int(list.size()))
      throw InputError("local rank " + std::to_string(local_rank) +
                       " has no GPU: " + "CUDA_VISIBLE_DEVICES='" + visible + "' lists " +
                       std::to_string(list.size()));
    mine = list[size_t(local_rank)];
  }
  setenv("CUDA_VISIBLE_DEVICES", mine.c_str(), 1);
}

std::string rendezvous_path(const std::string& trace) {
  return trace + ".rendezvous";
}

void check_local_gpus(int ranks) {
  const int gpus = cuda_device_count();
  if (gpus < ranks)
    throw InputError("config key 'train.ranks' = " + std::to_string(ranks) +
                     " with 'train.data_parallel' = \"nccl\" needs " + std::to_string(ranks) +
                     " GPUs, one per rank; this machine shows " + std::to_string(gpus) +
                     (env("CUDA_VISIBLE_DEVICES").empty()
                          ? std::string()
                          : " (CUDA_VISIBLE_DEVICES='" + env("CUDA_VISIBLE_DEVICES") + "')") +
                     "; train.data_parallel = \"simulated\" runs the same ranks on one device");
}

int launch_local_ranks(int ranks, bool gpus, const std::string& trace,
                       const std::vector<std::string>& args) {
  if (gpus) check_local_gpus(ranks);
  // CPU ranks share this host's cores (the kernels' fixed chunks give the same bits with any
  // count): each its share, unless OMP_NUM_THREADS says otherwise.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = env("OMP_NUM_THREADS").empty()
                                  ? std::to_string(std::max(1u, cores / unsigned(ranks)))
                                  : env("OMP_NUM_THREADS");
  const std::string nonce = random_nonce();
  std::remove(rendezvous_path(trace).c_str());  // an earlier launch's, never this one's
  std::vector<pid_t> pids;
  std::vector<int> statuses(size_t(ranks), -1);
  std::vector<int> sent(size_t(ranks), 0);  // the last signal this launcher sent each rank
  const auto signal_all = [&](int sig) {
    for (size_t r = 0; r < pids.size(); ++r)
      if (statuses[r] < 0) kill(pids[r], sig), sent[r] = sig;
  };
  for (int r = 0; r < ranks; ++r) {
    SpawnOptions so;
    // Its own process group: a terminal's Ctrl-C reaches this launcher alone, which passes the
    // request on to every rank, and they stop together (experiments/data_parallel.h).
    so.own_process_group = true;
    so.setenv = {std::string(kRank) + "=" + std::to_string(r),
                 std::string(kWorldSize) + "=" + std::to_string(ranks),
                 std::string(kLocalRank) + "=" + std::to_string(r),
                 std::string(kNonce) + "=" + nonce};
    if (!gpus) so.setenv.push_back("OMP_NUM_THREADS=" + threads);
    const pid_t pid = spawn_process(args, so);
    if (pid < 0) {
      signal_all(SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      throw RunFailed("cannot start rank " + std::to_string(r) + " ('" + args[0] + "')");
    }
    pids.push_back(pid);
  }
  using Clock = std::chrono::steady_clock;
  int forwarded = 0, first_failure = -1, killed = -1, live = ranks;
  Clock::time_point stop_asked{};
  while (live > 0) {
    for (int r = 0; r < ranks; ++r) {
      int status = 0;
      if (statuses[size_t(r)] >= 0 || waitpid(pids[size_t(r)], &status, WNOHANG) <= 0) continue;
      statuses[size_t(r)] = status, --live;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0) &&
                          !(WIFEXITED(status) && WEXITSTATUS(status) >= 128 && forwarded);
      // A rank killed by a signal this launcher did not send is where a failure began: its
      // peers fail after it (a closed socket, a lost NCCL peer), sometimes before it is seen.
      if (WIFSIGNALED(status) && WTERMSIG(status) != sent[size_t(r)] && killed < 0) killed = r;
      if (failed && first_failure < 0) {
        first_failure = r;
        signal_all(SIGTERM);
        stop_asked = Clock::now();
      }
    }
    if (stop_signal() != 0 && forwarded == 0) {
      forwarded = stop_signal();
      signal_all(forwarded);
      stop_asked = Clock::now();
    }
    if (live > 0 && stop_asked != Clock::time_point{} &&
        std::chrono::duration<double>(Clock::now() - stop_asked).count() > kRankStopGraceSeconds)
      signal_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::remove(rendezvous_path(trace).c_str());
  const int reported = killed >= 0 ? killed : first_failure >= 0 ? first_failure : 0;
  if (first_failure >= 0)
    std::fprintf(stderr, "divlab: rank %d ended with %s; the other ranks were stopped\n", reported,
                 describe_wait_status(statuses[size_t(reported)]).c_str());
  // Rank 0 killed (by a crash, or by this launcher after another rank failed) could not record
  // its end: the trace gets it here, where its writer lock is held.
  if (WIFSIGNALED(statuses[0]))
    record_crash(trace, "crashed: rank " + std::to_string(reported) + " ended with " +
                            describe_wait_status(statuses[size_t(reported)]) +
                            (reported == 0 ? "" : "; rank 0 was stopped"));
  const int status = statuses[size_t(reported)];
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace divlab
