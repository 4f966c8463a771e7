"""Helpers for tests that drive the divlab binary as a user would."""
import atexit
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

BIN = os.environ.get("DIVLAB_BIN", "divlab")
ROOT = os.environ.get("DIVLAB_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
# A model small enough that a 20-step run takes well under a second.
SMALL = ["model.vocab=64", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
         "model.seq_len=16", "train.batch=4", "train.steps=20", "data=zipf:1.2"]

# The [set] block of a grid whose cells run a model small enough for tests; append [axes].
SMALL_GRID_SET = """
[set]
data = "zipf:1.2"
[set.model]
vocab = 64
d_model = 32
n_layers = 1
n_heads = 2
seq_len = 16
[set.train]
batch = 4
steps = 10
"""


def run(*args, check=False, env=None, timeout=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([BIN, *args], capture_output=True, text=True, check=check, env=e,
                          timeout=timeout)


_made = []


def tmpdir(prefix="divlab_test_"):
    """A fresh folder, removed when the test process ends (its runs, grids and traces come to
    gigabytes over a few runs of the suite); DIVLAB_KEEP_TEST_FILES=1 keeps them."""
    d = tempfile.mkdtemp(prefix=prefix)
    _made.append(d)
    return d


@atexit.register
def _remove_made():
    if not os.environ.get("DIVLAB_KEEP_TEST_FILES"):
        for d in _made:
            shutil.rmtree(d, ignore_errors=True)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def snapshot(directory):
    """Every file under `directory` with its content hash: to prove nothing was written."""
    out = {}
    for base, dirs, files in os.walk(directory):
        for name in files + [n for n in dirs if os.path.islink(os.path.join(base, n))]:
            p = os.path.join(base, name)
            if os.path.islink(p):
                out[p] = "link to " + os.readlink(p)
            elif stat.S_ISREG(os.stat(p).st_mode):
                out[p] = digest(p)
            else:  # a named pipe would block a reader: its existence is what counts
                out[p] = "special"
    return out


def gpus():
    """How many GPUs nvidia-smi lists here (0 without the tool or a driver)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in r.stdout.splitlines()) if r.returncode == 0 else 0


def assert_rejected(tc, args, needle, setup=None, env=None):
    """The bad-input contract: exit code 2, one line on stderr containing `needle`, nothing on
    stdout, and no file created or modified. `args` may use {d} for a fresh folder that `setup(d)` prepares; `env`
    may be a function of that folder."""
    d = tmpdir()
    if setup:
        setup(d)
    before = snapshot(d)
    args = [a.replace("{d}", d) for a in args]
    needle = needle.replace("{d}", d)
    # A refusal is immediate; a run that blocks (on a named pipe, say) fails here, not in CI's
    # overall limit.
    r = run(*args, env=env(d) if callable(env) else env, timeout=120)
    tc.assertEqual(r.returncode, 2, f"{args}: rc {r.returncode}, stderr {r.stderr!r}")
    lines = r.stderr.strip().splitlines()
    tc.assertEqual(len(lines), 1, f"{args}: expected one line, got {r.stderr!r}")
    tc.assertIn(needle, lines[0])
    tc.assertEqual(r.stdout, "", f"{args}: a refusal prints nothing else (stdout {r.stdout!r})")
    tc.assertEqual(snapshot(d), before, f"{args}: files were created or modified")
    return d


def main_reporting_skips():
    """unittest.main for a gpu-labelled script (the test names it is given on the command line):
    exits 77, which ctest reports as skipped, when every test skipped itself (no GPU here), so a
    machine without one never shows the script as passed."""
    result = unittest.main(exit=False, verbosity=2).result
    if result.testsRun and len(result.skipped) == result.testsRun:
        print(f"all {result.testsRun} tests skipped: reported to ctest as skipped (exit 77)")
        sys.exit(77)
    sys.exit(0 if result.wasSuccessful() else 1)
