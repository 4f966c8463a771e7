"""One writer per trace and per sweep folder: a second writer is refused naming the holder, the
first finishes intact, and a killed writer never blocks the next one."""
import os
import signal
import subprocess
import time
import unittest

import h5py

from cli import BIN, SMALL, SMALL_GRID_SET, run, tmpdir

# Long enough that the second writer surely starts while the first one runs (a few seconds).
SLOW = [s for s in SMALL if not s.startswith("train.steps")] + ["train.steps=4000",
                                                                "checkpoint.every=0"]


def small_grid(d, steps, seeds):
    """The tests' small grid with `steps` per cell and one cell per seed; returns its path."""
    path = os.path.join(d, "grid.toml")
    with open(path, "w") as f:
        f.write(SMALL_GRID_SET.replace("steps = 10", f"steps = {steps}")
                + f"[set.checkpoint]\nevery = 0\n[axes.train]\nseed = {list(seeds)}\n")
    return path


def start(*args):
    return subprocess.Popen([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(path, proc, seconds=30):
    end = time.time() + seconds
    while not os.path.exists(path):
        if proc.poll() is not None or time.time() > end:
            raise AssertionError(f"{path} never appeared (writer exit {proc.poll()})")
        time.sleep(0.02)


class Writers(unittest.TestCase):
    def test_a_second_run_on_a_live_trace_is_refused_even_with_force(self):
        d = tmpdir()
        out = os.path.join(d, "run.h5")
        first = start("train", "--set", *SLOW, "--quiet", "--out", out)
        try:
            wait_for(out + ".lock", first)
            r = run("train", "--set", *SMALL, "--force", "--out", out)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"PID {first.pid}", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            r = run("train", "--resume", out)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"PID {first.pid}", r.stderr)
        finally:
            _, err = first.communicate(timeout=300)
        self.assertEqual(first.returncode, 0, err)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "completed")
            self.assertEqual(len(f["metrics/loss"]), 4000)
        self.assertFalse(os.path.exists(out + ".lock"))  # the holder removes it

    def test_a_killed_writer_does_not_block_the_next(self):
        d = tmpdir()
        out = os.path.join(d, "run.h5")
        first = start("train", "--set", *SLOW, "--quiet", "--out", out)
        wait_for(out + ".lock", first)
        time.sleep(0.3)
        first.send_signal(signal.SIGKILL)
        first.communicate()
        r = run("train", "--set", *SMALL, "--force", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(out + ".lock"))

    def test_a_second_sweep_on_a_live_folder_is_refused(self):
        d = tmpdir()
        grid = small_grid(d, 1500, range(4))
        out = os.path.join(d, "out")
        first = start("sweep", "--config", grid, "--out", out, "--jobs", "2")
        try:
            # Once its manifest exists the first sweep has laid out its folder; from then on it
            # only adds cells and replaces files through temporaries named by its PID.
            wait_for(os.path.join(out, "manifest.tsv"), first)

            def listing():
                return sorted(n for n in os.listdir(out) if f".tmp.{first.pid}" not in n)
            before = listing()
            r = run("sweep", "--config", grid, "--out", out, "--jobs", "2")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(f"PID {first.pid}", r.stderr)
            self.assertEqual(listing(), before)  # nothing written by the refused one
        finally:
            stdout, err = first.communicate(timeout=600)
        self.assertEqual(first.returncode, 0, err)
        self.assertIn("4 completed", stdout)
        self.assertFalse(os.path.exists(os.path.join(out, "sweep.lock")))
        r = run("sweep", "--config", grid, "--out", out, check=True)
        self.assertIn("4 already finished", r.stdout)

    def test_a_completed_trace_missing_steps_is_not_finished(self):
        # A trace marked completed must also hold every step it was asked for to be skipped.
        d = tmpdir()
        grid = small_grid(d, 10, [0])
        out = os.path.join(d, "out")
        run("sweep", "--config", grid, "--out", out, check=True)
        cell = os.path.join(out, "cells", "0000.h5")
        with h5py.File(cell, "a") as f:
            f["config"].attrs["train.steps"] = 20  # as if the trace were cut short
        r = run("sweep", "--config", grid, "--out", out, check=True)
        self.assertIn("0 already finished", r.stdout)
        self.assertIn("1 completed", r.stdout)

    def test_cells_run_from_the_frozen_grid_not_the_edited_original(self):
        d = tmpdir()
        base = os.path.join(d, "base.toml")
        with open(base, "w") as f:
            f.write("[model]\nd_model = 32\n")
        grid = os.path.join(d, "grid.toml")
        with open(grid, "w") as f:
            f.write('config = "base.toml"\n' + SMALL_GRID_SET.replace("d_model = 32\n", "")
                    .replace("steps = 10", "steps = 600")
                    + "[set.checkpoint]\nevery = 0\n[axes.train]\nseed = [0, 1, 2]\n")
        out = os.path.join(d, "out")
        sweep = start("sweep", "--config", grid, "--out", out, "--jobs", "1")
        wait_for(os.path.join(out, "cells", "0000.h5"), sweep)
        with open(base, "w") as f:  # edited while the sweep runs
            f.write("[model]\nd_model = 48\n")
        _, err = sweep.communicate(timeout=300)
        self.assertEqual(sweep.returncode, 0, err)
        for cell in ("0000", "0001", "0002"):
            with h5py.File(os.path.join(out, "cells", cell + ".h5"), "r") as f:
                self.assertIn("d_model = 32", f.attrs["config_toml"], cell)
        with open(os.path.join(out, "base.toml")) as f:
            self.assertEqual(f.read(), "[model]\nd_model = 32\n")
        r = run("sweep", "--config", grid, "--out", out)  # the edited grid is another grid
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("another grid", r.stderr)


def cell_processes(out):
    """PIDs of live processes whose command line names the sweep folder `out` (zombies, whose
    command line is empty, do not count: they run nothing)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"train" in argv and any(out.encode() in a for a in argv):
            pids.append(int(pid))
    return pids


class NoCellOutlivesItsSweep(unittest.TestCase):
    """However a sweep ends, its running cells end with it and leave resumable traces."""

    def start_sweep(self):
        d = tmpdir()
        out = os.path.join(d, "out")
        sweep = start("sweep", "--config", small_grid(d, 10 ** 7, range(3)), "--out", out,
                      "--jobs", "2")
        end = time.time() + 60
        while len(cell_processes(out)) < 2:
            self.assertIsNone(sweep.poll(), "the sweep ended early")
            self.assertLess(time.time(), end, "the cells never started")
            time.sleep(0.05)
        for cell in ("0000", "0001"):  # both traces published: the cells are training
            wait_for(os.path.join(out, "cells", cell + ".h5"), sweep)
        return sweep, out

    def assert_cells_stopped_cleanly(self, out, seconds):
        end = time.time() + seconds
        while cell_processes(out) and time.time() < end:
            time.sleep(0.05)
        self.assertEqual(cell_processes(out), [], "cells outlived their sweep")
        for cell in ("0000", "0001"):
            with h5py.File(os.path.join(out, "cells", cell + ".h5"), "r") as f:
                self.assertEqual(f.attrs["status"], "interrupted")

    def test_a_stop_signal_stops_the_cells_then_the_sweep(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig):
                sweep, out = self.start_sweep()
                sweep.send_signal(sig)
                _, err = sweep.communicate(timeout=120)
                self.assertEqual(sweep.returncode, 128 + sig, err)
                self.assertIn(f"stopped by signal {int(sig)}", err)
                self.assert_cells_stopped_cleanly(out, 0)
                with open(os.path.join(out, "manifest.tsv")) as f:
                    status = {row.split("\t")[0]: row.split("\t")[1] for row in f}
                self.assertEqual((status["0"], status["1"], status["2"]),
                                 ("interrupted", "interrupted", "pending"))
                self.assertFalse(os.path.exists(os.path.join(out, "sweep.lock")))

    def test_a_killed_sweep_takes_its_cells_with_it(self):
        sweep, out = self.start_sweep()
        sweep.send_signal(signal.SIGKILL)
        sweep.communicate()
        self.assert_cells_stopped_cleanly(out, 60)


if __name__ == "__main__":
    unittest.main()
