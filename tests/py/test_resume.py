"""Checkpoints and --resume: killed at random steps, resumed, bitwise the same as one run."""
import os
import random
import shutil
import signal
import subprocess
import time
import unittest

import h5py
import numpy as np

from cli import BIN, SMALL, digest, run, tmpdir

RUN = [*SMALL, "train.steps=400", "checkpoint.every=9", "eval.every=50", "trace.flush_steps=1",
       "model.seq_len=32", "train.batch=8"]


def steps_written(path):
    try:
        with h5py.File(path, "r", swmr=True) as f:
            return f["metrics/loss"].shape[0]
    except (OSError, KeyError):
        return 0


class Resume(unittest.TestCase):
    def check_bitwise_after_kills(self, extra):
        d = tmpdir()
        full, killed = os.path.join(d, "full.h5"), os.path.join(d, "killed.h5")
        run("train", "--set", *RUN, *extra, "--out", full, "--quiet", check=True)
        rng = random.Random()
        cmd = [BIN, "train", "--set", *RUN, *extra, "--out", killed, "--quiet"]
        kills, target = 0, 0
        while kills < 5:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Kill at a random step past the first checkpoint.
            target = min(390, max(target, 10) + rng.randint(5, 60))
            deadline = time.time() + 60
            while steps_written(killed) < target and p.poll() is None and time.time() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                kills += 1
            p.wait()
            with h5py.File(killed, "r", swmr=True) as f:
                self.assertNotEqual(f.attrs["status"], "completed")
            cmd = [BIN, "train", "--resume", killed, "--quiet"]
        run("train", "--resume", killed, "--quiet", check=True)
        with h5py.File(full, "r") as a, h5py.File(killed, "r") as b:
            self.assertEqual(b.attrs["status"], "completed")
            self.assertEqual(a["metrics/loss"].shape, b["metrics/loss"].shape)
            self.assertEqual(a["metrics/loss"][:].tobytes(), b["metrics/loss"][:].tobytes())
            np.testing.assert_array_equal(a["metrics/step"][:], b["metrics/step"][:])
            np.testing.assert_array_equal(a["eval/val_loss"][:], b["eval/val_loss"][:])
            np.testing.assert_array_equal(a["dataset/token_counts"][:],
                                          b["dataset/token_counts"][:])
            self.assertTrue(np.all(np.diff(b["metrics/wall_s"][:]) >= 0))

    def test_sgd_with_momentum_killed_five_times(self):
        self.check_bitwise_after_kills(["train.optimizer=sgd", "train.momentum=0.9"])

    def test_adamw_with_shadow_mode_killed_five_times(self):
        self.check_bitwise_after_kills(["train.optimizer=adamw", "train.lr=3e-3",
                                        "shadow.every=5",
                                        "shadow.variants=[embed_rmsnorm_backward=bf16_accum]"])

    def test_stochastic_rounding_killed_five_times(self):
        # Its random bits come from each call's seed, derived from (run seed, step): a resumed
        # run draws exactly the bits the uninterrupted one drew.
        self.check_bitwise_after_kills(["train.optimizer=sgd", "train.momentum=0.9",
                                        "kernels.embed_rmsnorm_backward=bf16_stochastic_accum"])

    def test_data_parallel_ranks_killed_five_times(self):
        # Four simulated ranks, each drawing its kernels' random bits from (run seed, step,
        # rank), their gradients reduced in bf16: the resumed run repeats every rank's bits.
        self.check_bitwise_after_kills(["train.optimizer=sgd", "train.momentum=0.9",
                                        "train.ranks=4", "kernels.grad_reduce=bf16_reduce",
                                        "kernels.embed_rmsnorm_backward=bf16_stochastic_accum"])

    def test_micro_batches_killed_five_times(self):
        # Two ranks of two micro-batches each, the micro-batches' calls drawing the seeds after
        # their rank's: the resumed run repeats them, and the accumulation, bit for bit.
        self.check_bitwise_after_kills(["train.optimizer=sgd", "train.momentum=0.9",
                                        "train.ranks=2", "train.micro_batches=2",
                                        "kernels.embed_rmsnorm_backward=bf16_stochastic_accum"])

    def test_resume_can_extend_a_finished_run(self):
        d = tmpdir()
        short, long_ = os.path.join(d, "short.h5"), os.path.join(d, "long.h5")
        base = [*SMALL, "checkpoint.every=10", "train.steps=60"]
        run("train", "--set", *base, "--out", long_, check=True)
        run("train", "--set", *base, "train.steps=40", "--out", short, check=True)
        # The 40-step run's last checkpoint is step 30; the steps after it are run again.
        run("train", "--resume", short, "--set", "train.steps=60", check=True)
        with h5py.File(short, "r") as a, h5py.File(long_, "r") as b:
            self.assertEqual(a["metrics/loss"][:].tobytes(), b["metrics/loss"][:].tobytes())


# Each window a kill can fall into, hit on purpose (common/fault.h): NAME:N kills the
# writer the N-th time it reaches NAME.
KILL_RUN = [*SMALL, "train.steps=40", "checkpoint.every=9", "eval.every=10", "trace.flush_steps=1"]
WINDOWS = ["trace.before_publish:1", "trace.between_flushes:1", "trace.between_flushes:23",
           "checkpoint.marked:2", "checkpoint.filled:2", "trace.finishing:1"]


def killed_at(window, *args):
    r = run(*args, "--quiet", env={"DIVLAB_FAULT": window})
    return r.returncode == -signal.SIGKILL


class KillWindows(unittest.TestCase):
    """A trace killed in any window is absent (if it never was readable) or readable and not
    completed; --resume, or a new run where it is absent, then finishes it bitwise like one run."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tmpdir()
        cls.full = os.path.join(cls.dir, "full.h5")
        run("train", "--set", *KILL_RUN, "--out", cls.full, "--quiet", check=True)

    def assert_like_full_run(self, path):
        with h5py.File(self.full, "r") as a, h5py.File(path, "r") as b:
            self.assertEqual(b.attrs["status"], "completed")
            self.assertEqual(a["metrics/loss"][:].tobytes(), b["metrics/loss"][:].tobytes())
            np.testing.assert_array_equal(a["eval/val_loss"][:], b["eval/val_loss"][:])

    def assert_readable_not_completed(self, path):
        with h5py.File(path, "r", swmr=True) as f:
            self.assertNotEqual(f.attrs["status"], "completed")
            steps = f["metrics/step"].shape[0]
            for name in ("metrics/loss", "metrics/grad_norm", "metrics/wall_s"):
                self.assertGreaterEqual(f[name].shape[0], steps, name)
                f[name][:steps]

    def test_a_new_run(self):
        for window in WINDOWS:
            with self.subTest(window=window):
                out = os.path.join(tmpdir(), "t.h5")
                self.assertTrue(killed_at(window, "train", "--set", *KILL_RUN, "--out", out))
                if window == "trace.before_publish:1":
                    self.assertFalse(os.path.exists(out))
                    run("train", "--set", *KILL_RUN, "--out", out, "--quiet", check=True)
                else:
                    self.assert_readable_not_completed(out)
                    run("train", "--resume", out, "--quiet", check=True)
                self.assertFalse(os.path.exists(out + ".partial"))
                self.assert_like_full_run(out)

    def test_a_resumed_run(self):
        stopped = os.path.join(self.dir, "stopped.h5")
        self.assertTrue(killed_at("trace.between_flushes:14", "train", "--set", *KILL_RUN,
                                  "--out", stopped))
        # checkpoint.marked:1 is the copy of the resumed checkpoint; :2 the run's next one.
        for window in ["trace.before_publish:1", "trace.between_flushes:1", "checkpoint.marked:1",
                       "checkpoint.marked:2", "trace.finishing:1"]:
            with self.subTest(window=window):
                out = os.path.join(tmpdir(), "t.h5")
                shutil.copy(stopped, out)
                self.assertTrue(killed_at(window, "train", "--resume", out))
                if window == "trace.before_publish:1":  # the old trace, untouched
                    self.assertEqual(digest(out), digest(stopped))
                self.assert_readable_not_completed(out)
                with h5py.File(out, "r", swmr=True) as f:  # a checkpoint survives every window
                    self.assertGreater(max(f[f"checkpoint/{i}/next_step"][0] for i in (0, 1)), 0)
                run("train", "--resume", out, "--quiet", check=True)
                self.assert_like_full_run(out)

    def test_a_run_without_a_checkpoint_starts_over(self):
        out = os.path.join(tmpdir(), "t.h5")
        self.assertTrue(killed_at("trace.between_flushes:12", "train", "--set", *KILL_RUN,
                                  "checkpoint.every=0", "--out", out))
        self.assert_readable_not_completed(out)
        r = run("train", "--resume", out, check=True)
        self.assertIn("starting over from step 0", r.stderr)
        self.assert_like_full_run(out)


if __name__ == "__main__":
    unittest.main()
