// check's compute-sanitizer pass: what a run found, read from its log.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "experiments/sanitizer_log.h"

namespace divlab {

// check's sanitizer pass reads what compute-sanitizer found from its log. Races racecheck
// reports between two accesses inside cuBLASLt's generated Hopper GEMMs (nvjet_sm*: TMA and
// mbarriers, which it does not model; the lines are an H200's, 2026-11-30) do not fail a check;
// a race with one access in any other kernel does, as does the sanitizer's own failure (it
// failed that way when those GEMMs were left uninstrumented) and any finding it words otherwise.
TEST(CheckSanitizerLog, RacesInsideCublasLtsGemmsAloneDoNotFailACheck) {
  const std::string nvjet =
      "========= COMPUTE-SANITIZER\n"
      "========= Error: Race reported between Read access at "
      "nvjet_sm90_tss_64x64_64x13_1x2_h_badd_NTT+0xaa0\n"
      "=========     and Write access at nvjet_sm90_tss_64x64_64x13_1x2_h_badd_NTT+0x2f50 "
      "[512 hazards]\n"
      "========= \n"
      "verdict: PASS (bf16-grade)\n"
      "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n";
  const std::string own =
      "========= Error: Race reported between Write access at void "
      "rmsnorm_missing_barrier<float>(const float *, float *, int)+0x1f0 in /src/racy.cu:42\n"
      "=========     and Read access at void rmsnorm_missing_barrier<float>(const float *, float "
      "*, int)+0x2a0 in /src/racy.cu:47 [64 hazards]\n";
  const std::string internal =
      "========= COMPUTE-SANITIZER\n"
      "========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.\n"
      "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n";
  const auto read = [](const std::string& text) {
    std::istringstream in(text);
    return read_sanitizer_log(in, "RACECHECK SUMMARY");
  };

  const SanitizerFindings only_gemm = read(nvjet);
  EXPECT_EQ(only_gemm.races, 1);
  EXPECT_EQ(only_gemm.races_unmodelled, 1);
  EXPECT_FALSE(only_gemm.fails(true));
  EXPECT_EQ(only_gemm.summary, "RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)");
  EXPECT_NE(only_gemm.line(true).find("1 of 1 race report(s) inside cuBLASLt"), std::string::npos)
      << only_gemm.line(true);

  const SanitizerFindings both = read(nvjet + own);
  EXPECT_EQ(both.races, 2);
  EXPECT_TRUE(both.fails(true));
  EXPECT_NE(both.line(true).find("first: Error: Race reported between Write access at void "
                                 "rmsnorm_missing_barrier"),
            std::string::npos)
      << both.line(true);
  EXPECT_NE(both.first.find("racy.cu:47 [64 hazards]"), std::string::npos) << both.first;

  // Only cuBLASLt's names: a plug-in's kernel that merely starts with "nvjet_" counts.
  EXPECT_TRUE(read("========= Error: Race reported between Read access at nvjet_mine+0x10\n"
                   "=========     and Write access at nvjet_mine+0x20 [4 hazards]\n")
                  .fails(true));

  const SanitizerFindings failed = read(internal);
  EXPECT_TRUE(failed.fails(true));
  EXPECT_EQ(failed.first,
            "Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.");

  // memcheck's form, and one this reader does not know: both count.
  const std::string invalid =
      "========= Invalid __global__ read of size 4 bytes\n"
      "=========     at gelu_kernel+0x70\n"
      "========= ERROR SUMMARY: 1 error\n";
  std::istringstream memcheck(invalid);
  const SanitizerFindings oob = read_sanitizer_log(memcheck, "ERROR SUMMARY");
  EXPECT_TRUE(oob.fails(true));
  EXPECT_EQ(oob.first, "Invalid __global__ read of size 4 bytes at gelu_kernel+0x70");
  EXPECT_EQ(oob.summary, "ERROR SUMMARY: 1 error");
  const SanitizerFindings other = read(
      "========= Error: Potential RAW hazard detected at __shared__ 0x10\n"
      "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n");
  EXPECT_TRUE(other.fails(true));
  EXPECT_EQ(other.first, "Error: Potential RAW hazard detected at __shared__ 0x10");
  EXPECT_FALSE(read("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
                   .fails(false));
}

// synccheck's findings (an H200's lines, 2026-11-30: a barrier inside a branch that part of a warp
// takes) fail a check and are quoted with the kernel, source line and thread they name. The
// checked run's own exit code (a failing verdict) is no finding: the tool prints "Target
// application returned an error", counts nothing and exits with the run's code, not its own.
TEST(CheckSanitizerLog, SynccheckFindingsAreQuotedWhereTheyHappened) {
  const auto read = [](const std::string& text) {
    std::istringstream in(text);
    return read_sanitizer_log(in, "ERROR SUMMARY");
  };
  const std::string barrier =
      "========= COMPUTE-SANITIZER\n"
      "========= Barrier error detected. Divergent thread(s) in warp.\n"
      "=========     at p3(float *, const float *, int)+0xf0 in probe.cu:32\n"
      "=========     by thread (96,0,0) in block (0,0,0)\n"
      "=========     Saved host backtrace up to driver entry point at kernel launch time\n"
      "=========         Host Frame: main [0x8ed1] in probe\n"
      "========= \n"
      "========= Barrier error detected. Divergent thread(s) in warp.\n"
      "=========     at p3(float *, const float *, int)+0xf0 in probe.cu:32\n"
      "=========     by thread (97,0,0) in block (0,0,0)\n"
      "========= \n"
      "========= ERROR SUMMARY: 2 errors\n";
  const SanitizerFindings sync = read(barrier);
  EXPECT_TRUE(sync.fails(true));
  EXPECT_EQ(sync.summary, "ERROR SUMMARY: 2 errors");
  EXPECT_EQ(sync.first,
            "Barrier error detected. Divergent thread(s) in warp. at p3(float *, const float *, "
            "int)+0xf0 in probe.cu:32 by thread (96,0,0) in block (0,0,0)");
  EXPECT_NE(sync.line(true).find("; first: Barrier error detected."), std::string::npos)
      << sync.line(true);

  const SanitizerFindings verdict = read(
      "========= COMPUTE-SANITIZER\n"
      "========= Target application returned an error\n"
      "========= ERROR SUMMARY: 0 errors\n");
  EXPECT_FALSE(verdict.fails(false));
  EXPECT_EQ(verdict.line(false), "ERROR SUMMARY: 0 errors");
}

// The pass runs every condition in one process, with no watchdog: after a hang under a
// condition (a worker killed by check's hang clock) it does not run; after a crash it does
// (memcheck may name the access). A tool gets 100x the conditions' time, at least 10 minutes.
TEST(CheckSanitizerPass, DoesNotRunAfterAHangAndGivesEachToolADeadline) {
  CheckReport r;
  r.conditions.resize(3);
  r.conditions[0].name = "shape odd";
  r.conditions[1].name = "arrays large (4 M)";
  EXPECT_EQ(sanitizer_pass_skipped(r), "");
  r.conditions[0].crashed = r.conditions[0].failed = true;
  r.conditions[0].why = "crashed: SIGSEGV (Segmentation fault)";
  EXPECT_EQ(sanitizer_pass_skipped(r), "");
  r.conditions[1].crashed = r.conditions[1].failed = true;
  r.conditions[1].why = "hang: no result within 120 s (--time-limit)";
  EXPECT_NE(sanitizer_pass_skipped(r).find("hung under 'arrays large (4 M)'"), std::string::npos)
      << sanitizer_pass_skipped(r);
  EXPECT_EQ(sanitizer_tool_seconds(2.5), 600.0);
  EXPECT_EQ(sanitizer_tool_seconds(30), 3000.0);
}

}  // namespace divlab
