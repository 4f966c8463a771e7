// Ranks as processes (train.data_parallel = "nccl" or "processes"), the parts below a run: how
// a rank learns its place from each launcher's environment, which GPU it narrows itself to, the
// rendezvous file through which the ranks of one launch, and only they, meet, and the CPU's
// socket transport (ranks as threads here). Whole runs: tests/py/ranks_cases.py.
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <map>
#include <random>
#include <tuple>

#include "common/errors.h"
#include "common/rendezvous.h"
#include "experiments/ranks.h"
#include "kernels/communicator.h"
#include "tests/support/check.h"
#include "tests/support/fixtures.h"

namespace divlab {
using namespace testing;

namespace {
// Every variable a launcher sets, cleared for the test and restored after it.
class CleanEnvironment {
 public:
  CleanEnvironment() {
    for (const char* name : {"DIVLAB_RANK",
                             "DIVLAB_WORLD_SIZE",
                             "DIVLAB_LOCAL_RANK",
                             "DIVLAB_RUN_NONCE",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "PMIX_NAMESPACE",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_JOB_ID",
                             "SLURM_STEP_ID",
                             "RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "TORCHELASTIC_RUN_ID",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "TORCHELASTIC_RESTART_COUNT",
                             "OMPI_MCA_ess_base_jobid",
                             "CUDA_VISIBLE_DEVICES"}) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      unsetenv(name);
      names_.push_back(name);
    }
  }
  ~CleanEnvironment() {
    for (const auto& name : names_) unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  void set(const char* name, const char* value) { setenv(name, value, 1); }

 private:
  std::vector<std::string> names_;
  std::map<std::string, std::string> saved_;
};

// f() throws InputError whose message holds `needle`.
template <class F>
void expect_input_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected one saying '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Ranks, NoLauncherNoRank) {
  CleanEnvironment env;
  EXPECT_FALSE(launched_rank().has_value());
}

// Each launcher's variables, and what a rank makes of them.
TEST(Ranks, EachLaunchersVariablesAreRead) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    const char* launcher;
    int rank, size, local_rank;
    const char* nonce;
    bool lock_held;  // only divlab's launcher holds the trace's lock for its ranks
  };
  const std::vector<Case> cases = {
      {{{"DIVLAB_RANK", "1"},
        {"DIVLAB_WORLD_SIZE", "2"},
        {"DIVLAB_LOCAL_RANK", "1"},
        {"DIVLAB_RUN_NONCE", "abc"}},
       "divlab",
       1,
       2,
       1,
       "abc",
       true},
      {{{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_JOB_ID", "77"},
        {"SLURM_STEP_ID", "0"}},
       "srun",
       3,
       4,
       1,
       "77.0",
       false},
      {{{"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
        {"PMIX_NAMESPACE", "job-5"}},
       "mpirun",
       0,
       2,
       0,
       "job-5",
       false},
      {{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"LOCAL_RANK", "1"},
        {"TORCHELASTIC_RUN_ID", "none"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "29500"}},
       "torchrun",
       1,
       2,
       1,
       "none@h:29500#",
       false},
  };
  for (const Case& c : cases) {
    CleanEnvironment env;
    for (const auto& [name, value] : c.vars) env.set(name, value);
    const auto l = launched_rank();
    ASSERT_TRUE(l.has_value()) << c.launcher;
    EXPECT_EQ(l->launcher, c.launcher);
    EXPECT_EQ(l->world.rank, c.rank) << c.launcher;
    EXPECT_EQ(l->world.size, c.size) << c.launcher;
    EXPECT_EQ(l->world.local_rank, c.local_rank) << c.launcher;
    EXPECT_EQ(l->nonce, c.nonce) << c.launcher;
    EXPECT_EQ(l->lock_held, c.lock_held) << c.launcher;
  }
}

TEST(Ranks, ASingleTaskIsNoLaunch) {
  // A Slurm batch script's one task: divlab starts the ranks itself.
  CleanEnvironment env;
  env.set("SLURM_PROCID", "0"), env.set("SLURM_NTASKS", "1");
  EXPECT_FALSE(launched_rank().has_value());
}

TEST(Ranks, AMalformedVariableIsNamed) {
  for (const auto& [rank, size, needle] :
       std::vector<std::tuple<const char*, const char*, const char*>>{
           {"x", "2", "DIVLAB_RANK='x'"},
           {"1", "2.5", "DIVLAB_WORLD_SIZE='2.5'"},
           {"2", "2", "DIVLAB_RANK=2: not below DIVLAB_WORLD_SIZE=2"},
           {"-1", "2", "DIVLAB_RANK='-1'"}}) {
    CleanEnvironment env;
    env.set("DIVLAB_RANK", rank), env.set("DIVLAB_WORLD_SIZE", size);
    expect_input_error([] { launched_rank(); }, needle);
  }
}

TEST(Ranks, EachRankNarrowsItselfToItsGpu) {
  const auto visible_after = [](const char* before, int local_rank) {
    CleanEnvironment env;
    if (before) env.set("CUDA_VISIBLE_DEVICES", before);
    use_local_gpu(local_rank);
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    return std::string(v ? v : "(unset)");
  };
  EXPECT_EQ(visible_after(nullptr, 1), "1");
  EXPECT_EQ(visible_after("4,6,7", 2), "7");
  EXPECT_EQ(visible_after("GPU-3f2a,GPU-77c1", 1), "GPU-77c1");
  EXPECT_EQ(visible_after("5", 1), "5");  // one GPU per task already
  CleanEnvironment env;
  env.set("CUDA_VISIBLE_DEVICES", "4,6");
  expect_input_error([] { use_local_gpu(2); }, "local rank 2 has no GPU");
}

TEST(Rendezvous, TheTokenOfThisLaunchArrivesWhole) {
  const std::string path = temp_dir("rendezvous") + "/run.h5.rendezvous";
  const std::string token("\x00\x01zz\xff\n ", 7);  // NCCL's id is raw bytes
  publish_token(path, "launch-1", token);
  EXPECT_EQ(await_token(path, "launch-1", 1.0), token);
}

TEST(Rendezvous, AnEarlierLaunchsFileIsNeverTaken) {
  const std::string path = temp_dir("rendezvous") + "/stale.rendezvous";
  publish_token(path, "killed-launch", "old id");
  try {
    await_token(path, "this-launch", 0.05);
    FAIL() << "a stale token was taken";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("published nothing"), std::string::npos) << e.what();
  }
  std::string token;
  EXPECT_FALSE(parse_token("not a rendezvous file\n", "", &token));
  EXPECT_FALSE(parse_token("divlab-rendezvous 1\nnonce a\ntoken 0g\n", "a", &token));
}

TEST(Rendezvous, AWaitGivesUpWhenAsked) {
  const std::string path = temp_dir("rendezvous") + "/never.rendezvous";
  int polls = 0;
  try {
    await_token(path, "n", 60.0, [&] { return ++polls >= 3; });
    FAIL() << "the wait did not give up";
  } catch (const RendezvousError& e) {
    EXPECT_EQ(polls, 3);
    EXPECT_NE(std::string(e.what()).find("stopped while waiting"), std::string::npos);
  }
}

namespace {
// A fresh socket name per test run, so two test binaries never meet.
std::string test_nonce() {
  return "test-" + std::to_string(std::random_device{}()) + "-" + std::to_string(getpid());
}
}  // namespace

TEST(Sockets, AllGatherStacksEveryRanksBytesInRankOrder) {
  constexpr int kRanks = 3;
  const std::string nonce = test_nonce();
  std::vector<std::future<std::vector<float>>> ranks;
  ranks.reserve(kRanks);
  for (int r = 0; r < kRanks; ++r)
    ranks.push_back(std::async(std::launch::async, [r, &nonce] {
      auto comm = open_local_sockets({r, kRanks, r}, nonce, 30);
      std::vector<float> all;
      for (int call = 0; call < 3; ++call) {  // the stack is rebuilt call after call
        const std::vector<float> mine(1000, float(10 * call + r));
        all.assign(size_t(kRanks) * mine.size(), -1.0f);
        comm->all_gather(mine.data(), all.data(), mine.size() * sizeof(float), nullptr);
      }
      return all;
    }));
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<float> all = ranks[size_t(r)].get();
    for (int from = 0; from < kRanks; ++from)
      for (int i = 0; i < 1000; ++i)
        ASSERT_EQ(all[size_t(from) * 1000 + size_t(i)], float(20 + from))
            << "rank " << r << " sees rank " << from << "'s value " << i;
  }
}

TEST(Sockets, APeerThatGoesAwayIsAnErrorNotAHang) {
  const std::string nonce = test_nonce();
  auto leaver = std::async(std::launch::async, [&nonce] {
    auto comm = open_local_sockets({1, 2, 1}, nonce, 30);  // joins, then leaves at once
  });
  auto comm = open_local_sockets({0, 2, 0}, nonce, 30);
  leaver.get();
  double mine = 1, all[2];
  try {
    comm->all_gather(&mine, all, sizeof mine, nullptr);
    FAIL() << "the all-gather returned without its peer";
  } catch (const CommunicatorError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 went away"), std::string::npos) << e.what();
  }
}

TEST(Sockets, NoRankZeroIsAnErrorAfterTheWait) {
  try {
    open_local_sockets({1, 2, 1}, test_nonce(), 0.1);
    FAIL() << "joined a world without rank 0";
  } catch (const CommunicatorError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 did not listen"), std::string::npos) << e.what();
  }
}

}  // namespace divlab
