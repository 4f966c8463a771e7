"""The report's failure on real text, on a laptop: configs/reproduce.toml's Brown cell (96 BPE
pieces, 65 536 tokens a step in 4 micro-batches, SGD, 30 steps) with the reported kernel learns
the text more slowly than the reference on a fresh seed, while the benign control does not move.
Measured gaps (mean of the last 3 steps): +0.07 to +0.15 over 12 seeds (docs/findings.md, "On a
laptop"); over 48 more fresh seeds on 2026-11-30, +0.025 to +0.154 (median +0.11; one seed,
229573088, at +0.025, the next lowest +0.055), after this test had asked for +0.03 and seed
229573088 failed CI. The control's gap stays below 1e-6: 0.01 is four orders beyond it."""
import csv
import os
import random
import unittest

import h5py

from cli import ROOT, run, tmpdir


def brown_cell():
    """configs/reproduce.toml's Brown cell under SGD as divlab itself expands the grid
    (`sweep --emit-slurm` writes the cells' overrides and runs nothing), seed and kernel left out."""
    out = os.path.join(tmpdir(), "grid")
    run("sweep", "--config", os.path.join(ROOT, "configs", "reproduce.toml"), "--out", out,
        "--emit-slurm", check=True)
    with open(os.path.join(out, "cells.tsv")) as f:
        cells = [row["overrides"].split() for row in csv.DictReader(f, delimiter="\t")]
    cell = next(c for c in cells if "data=brown" in c and "train.optimizer=sgd" in c)
    return [o for o in cell if not o.startswith(("train.seed=", "kernels."))]


def tail_loss(path, steps=3):
    with h5py.File(path, "r") as f:
        loss = f["metrics/loss"][:]
    return float(loss[-steps:].mean())


class RealTextOnALaptop(unittest.TestCase):
    def test_the_reported_kernel_slows_learning_and_the_control_does_not(self):
        seed = random.randrange(1 << 30)
        d = tmpdir()
        cell = brown_cell() + [f"train.seed={seed}", "train.threads=1"]
        self.assertIn("train.micro_batches=4", cell)
        loss = {}
        for variant in ("reference", "bf16_accum", "fp32_reordered"):
            out = os.path.join(d, variant + ".h5")
            run("train", "--quiet", "--out", out, "--set", *cell,
                f"kernels.embed_rmsnorm_backward={variant}", check=True)
            loss[variant] = tail_loss(out)
        bug = loss["bf16_accum"] - loss["reference"]
        control = loss["fp32_reordered"] - loss["reference"]
        self.assertGreater(bug, 0.01, f"seed {seed}: bf16_accum's gap {bug:+.4f}")
        self.assertLess(abs(control), 1e-3, f"seed {seed}: the control's gap {control:+.2e}")


if __name__ == "__main__":
    unittest.main()
