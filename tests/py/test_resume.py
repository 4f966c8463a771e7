"""Checkpoints and --resume: killed at random steps, resumed, bitwise the same as one run."""
import os
import random
import signal
import subprocess
import time
import unittest

import h5py
import numpy as np

from cli import BIN, SMALL, assert_rejected, run, tmpdir

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


class ResumeBadInput(unittest.TestCase):
    def check(self, args, needle, setup=None):
        assert_rejected(self, args, needle, setup)

    def make(self, *sets, check=True):
        return lambda d: run("train", "--set", *SMALL, *sets, "--out", os.path.join(d, "r.h5"),
                             check=check)

    def test_missing_trace(self):
        self.check(["train", "--resume", "{d}/none.h5"], "none.h5")

    def test_trace_without_checkpoint(self):
        self.check(["train", "--resume", "{d}/r.h5"], "no checkpoint",
                   self.make("checkpoint.every=0", "debug.abort_at_step=12", check=False))

    def test_finished_run(self):
        self.check(["train", "--resume", "{d}/r.h5"], "nothing left to run",
                   self.make("checkpoint.every=5"))

    def test_corrupt_trace(self):
        def setup(d):
            with open(os.path.join(d, "r.h5"), "wb") as f:
                f.write(b"\x89HDF\r\n\x1a\n" + os.urandom(512))
        self.check(["train", "--resume", "{d}/r.h5"], "r.h5", setup)

    def test_resume_with_config_or_out(self):
        self.check(["train", "--resume", "{d}/r.h5", "--out", "{d}/x.h5"], "drop --config and --out",
                   self.make("checkpoint.every=5"))


if __name__ == "__main__":
    unittest.main()
