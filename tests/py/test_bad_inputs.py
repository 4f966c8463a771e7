"""The bad-input catalogue (tests/bad_inputs/cases.toml): configs, command lines, corpora, traces
and sweep folders, including truncated and corrupt HDF5 given to resume, bisect and analyze.
Every case: exit code 2, one line on stderr naming the culprit, no file created or modified.

Run a part or one case: DIVLAB_BAD_INPUT_CLASS=toml (the word before the case name's colon;
ctest registers one test per class, py.bad_inputs.CLASS) or DIVLAB_BAD_INPUT_CASE=SUBSTRING of
a case's name, e.g.
  DIVLAB_BIN=build/cpu/divlab DIVLAB_BAD_INPUT_CASE="a table defined twice" \
    python3 -m unittest test_bad_inputs   (in tests/py)"""
import os
import stat
import tomllib
import unittest

from cli import ROOT, SMALL, SMALL_GRID_SET, assert_rejected, gpus, run

CASES = os.path.join(ROOT, "tests", "bad_inputs", "cases.toml")
SUBST = {"{plugin_bad_abi}": os.environ.get("DIVLAB_BROKEN_ABI_PLUGIN", "/missing"),
         "{plugin_crashing}": os.environ.get("DIVLAB_CRASHING_PLUGIN", "/missing"),
         "{plugin_crashing_on_load}": os.environ.get("DIVLAB_CRASHING_ON_LOAD_PLUGIN",
                                                     "/missing"),
         "{plugin_abi2}": os.environ.get("DIVLAB_ABI2_PLUGIN", "/missing"),
         "{plugin_unknown_dtype}": os.environ.get("DIVLAB_UNKNOWN_DTYPE_PLUGIN", "/missing"),
         "{plugin_unknown_flags}": os.environ.get("DIVLAB_UNKNOWN_FLAGS_PLUGIN", "/missing"),
         "{plugin_wrong_control}": os.environ.get("DIVLAB_WRONG_CONTROL_PLUGIN", "/missing"),
         "{plugin_abi3}": os.environ.get("DIVLAB_ABI3_PLUGIN", "/missing")}

FIXTURE_GRID = SMALL_GRID_SET + """
[axes.train]
seed = [0, 1, 2]
"""


def edited(d, name):
    """A trace of the fixture opened for editing (h5py: imported only by the cases that edit)."""
    import h5py
    return h5py.File(os.path.join(d, name), "r+")


def setup_for(case):
    def setup(d):
        for name in case.get("trace", []):
            run("train", "--set", *SMALL, "checkpoint.every=5", "--out", os.path.join(d, name),
                check=True)
        for name in case.get("grid", []):
            grid = os.path.join(d, "fixture-grid.toml")
            with open(grid, "w") as f:
                f.write(FIXTURE_GRID)
            run("sweep", "--config", grid, "--out", os.path.join(d, name), "--jobs", "2",
                check=True)
        for name in case.get("quick_grid", []):
            grid = os.path.join(d, "fixture-quick-grid.toml")
            with open(grid, "w") as f:
                f.write(FIXTURE_GRID + "[quick.set.train]\nsteps = 2\n")
            run("sweep", "--config", grid, "--out", os.path.join(d, name), "--quick", "--jobs",
                "2", check=True)
        for name, text in case.get("files", {}).items():
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            for k, v in SUBST.items():
                text = text.replace(k, v)
            with open(path, "w") as f:
                f.write(text * case.get("repeat", {}).get(name, 1))
        for name, hex_bytes in case.get("bytes", {}).items():  # what text cannot hold
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(bytes.fromhex(hex_bytes))
        for name in case.get("readonly", []):
            os.mkdir(os.path.join(d, name))
            os.chmod(os.path.join(d, name), stat.S_IRUSR | stat.S_IXUSR)
        for name in case.get("fifo", []):
            os.mkfifo(os.path.join(d, name))
        for name, target in case.get("symlink", {}).items():
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(target, path)
        for name, length in case.get("truncate", {}).items():
            os.truncate(os.path.join(d, name), length)
        for name, offset in case.get("corrupt", {}).items():
            with open(os.path.join(d, name), "r+b") as f:
                f.seek(offset)
                f.write(bytes((i * 97 + 13) % 256 for i in range(4096)))
        for name, word in case.get("status", {}).items():  # a trace another tool rewrote
            with edited(d, name) as f:
                f.attrs["status"] = word
        for name, values in case.get("attrs", {}).items():  # root attributes, any TOML type
            with edited(d, name) as f:
                for key, value in values.items():
                    f.attrs[key] = value
        for name, step in case.get("loss_nan_at", {}).items():  # a loss edited by hand
            with edited(d, name) as f:
                f["metrics/loss"][step] = float("nan")
        for name, kept in case.get("loss_kept", {}).items():  # a loss array cut short
            with edited(d, name) as f:
                loss = f["metrics/loss"][:kept]
                del f["metrics/loss"]
                f["metrics/loss"] = loss
    return setup


def load_cases():
    with open(CASES, "rb") as f:
        return tomllib.load(f)["case"]


def available_gib():
    """MemAvailable from /proc/meminfo, in GiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def skip_reason(case):
    """Why a case cannot be judged here, or None."""
    if case.get("readonly") and os.geteuid() == 0:
        return "root can write anywhere"
    if case.get("no_gpu") and gpus() > 0:
        return "a GPU is present: the command runs here"
    below = case.get("host_memory_below_gib")
    if below is not None and (gib := available_gib()) >= below:
        return f"{gib:.0f} GiB available: the command fits here"
    return None


def selected(cases):
    only_class = os.environ.get("DIVLAB_BAD_INPUT_CLASS")
    only_case = os.environ.get("DIVLAB_BAD_INPUT_CASE")
    return [c for c in cases
            if (not only_class or c["name"].split(":")[0] == only_class)
            and (not only_case or only_case in c["name"])]


class BadInputCatalogue(unittest.TestCase):
    def test_catalogue_is_well_formed(self):
        cases = load_cases()
        self.assertGreaterEqual(len(cases), 200)
        names = [c["name"] for c in cases]
        self.assertEqual(len(names), len(set(names)), "case names must be unique")
        # What setup_for and test_every_case read: a misspelled key would be ignored, and its
        # case would test another input than it says.
        known = {"name", "args", "needle", "env", "no_gpu", "host_memory_below_gib", "trace",
                 "grid", "quick_grid", "files", "repeat", "bytes", "readonly", "fifo", "symlink",
                 "truncate", "corrupt", "status", "attrs", "loss_nan_at", "loss_kept"}
        for c in cases:
            self.assertRegex(c["name"], r"^[a-z]+: ", "a case's name starts with its class")
            self.assertFalse(set(c) - known, c["name"])

    def test_every_case(self):
        cases = selected(load_cases())
        if not cases:
            self.skipTest("no case selected")
        for case in cases:
            with self.subTest(case["name"]):
                if skip_reason(case):
                    self.skipTest(skip_reason(case))
                args = case["args"]
                for k, v in SUBST.items():
                    args = [a.replace(k, v) for a in args]
                env = case.get("env")  # its values may name the case's folder, {d}
                assert_rejected(self, args, case["needle"], setup_for(case),
                                env and (lambda d, env=env: {k: v.replace("{d}", d)
                                                             for k, v in env.items()}))


if __name__ == "__main__":
    unittest.main()
