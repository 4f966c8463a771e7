"""Traces another tool edited. h5py writes whatever it is handed, so a trace someone "fixed" by hand
can hold any object with another type, shape or value than divlab wrote. Every root attribute,
the config mirror's step count and every dataset of a checkpointed trace (of the per-parameter
norms and weights, a matrix's and a vector's standing for the rest; one checkpoint slot for
both) is deleted, retyped (text where a number is, a number where text is), reshaped, emptied,
made NaN, negative or huge, or made text that is not UTF-8 or not one line, and read by each
command that reads a trace: resume, sample, export and check --trace. Each must answer (exit 0
or 1) or refuse with exit code 2 and one line of UTF-8 on stderr: never a crash, an escaped
exception, HDF5's error stack, or raw bytes (a status rewritten as -7 was printed as its eight
bytes)."""
import os
import shutil
import subprocess
import unittest

import h5py
import numpy as np

from cli import BIN, run, tmpdir

SETTINGS = ["model.vocab=64", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
            "model.seq_len=8", "train.batch=2", "data=zipf:1.2", "train.steps=4",
            "checkpoint.every=2", "eval.every=2", "trace.initial_weights=true",
            "trace.final_weights=true"]

EDITS = ["delete", "text", "2d", "empty", "nan", "negative", "huge", "not_utf8", "two_lines"]


def edit_attribute(obj, key, how):
    if how == "delete":
        del obj.attrs[key]
    else:
        obj.attrs[key] = {"text": "garbage", "2d": np.zeros((2, 3)), "empty": "",
                          "nan": np.nan, "negative": -7, "huge": 2**62,
                          "not_utf8": np.bytes_(b"\xff\xferunning"),
                          "two_lines": "run\nning"}[how]


def edit_dataset(f, path, how):
    old = f[path][()]
    dtype = getattr(old, "dtype", np.dtype("f8"))
    del f[path]
    if how == "delete":
        return
    if how in ("not_utf8", "two_lines"):
        f[path] = np.bytes_(b"\xff\xfe") if how == "not_utf8" else "1\n2"
        return
    f[path] = {"text": lambda: "garbage",
               "2d": lambda: np.zeros((2, 3), dtype=dtype),
               "empty": lambda: np.zeros((0,), dtype=dtype),
               "nan": lambda: np.full(np.shape(old), np.nan),
               "negative": lambda: np.full(np.shape(old), -7, dtype=np.int64),
               "huge": lambda: np.full(np.shape(old), 2**62, dtype=np.int64)}[how]()


class EditedTraces(unittest.TestCase):
    def test_every_object_edited_is_read_or_refused_in_one_line(self):
        d = tmpdir()
        base = os.path.join(d, "base.h5")
        run("train", "--quiet", "--set", *SETTINGS, "--out", base, check=True)
        objects = [("attr", "/", k) for k in h5py.File(base, "r").attrs]
        objects.append(("attr", "/config", "train.steps"))
        with h5py.File(base, "r") as f:
            def visit(name, obj):
                per_parameter = name.startswith(("metrics/grad_norm_by_param/", "weights/final/",
                                                 "weights/initial/"))
                skipped = name.startswith("checkpoint/1/") or (
                    per_parameter and not name.endswith(("/wte.weight", "/ln_f.weight")))
                if isinstance(obj, h5py.Dataset) and not skipped:
                    objects.append(("dataset", "/" + name, None))
            f.visititems(visit)
        self.assertGreater(len(objects), 25)
        commands = [["train", "--resume", "{t}"], ["sample", "{t}", "--tokens", "3"],
                    ["export", "{t}", "--out", os.path.join(d, "w.safetensors"), "--force"],
                    ["check", "linear_forward=reference", "--trace", "{t}", "--condition",
                     "values from trace", "--draws", "1", "--in-process"]]
        trace = os.path.join(d, "t.h5")
        findings = []
        for kind, path, key in objects:
            for how in EDITS:
                shutil.copy(base, trace)
                with h5py.File(trace, "r+") as f:
                    if kind == "attr":
                        edit_attribute(f[path], key, how)
                    else:
                        edit_dataset(f, path, how)
                for command in commands:
                    argv = [BIN] + [a.replace("{t}", trace) for a in command]
                    r = subprocess.run(argv, capture_output=True, timeout=120,
                                       env=dict(os.environ, OMP_NUM_THREADS="1"))
                    what = f"{path}{'@' + key if key else ''} {how}, divlab {command[0]}"
                    try:
                        err = r.stderr.decode()
                    except UnicodeDecodeError:
                        findings.append(f"{what}: stderr not UTF-8: {r.stderr[-200:]!r}")
                        continue
                    lines = err.strip().splitlines()
                    if r.returncode not in (0, 1, 2):
                        findings.append(f"{what}: exit {r.returncode}: {err[-300:]}")
                    elif r.returncode == 2 and (len(lines) != 1 or
                                                not lines[0].startswith("divlab: ")):
                        findings.append(f"{what}: refused in {len(lines)} lines: {err[-300:]}")
                    elif "terminate called" in err or "HDF5-DIAG" in err:
                        findings.append(f"{what}: {err[-300:]}")
        self.assertEqual(findings, [], "\n".join(findings))


if __name__ == "__main__":
    unittest.main()
