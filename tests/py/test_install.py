"""`cmake --install` gives a working divlab: the installed binary finds its grids, plot script and
data under PREFIX/share/divlab (not in the source tree it was built from), and still does after
the whole prefix is moved."""
import os
import shutil
import subprocess
import unittest

from cli import tmpdir
from test_experiments import STEPS, curve, synthetic_trace

import numpy as np

BUILD = os.path.dirname(os.environ.get("DIVLAB_BIN", "divlab"))
CMAKE = os.environ.get("DIVLAB_CMAKE", "cmake")
HAVE_MATPLOTLIB = os.environ.get("DIVLAB_HAVE_MATPLOTLIB", "ON") == "ON"


def divlab(prefix, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("DIVLAB_HOME", "DIVLAB_DATA")}
    return subprocess.run([os.path.join(prefix, "bin", "divlab"), *args], capture_output=True,
                          text=True, env=env)


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tmpdir()
        cls.prefix = os.path.join(cls.d, "prefix")
        r = subprocess.run([CMAKE, "--install", BUILD, "--prefix", cls.prefix],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

    def resources(self, prefix):
        r = divlab(prefix, "--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.split("resources (configs, plots, data): ")[1].strip()

    def test_no_library_search_starts_in_the_current_folder(self):
        # An empty or relative RUNPATH entry makes the loader look in the current folder for
        # divlab's libraries (CMake pads the build tree's with one by default).
        for binary in (os.path.join(BUILD, "divlab"), os.path.join(self.prefix, "bin", "divlab")):
            dynamic = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True,
                                     check=True).stdout
            for line in dynamic.splitlines():
                if "RPATH" in line or "RUNPATH" in line:
                    for entry in line.split("[", 1)[1].rsplit("]", 1)[0].split(":"):
                        self.assertTrue(entry.startswith(("/", "$ORIGIN")), binary + ": " + line)

    def test_layout(self):
        share = os.path.join(self.prefix, "share", "divlab")
        for path in ("configs/reproduce.toml", "configs/reproduce-gpu.toml", "analysis/plots.py"):
            self.assertTrue(os.path.isfile(os.path.join(share, path)), path)
        self.assertTrue(os.path.isfile(os.path.join(self.prefix, "include", "divlab",
                                                    "plugin_abi.h")))
        self.assertFalse(os.path.exists(os.path.join(share, "data", "cache")))

    def test_the_installed_binary_uses_its_share_folder_even_when_moved(self):
        self.assertEqual(self.resources(self.prefix),
                         os.path.join(os.path.realpath(self.prefix), "share", "divlab"))
        moved = os.path.join(self.d, "moved")
        shutil.copytree(self.prefix, moved, symlinks=True)
        self.assertEqual(self.resources(moved),
                         os.path.join(os.path.realpath(moved), "share", "divlab"))

    @unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib missing: no plots")
    def test_analyze_draws_with_the_installed_plot_script_in_any_folder(self):
        rng = np.random.default_rng()
        # A folder name a shell would need quoting for: the plots start without a shell.
        out = os.path.join(self.d, "it's a $folder")
        os.makedirs(os.path.join(out, "cells"))
        i = 0
        for s in range(2):
            base = curve(rng)
            for v in ("reference", "bf16_accum"):
                synthetic_trace(os.path.join(out, "cells", f"{i:04d}.h5"), "zipf:1.1", v, s,
                                base + (0 if v == "reference" else rng.normal(0, 1e-3, STEPS)))
                i += 1
        r = divlab(self.prefix, "analyze", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("plots: ok", r.stdout)
        self.assertTrue(os.path.exists(os.path.join(out, "dose.png")))


if __name__ == "__main__":
    unittest.main()
