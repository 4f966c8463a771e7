"""GPU speed of `divlab train` against the same model in PyTorch, on the same GPU, in one run.

    python3 bench/gpu_vs_torch.py --divlab build/cuda/divlab --config configs/bench-gpu.toml

1. divlab: `divlab train` on the config with backend = cuda (trace writing included); the
   median step time over the steps after the first few, from the trace's /metrics/wall_s.
2. The same model (tests/py/divlab_torch.py, fused SDPA attention), batch, token count and
   precision in PyTorch: eager, then torch.compile in each mode of --torch-modes (default,
   reduce-overhead = CUDA graphs; max-autotune on request: its GEMM autotuning takes minutes at
   GPT-2 small), each in a child process with a time limit (a mode that does not finish in it is
   reported, not waited for); SGD with momentum; bf16 autocast when divlab runs bf16;
   loss.item() every step (divlab records every step's loss too). The ratios are against eager
   and against the fastest compile mode that ran. A mode suffixed `+deterministic` (for example
   reduce-overhead+deterministic) runs under torch.use_deterministic_algorithms, as divlab's
   references run (a repeated run gives the same bits): the like-for-like peer, rated on its own
   line against the fastest such mode.
3. llm.c, where --llmc names a checkout and the config has the shape of one of its GPT-2 models
   (bench/llmc.py: built in a scratch copy with cuDNN attention, its default flags, uniform
   random tokens; its own per-step times).
4. divlab again, over --shadow-steps steps (more where a run would last under 3 s), plain and
   with shadow mode at every step and every 10th (the seed bug shadowed on the embedding op),
   for each shadow.reference in --shadow-references (fp32_device: compared on the GPU; fp64: on
   the CPU), three rounds: its cost as a fraction of step time, the median round's.
MFU: (6 x matmul parameters + 12 x layers x T x C) FLOPs per token against the GPU's dense bf16
peak. Either model family (model.arch: gpt2, or llama with its grouped kv heads and SwiGLU).
Prints a table last.
"""
import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "py"))
import bench_args  # noqa: E402  (bench/, beside this file)
import divlab_torch  # noqa: E402
import llmc  # noqa: E402  (bench/, beside this file)

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
MIN_STEPS = 6  # each timing is the median over the steps after the first 5 (or first quarter)


def run_divlab(args, extra, steps=None):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bench.h5")
        cmd = [args.divlab, "train", "--config", args.config, "--out", out, "--quiet",
               "--set", "backend=cuda", "--set", f"train.steps={steps or args.steps}"]
        for s in args.set + extra:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with h5py.File(out, "r", swmr=True) as f:
            wall = f["/metrics/wall_s"][:]
            cfg = {k: plain(f["/config"].attrs[k]) for k in f["/config"].attrs}
            device = f.attrs["device"]
    steps = [wall[i] - wall[i - 1] for i in range(max(5, len(wall) // 4), len(wall))]
    return statistics.median(steps), statistics.mean(steps), cfg, device


def as_str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def plain(v):
    """An HDF5 attribute as a plain Python value (str, int, float): JSON-ready."""
    return as_str(v) if isinstance(v, (bytes, str)) else v.item() if hasattr(v, "item") else v


def model_table(cfg):
    """The trace's model.* attributes as divlab_torch.from_config takes them."""
    def value(v):
        return {"true": True, "false": False}.get(v, v) if isinstance(v, str) else v
    return {k.split(".", 1)[1]: value(v) for k, v in cfg.items() if k.startswith("model.")}


def torch_model(cfg):
    """The same model in PyTorch (either family), with fused SDPA attention."""
    torch.manual_seed(0)
    return divlab_torch.from_config(model_table(cfg), sdpa=True)


def matmul_params(cfg):
    """Weights that multiply every token: every Linear, and the tied head's embedding."""
    model = torch_model(cfg)
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return n + (model.wte.weight.numel() if model.tied else 0)


def die_with_parent():
    """Child processes get SIGKILL when this script dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_torch_child(cfg, steps, mode, timeout):
    """run_torch in a child process: seconds per step, or None when it ran past `timeout`."""
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", mode, "--steps", str(steps),
           "--cfg-json", json.dumps(cfg)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"PyTorch ({mode}) failed: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.split()[-1])


def split_mode(mode):
    """'reduce-overhead+deterministic' -> ('reduce-overhead', True)."""
    base, plus, rest = mode.partition("+")
    return base, plus == "+" and rest == "deterministic"


def torch_step(cfg, mode):
    """One training step of the PyTorch model in `mode` (eager or a torch.compile mode), as a
    function of fresh random tokens: (tokens(), step(tokens)). Also bench/torch_profile.py's."""
    V, T, B = int(cfg["model.vocab"]), int(cfg["model.seq_len"]), int(cfg["train.batch"])
    bf16 = as_str(cfg["train.precision"]) == "bf16"
    mode, deterministic = split_mode(mode)
    if deterministic:
        # cuBLAS reads this when its handle is made (the first GEMM, after this).
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
    model = torch_model(cfg).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["train.lr"]),
                          momentum=float(cfg["train.momentum"]))
    step_fn = model if mode == "eager" else torch.compile(model, mode=mode)
    torch.backends.cuda.matmul.allow_tf32 = False

    def tokens():
        return (torch.randint(0, V, (B, T), device="cuda"),
                torch.randint(0, V, (B, T), device="cuda"))

    def step(batch):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = step_fn(*batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg["train.grad_clip"]) or 1e9)
        opt.step()
        return loss.item()
    return tokens, step


def run_torch(cfg, steps, mode):
    tokens, step = torch_step(cfg, mode)
    times = []
    for s in range(steps):
        batch = tokens()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[max(5, steps // 4):])


def main():
    p = bench_args.Parser()
    p.add_argument("--divlab", type=bench_args.executable)
    p.add_argument("--config", type=bench_args.existing_file)
    p.add_argument("--steps", type=bench_args.at_least(MIN_STEPS), default=60,
                   help=f"at least {MIN_STEPS}: the median is over the steps after the first 5")
    p.add_argument("--shadow-steps", type=bench_args.at_least(0), default=400,
                   help="steps of each run that measures shadow mode's cost (0: not measured)")
    p.add_argument("--shadow-references", default="fp32_device,fp64",
                   help="the shadow.reference values whose cost is measured, comma-separated")
    p.add_argument("--set", action="append", default=[], type=bench_args.key_value)
    p.add_argument("--torch-modes",
                   default="eager,default,reduce-overhead,reduce-overhead+deterministic",
                   help="comma-separated: eager and torch.compile modes (default, "
                        "reduce-overhead, max-autotune, max-autotune-no-cudagraphs), each "
                        "optionally +deterministic (torch.use_deterministic_algorithms)")
    p.add_argument("--torch-timeout", type=bench_args.positive_seconds, default=900,
                   help="seconds one PyTorch mode may take, compilation included")
    p.add_argument("--llmc", help="an llm.c checkout (github.com/karpathy/llm.c) to build and time")
    p.add_argument("--cudnn-frontend", help="cudnn-frontend's include folder for llm.c's build "
                   "(default: LLMC/../cudnn-frontend/include)")
    p.add_argument("--torch-child", help=argparse.SUPPRESS)
    p.add_argument("--cfg-json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_child:
        print(run_torch(json.loads(args.cfg_json), args.steps, args.torch_child))
        return
    if not args.divlab or not args.config:
        p.error("--divlab and --config are required")
    modes = [m for m in args.torch_modes.split(",") if m]
    known = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    for m in modes:
        base, deterministic = split_mode(m)
        if base not in known or ("+" in m and not deterministic):
            p.error(f"--torch-modes: unknown mode '{m}' (known: {', '.join(known)}, each "
                    "optionally +deterministic)")
    for ref in args.shadow_references.split(","):
        if ref and ref not in ("auto", "fp64", "fp32_device"):
            p.error(f"--shadow-references: unknown reference '{ref}' (known: auto, fp64, "
                    "fp32_device)")
    if args.llmc and not os.path.isfile(os.path.join(args.llmc, "train_gpt2.cu")):
        p.error(f"--llmc: '{args.llmc}' is no llm.c checkout (no train_gpt2.cu there)")

    t_div, _, cfg, device = run_divlab(args, [])
    V, C, L = int(cfg["model.vocab"]), int(cfg["model.d_model"]), int(cfg["model.n_layers"])
    H = int(cfg["model.n_heads"])
    T, B = int(cfg["model.seq_len"]), int(cfg["train.batch"])
    tokens = B * T
    flops_per_token = 6 * matmul_params(cfg) + 12 * L * T * C
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    t_torch, failed = {}, {}
    for m in modes:
        try:
            t_torch[m] = run_torch_child(cfg, args.steps, m, args.torch_timeout)
        except RuntimeError as e:
            if not split_mode(m)[1]:
                raise
            # PyTorch refuses an op it has no deterministic kernel for: a finding, not a crash.
            t_torch[m], failed[m] = None, str(e).strip().splitlines()[-1][:200]
    t_llmc, llmc_note = None, None
    if args.llmc:
        model, llmc_note = llmc.descriptor(L, C, H, V, T, as_str(cfg["model.arch"]),
                                           as_str(cfg["model.tied_embeddings"]) == "true")
        if model:
            frontend = args.cudnn_frontend or os.path.join(args.llmc, "..", "cudnn-frontend",
                                                           "include")
            with tempfile.TemporaryDirectory() as scratch:
                binary = llmc.build(os.path.abspath(args.llmc), os.path.abspath(frontend),
                                    scratch, die_with_parent, args.torch_timeout)
                t_llmc = llmc.run(binary, model, B, T, args.steps, scratch, die_with_parent,
                                  args.torch_timeout)
    # Shadow cost from longer runs than the speed rows, three rounds of (plain, every step, every
    # 10th), the median of each round's ratio. A mean over a few shadowed steps moved by 12 % to
    # 30 % between two back-to-back runs of the small model (one host hiccup in ~70 ms), and one
    # 400-step round of the 1.2 ms small model still gave 24.5 % in one run and -0.6 % in
    # another: each run now lasts at least 3 s.
    # Each shadow reference (--shadow-references) is measured in every round against the same
    # plain run.
    shadow = "shadow.variants=[embed_rmsnorm_backward=bf16_accum]"
    shadow_steps = max(args.shadow_steps, int(3.0 / t_div)) if args.shadow_steps > 0 else 0
    references = [r for r in args.shadow_references.split(",") if r]
    every1 = {r: [] for r in references}
    every10 = {r: [] for r in references}
    for _ in range(3 if shadow_steps else 0):
        _, mean_plain, _, _ = run_divlab(args, [], shadow_steps)
        for ref in references:
            mode = [shadow, "shadow.reference=" + ref]
            _, mean_shadow1, _, _ = run_divlab(args, ["shadow.every=1"] + mode, shadow_steps)
            _, mean_shadow10, _, _ = run_divlab(args, ["shadow.every=10"] + mode, shadow_steps)
            every1[ref].append(100 * (mean_shadow1 / mean_plain - 1))
            every10[ref].append(100 * (mean_shadow10 / mean_plain - 1))

    t_eager = t_torch.get("eager")
    peers = [("eager", t_eager)]
    for kind in (False, True):  # the fastest compile mode, then the fastest deterministic one
        compiled = {m: t for m, t in t_torch.items()
                    if split_mode(m)[0] != "eager" and split_mode(m)[1] == kind and t is not None}
        best = min(compiled, key=compiled.get) if compiled else None
        label = "best deterministic compile" if kind else "best compile"
        peers.append((f"{label} ({best})" if best else label, compiled.get(best)))
    peers += [("eager+deterministic", t_torch.get("eager+deterministic")), ("llm.c", t_llmc)]
    peers = [(label, t) for label, t in peers if t is not None]

    def row(label, t, why=None):
        if t is None:
            print(f"{label:54s} {why or 'did not finish in --torch-timeout'}")
            return
        mfu = f"{100 * flops_per_token * tokens / t / peak:5.1f}%" if peak else "   n/a"
        print(f"{label:54s} {tokens / t:12.0f} {1e3 * t:9.2f} {mfu:>7s}")

    print(f"\nGPU speed: {name} ({as_str(device)}); torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; "
          f"{as_str(cfg['model.arch'])} V={V} C={C} L={L} H={H} T={T} B={B}, precision "
          f"{as_str(cfg['train.precision'])}, {args.steps} steps, median step")
    print(f"{'implementation':54s} {'tokens/s':>12s} {'ms/step':>9s} {'MFU':>7s}")
    row("divlab cuda", t_div)
    for m in modes:
        base, deterministic = split_mode(m)
        label = "PyTorch eager (SDPA)" if base == "eager" else f"PyTorch torch.compile {base}"
        row(label + (", deterministic" if deterministic else ""), t_torch[m],
            f"failed: {failed[m]}" if m in failed else None)
    if args.llmc:
        if t_llmc is None:
            print(f"llm.c: not run: {llmc_note}")
        else:
            row("llm.c (cuDNN attention, AdamW)", t_llmc)
    print("divlab speed-up: " + ", ".join(f"{t / t_div:.2f}x {label}" for label, t in peers))
    # Mean step times here: with shadow.every=10 the median would skip the shadowed steps.
    def spread(v):
        return f"{statistics.median(v):.1f}% (rounds {', '.join(f'{x:.1f}' for x in v)})"
    for ref in references if shadow_steps else []:
        print(f"divlab shadow cost, shadow.reference = {ref} (mean step over {shadow_steps} "
              f"steps, median of 3 rounds): every step {spread(every1[ref])}, every 10th step "
              f"{spread(every10[ref])} (goals: <= 25% and <= 5% on the device)")


if __name__ == "__main__":
    main()
