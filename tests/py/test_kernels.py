"""Kernel selection and shadow mode from the command line."""
import os
import unittest

import h5py
import numpy as np

from cli import ROOT, SMALL, run, tmpdir

BUCKETS = ["1", "2-3", "4-15", "16-63", "64-255", "256-1023", "1024+"]
# Skewed and large enough that rows reach the 64-255 bucket.
SHADOW_RUN = [*SMALL, "model.vocab=200", "model.seq_len=64", "train.batch=16", "train.steps=6",
              "data=zipf:1.2", "shadow.every=2"]


class KernelsCommand(unittest.TestCase):
    def test_lists_every_op_with_its_variants(self):
        out = run("kernels", check=True).stdout
        for op in ("embed_rmsnorm_backward", "rmsnorm_forward", "linear_forward",
                   "attention_forward", "cross_entropy", "adamw_step"):
            self.assertIn(op + ":", out)
        for variant in ("bf16_accum", "fp16_accum", "racy_scatter", "fp32_reordered",
                        "fp64_accum", "mask_off_by_one", "tail_skip", "no_max_subtraction",
                        "bf16_reduce", "eps_outside_sqrt", "bf16_truncate",
                        "bf16_stochastic_reused_seed"):
            self.assertIn(variant, out)

    def test_docs_match_the_catalogue(self):
        with open(os.path.join(ROOT, "docs", "kernels.md")) as f:
            doc = f.read()
        generated = run("kernels", "--markdown", check=True).stdout
        self.assertIn(generated, doc, "docs/kernels.md is stale: regenerate with "
                      "divlab kernels --markdown")

    def test_unknown_op(self):
        r = run("kernels", "--op", "matmul")
        self.assertEqual(r.returncode, 2)
        self.assertIn("valid ops", r.stderr)

    def test_gpu_catalogue_shows_its_pairs(self):
        # Needs the cuda build (not a GPU): listing touches no device.
        r = run("kernels", "--backend", "cuda", "--precision", "bf16", "--op", "attention_forward")
        if r.returncode == 2 and "no CUDA backend" in r.stderr:
            self.skipTest("this build has no CUDA backend")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("cuDNN fused SDPA", r.stdout)
        self.assertIn("runs with: attention_backward=batched_gemm", r.stdout)


class Selection(unittest.TestCase):
    def test_selected_variant_is_recorded_and_changes_the_run(self):
        d = tmpdir()
        losses = {}
        for variant in ("reference", "bf16_accum"):
            path = os.path.join(d, variant + ".h5")
            run("train", "--set", *SMALL, f"kernels.embed_rmsnorm_backward={variant}",
                "--out", path, check=True)
            with h5py.File(path, "r") as f:
                self.assertEqual(f["config"].attrs["kernels.embed_rmsnorm_backward"], variant)
                losses[variant] = f["metrics/loss"][:]
        self.assertEqual(losses["reference"][0], losses["bf16_accum"][0])  # same start
        self.assertFalse(np.array_equal(losses["reference"], losses["bf16_accum"]))

    def test_several_ops_at_once(self):
        d = tmpdir()
        path = os.path.join(d, "r.h5")
        run("train", "--set", *SMALL, "kernels.embed_rmsnorm_backward=fp64_accum",
            "kernels.rmsnorm_backward=bf16_reduce", "--out", path, check=True)
        with h5py.File(path, "r") as f:
            self.assertEqual(f["config"].attrs["kernels.rmsnorm_backward"], "bf16_reduce")


    def test_every_op_has_a_benign_control_that_trains_like_the_reference(self):
        # fp64_accum: each op's fp64 reference, rounded once. All nine swapped in at once, the
        # run stays within fp32 rounding of the reference, and every one is a control.
        ops = ["rmsnorm_forward", "rmsnorm_backward", "linear_forward", "linear_backward",
               "attention_forward", "attention_backward", "gelu_forward", "gelu_backward",
               "cross_entropy"]
        listed = run("kernels", check=True).stdout
        d = tmpdir()
        losses, head = {}, {}
        for name, kernels in (("reference", []),
                              ("controls", [f"kernels.{op}=fp64_accum" for op in ops])):
            path = os.path.join(d, name + ".h5")
            run("train", "--set", *SMALL, *kernels, "trace.final_weights=true", "--out", path,
                check=True)
            with h5py.File(path, "r") as f:
                losses[name] = f["metrics/loss"][:]
                head[name] = f["weights/final/lm_head.weight"][:]
                roles = f.attrs.get("kernel_roles", b"")
                roles = roles.decode() if isinstance(roles, bytes) else roles
        for op in ops:
            self.assertIn(f"{op}=fp64_accum control", roles)
        # Other bits (the controls run: the weights move apart at rounding level, which a
        # 20-step loss in fp32 does not always show), the same training.
        self.assertFalse(np.array_equal(head["reference"], head["controls"]))
        np.testing.assert_allclose(head["controls"], head["reference"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(losses["controls"], losses["reference"], rtol=1e-4)
        self.assertGreaterEqual(listed.count("fp64_accum"), len(ops) + 1)


class Shadow(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tmpdir()
        cls.plain = os.path.join(cls.dir, "plain.h5")
        cls.shadowed = os.path.join(cls.dir, "shadowed.h5")
        base = [x for x in SHADOW_RUN if not x.startswith("shadow.")]
        run("train", "--set", *base, "--out", cls.plain, check=True)
        run("train", "--set", *SHADOW_RUN,
            "shadow.variants=[embed_rmsnorm_backward=bf16_accum,"
            "embed_rmsnorm_backward=fp32_reordered,embed_rmsnorm_backward=fp64_accum,"
            "embed_rmsnorm_backward=reference,linear_forward=tail_skip]",
            "model.vocab=200", "--out", cls.shadowed, check=True)

    def test_does_not_change_the_trajectory(self):
        with h5py.File(self.plain, "r") as a, h5py.File(self.shadowed, "r") as b:
            self.assertEqual(a["metrics/loss"][:].tobytes(), b["metrics/loss"][:].tobytes())
            for name in a["metrics/grad_norm_by_param"]:
                np.testing.assert_array_equal(a["metrics/grad_norm_by_param"][name][:],
                                              b["metrics/grad_norm_by_param"][name][:])

    def test_layout_every_k_steps(self):
        with h5py.File(self.shadowed, "r") as f:
            g = f["shadow/embed_rmsnorm_backward/bf16_accum"]
            np.testing.assert_array_equal(g["step"][:], [0, 2, 4])
            for m in ("rel_l2", "max_row_rel", "cosine"):
                self.assertEqual(g[m].shape, (3,))
            self.assertEqual(sorted(g["bucket_rel_l2"]), sorted(BUCKETS))

    def test_frequent_rows_are_the_wrong_ones(self):
        with h5py.File(self.shadowed, "r") as f:
            g = f["shadow/embed_rmsnorm_backward/bf16_accum/bucket_rel_l2"]
            errors = [np.nanmean(g[b][:]) for b in BUCKETS if not np.all(np.isnan(g[b][:]))]
            self.assertGreaterEqual(len(errors), 4)
            self.assertGreater(errors[-1], 3 * errors[0], f"per-bucket errors {errors}")

    def test_controls_and_reference_sit_at_fp32_rounding(self):
        with h5py.File(self.shadowed, "r") as f:
            for v in ("fp32_reordered", "fp64_accum", "reference"):
                rel = f[f"shadow/embed_rmsnorm_backward/{v}/rel_l2"][:]
                self.assertTrue(np.all(rel < 1e-5), f"{v}: {rel}")
                self.assertTrue(np.all(f[f"shadow/embed_rmsnorm_backward/{v}/cosine"][:] > 0.99999))
            bug = f["shadow/embed_rmsnorm_backward/bf16_accum/rel_l2"][:]
            self.assertTrue(np.all(bug > 1e-3), bug)

    def test_tail_bug_shows_on_the_lm_head(self):
        with h5py.File(self.shadowed, "r") as f:  # vocab 200 is not a multiple of 32
            self.assertTrue(np.all(f["shadow/linear_forward/tail_skip/rel_l2"][:] > 1e-2))


if __name__ == "__main__":
    unittest.main()
