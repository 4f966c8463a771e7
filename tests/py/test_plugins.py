"""Plug-ins from the command line: the example library's variants listed, trained with,
shadowed and swept like built-in ones; broken libraries refused (exit 2, one line)."""
import os
import unittest

import h5py

from cli import SMALL, SMALL_GRID_SET, assert_rejected, run, tmpdir

PLUGIN = os.environ["DIVLAB_EXAMPLE_PLUGIN"]
BROKEN = os.environ["DIVLAB_BROKEN_ABI_PLUGIN"]


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
        # Zipf(1.2) over 64 ids, 2048 tokens per step: the hottest rows collect hundreds of adds.
        self.assertEqual(len(rel), 4)
        self.assertTrue((rel > 1e-3).all(), rel)

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

    def test_bad_plugins_are_refused(self):
        assert_rejected(self, ["train", "--set", *SMALL, "plugins=[{d}/libnone.so]", "--out",
                               "{d}/r.h5"], "cannot load")
        assert_rejected(self, ["train", "--set", *SMALL, f"plugins=[{BROKEN}]", "--out",
                               "{d}/r.h5"], "this divlab speaks ABI 1")
        assert_rejected(self, ["kernels", "--plugins", BROKEN], "ABI 999")


if __name__ == "__main__":
    unittest.main()
