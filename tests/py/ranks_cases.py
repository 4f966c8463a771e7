"""The checks every transport of data-parallel ranks as processes must pass, shared by
test_nccl_ranks.py (one GPU per rank, NCCL) and test_process_ranks.py (ranks on the CPU, sockets):
the simulated ranks' numbers bit for bit, for the reference reduction and a variant, shadow
metrics included, and in micro-batches; the one-rank run's losses within the fp32 band; one trace, written by rank 0,
with each rank's timing; a resumed run bit for bit; a NaN attributed as the simulated ranks
attribute it; a stop signal ending every rank after the same step; a dead rank ending the run;
mpirun and torchrun starting the same run as divlab's own launcher."""
import os
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np

from cli import tmpdir

BIN = os.environ["DIVLAB_BIN"]
SMALL = ["data=zipf:1.2", "model.vocab=512", "model.d_model=64", "model.n_layers=2",
         "model.n_heads=4", "model.seq_len=64", "train.batch=8", "train.steps=12",
         "train.lr=0.3", "train.ranks=2", "eval.every=4", "eval.batches=2"]


def series(path, name):
    with h5py.File(path, "r") as f:
        return f[name][:]


class RanksAsProcesses:
    """Mixed into a unittest.TestCase with MODEL (the run's keys, backend included) and
    TRANSPORT (the value of train.data_parallel)."""
    MODEL = SMALL
    TRANSPORT = None

    def setUp(self):
        self.dir = tmpdir(prefix=f"divlab_{self.TRANSPORT}_")

    def path(self, name):
        return os.path.join(self.dir, name)

    def train(self, out, *keys, transport=True):
        ranks = [f"train.data_parallel={self.TRANSPORT}"] if transport else []
        r = subprocess.run([BIN, "train", "--quiet", "--set", *self.MODEL, *ranks, *keys, "--out",
                            out], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"divlab train {keys} exited {r.returncode}:\n{r.stdout}\n"
                                 f"{r.stderr}")
        return r

    def assert_same_run(self, a, b, extra=()):
        for name in ["/metrics/loss", "/metrics/grad_norm", "/eval/val_loss",
                     "/metrics/grad_norm_by_param/wte.weight", *extra]:
            np.testing.assert_array_equal(series(a, name), series(b, name), err_msg=name)

    def test_the_same_bits_as_simulated_ranks_for_the_reference_and_a_variant(self):
        # Shadow mode judges rank 0's shard either way: the same metrics too, for a candidate
        # that is itself deterministic (the GPU's bf16_accum atomics are not, run to run).
        shadow = ["shadow.every=3", "shadow.variants=[embed_rmsnorm_backward=fp64_accum]"]
        shadowed = ["/shadow/embed_rmsnorm_backward/fp64_accum/rel_l2",
                    "/shadow/embed_rmsnorm_backward/fp64_accum/max_row_rel"]
        for kernel in ["reference", "bf16_comm"]:
            with self.subTest(kernel=kernel):
                sim, ours = self.path(f"sim-{kernel}.h5"), self.path(f"ranks-{kernel}.h5")
                self.train(sim, f"kernels.grad_reduce={kernel}", *shadow, transport=False)
                r = self.train(ours, f"kernels.grad_reduce={kernel}", *shadow)
                self.assert_same_run(sim, ours, shadowed)
                self.assertEqual(r.stdout.count("status completed"), 1, r.stdout)
                with h5py.File(ours, "r") as f:
                    self.assertEqual(f.attrs["status"], "completed")
                    self.assertIn(f"{self.TRANSPORT}: 2 ranks", f.attrs["data_parallel"])
                    np.testing.assert_array_equal(f["/ranks/step"][:], np.arange(12))
                    for rank in ["0", "1"]:
                        for what in ["compute_s", "reduce_s"]:
                            t = f[f"/ranks/{rank}/{what}"][:]
                            self.assertEqual(len(t), 12)
                            self.assertTrue(np.all(t > 0), f"rank {rank} {what}: {t}")
                # Rank 0 alone wrote: nothing else beside the trace.
                left = sorted(n for n in os.listdir(self.dir) if n.startswith(f"ranks-{kernel}"))
                self.assertEqual(left, [f"ranks-{kernel}.h5"])

    def test_micro_batches_give_the_bits_of_simulated_ranks_micro_batches(self):
        # Each rank process runs its shard as two micro-batches accumulated in place, as the
        # simulated ranks do, reduced by a variant (deterministic on both devices).
        keys = ["train.micro_batches=2", "kernels.grad_reduce=bf16_comm"]
        sim, ours = self.path("micro-sim.h5"), self.path("micro-ranks.h5")
        self.train(sim, *keys, transport=False)
        self.train(ours, *keys)
        self.assert_same_run(sim, ours)

    def test_one_rank_losses_within_the_fp32_band(self):
        one, ours = self.path("one.h5"), self.path("ranks.h5")
        self.train(one, "train.ranks=1", transport=False)
        self.train(ours)
        gap = np.max(np.abs(series(one, "/metrics/loss") - series(ours, "/metrics/loss")))
        self.assertLessEqual(gap, 1e-4, f"ranks as processes vs one rank: loss gap {gap:.3g}")

    def test_a_resumed_run_continues_bit_for_bit(self):
        whole, part = self.path("whole.h5"), self.path("part.h5")
        self.train(whole, "checkpoint.every=4")
        self.train(part, "checkpoint.every=4", "train.steps=8")
        r = subprocess.run([BIN, "train", "--quiet", "--resume", part, "--set", "train.steps=12"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_run(whole, part)
        np.testing.assert_array_equal(series(part, "/ranks/step"), np.arange(12))

    def test_a_nan_is_attributed_as_the_simulated_ranks_attribute_it(self):
        keys = ["kernels.grad_reduce=fp16_comm", "train.lr=1e4", "eval.every=0"]
        sim, ours = self.path("nan-sim.h5"), self.path("nan-ranks.h5")
        self.train(sim, *keys, transport=False)
        self.train(ours, *keys)
        with h5py.File(sim, "r") as a, h5py.File(ours, "r") as b:
            self.assertEqual(b.attrs["status"], "nan")
            for k in ["nan_step", "nan_op", "nan_pass", "nan_tensor"]:
                self.assertEqual(a.attrs[k], b.attrs[k], k)

    def start_long_run(self, out):
        """A run that would take hours, once its trace holds a few steps."""
        p = subprocess.Popen([BIN, "train", "--quiet", "--set", *self.MODEL, "train.steps=1000000",
                              f"train.data_parallel={self.TRANSPORT}", "eval.every=0",
                              "trace.flush_steps=1", "--out", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
        self.assertIn("rank 1 ended with SIGKILL (Killed); the other ranks were stopped", err)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "failed")
            self.assertGreaterEqual(len(f["/metrics/step"]), 3)  # what rank 0 wrote is kept
        self.assertEqual(self.rank_processes(out), [])

    def launched_by(self, launcher, out):
        """The run started by another launcher: its ranks read its variables."""
        cmd = [BIN, "train", "--quiet", "--set", *self.MODEL,
               f"train.data_parallel={self.TRANSPORT}", "--out", out]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        r = subprocess.run(launcher + cmd, capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("status completed"), 1, r.stdout)  # rank 0 reports
        ours = self.path("ours.h5")
        self.train(ours)
        self.assert_same_run(ours, out)
        with h5py.File(out, "r") as f:
            return f.attrs["data_parallel"]

    def usable_launcher(self, launcher):
        """`launcher`, or a skip where it is missing or cannot start two copies of `true` (Debian
        12's torchrun 1.13 fails in its own argument handling)."""
        if not shutil.which(launcher[0]):
            self.skipTest(f"needs {launcher[0]}")
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        probe = subprocess.run(launcher + [shutil.which("true")], capture_output=True, env=env,
                               timeout=120)
        if probe.returncode != 0:
            self.skipTest(f"{launcher[0]} cannot start two processes here")
        return launcher

    def test_mpirun_starts_the_same_run(self):
        mpirun = self.usable_launcher(["mpirun", "-np", "2", "--oversubscribe"])
        self.assertIn("launched by mpirun", self.launched_by(mpirun, self.path("mpi.h5")))

    def test_torchrun_starts_the_same_run(self):
        # Underscored options: torchrun 1.x knows only those, 2.x both spellings.
        torchrun = self.usable_launcher(["torchrun", "--standalone", "--nproc_per_node", "2",
                                         "--no_python"])
        self.assertIn("launched by torchrun", self.launched_by(torchrun, self.path("tr.h5")))
