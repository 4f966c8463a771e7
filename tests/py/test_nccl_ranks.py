"""Data-parallel ranks over NCCL, one process per GPU (train.data_parallel = "nccl"): the same
numbers as the simulated ranks on one GPU, bit for bit, for the reference reduction and for a
variant; the single-GPU run's losses within the fp32 band; one trace, written by rank 0, with
each rank's timing; a resumed run continuing bit for bit; a NaN replayed and attributed as the
simulated ranks attribute it. Skipped where fewer than two GPUs or no NCCL build are present."""
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import h5py
import numpy as np

import cli

BIN = os.environ["DIVLAB_BIN"]
MODEL = ["backend=cuda", "train.precision=fp32", "data=zipf:1.2", "model.vocab=512",
         "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.seq_len=64",
         "train.batch=8", "train.steps=12", "train.lr=0.3", "train.ranks=2", "eval.every=4",
         "eval.batches=2"]


def gpus():
    if shutil.which("nvidia-smi") is None:
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in r.stdout.splitlines()) if r.returncode == 0 else 0


def cuda_build():
    r = subprocess.run([BIN, "kernels", "--backend", "cuda", "--op", "add"], capture_output=True)
    return r.returncode == 0


def nccl_ready():
    # A CPU or NCCL-less build refuses the transport with exit 2 before starting anything.
    return gpus() >= 2 and cuda_build()


def train(out, *keys, extra=()):
    r = subprocess.run([BIN, "train", "--quiet", "--set", *MODEL, *keys, "--out", out, *extra],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"divlab train {keys} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def series(path, name):
    with h5py.File(path, "r") as f:
        return f[name][:]


@unittest.skipUnless(nccl_ready(), "needs two GPUs and the cuda build of divlab with NCCL")
class NcclRanks(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="divlab_nccl_")

    def path(self, name):
        return os.path.join(self.dir, name)

    def assert_same_run(self, a, b, extra=()):
        for name in ["/metrics/loss", "/metrics/grad_norm", "/eval/val_loss",
                     "/metrics/grad_norm_by_param/wte.weight", *extra]:
            np.testing.assert_array_equal(series(a, name), series(b, name), err_msg=name)

    def test_the_same_bits_as_simulated_ranks_for_the_reference_and_a_variant(self):
        # Shadow mode judges rank 0's shard either way: the same metrics too, for a candidate
        # that is itself deterministic (bf16_accum's atomics are not, run to run).
        shadow = ["shadow.every=3", "shadow.variants=[embed_rmsnorm_backward=fp64_accum]"]
        shadowed = ["/shadow/embed_rmsnorm_backward/fp64_accum/rel_l2",
                    "/shadow/embed_rmsnorm_backward/fp64_accum/max_row_rel"]
        for kernel in ["reference", "bf16_comm"]:
            with self.subTest(kernel=kernel):
                sim, nccl = self.path(f"sim-{kernel}.h5"), self.path(f"nccl-{kernel}.h5")
                train(sim, f"kernels.grad_reduce={kernel}", *shadow)
                r = train(nccl, f"kernels.grad_reduce={kernel}", "train.data_parallel=nccl",
                          *shadow)
                self.assert_same_run(sim, nccl, shadowed)
                self.assertIn("status completed", r.stdout)
                with h5py.File(nccl, "r") as f:
                    self.assertEqual(f.attrs["status"], "completed")
                    self.assertIn("nccl: 2 ranks", f.attrs["data_parallel"])
                    for rank in ["0", "1"]:
                        for what in ["compute_s", "reduce_s"]:
                            t = f[f"/ranks/{rank}/{what}"][:]
                            self.assertEqual(len(t), 12)
                            self.assertTrue(np.all(t > 0), f"rank {rank} {what}: {t}")
                # Rank 0 alone wrote: nothing else beside the trace.
                left = sorted(n for n in os.listdir(self.dir) if n.startswith(f"nccl-{kernel}"))
                self.assertEqual(left, [f"nccl-{kernel}.h5"])

    def test_one_gpu_losses_within_the_fp32_band(self):
        one, nccl = self.path("one.h5"), self.path("nccl.h5")
        train(one, "train.ranks=1")
        train(nccl, "train.data_parallel=nccl")
        gap = np.max(np.abs(series(one, "/metrics/loss") - series(nccl, "/metrics/loss")))
        self.assertLessEqual(gap, 1e-4, f"ranks over NCCL vs one GPU: loss gap {gap:.3g}")

    def test_a_resumed_run_continues_bit_for_bit(self):
        whole, part = self.path("whole.h5"), self.path("part.h5")
        train(whole, "train.data_parallel=nccl", "checkpoint.every=4")
        train(part, "train.data_parallel=nccl", "checkpoint.every=4", "train.steps=8")
        r = subprocess.run([BIN, "train", "--quiet", "--resume", part, "--set", "train.steps=12"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_run(whole, part)

    def test_a_nan_is_attributed_as_the_simulated_ranks_attribute_it(self):
        keys = ["kernels.grad_reduce=fp16_comm", "train.lr=1e4", "eval.every=0"]
        sim, nccl = self.path("nan-sim.h5"), self.path("nan-nccl.h5")
        train(sim, *keys)
        train(nccl, *keys, "train.data_parallel=nccl")
        with h5py.File(sim, "r") as a, h5py.File(nccl, "r") as b:
            self.assertEqual(b.attrs["status"], "nan")
            for k in ["nan_step", "nan_op", "nan_pass", "nan_tensor"]:
                self.assertEqual(a.attrs[k], b.attrs[k], k)

    def start_long_run(self, out):
        """A run over NCCL that would take hours, once its trace holds a few steps."""
        p = subprocess.Popen([BIN, "train", "--quiet", "--set", *MODEL, "train.steps=1000000",
                              "train.data_parallel=nccl", "eval.every=0", "trace.flush_steps=1",
                              "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with h5py.File(out, "r", swmr=True) as f:
                    if len(f["/metrics/step"]) >= 3:
                        return p
            except (OSError, KeyError):
                pass
            time.sleep(0.2)
        p.kill()
        self.fail("the run wrote no steps in 120 s: " + p.communicate()[1])

    def rank_processes(self, out, rank=None):
        """Every process of the run's ranks (a rank is a supervisor and its worker)."""
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            want = [b"DIVLAB_RANK=%d" % rank] if rank is not None else \
                [e for e in env if e.startswith(b"DIVLAB_RANK=")]
            if out.encode() in cmd and want and all(w in env for w in want):
                pids.append(int(pid))
        return pids

    def test_a_stop_signal_stops_every_rank_after_the_same_step(self):
        out = self.path("stop.h5")
        p = self.start_long_run(out)
        self.assertEqual(len(self.rank_processes(out)), 4)  # 2 ranks x (supervisor, worker)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 128 + signal.SIGINT, err)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "interrupted")
            steps = len(f["/metrics/step"])
            self.assertEqual(len(f["/ranks/step"]), steps)
            self.assertEqual(len(f["/ranks/1/compute_s"]), steps)
        self.assertEqual(self.rank_processes(out), [])

    def test_a_rank_that_dies_ends_the_run_and_the_trace_says_so(self):
        out = self.path("dies.h5")
        p = self.start_long_run(out)
        for pid in self.rank_processes(out, rank=1):
            os.kill(pid, signal.SIGKILL)
        _, err = p.communicate(timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("rank 1 ended with signal 9", err)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "failed")
            self.assertGreaterEqual(len(f["/metrics/step"]), 3)  # what rank 0 wrote is kept
        self.assertEqual(self.rank_processes(out), [])

    def launched_by(self, launcher, out):
        """The run over NCCL started by another launcher: its ranks read its variables."""
        cmd = [BIN, "train", "--quiet", "--set", *MODEL, "train.data_parallel=nccl", "--out", out]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        r = subprocess.run(launcher + cmd, capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("status completed"), 1, r.stdout)  # rank 0 reports
        ours = self.path("ours.h5")
        train(ours, "train.data_parallel=nccl")
        self.assert_same_run(ours, out)
        with h5py.File(out, "r") as f:
            return f.attrs["data_parallel"]

    @unittest.skipUnless(shutil.which("mpirun"), "needs mpirun")
    def test_mpirun_starts_the_same_run(self):
        how = self.launched_by(["mpirun", "-np", "2", "--oversubscribe"], self.path("mpi.h5"))
        self.assertIn("launched by mpirun", how)

    @unittest.skipUnless(shutil.which("torchrun"), "needs torchrun")
    def test_torchrun_starts_the_same_run(self):
        how = self.launched_by(["torchrun", "--nproc-per-node", "2", "--no-python"],
                               self.path("torchrun.h5"))
        self.assertIn("launched by torchrun", how)

    def test_more_ranks_than_gpus_is_refused_with_one_line(self):
        r = subprocess.run([BIN, "train", "--set", *MODEL, "train.ranks=8", "train.batch=8",
                            "train.data_parallel=nccl", "--out", self.path("no.h5")],
                           capture_output=True, text=True,
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("needs 8 GPUs", r.stderr)
        self.assertEqual(os.listdir(self.dir), [])


@unittest.skipUnless(cuda_build(), "needs the cuda build of divlab (no GPU)")
class NcclSlurm(unittest.TestCase):
    GRID = cli.SMALL_GRID_SET.replace("[set]\n", '[set]\nbackend = "cuda"\n', 1) + """
[axes.train]
ranks = [2, 4]
data_parallel = ["simulated", "nccl"]
"""

    def emit(self, *extra):
        d = tempfile.mkdtemp(prefix="divlab_slurm_")
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
