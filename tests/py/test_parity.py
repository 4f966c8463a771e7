"""Parity with PyTorch on the CPU, for both model families: the same weights and batches give the same loss, the same
gradient for every parameter, and the same losses over 20 optimizer steps (SGD and AdamW)."""
import os
import random
import subprocess
import tomllib
import unittest

import h5py
import numpy as np
import torch

from cli import tmpdir
from divlab_torch import from_config, optimizer_for

DUMP = os.environ["DIVLAB_PARITY_DUMP"]
MODEL = ["model.vocab=97", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
         "model.seq_len=16", "model.init_std=0.1", "train.batch=4", "data=zipf:1.1"]
# lr 0.2: at 0.5 these 20 steps amplify fp32 rounding up to ~10x a step near the end, and two
# correct fp32 runs' gaps to fp64 (each an amplified rounding, their ratio heavy-tailed) broke
# the bound below about once in 70 runs (2e-5 against PyTorch's 2e-6, llama over four ranks,
# seed 643548714). At 0.2 the largest gap in 150 runs was 5e-7, 20x inside the bound, and any
# difference in the optimizer's semantics still moves the losses by far more.
SGD = ["train.optimizer=sgd", "train.lr=0.2", "train.momentum=0.9", "train.nesterov=true",
       "train.weight_decay=0.01", "train.warmup_steps=5", "train.schedule=cosine",
       "train.grad_clip=1.0"]
ADAMW = ["train.optimizer=adamw", "train.lr=3e-3", "train.weight_decay=0.1",
         "train.warmup_steps=3", "train.schedule=cosine"]
# (loss tolerance, gradient tolerance) per working precision, relative.
TOL = {"fp32": 1e-5, "fp64": 1e-10}


def torch_model(f, dtype, device="cpu", perturb=0.0):
    """The PyTorch twin of a parity dump's model, with the dump's initial weights (each scaled by
    1 + perturb * N(0, 1), for a measure of how far the dynamics carry a rounding)."""
    cfg = tomllib.loads(f.attrs["config_toml"])
    model = from_config(cfg["model"]).to(dtype)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = torch.from_numpy(f["params/" + name][:]).view(p.shape)
            p.copy_(w * (1 + perturb * torch.randn(w.shape, generator=noise, dtype=w.dtype)))
    return model.to(device), cfg


def batches(f, cfg):
    """A parity dump's batches as (steps, B, T) inputs and targets."""
    B, T = cfg["train"]["batch"], cfg["model"]["seq_len"]
    inputs = torch.from_numpy(f["batches/inputs"][:]).view(-1, B, T)
    targets = torch.from_numpy(f["batches/targets"][:]).view(-1, B, T)
    return inputs, targets


def normalised_error(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def twin_losses(f, dtype, steps, device="cpu", perturb=0.0):
    """The twin's loss at each of a parity dump's steps, from its initial weights and batches."""
    model, cfg = torch_model(f, dtype, device, perturb)
    inputs, targets = batches(f, cfg)
    inputs, targets = inputs.to(device), targets.to(device)
    opt, sched = optimizer_for(model, cfg)
    clip = cfg["train"]["grad_clip"]
    # Data-parallel ranks as PyTorch users write them: gradient accumulation over the
    # batch's shards, each shard's mean loss divided by the rank count.
    ranks = cfg["train"].get("ranks", 1)
    shard = inputs.shape[1] // ranks
    losses = []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for r in range(ranks):
            rows = slice(r * shard, (r + 1) * shard)
            loss = model(inputs[s][rows], targets[s][rows])
            (loss / ranks).backward()
            total += loss.item() / ranks
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        losses.append(total)
        opt.step()
        sched.step()
    return losses


class Parity(unittest.TestCase):
    MODEL = MODEL

    def run_dump(self, precision, optimizer_keys, steps):
        path = os.path.join(tmpdir(), "dump.h5")
        self.seed = int(np.random.randint(1 << 30))
        keys = self.MODEL + optimizer_keys + [f"train.precision={precision}",
                                              f"train.steps={steps}", f"train.seed={self.seed}"]
        subprocess.run([DUMP, path] + keys, check=True)
        return h5py.File(path, "r")

    def check_one_batch(self, precision, dtype):
        f = self.run_dump(precision, ["train.optimizer=sgd"], 1)
        model, cfg = torch_model(f, dtype)
        inputs, targets = batches(f, cfg)
        loss = model(inputs[0], targets[0])
        loss.backward()
        tol = TOL[precision]
        ours = f["losses"][0]
        self.assertLess(abs(ours - loss.item()) / loss.item(), tol, f"loss {ours} vs {loss.item()}")
        for name, p in model.named_parameters():
            err = normalised_error(f["grads/" + name][:], p.grad.double().flatten().numpy())
            self.assertLess(err, tol, f"{precision} gradient of {name}: normalised error {err}")

    def our_losses(self, f, optimizer_keys, steps):
        """divlab's losses for the dumped run: the dump's own (the CPU trainer's)."""
        return f["losses"][:]

    def check_training(self, optimizer_keys, device="cpu"):
        # Training amplifies fp32 rounding (Nesterov momentum most), so two correct
        # fp32 implementations drift apart by about as much as either drifts from fp64. The bound
        # per step: 1e-5, or 4x PyTorch's own fp32-vs-fp64 gap at that step where the dynamics
        # have amplified rounding beyond it (seen once in ten runs here: 5e-5 at step 8).
        steps = 20
        f = self.run_dump("fp32", optimizer_keys, steps)
        t32 = twin_losses(f, torch.float32, steps, device)
        t64 = twin_losses(f, torch.float64, steps, device)
        losses = self.our_losses(f, optimizer_keys, steps)
        for s in range(steps):
            ours = losses[s]
            rel = abs(ours - t32[s]) / t32[s]
            floor = abs(t32[s] - t64[s]) / t64[s]
            self.assertLess(rel, max(TOL["fp32"], 4 * floor),
                            f"seed {self.seed} step {s}: loss {ours} vs torch {t32[s]} "
                            f"(torch fp64 {t64[s]})")

    def test_loss_and_gradients_fp32(self):
        self.check_one_batch("fp32", torch.float32)

    def test_loss_and_gradients_fp64(self):
        self.check_one_batch("fp64", torch.float64)

    def test_20_steps_sgd_nesterov_cosine_clipped(self):
        self.check_training(SGD)

    def test_20_steps_adamw(self):
        self.check_training(ADAMW)

    def test_20_steps_sgd_over_four_data_parallel_ranks(self):
        self.check_training(SGD + ["train.ranks=4"])

    def test_20_steps_adamw_in_four_micro_batches(self):
        # Gradient accumulation: four batches of a quarter each, added into one gradient.
        self.check_training(ADAMW + ["train.micro_batches=4"])


class LlamaParity(Parity):
    """The llama family with everything on: RoPE at llama 3's base, 4 query heads sharing 2
    key/value heads, SwiGLU, tied embeddings and a soft-cap the logits reach."""
    MODEL = MODEL + ["model.arch=llama", "model.n_kv_heads=2", "model.rope_base=500000",
                     "model.tied_embeddings=true", "model.logit_softcap=2"]


def random_keys(rng):
    """A configuration drawn from the space the options span (both families and their options,
    each optimizer and schedule setting, ranks and micro-batches, the synthetic data kinds), at
    sizes a test affords."""
    arch, heads = rng.choice(["gpt2", "llama"]), rng.choice([1, 2, 4])
    head_dim = rng.choice([2, 4, 8]) if arch == "llama" else rng.choice([1, 3, 4, 8])
    ranks, micro, steps = rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 4]), rng.randint(3, 12)
    # One in four with micro-batches of 2048 rows or more, where the CPU sums a narrow layer's
    # weight gradient over the rows in slices (kernels/linear/cpu.cpp).
    long = rng.random() < 0.25
    seq = rng.randint(64, 128) if long else rng.randint(1, 20)
    sequences = -(-rng.randint(2048, 3000) // seq) if long else rng.randint(1, 3)
    keys = [f"model.arch={arch}", f"model.vocab={rng.randint(3, 150)}",
            f"model.d_model={heads * head_dim}", f"model.n_layers={rng.randint(1, 3)}",
            f"model.n_heads={heads}", f"model.seq_len={seq}",
            f"model.init_std={rng.choice([0.02, 0.1, 0.3])}",
            f"model.norm_eps={rng.choice([1e-5, 1e-3, 0.1])}", f"train.ranks={ranks}",
            f"train.micro_batches={micro}", f"train.batch={ranks * micro * sequences}",
            f"train.steps={steps}", f"train.seed={rng.randint(0, 10**6)}",
            "data=" + rng.choice(["uniform", "zipf:1.1", "zipf:2", "markov:1.2,0.5"])]
    if arch == "llama":
        kv = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
        keys += [f"model.n_kv_heads={kv}", f"model.rope_base={rng.choice([10000, 500000, 7.5])}"]
    options = {"model.mlp_hidden": rng.randint(1, 50), "model.tied_embeddings": "true",
               "model.logit_softcap": rng.choice([0.5, 2, 30]),
               "train.weight_decay": rng.choice([0.01, 0.1, 1.0]),
               "train.grad_clip": rng.choice([0.1, 1.0, 5.0]),
               "train.warmup_steps": rng.randint(0, steps + 2)}
    keys += [f"{k}={v}" for k, v in options.items() if rng.random() < 0.4]
    if rng.random() < 0.5:
        keys += ["train.schedule=cosine", f"train.min_lr_ratio={rng.choice([0, 0.1, 0.5])}"]
    if rng.random() < 0.5:
        momentum = rng.choice([0, 0.5, 0.9])
        keys += ["train.optimizer=sgd", f"train.lr={rng.choice([0.05, 0.2, 0.5])}",
                 f"train.momentum={momentum}"]
        if momentum > 0 and rng.random() < 0.5:
            keys.append("train.nesterov=true")
    else:
        keys += ["train.optimizer=adamw", f"train.lr={rng.choice([1e-3, 1e-2, 3e-2])}",
                 f"train.beta1={rng.choice([0.9, 0.5, 0])}",
                 f"train.beta2={rng.choice([0.999, 0.95])}", f"train.eps={rng.choice([1e-8, 1e-3])}"]
    return keys


class RandomConfigs(unittest.TestCase):
    """Configurations no fixed test names: four fresh ones a run (the seed is printed on
    failure), each in fp64 against the twin in fp64, step by step. Training can carry a rounding
    far (AdamW with beta1 0 and eps 1e-3 grew 1e-16 to 3e-8 in five steps, in both programs), so
    a step's bound is 100x the twin's distance from itself started from weights moved by 1e-15,
    and at least 1e-11. `divlab train` on the same keys must give the dump's losses and final
    weights bit for bit (the dump runs the trainer's step and optimizer): it did not while host
    buffers kept malloc's 16-byte alignment (kernels/memory.cpp). A 430-configuration search
    with this bound found one gap in the twin (gpt2's mlp_hidden), none in divlab's physics."""

    def test_four_fresh_configurations(self):
        seed = int.from_bytes(os.urandom(4), "little")
        rng = random.Random(seed)
        tested = 0
        while tested < 4:
            keys = random_keys(rng) + ["train.precision=fp64"]
            path = os.path.join(tmpdir(), "dump.h5")
            subprocess.run([DUMP, path] + keys, check=True)
            with h5py.File(path, "r") as f:
                if not np.all(np.isfinite(f["losses"][:])):
                    continue  # a run that blew up (none in 750 drawn) compares nothing
            tested += 1
            trace = os.path.join(os.path.dirname(path), "run.h5")
            subprocess.run([os.environ["DIVLAB_BIN"], "train", "--quiet", "--out", trace, "--set"]
                           + keys + ["trace.final_weights=true"], check=True,
                           stdout=subprocess.DEVNULL)
            with h5py.File(trace, "r") as t, h5py.File(path, "r") as f:
                ours = f["losses"][:]
                np.testing.assert_array_equal(t["metrics/loss"][:], ours,
                                              f"seed {seed}: divlab train {keys}")
                for name in f["final"]:
                    np.testing.assert_array_equal(t["weights/final/" + name][:].ravel(),
                                                  f["final/" + name][:],
                                                  f"seed {seed}: divlab train's {name}, {keys}")
            with h5py.File(path, "r") as f:
                twin = twin_losses(f, torch.float64, len(ours))
                moved = twin_losses(f, torch.float64, len(ours), perturb=1e-15)
            floor = max(abs(a - b) / abs(b) for a, b in zip(moved, twin))
            for s, (a, b) in enumerate(zip(ours, twin)):
                self.assertLess(abs(a - b) / abs(b), max(1e-11, 100 * floor),
                                f"seed {seed} step {s}: loss {a} vs twin {b} (perturbed twin's "
                                f"distance {floor:.1e}); keys {keys}")


class Gpt2OptionsParity(Parity):
    """The gpt2 family with the options the reference model does not use: an MLP width of its
    own, a tied head, a soft-cap the logits reach and a wide RMSNorm epsilon."""
    MODEL = MODEL + ["model.mlp_hidden=40", "model.tied_embeddings=true",
                     "model.logit_softcap=2", "model.norm_eps=1e-2"]


if __name__ == "__main__":
    unittest.main()
