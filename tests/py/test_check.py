"""`divlab check`: the seed bug flagged through Zipf and real-text tokens while uniform tokens and
the benchmark verifier pass it; every built-in variant caught by the condition its documentation
names; controls pass everything; plug-ins checked the same way; bad input refused; --train runs
the op's short grid."""
import csv
import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

from cli import BIN, assert_rejected, run, tmpdir

PLUGIN = os.environ["DIVLAB_EXAMPLE_PLUGIN"]

# variant -> a condition that must fail, quoted from (or implied by) its "exposed by" text.
CAUGHT_BY = {
    "embed_rmsnorm_backward=bf16_accum": "tokens zipf:1.1",  # skewed token streams
    "embed_rmsnorm_backward=fp16_accum": "values tiny",  # tiny gradients (subnormals)
    "embed_rmsnorm_backward=bf16_truncate_accum": "tokens zipf:1.1",  # any repeated ids
    "embed_rmsnorm_backward=bf16_stochastic_accum": "tokens zipf:1.1",  # hot rows
    "embed_rmsnorm_backward=bf16_stochastic_reused_seed": "tokens zipf:1.1",  # hot rows
    "rmsnorm_forward=eps_outside_sqrt": "values tiny",  # RMS ~ eps
    "rmsnorm_forward=no_eps": "values zero rows",  # an all-zero input row
    "rmsnorm_backward=bf16_reduce": "shape large",  # many rows per step
    "linear_forward=tail_skip": "shape odd",  # a dimension not a multiple of 32
    "linear_forward=bf16_truncate": "shape aligned",  # biased everywhere
    "attention_forward=mask_off_by_one": "shape aligned",  # a different function everywhere
    "attention_forward=no_max_subtraction": "values large",  # large attention scores
    "cross_entropy=no_max_subtraction": "values large",  # large logits
    # A base other than 10000: each draw takes 1e4 or 5e5, so some shape's draw fails.
    "rope_forward=base_10000": "shape",
    "rope_forward=interleaved_pairs": "shape aligned",  # any sequence longer than one
    "rope_forward=position_plus_one": "shape tiny",  # every position
    "gqa_backward=interleaved_groups": "shape aligned",  # 1 < NKV < NH
    "swiglu_backward=swapped_halves": "shape tiny",  # any input
    "softcap_forward=omitted": "values large",  # logits of realistic scale
    "add_rmsnorm_forward=tested_lengths_only": "shape odd",  # an untested sequence length
}
# variant -> a condition that must pass: what its documentation says masks it.
MASKED_BY = {
    "add_rmsnorm_forward=tested_lengths_only": "shape aligned",  # a tested length
}
# Variants the benchmark's verifier (emulated: its shapes and scalars, one seed) would accept.
VERIFIER_ACCEPTS = [
    "softcap_forward=omitted",  # Gaussian logits sit near zero for its cap of 30
    "add_rmsnorm_forward=tested_lengths_only",  # only tested lengths
    "embed_rmsnorm_backward=bf16_accum",  # uniform ids, no hot row
]
# Controls and references: fp32-grade everywhere. bf16_rne: nothing wrong beyond bf16 itself, so
# it passes where bf16 arithmetic is accepted (--grade bf16) and fails the fp32 grade alone.
PASS_FP32 = ["embed_rmsnorm_backward=reference", "embed_rmsnorm_backward=fp32_reordered",
             "embed_rmsnorm_backward=fp64_accum", "linear_forward=reference",
             "attention_forward=reference", "rmsnorm_backward=reference",
             "cross_entropy=reference", "gelu_backward=reference", "rope_backward=reference",
             "gqa_backward=reference", "swiglu_backward=reference", "softcap_forward=reference",
             "add_rmsnorm_forward=reference"]
PASS_BF16 = ["linear_forward=bf16_rne"]
# racy_scatter is left out: whether two threads collide during one call is a matter of timing
# (tests/kernels cover it with a forced collision).


def check(target, *extra):
    return run("check", target, *extra)


def failing(out):
    m = re.search(r"^verdict: FAIL under:(.*)$", out, re.M)
    return re.findall(r"\[([^\]]+)\]", m.group(1)) if m else []


def proc_file(path):
    """A /proc file's text, or "" once its process is gone."""
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""


class Check(unittest.TestCase):
    def test_seed_bug_flagged_by_skewed_tokens_only(self):
        r = check("embed_rmsnorm_backward=bf16_accum")
        self.assertEqual(r.returncode, 1, r.stderr)
        fails = failing(r.stdout)
        self.assertIn("tokens zipf:1.1", fails)
        self.assertIn("tokens text (Brown)", fails)
        self.assertNotIn("tokens uniform", fails)
        self.assertRegex(r.stdout, r"tokens uniform .* pass .* ok")
        self.assertIn("the benchmark verifier", r.stdout)  # ... emulated, passes it
        # A replay line with the seed, which gives the same table again.
        seed = re.search(r"replay: divlab check \S+ --seed (\d+)", r.stdout).group(1)
        again = check("embed_rmsnorm_backward=bf16_accum", "--seed", seed)
        self.assertEqual(again.stdout, r.stdout)

    def test_every_zoo_variant_is_caught_where_its_doc_says(self):
        targets = list(CAUGHT_BY) + PASS_FP32 + PASS_BF16
        with ThreadPoolExecutor(2) as pool:
            results = dict(zip(targets, pool.map(check, targets)))
        for target, condition in CAUGHT_BY.items():
            r = results[target]
            self.assertEqual(r.returncode, 1, f"{target}: {r.stdout}{r.stderr}")
            self.assertTrue(any(f.startswith(condition) for f in failing(r.stdout)),
                            f"{target} not caught by '{condition}':\n{r.stdout}")
        for target, condition in MASKED_BY.items():
            self.assertNotIn(condition, failing(results[target].stdout), target)
        for target in VERIFIER_ACCEPTS:
            self.assertRegex(results[target].stdout, r"benchmark verifier .*, emulated, passes it",
                             target)
        for target in PASS_FP32:
            r = results[target]
            self.assertEqual(r.returncode, 0, f"{target}: {r.stdout}")
            self.assertIn("verdict: PASS (fp32-grade)", r.stdout)
        for target in PASS_BF16:
            self.assertEqual(failing(results[target].stdout), ["fp32 grade"], target)
            accepted = check(target, "--grade", "bf16")
            self.assertEqual(accepted.returncode, 0, accepted.stdout)
            self.assertIn("verdict: PASS (bf16-grade", accepted.stdout)

    def test_plugin_variants_are_checked_too(self):
        bad = check("embed_rmsnorm_backward=example_bf16_rows", "--plugins", PLUGIN)
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("tokens zipf:1.1", failing(bad.stdout))
        good = check("embed_rmsnorm_backward=example_fp32_rows", "--plugins", PLUGIN)
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)

    def test_a_crash_or_a_hang_is_a_verdict_for_its_condition(self):
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        r = check("add=segfaults_on_large", "--plugins", lib)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"shape tiny .* ok")  # small inputs: right
        self.assertRegex(r.stdout, r"shape aligned .* FAIL: crashed: SIGSEGV")
        self.assertIn("shape aligned", failing(r.stdout))
        # Every condition still has its row: the check went on after each crash.
        self.assertRegex(r.stdout, r"repeat \(bitwise\) .* FAIL: crashed")
        # exit(0) inside the kernel: no signal and a zero exit code, still not a pass.
        r = check("add=exits_on_large", "--plugins", lib)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"shape tiny .* ok")
        self.assertRegex(r.stdout, r"shape aligned .* FAIL: crashed: the process ended \(exit "
                                   r"code 0\) inside the condition")
        self.assertRegex(r.stdout, r"repeat \(bitwise\) .* FAIL: crashed")
        r = check("add=hangs_on_one_size", "--plugins", lib, "--time-limit", "2")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"shape large .* FAIL: hang: no result within 2 s")
        self.assertEqual(failing(r.stdout), ["shape large"], r.stdout)
        # Its replay waits as long: the hang's row names the limit.
        self.assertRegex(r.stdout, r"\nreplay: divlab check add=hangs_on_one_size --seed \d+ "
                                   r"--time-limit 2 --plugins \S+\n")

    def test_one_condition_alone_gives_its_row_of_the_whole_table(self):
        # A kernel's author fixing a failure reruns that condition alone. Its draws follow from
        # the seed and its place in the list, not from which others run, so the whole table's
        # row comes back (shrunk shape and worst element included); the replay lines repeat
        # every option that changes the table (--grade, --draws). Fresh seed, printed on failure.
        seed = str(int.from_bytes(os.urandom(4), "little") or 1)
        whole = check("rmsnorm_forward=eps_outside_sqrt", "--seed", seed, "--grade", "bf16",
                      "--draws", "2")
        self.assertEqual(whole.returncode, 1, whole.stdout + whole.stderr)
        replay = re.search(r"^replay: (.*)$", whole.stdout, re.M).group(1)
        self.assertEqual(replay, "divlab check rmsnorm_forward=eps_outside_sqrt --seed " + seed
                         + " --grade bf16 --draws 2")
        first = failing(whole.stdout)[0]
        alone_line = re.search(r"^its first failure alone: (.*)$", whole.stdout, re.M).group(1)
        self.assertEqual(shlex.split(alone_line), shlex.split(replay) + ["--condition", first])
        alone = run(*shlex.split(alone_line)[1:])
        self.assertEqual(alone.returncode, 1, alone.stdout + alone.stderr)
        self.assertIn("1 of 37 conditions (--condition)", alone.stdout)
        rows = lambda out: [l for l in out.splitlines() if re.match(r"\S.*?  +B\d", l)]
        self.assertEqual(rows(alone.stdout), [l for l in rows(whole.stdout) if l.startswith(first)],
                         f"seed {seed}")
        details = lambda out: [l for l in out.splitlines() if l.startswith(f"  [{first}] ")]
        self.assertTrue(details(whole.stdout), whole.stdout)  # its smallest failing shape
        self.assertEqual(details(alone.stdout), details(whole.stdout), f"seed {seed}")
        self.assertEqual(failing(alone.stdout), [first])  # and no verifier note: not its table
        self.assertNotIn("benchmark verifier", alone.stdout)
        self.assertNotIn("its first failure alone", alone.stdout)
        # A crash inside the condition named is still that condition's verdict (the isolated
        # worker gets --condition too), and the conditions not named have no row.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        r = check("add=segfaults_on_large", "--plugins", lib, "--condition", "SHAPE ALIGNED",
                  "--condition", "shape tiny")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual([l.split("  ")[0] for l in rows(r.stdout)], ["shape tiny", "shape aligned"])
        self.assertRegex(r.stdout, r"shape aligned .* FAIL: crashed: SIGSEGV")
        self.assertRegex(r.stdout, r"replay: .* --plugins \S+ --condition 'shape tiny' "
                                   r"--condition 'shape aligned'\n")

    def test_divlab_s_own_work_is_not_the_kernel_s_time(self):
        # --time-limit times a draw's kernel calls; the fp64 work between them (AdamW's reference
        # over 16.8 M values, its rounding allowances, the next draw) is bounded apart. With the
        # cores busy it took past 1 s, and a correct kernel was called hung ("arrays past 2^24").
        # The limit sits between the two: on CI's 2 cores, busy, the kernel's AdamW over those
        # values takes 0.5 s and the own work before it 6.7 s (a limit of 1 s failed CI once, with
        # another test running beside this one), so 3 s passes the kernel 6 times over and still
        # fails a clock that counted the own work. Each busy loop ends with the test's process,
        # should that be killed first.
        spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
        load = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]
        try:
            r = check("adamw_step=reference", "--time-limit", "3")
        finally:
            for p in load:
                p.kill()
                p.wait()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("hang", r.stdout)

    def test_reading_an_output_or_writing_an_input_fails_everywhere(self):
        # Training hands a kernel last step's values in its outputs and needs its inputs after
        # the call; both kernels compute the right sums on check's arrays as they come.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        for variant, why in [("reads_its_output", "non-finite output where the reference is finite"),
                             ("writes_its_input", "writes outside its outputs (input 0: written at value ")]:
            r = check("add=" + variant, "--plugins", lib)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            # (Not "values NaN": there a NaN the kernel adds to an output is not told apart from
            # one it carries from its inputs, and NaN spreading further than the reference's is
            # allowed.)
            rows = [line for line in r.stdout.splitlines()
                    if line.startswith(("shape", "values")) and not line.startswith("values NaN")]
            self.assertGreater(len(rows), 5, r.stdout)
            for line in rows:
                self.assertIn("FAIL: " + why, line, r.stdout)

    def test_a_scalar_written_into_the_kernel_fails(self):
        # Each draw passes its own cap (5 to 100), as it does eps, the RoPE base, dloss and the
        # optimizers' settings; the kernel is right only where the draw's cap is 30.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        r = check("softcap_forward=softcap_at_30", "--plugins", lib, "--draws", "4")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"worst element at .*\(cap (?!30\))[0-9.]+\)")
        self.assertGreaterEqual(len(failing(r.stdout)), 4, r.stdout)

    def test_a_result_kept_by_address_fails_on_refilled_arrays(self):
        # Right whenever its arrays are new; training refills the same ones every step.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        r = check("add=caches_by_address", "--plugins", lib)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("arrays refilled", failing(r.stdout), r.stdout)
        self.assertRegex(r.stdout, r"arrays refilled .* FAIL: .*kept by address\?")

    def test_kernels_written_for_smaller_sizes_fail_only_past_them(self):
        # 16-bit token ids, a RoPE table of 2048 (or 8192) positions, a row buffer of 65 536
        # logits, a 16-bit row index, 16-bit per-id counts in a sorted scatter, a row staged in
        # 4096 values, a q.k tile of 64 channels, a path for tensors past 2^20 values that drops
        # its partial chunk, one with a body of 16 values and no tail: right at every size the
        # other conditions draw, wrong at a vocabulary past 2^17 ids (Llama 3 has 128 256), a
        # sequence past 2048 (or 16 384) positions, 65 536 rows, one id at 65 536 positions, rows
        # of 4224 channels in heads of 128 (and of 256), 4 M values in one array (and 16 M), or
        # 16 M values no multiple of 16.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        for target, conditions in [
                ("embedding_forward=u16_ids", ["vocabulary wide"]),
                ("cross_entropy=row_buffer_65536", ["vocabulary wide"]),
                ("rope_forward=table_2048", ["sequence long", "sequence 2^14+"]),
                ("rope_forward=table_8192", ["sequence 2^14+"]),
                ("rmsnorm_forward=rows_u16", ["rows many"]),
                ("embed_rmsnorm_backward=u16_row_counts", ["row hot (2^16+)"]),
                ("rmsnorm_forward=row_buffer_4096", ["channels wide"]),
                ("attention_forward=head_tile_64", ["channels wide", "heads wide (256)"]),
                ("gelu_forward=chunks_of_2_20", ["arrays large (4 M)", "arrays past 2^24"]),
                ("add=vector_body_without_tail", ["arrays past 2^24"])]:
            with self.subTest(target):
                r = check(target, "--plugins", lib)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertEqual(failing(r.stdout), conditions, r.stdout)

    def test_what_many_calls_change_fails_at_the_257th_call(self):
        # Right for its first 100 calls at a size, then a "tuned" path that is not; right values
        # through scratch malloc'd at every call and never freed (128 KiB a call). Of the
        # conditions up to it, only the one that calls a kernel 257 times in the same arrays sees
        # either (those after it, at the same size in the same worker, meet the tuned path too).
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        for variant, why in [("tuned_after_100_calls",
                              r"FAIL: .*after 256 calls on other values: a path taken after "
                              r"warm-up\?"),
                             ("leaks_its_scratch",
                              r"FAIL: leaks memory: host heap \+30\.0 MiB over calls 17-256")]:
            with self.subTest(variant):
                r = check("add=" + variant, "--plugins", lib)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertEqual(failing(r.stdout)[0], "call 257 (warmed up)", r.stdout)
                rows = re.findall(r"^(\S.*?)  +B\d", r.stdout, re.M)
                before = rows[:rows.index("call 257 (warmed up)")]
                self.assertFalse(set(failing(r.stdout)) & set(before), r.stdout)
                self.assertRegex(r.stdout, r"call 257 \(warmed up\) .* " + why)

    def test_a_path_no_other_condition_takes_fails_its_own(self):
        # Each right on every other condition: a cross-entropy fed a step's NaNs that reports a
        # finite loss (a run that blew up would look healthy), and a fused one that writes the
        # gradient even in evaluation's loss-only call (no dlogits: a run's first evaluation
        # crashes). The reference passes both.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        for variant, condition, why in [
                ("skips_nonfinite", "values NaN", r"NaN hidden: \d+ output value"),
                ("writes_gradient_always", "loss only (evaluation)", r"crashed: SIGSEGV")]:
            with self.subTest(variant):
                r = check("cross_entropy=" + variant, "--plugins", lib)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertEqual(failing(r.stdout), [condition], r.stdout)
                self.assertRegex(r.stdout, re.escape(condition) + " .* FAIL: " + why)
        r = check("cross_entropy=reference")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_a_killed_check_leaves_no_worker_and_no_file(self):
        # SIGKILL at any moment: here while its worker spins in a kernel that hangs. The worker
        # dies with it, and the files the two exchanged were never in a folder.
        lib = os.environ["DIVLAB_CRASHING_KERNELS_PLUGIN"]
        before = set(glob.glob("/tmp/divlab-check-*"))
        p = subprocess.Popen([BIN, "check", "add=hangs_on_one_size", "--plugins", lib,
                              "--time-limit", "60"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        workers = []
        for _ in range(200):  # the worker, started within moments
            time.sleep(0.05)
            workers = [int(t) for t in proc_file(f"/proc/{p.pid}/task/{p.pid}/children").split()]
            if workers:
                break
        self.assertTrue(workers, "check started no worker")
        time.sleep(1.0)  # well into its conditions, in the hanging one
        p.send_signal(signal.SIGKILL)
        p.wait()
        for _ in range(100):
            # A worker gone between two reads has no stat: gone, like one that is a zombie.
            if not any(proc_file(f"/proc/{w}/stat").split()[2:3] not in ([], ["Z"])
                       for w in workers):
                break
            time.sleep(0.05)
        else:
            self.fail(f"worker {workers} outlived its check")
        self.assertEqual(set(glob.glob("/tmp/divlab-check-*")) - before, set())

    def test_a_traces_weights_that_are_not_finite_are_passed_over(self):
        # NaN weights would feed the op NaN everywhere: the reference itself would "fail" against
        # the fp64 reference. The newest finite weights are taken, and none at all is refused.
        import h5py
        import numpy as np
        d = tmpdir()
        trace = os.path.join(d, "run.h5")
        r = run("train", "--quiet", "--out", trace, "--set", "model.vocab=96", "model.d_model=16",
                "model.n_layers=1", "model.seq_len=12", "train.batch=3", "train.steps=4",
                "trace.final_weights=true", "trace.initial_weights=true")
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(trace, "r+") as f:
            f["/weights/final/wte.weight"][0, 0] = np.nan
        r = run("check", "linear_forward=reference", "--trace", trace, "--draws", "1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("the trace's weights: initial (step 0); newer: final (step 4), not finite",
                      r.stdout)
        with h5py.File(trace, "r+") as f:
            f["/weights/initial/ln_f.weight"][3] = np.inf
        assert_rejected(self, ["check", "linear_forward=reference", "--trace", trace],
                        "every set of weights it keeps holds NaN or inf (final (step 4), "
                        "initial (step 0))")

    def test_train_runs_the_ops_short_grid(self):
        # A dense op's grid (configs/check-train.toml): a mask that lets each position see the
        # next token lowers the loss under both optimizers; its control stays quiet. (The token
        # ops' grid is the reproduce grid: tests/test_check_train.cpp picks it, test_experiments
        # runs it.)
        # Without --out, in a folder with no runs/ yet (a fresh checkout): runs/ is made.
        d = tmpdir()
        out = os.path.join(d, "runs", "check-attention_forward-mask_off_by_one")
        r = subprocess.run([BIN, "check", "attention_forward=mask_off_by_one", "--train", "--jobs",
                            "2", "--no-plots"], cwd=d, capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stderr)  # the kernel-level verdict
        self.assertIn("--train: the short training grid for attention_forward", r.stdout)
        with open(out + ".grid.toml") as f:
            grid = f.read()
        self.assertIn('axes.kernels.attention_forward = ["reference", "mask_off_by_one", '
                      '"fp64_accum"]', grid)
        with open(os.path.join(out, "verdicts.csv")) as f:
            rows = list(csv.DictReader(f))
        got = {("adamw" if "optimizer=adamw" in row["group"] else "sgd",
                row["variant"].split("=", 1)[1]): row["verdict"] for row in rows}
        self.assertEqual(got, {("sgd", "mask_off_by_one"): "lower-loss",
                               ("adamw", "mask_off_by_one"): "lower-loss",
                               ("sgd", "fp64_accum"): "no-divergence",
                               ("adamw", "fp64_accum"): "no-divergence"})
        self.assertRegex(r.stdout, r"summary: attention_forward=mask_off_by_one changed training "
                                   r"in 2 of 2 groups: .*sgd: lower-loss")


if __name__ == "__main__":
    unittest.main()
