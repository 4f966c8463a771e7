"""divlab train from the command line: bad input, determinism, the trace as h5py sees it."""
import os
import resource
import signal
import subprocess
import time
import tomllib
import unittest

import h5py
import numpy as np

import glob
import re

from cli import BIN, ROOT, SMALL, run, tmpdir


class OutputFolders(unittest.TestCase):
    """The folders on the way to an output are made (runs/ in a fresh checkout), as sweep and
    analyze make theirs; a refused run removes them again (the bad-input catalogue's case)."""

    def test_train_and_export_make_the_folders_on_the_way(self):
        d = tmpdir()
        trace = os.path.join(d, "runs", "new", "r.h5")
        run("train", "--set", *SMALL, "train.steps=2", "trace.final_weights=true", "--out", trace,
            check=True)
        self.assertTrue(os.path.isfile(trace))
        weights = os.path.join(d, "out", "w", "r.safetensors")
        run("export", trace, "--out", weights, check=True)
        self.assertTrue(os.path.isfile(weights))


class Trace(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tmpdir()
        cls.path = os.path.join(cls.dir, "run.h5")
        run("train", "--set", *SMALL, "eval.every=10", "--out", cls.path, check=True)
        cls.f = h5py.File(cls.path, "r")

    def test_root_attributes(self):
        a = self.f.attrs
        self.assertEqual(a["status"], "completed")
        self.assertEqual(a["backend"], "cpu")
        for key in ("divlab_version", "git_commit", "start_utc", "host", "cpu_model", "compiler",
                    "build_flags"):
            self.assertIsInstance(a[key], str)
            self.assertTrue(a[key])
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "unknown")
        self.assertEqual(a["cpu_model"], model)
        self.assertRegex(a["compiler"], r"^(GNU|Clang) \d+\.")

    def test_git_commit_is_the_checkouts_at_build_time(self):
        # Read at every build (cmake/version.cmake), not at configure time: a binary built after
        # a commit is labelled with it, "-dirty" if tracked files were edited since.
        head = subprocess.run(["git", "-C", os.environ["DIVLAB_ROOT"], "rev-parse", "--short=12",
                               "HEAD"], capture_output=True, text=True)
        label = self.f.attrs["git_commit"]
        if head.returncode != 0:  # built outside a checkout
            self.assertEqual(label, "unknown")
            return
        self.assertIn(label, (head.stdout.strip(), head.stdout.strip() + "-dirty"),
                      "rebuild divlab if HEAD moved since the last build")

    def test_config_as_toml_and_attributes(self):
        cfg = tomllib.loads(self.f.attrs["config_toml"])
        self.assertEqual(cfg["model"]["d_model"], 32)
        self.assertEqual(self.f["config"].attrs["model.d_model"], 32)
        self.assertEqual(self.f["config"].attrs["data"], "zipf:1.2")
        self.assertAlmostEqual(self.f["config"].attrs["train.lr"], cfg["train"]["lr"])

    def test_metrics_are_extendible_series_of_one_entry_per_step(self):
        m = self.f["metrics"]
        for name in ("step", "loss", "grad_norm", "lr", "tokens", "wall_s",
                     "max_row_contributions", "top1_share"):
            ds = m[name]
            self.assertEqual(ds.shape, (20,), name)
            self.assertEqual(ds.maxshape, (None,), name)
            self.assertIsNotNone(ds.chunks, name)
        np.testing.assert_array_equal(m["step"][:], np.arange(20))
        np.testing.assert_array_equal(m["tokens"][:], (np.arange(20) + 1) * 64)
        self.assertTrue(np.all(np.isfinite(m["loss"][:])))
        self.assertTrue(np.all(np.diff(m["wall_s"][:]) >= 0))

    def test_grad_norm_by_param_adds_up_to_the_global_norm(self):
        g = self.f["metrics/grad_norm_by_param"]
        self.assertIn("wte.weight", g)
        self.assertIn("blocks.1.mlp.proj.weight", g)
        total = np.sqrt(sum(g[name][:] ** 2 for name in g))
        np.testing.assert_allclose(total, self.f["metrics/grad_norm"][:], rtol=1e-12)

    def test_eval_and_dataset(self):
        self.assertEqual(list(self.f["eval/step"][:]), [9, 19])
        self.assertTrue(np.all(np.isfinite(self.f["eval/val_loss"][:])))
        counts = self.f["dataset/token_counts"][:]
        self.assertEqual(counts.shape, (64,))
        self.assertEqual(counts.sum(), 20 * 64)
        self.assertEqual(self.f["dataset"].attrs["spec"], "zipf:1.2")


    def test_a_run_of_no_steps_claims_no_loss(self):
        # train.steps = 0 writes the initial weights into a trace; its last line said "final
        # loss 0", a loss no step computed.
        path = os.path.join(tmpdir(), "init.h5")
        r = run("train", "--set", *SMALL, "train.steps=0", "trace.initial_weights=true", "--out",
                path, check=True)
        self.assertRegex(r.stdout, r"status completed  steps 0  final loss - \(no step ran\)")
        with h5py.File(path, "r") as f:
            self.assertEqual(f["metrics/loss"].shape, (0,))


class Determinism(unittest.TestCase):
    def test_loss_bitwise_identical_for_one_and_two_threads(self):
        d = tmpdir()
        losses = []
        for threads in (1, 2):
            path = os.path.join(d, f"t{threads}.h5")
            run("train", "--set", *SMALL, "model.seq_len=40", "train.batch=5",
                f"train.threads={threads}", "--out", path, check=True)
            with h5py.File(path, "r") as f:
                losses.append(f["metrics/loss"][:].tobytes())
        self.assertEqual(losses[0], losses[1])


class Profile(unittest.TestCase):
    def test_profile_leaves_out_the_first_step(self):
        # The first step pays one-time costs (cuDNN plans on the GPU, scratch growth); the table
        # covers the steps after it, and every op the model runs appears in it.
        r = run("train", "--set", *SMALL, "train.steps=5", "--profile", "--quiet",
                "--out", os.path.join(tmpdir(), "p.h5"), check=True)
        self.assertIn("op time over 4 steps after the first", r.stderr)
        rows = {line.split()[0]: line.split() for line in r.stderr.splitlines() if line.strip()}
        # 2 blocks: 4 linear layers each, plus the LM head; 4 steps.
        self.assertEqual(rows["linear_forward"][1], str(4 * (2 * 4 + 1)))
        self.assertEqual(rows["attention_backward"][1], str(4 * 2))
        # The ops run inside the steps: their sum cannot exceed the steps' wall time (both printed
        # in ms per step, to 3 decimals).
        self.assertLessEqual(float(rows["total"][1]), float(rows["step"][2]) + 0.002)


class CrashSafety(unittest.TestCase):
    def test_readable_while_writing_and_after_sigkill(self):
        d = tmpdir()
        path = os.path.join(d, "long.h5")
        p = subprocess.Popen([BIN, "train", "--set", *SMALL, "train.steps=1000000",
                              "trace.flush_steps=5", "--out", path, "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            seen = 0
            deadline = time.time() + 60
            while seen < 50 and time.time() < deadline:
                time.sleep(0.2)
                if os.path.exists(path):
                    try:
                        with h5py.File(path, "r", swmr=True) as f:
                            seen = f["metrics/loss"].shape[0]
                    except OSError:
                        pass  # created but SWMR writing not started yet
            self.assertGreaterEqual(seen, 50, "no steps visible while the run was writing")
            self.assertIsNone(p.poll(), "the run should still be going")
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        with h5py.File(path, "r", swmr=True) as f:
            self.assertEqual(f.attrs["status"], "running")  # never marked completed
            # A kill may land inside a flush: /metrics/step is written last, so it counts the
            # steps every series holds.
            n = f["metrics/step"].shape[0]
            self.assertGreaterEqual(n, seen - 5)  # at most one flush (5 steps) behind the loss
            np.testing.assert_array_equal(f["metrics/step"][:n], np.arange(n))
            for name in ("loss", "grad_norm", "lr", "tokens", "wall_s"):
                self.assertGreaterEqual(f["metrics/" + name].shape[0], n, name)
            self.assertTrue(np.all(np.isfinite(f["metrics/loss"][:n])))


class Signals(unittest.TestCase):
    def test_sigterm_finishes_the_step_and_marks_interrupted(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            path = os.path.join(tmpdir(), "run.h5")
            p = subprocess.Popen([BIN, "train", "--set", *SMALL, "train.steps=1000000", "--out",
                                  path, "--quiet"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            deadline = time.time() + 30
            while not os.path.exists(path) and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            p.send_signal(sig)
            self.assertEqual(p.wait(timeout=30), 128 + sig)
            with h5py.File(path, "r") as f:  # closed cleanly: any reader opens it
                self.assertEqual(f.attrs["status"], "interrupted")
                n = f["metrics/loss"].shape[0]
                self.assertGreater(n, 0)
                np.testing.assert_array_equal(f["metrics/step"][:], np.arange(n))

    def test_a_stop_during_a_long_evaluation_ends_the_run_without_its_row(self):
        # eval.batches = 10^8 after the first step: hours of validation. SIGTERM ends it (before,
        # the loop never looked and the run went on), the run is interrupted, and the
        # evaluation it cut short leaves no row: a mean over part of the batches would be
        # another measurement.
        path = os.path.join(tmpdir(), "run.h5")
        p = subprocess.Popen([BIN, "train", "--set", *SMALL, "eval.every=1",
                              "eval.batches=100000000", "--out", path, "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        try:
            self.assertEqual(p.wait(timeout=30), 128 + signal.SIGTERM)
        finally:
            p.kill()  # a run that did not stop must not outlive the test
        with h5py.File(path, "r") as f:
            self.assertEqual(f.attrs["status"], "interrupted")
            self.assertEqual(f["metrics/loss"].shape[0], 1)
            self.assertEqual(f["eval/val_loss"].shape[0], 0)

    def test_a_stop_while_the_tokenizer_trains_ends_the_run_at_once(self):
        # Training a BPE tokenizer (Brown at 32 768 pieces: tens of seconds) cannot stop at a step
        # of its own: a stop request then ends the run as the signal would, at once, with nothing
        # written (no trace, nothing cached), so a sweep's cell does not outlive its sweep.
        d = tmpdir()
        path, cache = os.path.join(d, "run.h5"), os.path.join(d, "cache")
        env = dict(os.environ, DIVLAB_CACHE=cache)
        p = subprocess.Popen([BIN, "train", "--set", "data=brown", "model.vocab=32768",
                              "model.seq_len=16", "model.d_model=16", "model.n_heads=1",
                              "train.batch=2", "--out", path, "--quiet"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=20), -signal.SIGTERM)
        self.assertEqual(sorted(os.listdir(d)), [])  # no trace, no cache, no lock file
        # The tokenizer trains in a process of the run's own (sentencepiece may end its process):
        # gone with the run (a fork: the run's command line).
        time.sleep(0.5)
        self.assertEqual(subprocess.run(["pgrep", "-f", path], capture_output=True).stdout, b"")


class DiskFull(unittest.TestCase):
    def test_clear_error_and_the_trace_so_far_intact(self):
        # A file-size limit stands in for a full disk: writes past it fail with EFBIG.
        limit = 1 << 20
        path = os.path.join(tmpdir(), "full.h5")
        r = subprocess.run([BIN, "train", "--set", *SMALL, "train.steps=10000000",
                            "checkpoint.every=0", "--out", path, "--quiet"],
                           capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                 (limit, limit)))
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("disk full", lines[0])
        self.assertIn(path, lines[0])
        with h5py.File(path, "r") as f:  # closed cleanly: any reader opens it
            self.assertNotEqual(f.attrs["status"], "completed")
            n = f["metrics/loss"].shape[0]
            self.assertGreater(n, 100)
            np.testing.assert_array_equal(f["metrics/step"][:], np.arange(n))
            self.assertTrue(np.all(np.isfinite(f["metrics/loss"][:])))


class NanAttribution(unittest.TestCase):
    def test_first_non_finite_op_is_recorded(self):
        for precision in ["fp32", "bf16"]:
            with self.subTest(precision=precision):
                self.first_non_finite_op(precision)

    def first_non_finite_op(self, precision):
        # Softmax without max subtraction in the loss overflows once logits pass ~88: a large
        # learning rate gets there within a few steps. In bf16 mode every op before the loss
        # writes bf16 activations, which the replay must read as bf16 to find them finite.
        path = os.path.join(tmpdir(), f"nan_{precision}.h5")
        r = run("train", "--set", *SMALL, "train.steps=500", "train.lr=200",
                f"train.precision={precision}", "kernels.cross_entropy=no_max_subtraction",
                "--out", path)
        self.assertEqual(r.returncode, 0, r.stderr)  # a NaN is a finding, not an error
        self.assertIn("status nan", r.stdout)
        with h5py.File(path, "r") as f:
            a = f.attrs
            self.assertEqual(a["status"], "nan")
            self.assertEqual((a["nan_pass"], a["nan_op"], a["nan_tensor"]),
                             ("forward", "cross_entropy", "losses"), dict(a))
            step = int(a["nan_step"])
            self.assertEqual(f["metrics/loss"].shape[0], step + 1)
            self.assertFalse(np.isfinite(f["metrics/loss"][step]))
            self.assertTrue(np.all(np.isfinite(f["metrics/loss"][:step])))



class Commands(unittest.TestCase):
    def test_no_command_prints_the_overview(self):
        r = run()
        self.assertEqual(r.returncode, 2)
        for command in ("train", "sweep", "analyze", "reproduce", "check", "bisect"):
            self.assertIn(command, r.stdout)
        r = run("help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("reproduce", r.stdout)

    def test_help_config_names_every_choice_of_a_closed_set(self):
        r = run("train", "--help-config")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = {l.split()[0]: l for l in r.stdout.splitlines() if l.strip()}
        for key, choices in (("train.optimizer", ("sgd", "adamw")),
                             ("train.schedule", ("constant", "cosine")),
                             ("backend", ("cpu", "cuda")),
                             ("train.precision", ("fp32", "fp64", "bf16"))):
            for choice in choices:
                self.assertIn(choice, lines[key].split(":", 1)[1], key)

    def test_version(self):
        r = run("--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^divlab \S+ \(\S+\)")

    def test_a_mistyped_command_gets_the_nearest(self):
        for typo, meant in (("trian", "train"), ("analyse", "analyze"), ("sweeep", "sweep")):
            r = run(typo, "--out", "x.h5")
            self.assertEqual(r.returncode, 2)
            self.assertEqual(r.stderr.strip(), f"divlab: unknown command '{typo}'; did you mean "
                             f"'{meant}'? (divlab --help lists them)")
        r = run("frobnicate")
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("did you mean", r.stderr)


class ShippedConfigs(unittest.TestCase):
    """What the repository ships and its documents point users at must load."""

    def test_every_grid_in_configs_expands_into_cells(self):
        # --emit-slurm resolves every cell's config (keys, values, data specs) and runs nothing.
        def is_grid(path):
            with open(path) as f:
                return re.search(r"^\[(axes|parts)[.\]]", f.read(), re.M) is not None
        grids = [p for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml"))) if is_grid(p)]
        self.assertGreaterEqual(len(grids), 10)
        for grid in grids:
            with self.subTest(os.path.basename(grid)):
                out = os.path.join(tmpdir(), "out")
                r = run("sweep", "--config", grid, "--out", out, "--emit-slurm")
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(out, "cells.tsv")) as f:
                    self.assertGreater(len(f.read().splitlines()), 1)

    def test_every_config_the_documents_name_exists(self):
        documents = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))
        named = set()
        for doc in documents:
            with open(doc) as f:
                named |= {(os.path.basename(doc), m) for m in
                          re.findall(r"configs/[A-Za-z0-9_.-]+\.toml", f.read())}
        self.assertGreater(len(named), 10)
        for doc, config in sorted(named):
            self.assertTrue(os.path.exists(os.path.join(ROOT, config)), f"{doc} names {config}")


if __name__ == "__main__":
    unittest.main()
