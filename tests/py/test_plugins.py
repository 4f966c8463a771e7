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

import cli
from cli import ROOT, SMALL, SMALL_GRID_SET, assert_rejected, run, tmpdir

PLUGIN = os.environ["DIVLAB_EXAMPLE_PLUGIN"]
BROKEN = os.environ["DIVLAB_BROKEN_ABI_PLUGIN"]
ABI2 = os.environ["DIVLAB_ABI2_PLUGIN"]
LLAMA = ["model.arch=llama", "model.n_heads=4", "model.n_kv_heads=2", "model.mlp_hidden=44"]


def documented_snippet():
    """The C plug-in docs/kernel-authors.md prints."""
    with open(os.path.join(ROOT, "docs", "kernel-authors.md")) as f:
        return re.search(r"```c\n(.*?)```", f.read(), re.S).group(1)


class DocumentedSnippet(unittest.TestCase):
    """docs/kernel-authors.md's plug-in, as printed there, built as C and as C++, loads and
    passes `divlab check` (its symbol exported unmangled either way)."""

    def test_builds_as_c_and_cpp_and_passes_check(self):
        snippet = documented_snippet()
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

    def test_linked_with_fast_math_it_is_refused_where_that_changes_the_process(self):
        # The same snippet linked with -ffast-math: where the toolchain links in crtfastmath.o
        # (GCC 12, Debian 12's), whose constructor turns flush-to-zero on for whoever loads the
        # library, every op of the run would compute under it, so divlab refuses the library;
        # where it does not (GCC 13 and newer), the library loads and passes as before.
        if not shutil.which("cc") or not shutil.which("nm"):
            self.skipTest("no cc or nm")
        d = tmpdir()
        src, lib = os.path.join(d, "my_add.c"), os.path.join(d, "libmy_add.so")
        with open(src, "w") as f:
            f.write(documented_snippet())
        subprocess.run(["cc", "-O2", "-ffast-math", "-shared", "-fPIC", "-I", ROOT, src, "-o", lib],
                       check=True)
        symbols = subprocess.run(["nm", lib], capture_output=True, text=True, check=True).stdout
        r = run("check", "add=my_add", "--plugins", lib, "--seed", "1")
        if "set_fast_math" not in symbols:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            return
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertRegex(r.stderr, r"^divlab: .*plug-in '%s': loading it changed the thread's "
                                   r"floating-point control \(flush-to-zero on, denormals-are-zero "
                                   r"on\).*crtfastmath\.o" % re.escape(lib))
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)


class Plugins(unittest.TestCase):
    def test_listed_with_their_documentation(self):
        r = run("kernels", "--op", "embed_rmsnorm_backward", "--plugins", PLUGIN, check=True)
        self.assertIn("example_bf16_rows", r.stdout)
        self.assertIn("[plug-in]", r.stdout)

    def test_a_bare_name_is_a_file_in_the_current_folder(self):
        # As every path divlab takes, not a name for dlopen's search of the library path (which,
        # from another folder, finds none, or a system library of that name).
        d = tmpdir()
        shutil.copy(PLUGIN, os.path.join(d, "libmine.so"))
        r = subprocess.run([cli.BIN, "kernels", "--op", "embed_rmsnorm_backward", "--plugins",
                            "libmine.so", "--plugins", "./libmine.so"], cwd=d,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("example_bf16_rows"), 1, r.stdout)  # one library
        elsewhere = tmpdir()
        for name in ("libmine.so", "libm.so.6"):
            r = subprocess.run([cli.BIN, "kernels", "--plugins", name], cwd=elsewhere,
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertEqual(r.stderr, "divlab: --plugins: plug-in '%s': cannot load: no such "
                             "file\n" % name)

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
        self.assertIn("abi:2", identity)
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

    def test_a_resumed_run_refuses_a_rebuilt_library(self):
        # Stopped after its step-10 checkpoint; the library at the recorded path then changes (a
        # rebuild: here the same library with bytes appended, which still loads). Resuming would
        # run the remaining steps with other kernels under the same names: refused, the trace
        # untouched. With the recorded file back in place the run resumes and completes.
        def setup(d):
            lib = os.path.join(d, "lib.so")
            shutil.copy(PLUGIN, lib)
            run("train", "--set", *SMALL, "checkpoint.every=10", "debug.abort_at_step=15",
                "kernels.embed_rmsnorm_backward=example_bf16_rows", "--plugins", lib, "--out",
                os.path.join(d, "r.h5"))
            with open(lib, "ab") as f:
                f.write(b"rebuilt")
        d = tmpdir()
        setup(d)
        with h5py.File(os.path.join(d, "r.h5"), "r") as f:
            self.assertEqual(f.attrs["status"], "failed")  # the abort, after its checkpoint
        assert_rejected(self, ["train", "--resume", "{d}/r.h5"],
                        "plug-in '{d}/lib.so' is not the file the run started with", setup)
        shutil.copy(PLUGIN, os.path.join(d, "lib.so"))
        r = run("train", "--resume", os.path.join(d, "r.h5"), "--set", "debug.abort_at_step=-1")
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(os.path.join(d, "r.h5"), "r") as f:
            self.assertEqual(f.attrs["status"], "completed")

    def test_a_sweep_continued_with_a_rebuilt_library_is_refused(self):
        # One cell of two finished, then the library rebuilt: the rest would run another build
        # under the same variant name in the same folder.
        def setup(d):
            lib = os.path.join(d, "lib.so")
            shutil.copy(PLUGIN, lib)
            with open(os.path.join(d, "grid.toml"), "w") as f:
                f.write(SMALL_GRID_SET.replace("[set]\n", f'[set]\nplugins = ["{lib}"]\n') +
                        '[axes.kernels]\nembed_rmsnorm_backward = ["reference", '
                        '"example_bf16_rows"]\n')
            run("sweep", "--config", os.path.join(d, "grid.toml"), "--out",
                os.path.join(d, "out"), "--cell", "0", check=True)
            with open(lib, "ab") as f:
                f.write(b"rebuilt")
        assert_rejected(self, ["sweep", "--out", "{d}/out"],
                        "--out '{d}/out': cell 0 ran with another build: plug-in '{d}/lib.so' is "
                        "not the file the run started with", setup)

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
        # A segfaulting candidate: the run dies of the signal as before (a sweep sees it). One
        # that calls exit(0) raises no signal and would read as success: the run exits with code
        # 1. Either way its last line names the op, the variant and the step, and the trace
        # (marked by the run's supervising process once the run is dead) says "failed" and where.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        for variant, code, how in [
                ("segfaults_on_large", -signal.SIGSEGV, "SIGSEGV (Segmentation fault)"),
                ("exits_on_large", 1, "the process was ended by a call to exit()")]:
            with self.subTest(variant):
                out = os.path.join(tmpdir(), "r.h5")
                r = run("train", "--set", *SMALL, "model.d_model=128", "kernels.add=" + variant,
                        "--plugins", lib, "--out", out, "--quiet")
                self.assertEqual(r.returncode, code, r.stderr)
                line = f"crashed: {how} in op add (variant {variant}, plug-in {lib}) at step 0"
                self.assertIn("divlab: " + line, r.stderr)
                with h5py.File(out, "r") as f:
                    self.assertEqual(f.attrs["status"], "failed")
                    self.assertEqual(f.attrs["failure"], line)
                self.assertIn(f"the trace '{out}' records it: status failed", r.stderr)
                # A resume may not swap the kernel that crashed: the steps kept would be
                # mislabelled.
                r = run("train", "--resume", out, "--set", "kernels.add=reference", "--quiet")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("kernels.add", r.stderr)

    def test_a_shadowed_kernel_that_crashes_is_named_as_shadowed(self):
        # Shadow mode replays the candidate after the step, outside the run's ops: its crash
        # names the shadowed variant, not the op the run entered last.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        out = os.path.join(tmpdir(), "r.h5")
        r = run("train", "--set", *SMALL, "model.d_model=128", "shadow.every=1",
                "shadow.variants=[add=segfaults_on_large]", "--plugins", lib, "--out", out,
                "--quiet")
        self.assertEqual(r.returncode, -signal.SIGSEGV, r.stderr)
        line = (f"crashed: SIGSEGV (Segmentation fault) in op add (variant segfaults_on_large, "
                f"plug-in {lib}, replayed by shadow mode) at step 0")
        self.assertIn("divlab: " + line, r.stderr)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["failure"], line)

    def test_bad_plugins_are_refused(self):
        assert_rejected(self, ["train", "--set", *SMALL, "plugins=[{d}/libnone.so]", "--out",
                               "{d}/r.h5"], "cannot load")
        assert_rejected(self, ["train", "--set", *SMALL, f"plugins=[{BROKEN}]", "--out",
                               "{d}/r.h5"], "this divlab speaks ABI 1")
        assert_rejected(self, ["kernels", "--plugins", BROKEN], "ABI 999")


class Abi2Kernels(unittest.TestCase):
    """A kernel author's bf16 kernel, plugged in as written (ABI 2, raw bf16 arrays): checked in
    the bf16 mode, where it runs, and trained with; asking the fp32 mode for it says where it
    runs instead of "unknown variant"."""

    def test_check_catches_the_packed_kernel_and_passes_the_correct_one(self):
        bad = run("check", "swiglu_forward=abi2_bf16_swiglu_vec8", "--plugins", ABI2,
                  "--precision", "bf16")
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("[shapes random]", bad.stdout)
        self.assertIn("smallest failing shape", bad.stdout)
        self.assertIn("would have accepted this kernel", bad.stdout)  # the emulated verifier
        good = run("check", "swiglu_forward=abi2_bf16_swiglu", "--plugins", ABI2,
                   "--precision", "bf16")
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)
        assert_rejected(self, ["check", "swiglu_forward=abi2_bf16_swiglu", "--plugins", ABI2],
                        "is a bf16 kernel: it runs in the bf16 mode")

    def test_check_train_trains_a_bf16_kernel_in_the_bf16_mode(self):
        # --train's grid runs in the mode the kernel was checked in: the fp32 mode's grid
        # refused this kernel after the whole stress table had run.
        out = os.path.join(tmpdir(), "swiglu")
        r = run("check", "swiglu_forward=abi2_bf16_swiglu", "--plugins", ABI2, "--precision",
                "bf16", "--train", "--jobs", "2", "--no-plots", "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out + ".grid.toml") as f:
            grid = f.read()
        self.assertIn('train.precision = "bf16"', grid)
        self.assertIn('axes.kernels.swiglu_forward = ["reference", "abi2_bf16_swiglu"', grid)
        self.assertIn("summary: swiglu_forward=abi2_bf16_swiglu", r.stdout)

    def test_a_gradient_rounded_toward_zero_is_a_bias_and_round_to_nearest_is_not(self):
        # Each output's bias is its own: summed with the losses, the gradient's shrink of
        # 2.5-3.3e-3 read as 4e-7. A bf16 output is judged against the reference rounded to
        # bf16, so the bf16 reference's gradient (equal values at uniform logits share one
        # rounding; a short row's sum carried by its target) is not called biased: seed 4 was,
        # with the unrounded reference and a count of values in place of those carrying the sum.
        bad = run("check", "cross_entropy=abi2_bf16_xent_toward_zero", "--plugins", ABI2,
                  "--precision", "bf16")
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("FAIL: biased: outputs shrink by", bad.stdout)
        self.assertNotIn("FAIL: error", bad.stdout)
        for seed in ("4", "21"):
            good = run("check", "cross_entropy=reference", "--precision", "bf16", "--seed", seed)
            self.assertEqual(good.returncode, 0, good.stdout + good.stderr)

    def test_an_fp16_kernel_is_fp16_grade_and_underflows(self):
        # Run on fp16 copies of its activations: more than fp32 rounding (the fp32 grade fails),
        # well within the bf16 grade, except where fp16's range ends: values near 1e-10 flush
        # to zero (bf16 keeps fp32's exponent range; fp16's smallest value is 6e-8).
        strict = run("check", "gelu_forward=abi2_fp16_gelu", "--plugins", ABI2)
        self.assertEqual(strict.returncode, 1, strict.stdout + strict.stderr)
        # Beside the tiny values' failure the grade's line names both causes, not "accepts it".
        self.assertIn("[fp32 grade] besides the failures named", strict.stdout)
        self.assertIn("reduced-precision arithmetic", strict.stdout)
        lenient = run("check", "gelu_forward=abi2_fp16_gelu", "--plugins", ABI2,
                      "--grade", "bf16")
        self.assertEqual(lenient.returncode, 1, lenient.stdout + lenient.stderr)
        self.assertIn("verdict: FAIL under: [values tiny (x1e-10)]\n", lenient.stdout)

    def test_scratch_read_before_it_is_written_fails_every_condition(self):
        # New scratch holds NaN bytes, not the zeros fresh memory happens to hold: a kernel that
        # sums into workspace it never clears fails at its first call, in every condition, with
        # the reason, not only where a second call finds the first one's sums ("arrays
        # refilled", the one condition that failed it while new scratch read as zeros).
        r = run("check", "rmsnorm_forward=abi2_scratch_as_zero", "--plugins", ABI2)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        for condition in ("shape tiny", "shape odd", "shapes random", "values large (x1e3)",
                          "arrays refilled"):
            self.assertIn("[%s]" % condition, r.stdout)
        self.assertIn("scratch left unwritten or read before it is written", r.stdout)

    def test_scratch_written_past_its_end_fails_every_condition(self):
        # A kernel that asks its workspace for one value less than it writes gets, under check,
        # a region of exactly that size between guards, and each call's guards are read back:
        # every condition fails by name, at every size (in training the last value lands in a
        # region's rounding at most sizes and in the heap at a few; before the guards this
        # kernel passed check).
        r = run("check", "add=abi2_scratch_one_short", "--plugins", ABI2)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        for condition in ("shape tiny", "shape odd", "shapes random", "arrays refilled",
                          "call 257 (warmed up)", "arrays large (4 M)"):
            self.assertIn("[%s]" % condition, r.stdout)
        self.assertRegex(r.stdout, r"shape odd .* FAIL: writes outside its outputs \(scratch "
                         r"region 0 \(asked for 34628 bytes\): written up to 4 bytes past its "
                         r"end\)")
        # The same add through scratch of the right size passes.
        good = run("check", "add=abi2_context_add", "--plugins", ABI2)
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)

    def test_a_declared_control_that_fails_is_told_it_is_none(self):
        # The exact GELU flagged DIVLAB_CONTROL: another function than the op's tanh form, off by
        # up to 1e-3, so no control. check says so under its verdict (a control's runs would set
        # the noise floor); a true control's passing report has no such line.
        r = self.failing_check("gelu_forward=abi2_erf_gelu_control", "fp32 grade")
        self.assertIn("gelu_forward=abi2_erf_gelu_control is declared a benign control", r.stdout)
        good = run("check", "add=abi2_context_add", "--plugins", ABI2)
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)
        self.assertNotIn("declared a benign control", good.stdout)

    def failing_check(self, target, condition):
        # check on one of the library's variants, which must fail under `condition` alone.
        r = run("check", target, "--plugins", ABI2)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("verdict: FAIL under: [%s]\n" % condition, r.stdout)
        return r

    def test_a_row_dropped_past_a_size_is_not_called_reduced_precision(self):
        # Exact below 4097 rows, one row short above: off by more than 1e-4 under 'rows many'
        # alone, which the fp32 grade's line tells apart from a low-precision kernel (whose
        # error shows under most conditions).
        r = self.failing_check("linear_backward=abi2_dw_drops_last_row", "fp32 grade")
        self.assertRegex(r.stdout, r"off by more than 1e-4 only under 'rows many', while \d+ "
                                   r"other conditions stay within it")
        self.assertNotIn("reduced-precision arithmetic inside an fp32 kernel:", r.stdout)

    def test_a_result_kept_in_scratch_between_calls_fails_the_repeat(self):
        # A RoPE exact on every first call, its table kept in scratch for the next call with the
        # same length, width and base: the repeat, in a region of its own, reads NaN there.
        r = self.failing_check("rope_forward=abi2_rope_table_in_scratch", "repeat (bitwise)")
        self.assertRegex(r.stdout, r"repeat \(bitwise\) .* FAIL: the same call again, on the "
                                   r"same inputs and in fresh scratch: non-finite output")

    def test_a_kernel_that_leaves_the_rounding_changed_fails_check_and_stops_a_run(self):
        # Its own sums are within fp32's grade; every op after it would round toward zero.
        changed = ("a plug-in kernel returned with the thread's floating-point control changed "
                   "(rounding toward zero")
        r = run("check", "add=abi2_add_rounding_toward_zero", "--plugins", ABI2)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"shape aligned .* FAIL: the kernel threw: " + re.escape(changed))
        out = os.path.join(tmpdir(), "r.h5")
        r = run("train", "--set", *SMALL, "kernels.add=abi2_add_rounding_toward_zero", "--plugins",
                ABI2, "--out", out)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("train failed in op add (variant abi2_add_rounding_toward_zero, plug-in %s) "
                      "at step 0: %s" % (ABI2, changed), r.stderr)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "failed")

    def test_optimizer_updates_plug_in_checked_and_trained(self):
        # The optimizer's updates are pluggable like the model's ops: a plain SGD passes check
        # and trains as the reference does (to fp32's last bits: its multiply-adds may fuse
        # otherwise); AdamW with bf16 moments (16-bit optimizer states) fails the fp32 grade
        # and trains in both modes, its kernel's role recorded.
        good = run("check", "sgd_step=abi2_sgd", "--plugins", ABI2)
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)
        bad = run("check", "adamw_step=abi2_adamw_bf16_moments", "--plugins", ABI2)
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("[fp32 grade] besides the failures named", bad.stdout)
        # Scalars are drawn from ranges: a momentum written in as 0.9 fails where another is
        # drawn (it passed while the draws were 0 or 0.9), named in the worst element.
        fixed = run("check", "sgd_step=abi2_sgd_momentum_09", "--plugins", ABI2)
        self.assertEqual(fixed.returncode, 1, fixed.stdout + fixed.stderr)
        self.assertRegex(fixed.stdout, r"worst element .*momentum 0\.(?!9\b)\d+")
        d = tmpdir()
        losses = {}
        for name, extra in (("ref", []), ("sgd", ["kernels.sgd_step=abi2_sgd"])):
            out = os.path.join(d, name + ".h5")
            run("train", "--set", *SMALL, "train.optimizer=sgd", *extra, "--plugins", ABI2,
                "--out", out, check=True)
            with h5py.File(out, "r") as f:
                losses[name] = f["metrics/loss"][:]
                roles = f.attrs.get("kernel_roles", "")
        self.assertEqual(len(losses["sgd"]), 20)
        for a, b in zip(losses["ref"], losses["sgd"]):
            self.assertAlmostEqual(a, b, delta=1e-5 * abs(a))
        self.assertIn("sgd_step=abi2_sgd candidate", roles)
        for precision in ("fp32", "bf16"):
            out = os.path.join(d, "adamw-" + precision + ".h5")
            run("train", "--set", *SMALL, "train.optimizer=adamw", "train.lr=3e-3",
                "train.precision=" + precision, "kernels.adamw_step=abi2_adamw_bf16_moments",
                "--plugins", ABI2, "--out", out, check=True)
            with h5py.File(out, "r") as f:
                self.assertEqual(f.attrs["status"], "completed")

    def test_trained_in_the_bf16_mode_and_refused_in_fp32(self):
        d = tmpdir()
        out = os.path.join(d, "r.h5")
        run("train", "--set", *SMALL, *LLAMA, "train.precision=bf16",
            "kernels.swiglu_forward=abi2_bf16_swiglu", "shadow.every=5",
            "shadow.variants=[swiglu_forward=abi2_bf16_swiglu_vec8]",
            "--plugins", ABI2, "--out", out, check=True)
        with h5py.File(out, "r") as f:
            self.assertEqual(f.attrs["status"], "completed")
            self.assertIn("abi:2", f.attrs["plugins"])
            # The packed kernel shadowed on the run's own inputs (hidden size 44 = 5 x 8 + 4):
            # the tails it leaves unwritten show at every shadowed step.
            rel = f["shadow/swiglu_forward/abi2_bf16_swiglu_vec8/rel_l2"][:]
            self.assertEqual(len(rel), 4)
            self.assertTrue((rel > 1e-2).all(), rel)
        assert_rejected(self, ["train", "--set", *SMALL, *LLAMA,
                               "kernels.swiglu_forward=abi2_bf16_swiglu", "--plugins", ABI2,
                               "--out", "{d}/r.h5"], "is a bf16 kernel")


if __name__ == "__main__":
    unittest.main()
