"""Data-parallel ranks over NCCL, one process per GPU (train.data_parallel = "nccl"): every check
of ranks_cases.py (the simulated ranks' numbers bit for bit, one trace by rank 0 with each rank's
timing, resume, NaN attribution, stop signals, a dead rank, mpirun and torchrun) on two GPUs;
more ranks than GPUs refused; and, in the cuda build without a GPU, --emit-slurm asking for a GPU
per rank. Skipped where fewer than two GPUs or no cuda build are present."""
import os
import subprocess
import unittest

import cli
import ranks_cases

BIN = os.environ["DIVLAB_BIN"]


def cuda_build():
    r = subprocess.run([BIN, "kernels", "--backend", "cuda", "--op", "add"], capture_output=True)
    return r.returncode == 0


@unittest.skipUnless(cli.gpus() >= 2 and cuda_build(),
                     "needs two GPUs and the cuda build of divlab with NCCL")
class NcclRanks(ranks_cases.RanksAsProcesses, unittest.TestCase):
    MODEL = ["backend=cuda", "train.precision=fp32", *ranks_cases.SMALL]
    TRANSPORT = "nccl"

    def test_more_ranks_than_gpus_is_refused_with_one_line(self):
        r = subprocess.run([BIN, "train", "--set", *self.MODEL, "train.ranks=8", "train.batch=8",
                            "train.data_parallel=nccl", "--out", self.path("no.h5")],
                           capture_output=True, text=True,
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("needs 8 GPUs", r.stderr)
        self.assertEqual(r.stdout, "")  # refused before the config is printed
        self.assertEqual(os.listdir(self.dir), [])


@unittest.skipUnless(cuda_build(), "needs the cuda build of divlab (no GPU)")
class NcclSlurm(unittest.TestCase):
    GRID = cli.SMALL_GRID_SET.replace("[set]\n", '[set]\nbackend = "cuda"\n', 1) + """
[axes.train]
ranks = [2, 4]
data_parallel = ["simulated", "nccl"]
"""

    def emit(self, *extra):
        d = cli.tmpdir(prefix="divlab_slurm_")
        grid = os.path.join(d, "grid.toml")
        with open(grid, "w") as f:
            f.write(self.GRID)
        out = os.path.join(d, "sweep")
        r = subprocess.run([BIN, "sweep", "--config", grid, "--out", out, "--emit-slurm", *extra],
                           capture_output=True, text=True)
        return r, out

    def test_the_array_asks_for_a_gpu_per_rank_of_the_widest_cell(self):
        r, out = self.emit()
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "sweep.slurm")) as f:
            self.assertIn("#SBATCH --gpus-per-task=4\n", f.read())

    def test_fewer_gpus_than_a_cell_needs_are_refused(self):
        r, out = self.emit("--slurm-gpus", "2")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("slurm gpus_per_task = 2: cell", r.stderr)
        self.assertIn("runs 4 ranks over NCCL", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    cli.main_reporting_skips()
