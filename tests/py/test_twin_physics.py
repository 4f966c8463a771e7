"""The reported bug's PyTorch twin: bf16_accum written here from its documented definition (each
embedding row accumulated in a bf16 accumulator, rounded to nearest even after every addition,
in position order, from what the buffer holds: a tied head's dense gradient, or the
micro-batches' before), independently of divlab's kernel, on tests/py/divlab_torch.py's model,
and its fp16 and truncating siblings. divlab's buggy gradients and buggy training runs must be
the twin's, so that a divergence the lab reports is the bug's and not the lab's: the same
embedding gradients (bit for bit in practice; asserted: 99 % of the elements, and a twentieth of
the bug's own error), the same SGD losses step by step, and AdamW masking the bug in both."""
import os
import subprocess
import unittest

import h5py
import numpy as np
import torch

from cli import tmpdir
from divlab_torch import loss_after_embedding, optimizer_for
from test_parity import batches, torch_model

DUMP = os.environ["DIVLAB_PARITY_DUMP"]
# configs/reproduce.toml's cell (its skewed chain: the hottest of 64 ids is a third of the
# stream) at half its batch: 8 192 tokens a step, the hottest row ~2 700 additions, where bf16
# stalls near 256 same-sign ones.
CELL = ["data=markov:0.8,0.8", "model.vocab=64", "model.d_model=32", "model.n_layers=1",
        "model.n_heads=2", "model.seq_len=32", "train.batch=256", "train.lr=0.3",
        "train.momentum=0.9", "train.warmup_steps=20", "train.grad_clip=0"]
BUG = "kernels.embed_rmsnorm_backward=bf16_accum"
SGD = ["train.optimizer=sgd"]
ADAMW = ["train.optimizer=adamw", "train.lr=3e-3"]
# Two fp32 implementations of the same buggy run: their dx0 differ in fp32 rounding, which flips
# a bf16 rounding about once in 10^5 additions. Measured: at most 1.3e-6 relative between the
# losses over 6 SGD steps (30 seeds) and 5e-7 over 30 AdamW steps (24 seeds).
LOSS_TOL = 1e-5


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def fp16(x):
    return x.to(torch.float16).to(torch.float32)


def bf16_truncated(x):
    return (x.view(torch.int32) & -65536).view(torch.float32)


# The deterministic low-precision variants and the rounding each applies after every addition.
ROUNDINGS = {"bf16_accum": bf16, "fp16_accum": fp16, "bf16_truncate_accum": bf16_truncated}


def rounded_scatter(start, rows, contributions, rounding=bf16):
    """start with contributions[n] added to row rows[n] in n order, the sum rounded (bf16 to
    nearest even unless told) after every addition; rows that receive nothing keep their start
    value."""
    V = start.shape[0]
    counts = torch.bincount(rows, minlength=V)
    order = torch.argsort(rows, stable=True)
    sorted_rows = rows[order]
    nth = torch.arange(rows.numel()) - (torch.cumsum(counts, 0) - counts)[sorted_rows]
    # Wave j holds every row's j-th contribution: rows are independent, so a wave is one
    # vectorised addition, and a row that has run out adds zeros to a bf16 value (no change).
    waves = torch.zeros(int(counts.max()), V, start.shape[1])
    waves[nth, sorted_rows] = contributions[order]
    touched = counts > 0
    acc = start.clone()
    for wave in waves:
        acc[touched] = rounding(acc[touched] + wave[touched])
    return acc


def twin_bug_loss(model, idx, targets, rounding=bf16, scale=1.0):
    """(scale * loss).backward() of the twin with its embedding gradient scattered as bf16_accum
    (or the variant of `rounding`) does: into the rows the gradient buffers hold (a tied head's
    dense part, or the micro-batches' before this one)."""
    x = model.embed(idx).detach().requires_grad_()
    loss = loss_after_embedding(model, x, targets)
    (loss * scale).backward()  # every gradient but the scatter's
    B, T, C = x.shape
    dx0 = x.grad.reshape(-1, C)
    tables = [(model.wte.weight, idx.reshape(-1))]
    if hasattr(model, "wpe"):  # positions b-major, as the batch is laid out
        tables.append((model.wpe.weight, torch.arange(T).repeat(B)))
    for table, rows in tables:
        start = table.grad if table.grad is not None else torch.zeros_like(table)
        table.grad = rounded_scatter(start, rows, dx0, rounding)
    return loss


class TwinPhysics(unittest.TestCase):
    def dump(self, keys, steps):
        path = os.path.join(tmpdir(), "dump.h5")
        subprocess.run([DUMP, path] + CELL + keys + [f"train.steps={steps}",
                                                     f"train.seed={self.seed}"], check=True)
        return h5py.File(path, "r")

    def setUp(self):
        self.seed = int(np.random.randint(1 << 30))

    def twin(self, f, dtype=torch.float32):
        model, cfg = torch_model(f, dtype)
        return (model, cfg) + batches(f, cfg)

    def check_gradients(self, model_keys, variant="bf16_accum"):
        f = self.dump(SGD + [f"kernels.embed_rmsnorm_backward={variant}"] + model_keys, 1)
        bug, _, inputs, targets = self.twin(f)
        twin_bug_loss(bug, inputs[0], targets[0], ROUNDINGS[variant])
        self.compare(f, bug, variant, model_keys)

    def exact_gradient(self, f):
        exact, _, inputs, targets = self.twin(f, torch.float64)
        exact(inputs[0], targets[0]).backward()
        return exact

    def compare(self, f, bug, variant, model_keys):
        """divlab's dumped embedding gradients against the twin's `bug` (its buggy gradients)."""
        exact = self.exact_gradient(f)
        names = ["wte.weight"] + (["wpe.weight"] if hasattr(bug, "wpe") else [])
        for name in names:
            ours = f["grads/" + name][:]
            twin = dict(bug.named_parameters())[name].grad.double().flatten().numpy()
            true = dict(exact.named_parameters())[name].grad.flatten().numpy()
            bug_error = np.linalg.norm(twin - true)
            gap = np.linalg.norm(ours - twin)
            where = f"seed {self.seed} {variant} {model_keys} {name}"
            self.assertLessEqual(gap, 0.05 * bug_error,
                                 f"{where}: divlab's buggy gradient is {gap:.3e} from the twin's, "
                                 f"whose own error is {bug_error:.3e}")
            # Bit for bit but where a flipped rounding parts the two (measured: up to 0.05 % of
            # the elements in bf16, 0.3 % in fp16, each a few ulps at most: the distance below
            # stays under 2.1 % of the bug's own error); another order or rounding mode changes
            # most rows.
            same = np.mean(ours == twin)
            self.assertGreaterEqual(same, 0.99, f"{where}: {same:.2%} of the elements equal")
            if name == "wte.weight":  # the dose is one where the hot rows lose much
                self.assertGreater(bug_error, self.least_error[variant] * np.linalg.norm(true),
                                   where)

    def test_embedding_gradients_are_the_twins(self):
        self.check_gradients([])

    def test_tied_head_gradient_is_where_the_scatter_starts(self):
        self.check_gradients(["model.tied_embeddings=true"])

    def test_llama_token_rows(self):
        self.check_gradients(["model.arch=llama", "model.n_kv_heads=1"])

    # The bug's error on wte at this dose, relative to the gradient: measured 0.57-0.73 for
    # bf16_accum, 0.004-0.045 for fp16_accum (11 bits stall near 2 048 additions), 0.80-0.86
    # truncating (3 to 15 seeds).
    least_error = {"bf16_accum": 0.05, "fp16_accum": 0.001, "bf16_truncate_accum": 0.05}

    def test_fp16_and_truncating_variants_are_their_twins(self):
        for variant in ("fp16_accum", "bf16_truncate_accum"):
            self.check_gradients([], variant)

    def test_micro_batches_go_on_accumulating_in_the_rows(self):
        # train.micro_batches: four quarters of the batch, each (its loss scaled by 1/4) adding
        # into the gradient, the scatter rounding into the rows the quarter before left. A twin
        # that gives each quarter a fresh accumulator and adds the four in fp32 (PyTorch's
        # autograd accumulating a fresh op output into .grad) has a quarter of the dose and less
        # error: measured 0.07-0.53 of the in-place error over 14 seeds (the chain's hot ids, so
        # the dose, are drawn per seed; where a quarter still stalls, the ratio is highest).
        M = 4
        f = self.dump(SGD + [BUG, f"train.micro_batches={M}"], 1)
        in_place, _, inputs, targets = self.twin(f)
        fresh, _, _, _ = self.twin(f)
        summed = torch.zeros_like(fresh.wte.weight)
        quarter = inputs[0].shape[0] // M
        for m in range(M):
            part = slice(m * quarter, (m + 1) * quarter)
            twin_bug_loss(in_place, inputs[0][part], targets[0][part], scale=1.0 / M)
            fresh.zero_grad(set_to_none=True)
            twin_bug_loss(fresh, inputs[0][part], targets[0][part], scale=1.0 / M)
            summed += fresh.wte.weight.grad
        self.compare(f, in_place, "bf16_accum", [f"train.micro_batches={M}"])
        true = self.exact_gradient(f).wte.weight.grad.numpy()
        kept = np.linalg.norm(in_place.wte.weight.grad.double().numpy() - true)
        split = np.linalg.norm(summed.double().numpy() - true)
        self.assertLess(split, 0.75 * kept, f"seed {self.seed}: fresh quarters {split:.3e}, "
                                           f"in place {kept:.3e}")

    def twin_losses(self, f, steps):
        model, cfg, inputs, targets = self.twin(f)
        opt, sched = optimizer_for(model, cfg)
        losses = []
        for s in range(steps):
            opt.zero_grad()
            losses.append(twin_bug_loss(model, inputs[s], targets[s]).item())
            opt.step()
            sched.step()
        return np.array(losses)

    def check_losses(self, ours, twin, what):
        for s, (a, b) in enumerate(zip(ours, twin)):
            self.assertLess(abs(a - b) / b, LOSS_TOL,
                            f"seed {self.seed} {what} step {s}: divlab {a} vs the twin {b}")

    def test_sgd_steps_are_the_twins(self):
        # Six steps: later, SGD amplifies a flipped rounding as it parts two seeds' runs (over 30
        # seeds the largest gap was 1.3e-6 by step 5, 4.5e-6 at step 7, 4.9e-5 at step 8, and
        # 1e-3 after 13-20 steps); a twin adding in reverse order is 8e-5 off by step 3.
        f = self.dump(SGD + [BUG], 6)
        self.check_losses(f["losses"][:], self.twin_losses(f, 6), "SGD")

    def test_adamw_masks_the_bug_in_both(self):
        steps = 30
        f = self.dump(ADAMW + [BUG], steps)
        reference = self.dump(ADAMW, steps)["losses"][:]
        ours, twin = f["losses"][:], self.twin_losses(f, steps)
        self.check_losses(ours, twin, "AdamW")
        # Adam's update is invariant to a row's gradient scale, so the rows the bug shrinks move
        # almost as the reference's do. Measured over 41 seeds, the worst step's relative gap:
        # median 8.7e-5, 90th percentile 1.6e-4, and a tail to 1.5e-3 (seed 757282462 at step
        # 28, a small consistent drop). The same seeds under SGD move by 0.034 to 4.0 at their
        # worst step (101 seeds, 2026-11-30: one in ten below 0.1, where this test once asked
        # for more and so failed at seed 1063836651's 0.047), each at least 760 times as far as
        # under AdamW (60 seeds). Masked: at every step within 1e-2 and within a thirtieth of
        # SGD's, which moves by over 1 %.
        sgd = self.dump(SGD + [BUG], steps)["losses"][:] / self.dump(SGD, steps)["losses"][:]
        sgd_worst = float(np.abs(sgd - 1).max())
        self.assertGreater(sgd_worst, 0.01, f"seed {self.seed}: the bug under SGD")
        for s in range(steps):
            for name, bug in (("divlab", ours[s]), ("twin", twin[s])):
                gap = abs(bug - reference[s]) / reference[s]
                self.assertLess(gap, min(1e-2, sgd_worst / 30),
                                f"seed {self.seed} AdamW step {s}: {name}'s buggy run "
                                f"{bug} vs the reference {reference[s]} (SGD's worst gap "
                                f"{sgd_worst:.3f})")


if __name__ == "__main__":
    unittest.main()
