"""Parity with PyTorch on the GPU itself, for both model families: divlab's cuda trainer in fp32
and PyTorch on the same GPU (no TF32), from the same initial weights and batches (parity_dump),
give the same losses over 20 optimizer steps, SGD and AdamW, within the CPU parity test's bound.
Skipped where PyTorch has no GPU or divlab was built without CUDA."""
import os
import subprocess
import unittest

import h5py
import torch

import cli
import test_parity

BIN = os.environ["DIVLAB_BIN"]


def gpu_ready():
    if not torch.cuda.is_available():
        return False
    r = subprocess.run([BIN, "kernels", "--backend", "cuda", "--op", "add"], capture_output=True)
    return r.returncode == 0


@unittest.skipUnless(gpu_ready(), "needs a GPU for PyTorch and the cuda build of divlab")
class GpuParity(test_parity.Parity):
    MODEL = test_parity.MODEL

    def setUp(self):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def our_losses(self, f, optimizer_keys, steps):
        """The cuda trainer's losses for the dumped run's config and seed."""
        out = os.path.join(cli.tmpdir(), "gpu.h5")
        keys = self.MODEL + optimizer_keys + ["backend=cuda", "train.precision=fp32",
                                              f"train.steps={steps}", f"train.seed={self.seed}",
                                              "eval.every=0", "checkpoint.every=0"]
        subprocess.run([BIN, "train", "--set", *keys, "--out", out, "--quiet"], check=True,
                       stdout=subprocess.DEVNULL)
        with h5py.File(out, "r") as g:
            return g["/metrics/loss"][:]

    def test_20_steps_sgd_nesterov_cosine_clipped(self):
        self.check_training(test_parity.SGD, "cuda")

    def test_20_steps_adamw(self):
        self.check_training(test_parity.ADAMW, "cuda")

    def test_20_steps_sgd_over_four_data_parallel_ranks(self):
        # The cuda trainer's simulated ranks: shards in turn, gradients stacked on the device and
        # reduced by the GPU's grad_reduce (not yet run on a GPU when written, 2026-11-26).
        self.check_training(test_parity.SGD + ["train.ranks=4"], "cuda")

    def test_20_steps_adamw_in_four_micro_batches(self):
        # Gradient accumulation on the device: four graphed micro-batches per step, the three
        # after the first replaying the step's graph without zeroing the gradients.
        self.check_training(test_parity.ADAMW + ["train.micro_batches=4"], "cuda")

    # The one-batch gradient tests compare the CPU dump; the GPU's gradients are held to the
    # CPU's by tests/gpu (GpuTraining.GradientsPerTensorAgreeWithTheCpu).
    test_loss_and_gradients_fp32 = None
    test_loss_and_gradients_fp64 = None


class GpuLlamaParity(GpuParity):
    MODEL = test_parity.LlamaParity.MODEL


if __name__ == "__main__":
    cli.main_reporting_skips()
