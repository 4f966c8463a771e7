"""Plug-ins from the command line: the example library's variants listed, trained with,
shadowed and swept like built-in ones; broken libraries refused (exit 2, one line)."""
import hashlib
import os
import re
import shutil
import signal
import subprocess
import unittest

import h5py

from cli import ROOT, SMALL, SMALL_GRID_SET, assert_rejected, run, tmpdir

PLUGIN = os.environ["DIVLAB_EXAMPLE_PLUGIN"]
BROKEN = os.environ["DIVLAB_BROKEN_ABI_PLUGIN"]


class DocumentedSnippet(unittest.TestCase):
    """docs/kernel-authors.md's plug-in, as printed there, built as C and as C++, loads and
    passes `divlab check` (its symbol exported unmangled either way)."""

    def test_builds_as_c_and_cpp_and_passes_check(self):
        with open(os.path.join(ROOT, "docs", "kernel-authors.md")) as f:
            snippet = re.search(r"```c\n(.*?)```", f.read(), re.S).group(1)
        for compiler, lang in (("cc", "c"), ("c++", "c++")):
            if not shutil.which(compiler):
                self.skipTest(f"no {compiler}")
            d = tmpdir()
            src, lib = os.path.join(d, "my_add.src"), os.path.join(d, "libmy_add.so")
            with open(src, "w") as f:
                f.write(snippet)
            subprocess.run([compiler, "-x", lang, "-shared", "-fPIC", "-Wall", "-Werror",
                            "-I", ROOT, src, "-o", lib], check=True)
            r = run("check", "add=my_add", "--plugins", lib, "--seed", "1")
            self.assertEqual(r.returncode, 0, lang + ": " + r.stdout + r.stderr)
            self.assertIn("PASS", r.stdout)
            # The same library under another spelling of its path is the same library.
            again = run("kernels", "--op", "add", "--plugins", lib,
                        "--plugins", os.path.join(d, ".", "libmy_add.so"))
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertEqual(again.stdout.count("my_add"), 1, again.stdout)


class Plugins(unittest.TestCase):
    def test_listed_with_their_documentation(self):
        r = run("kernels", "--op", "embed_rmsnorm_backward", "--plugins", PLUGIN, check=True)
        self.assertIn("example_bf16_rows", r.stdout)
        self.assertIn("[plug-in]", r.stdout)

    def test_train_and_shadow_with_a_plugin_variant(self):
        d = tmpdir()
        out = os.path.join(d, "r.h5")
        run("train", "--set", *SMALL, f"plugins=[{PLUGIN}]", "model.seq_len=64", "train.batch=32",
            "kernels.embed_rmsnorm_backward=example_fp32_rows", "shadow.every=5",
            "shadow.variants=[embed_rmsnorm_backward=example_bf16_rows]", "--out", out,
            check=True)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "completed")
            self.assertEqual(f["config"].attrs["kernels.embed_rmsnorm_backward"],
                             "example_fp32_rows")
            rel = f["shadow/embed_rmsnorm_backward/example_bf16_rows/rel_l2"][:]
            # The library's identity: a rebuilt one gets another hash.
            identity = f.attrs["plugins"]
        with open(PLUGIN, "rb") as lib:
            self.assertIn("sha256:" + hashlib.sha256(lib.read()).hexdigest(), identity)
        self.assertIn("abi:1", identity)
        # Zipf(1.2) over 64 ids, 2048 tokens per step: the hottest rows collect hundreds of adds.
        self.assertEqual(len(rel), 4)
        self.assertTrue((rel > 1e-3).all(), rel)

    def test_train_takes_plugins_like_check(self):
        d = tmpdir()
        out = os.path.join(d, "r.h5")
        run("train", "--set", *SMALL, "kernels.embed_rmsnorm_backward=example_fp32_rows",
            "--plugins", PLUGIN, "--out", out, check=True)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "completed")
        assert_rejected(self, ["train", "--set", *SMALL, f"plugins=[{PLUGIN}]", "--plugins",
                               PLUGIN, "--out", "{d}/r.h5"], "give the libraries once")

    def test_swept_in_a_grid(self):
        d = tmpdir()
        grid = os.path.join(d, "grid.toml")
        with open(grid, "w") as f:
            f.write(SMALL_GRID_SET.replace("[set]\n", f'[set]\nplugins = ["{PLUGIN}"]\n') + """
[axes.kernels]
embed_rmsnorm_backward = ["reference", "example_bf16_rows"]
""")
        out = os.path.join(d, "out")
        r = run("sweep", "--config", grid, "--out", out, "--jobs", "2", check=True)
        self.assertIn("2 completed", r.stdout)
        with h5py.File(os.path.join(out, "cells", "0001.h5"), "r") as f:
            self.assertEqual(f["config"].attrs["kernels.embed_rmsnorm_backward"],
                             "example_bf16_rows")

    def test_a_kernel_that_crashes_training_is_named(self):
        # A segfaulting candidate: the run dies of the signal as before (a sweep sees it), its
        # last line names the op, the variant and the step, and the trace stays readable.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        d = tmpdir()
        out = os.path.join(d, "r.h5")
        r = run("train", "--set", *SMALL, "model.d_model=128", "kernels.add=segfaults_on_large",
                "--plugins", lib, "--out", out, "--quiet")
        self.assertEqual(r.returncode, -signal.SIGSEGV, r.stderr)
        self.assertIn("divlab: crashed: SIGSEGV (Segmentation fault) in op add "
                      f"(variant segfaults_on_large, plug-in {lib}) at step 0", r.stderr)
        with h5py.File(out, "r", swmr=True) as f:
            self.assertEqual(f.attrs["status"], "running")

    def test_bad_plugins_are_refused(self):
        assert_rejected(self, ["train", "--set", *SMALL, "plugins=[{d}/libnone.so]", "--out",
                               "{d}/r.h5"], "cannot load")
        assert_rejected(self, ["train", "--set", *SMALL, f"plugins=[{BROKEN}]", "--out",
                               "{d}/r.h5"], "this divlab speaks ABI 1")
        assert_rejected(self, ["kernels", "--plugins", BROKEN], "ABI 999")


if __name__ == "__main__":
    unittest.main()
