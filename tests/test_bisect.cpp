// `divlab bisect`'s closing lines. (The end-to-end runs are in tests/py/test_bisect.py.)
#include <gtest/gtest.h>

#include <string>

#include "experiments/bisect.h"

namespace divlab {

namespace {
BisectResult nothing_found(const std::string& moved) {
  BisectResult r;
  r.swapped = {"add=a", "gelu_forward=b"};
  BisectDecision all;
  all.subset = r.swapped, all.verdict = Outcome::NoDivergence, all.moved = moved;
  r.decisions = {all};
  r.runs = 12;
  return r;
}
}  // namespace

TEST(Bisect, NamesTheCulpritsOrSaysWhyThereAreNone) {
  BisectResult found = nothing_found("");
  found.culprits = {"gelu_forward=b"}, found.verdict = Outcome::Diverged, found.onset = 17;
  found.decisions.push_back(found.decisions.front());
  EXPECT_EQ(bisect_conclusion(found, 3),
            "bisect: culprit: gelu_forward=b (diverged, onset at step 17); 2 decisions, 12 runs\n");

  const std::string quiet = bisect_conclusion(nothing_found(""), 3);
  EXPECT_NE(quiet.find("does not leave the control band (no-divergence); nothing to blame"),
            std::string::npos)
      << quiet;

  // Every seed one way, one far beyond the rest: no verdict at 3 seeds is not innocence.
  const std::string moved =
      bisect_conclusion(nothing_found("`add=a+gelu_forward=b` in all: lopsided. Every seed..."), 3);
  EXPECT_EQ(moved.find("does not leave the control band"), std::string::npos) << moved;
  EXPECT_NE(moved.find("no verdict (no-divergence), but the seeds moved: `add=a+gelu_forward=b` "
                       "in all: lopsided."),
            std::string::npos)
      << moved;
  EXPECT_NE(moved.find("nothing to blame at 3 seeds; --seeds 8 or more may settle it. 12 runs."),
            std::string::npos)
      << moved;

  // Every run moved in no consistent direction: the kernels that move them are named as such.
  BisectResult perturbing = nothing_found("... perturbed ...");
  perturbing.perturbed = true, perturbing.culprits = {"add=a"};
  EXPECT_EQ(bisect_conclusion(perturbing, 8),
            "bisect: no divergence, but every run moved: perturbing: add=a (far past the "
            "controls, in no consistent direction); 1 decisions, 12 runs\n");
}

}  // namespace divlab
