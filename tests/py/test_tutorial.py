"""docs/tutorial.md, run as a class would: every command in its sh blocks, in a scratch folder,
and the claims the page makes about their outputs."""
import math
import os
import re
import shlex
import subprocess
import unittest

import h5py

from cli import BIN, ROOT, tmpdir

TUTORIAL = os.path.join(ROOT, "docs", "tutorial.md")


def commands():
    with open(TUTORIAL) as f:
        text = f.read()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def final_loss(path):
    with h5py.File(path, "r") as f:
        return float(f["metrics/loss"][-1])


def mean_dose(path):
    with h5py.File(path, "r") as f:
        return float(f["metrics/max_row_contributions"][:].mean())


class Tutorial(unittest.TestCase):
    def test_every_command_runs_and_the_page_tells_the_truth(self):
        d = tmpdir()
        os.symlink(os.path.join(ROOT, "configs"), os.path.join(d, "configs"))
        os.makedirs(os.path.join(d, "runs", "lesson"))
        outputs = {}
        lines = commands()
        self.assertGreaterEqual(len(lines), 9)
        for line in lines:
            argv = shlex.split(line)
            self.assertEqual(argv[0], "divlab", line)
            r = subprocess.run([BIN, *argv[1:]], cwd=d, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"{line}\n{r.stderr}")
            outputs[line] = r.stdout
        run = lambda name: final_loss(os.path.join(d, "runs", "lesson", name + ".h5"))
        # Section 1: a third of the tokens are one token; the floor is the entropy rate.
        data = next(out for line, out in outputs.items() if line.startswith("divlab data"))
        self.assertGreater(float(re.search(r"top-1 share\s+([0-9.]+)", data)[1]), 0.3)
        floor = float(re.search(r"loss floor\)\s+([0-9.]+)", data)[1])
        # Section 2: the reference reaches the floor, the bug ends well above it.
        self.assertLess(run("sgd-reference") - floor, 0.02)
        self.assertGreater(run("sgd-bug") - run("sgd-reference"), 0.2)
        # Section 3: same seed, same output; a header, then the prompt continued.
        samples = [out for line, out in outputs.items() if line.startswith("divlab sample")]
        self.assertEqual(len(samples), 2)
        for out in samples:
            ids = out.splitlines()[1].split()
            self.assertEqual(ids[0], "0")
            self.assertEqual(len(ids), 25)
        # Sections 4 and 5: AdamW, and the chain without hot tokens, hide it.
        self.assertLess(abs(run("adamw-bug") - run("adamw-reference")), 0.01)
        self.assertLess(abs(run("cold-bug") - run("cold-reference")), 0.01)
        # Section 6: four ranks train like one; the bug's dose per call falls to about a
        # quarter and its gap shrinks but stays; a missing world-size division stops SGD from
        # learning and leaves AdamW where its correct run ended.
        self.assertLess(abs(run("ranks-reference") - run("sgd-reference")), 1e-3)
        dose = lambda name: mean_dose(os.path.join(d, "runs", "lesson", name + ".h5"))
        self.assertLess(dose("ranks-bug"), 0.3 * dose("sgd-bug"))
        ranks_gap = run("ranks-bug") - run("ranks-reference")
        self.assertGreater(ranks_gap, 0.05)
        self.assertLess(ranks_gap, run("sgd-bug") - run("sgd-reference"))
        # Micro-batches keep the dose whole, and the bug's gap with it.
        self.assertEqual(dose("micro-bug"), dose("sgd-bug"))
        self.assertLess(abs(run("micro-bug") - run("sgd-bug")),
                        0.25 * (run("sgd-bug") - run("sgd-reference")))
        # (Four times the step without clipping sits at the uniform guess or, with another CPU's
        # GEMM rounding, blows up to NaN: either way it never learns.)
        never_learns = run("ranks-sum")
        self.assertTrue(math.isnan(never_learns) or never_learns - run("ranks-reference") > 1.0,
                        never_learns)
        self.assertLess(abs(run("adamw-ranks-sum") - run("adamw-reference")), 0.01)


if __name__ == "__main__":
    unittest.main()
