"""Data-parallel ranks on one device and as processes, in one run, on the same machine.

    python3 bench/data_parallel.py --divlab build/cuda/divlab [--ranks 2] [--steps 20]
    python3 bench/data_parallel.py --divlab build/cpu/divlab --cpu    # configs/tiny.toml's model

At GPT-2 small's shape (V 50304, C 768, 12 blocks, 12 heads, T 1024, bf16, SGD) it times
`divlab train` four ways, each the median step over the steps after the first three, from the
trace's /metrics/wall_s:
  1. one GPU, one rank, B sequences per step;
  2. one GPU, R simulated ranks sharing those B sequences (shards one after another);
  3. R GPUs over NCCL sharing the same B sequences (the same numbers as 2, bit for bit);
  4. R GPUs over NCCL with R x B sequences (each rank B: weak scaling).
and, for the NCCL runs, each rank's median compute (forward + backward) and reduction (the
all-gather of every rank's fp32 gradient and the grad_reduce kernel) from /ranks. Prints a table
with tokens/s and the weak-scaling efficiency (4's tokens/s over R x 1's). With --cpu the same
four runs on the CPU at configs/tiny.toml's model (T 64), the ranks as processes over sockets
(train.data_parallel = "processes"), each on its share of the cores, and 4's tokens/s over 1's
(the same cores either way).
"""
import os
import statistics
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from bench_args import Parser, at_least, executable  # bench/, beside this file

GPT2_SMALL = ["backend=cuda", "train.precision=bf16", "data=uniform", "model.vocab=50304",
              "model.d_model=768", "model.n_layers=12", "model.n_heads=12", "model.seq_len=1024",
              "train.lr=1e-4", "checkpoint.every=0", "eval.every=0"]


TINY_CPU = ["--config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs",
                                      "tiny.toml"), "--set", "backend=cpu", "train.precision=fp32",
            "checkpoint.every=0", "eval.every=0", "train.schedule=constant",
            "train.warmup_steps=0"]


def run(divlab, keys, steps, cpu=False):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "run.h5")
        model = TINY_CPU if cpu else ["--set", *GPT2_SMALL]
        cmd = [divlab, "train", "--quiet", *model, f"train.steps={steps}", *keys, "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
        with h5py.File(out, "r") as f:
            wall = f["/metrics/wall_s"][:]
            loss = f["/metrics/loss"][:]
            ranks = {}
            if "ranks" in f:
                for name in f["ranks"]:
                    if name != "step":
                        ranks[int(name)] = {k: float(np.median(f[f"ranks/{name}/{k}"][3:]))
                                            for k in ("compute_s", "reduce_s")}
        return statistics.median(np.diff(wall)[3:]), loss, ranks


def main():
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--divlab", required=True, type=executable)
    p.add_argument("--ranks", type=at_least(2), default=2)
    p.add_argument("--batch", type=at_least(1), default=16, help="sequences per step of rows 1-3")
    p.add_argument("--steps", type=at_least(5), default=20,
                   help="at least 5: each timing is the median over the steps after the first 3")
    p.add_argument("--cpu", action="store_true", help="the CPU, ranks as processes")
    a = p.parse_args()
    if a.batch % a.ranks:
        p.error(f"argument --batch: {a.batch} sequences do not split over --ranks {a.ranks}")
    R, B, T = a.ranks, a.batch, 64 if a.cpu else 1024
    transport = "processes" if a.cpu else "nccl"
    where = "CPU processes" if a.cpu else "GPUs"
    one = "1 process" if a.cpu else "1 GPU"
    rows = [(f"{one}, 1 rank", [f"train.batch={B}", "train.ranks=1"], B),
            (f"{one}, {R} simulated ranks", [f"train.batch={B}", f"train.ranks={R}"], B),
            (f"{R} {where}", [f"train.batch={B}", f"train.ranks={R}",
                              f"train.data_parallel={transport}"], B),
            (f"{R} {where}, {R}x batch", [f"train.batch={R * B}", f"train.ranks={R}",
                                          f"train.data_parallel={transport}"], R * B)]
    results = []
    for name, keys, batch in rows:
        step_s, loss, ranks = run(a.divlab, ["--set", *keys] if a.cpu else keys, a.steps, a.cpu)
        results.append((name, batch, step_s, loss, ranks))
    if a.cpu:
        print(f"configs/tiny.toml's model, fp32, {a.steps} steps, {os.cpu_count()} cores")
    else:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.split("\n")[0]
        print(f"GPT-2 small shape, bf16, {a.steps} steps, {gpu}")
    print(f"{'run':34} {'seq/step':>8} {'ms/step':>9} {'tokens/s':>10}   per-rank compute / reduce ms")
    for name, batch, step_s, _, ranks in results:
        per_rank = "  ".join(f"r{r}: {v['compute_s'] * 1e3:.2f} / {v['reduce_s'] * 1e3:.2f}"
                             for r, v in sorted(ranks.items()))
        print(f"{name:34} {batch:8d} {step_s * 1e3:9.2f} {batch * T / step_s:10.0f}   {per_rank}")
    same = np.array_equal(results[1][3], results[2][3])
    print(f"simulated ranks and ranks as {where}, losses bit for bit equal: {same}")
    base, weak = results[0], results[3]
    if a.cpu:  # the one process already uses every core: the ranks share the same cores
        print(f"{R} CPU processes on the same cores: {weak[1] / weak[2] / (base[1] / base[2]):.2f}"
              " of one process's tokens/s")
    else:
        print(f"weak scaling over {R} GPUs: {weak[1] / weak[2] / (R * base[1] / base[2]):.2f} "
              f"of {R}x one GPU's tokens/s")


if __name__ == "__main__":
    main()
