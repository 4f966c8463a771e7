"""Where PyTorch's step time goes, in the categories `divlab train --profile` reports, so that a
speed ratio against torch.compile can be read per kind of work (issue #19: is the gap in the
GEMMs, in attention, or in everything else?).

    python3 bench/torch_profile.py --divlab build/cuda/divlab --config configs/bench-gpt2-small.toml \
        --mode default

The model, batch and precision of bench/gpu_vs_torch.py's PyTorch run (tests/py/divlab_torch.py,
fused SDPA attention, SGD with momentum, bf16 autocast in bf16 mode, random tokens); a few
warm-up steps, then --steps steps under torch.profiler (CUDA activity from CUPTI: no nsys
needed). Each GPU kernel is put in one category by its name: GEMM (cuBLAS, cuBLASLt, CUTLASS,
Triton matmul templates), attention (flash, memory-efficient and cuDNN SDPA kernels), and the
rest (Triton's fused elementwise and reduction kernels, PyTorch's own, the optimizer). Prints
device milliseconds per step by category and the kernels that take the most time, with the SDPA
backend PyTorch chose. Kernels inside CUDA graphs (mode reduce-overhead) are counted where the
CUPTI in use reports graph nodes; the line "kernels seen" says how many it saw per step.
"""
import collections
import re
import subprocess
import tomllib

import torch
from torch.profiler import ProfilerActivity, profile

from bench_args import Parser, at_least, executable, existing_file, key_value  # bench/
from gpu_vs_torch import torch_step  # bench/, beside this file: the timed run's step

MODES = [base + suffix for suffix in ("", "+deterministic")
         for base in ("eager", "default", "reduce-overhead", "max-autotune",
                      "max-autotune-no-cudagraphs")]

GEMM = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "triton_tem", "mm_", "_mm", "matmul")
ATTENTION = ("flash", "fmha", "attention", "sdpa", "cudnn", "mha")


def category(name):
    low = name.lower()
    if any(k in low for k in ATTENTION):
        return "attention"
    if any(k in low for k in GEMM):
        return "GEMM"
    return "other"


def toml_value(text):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word, as divlab's --set takes it


def load_config(divlab, path, overrides):
    """The config's keys over divlab's own defaults (`divlab train --help-config`)."""
    help_text = subprocess.run([divlab, "train", "--help-config"], capture_output=True,
                               text=True, check=True)
    flat = {m.group(1): toml_value(m.group(2)) for m in re.finditer(
        r"^\s+(\S+) \(\w+, default ([^)]*)\)", help_text.stdout + help_text.stderr, re.M)}
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    for section, table in cfg.items():
        if isinstance(table, dict):
            for k, v in table.items():
                flat[f"{section}.{k}"] = v
        else:
            flat[section] = table
    for o in overrides:
        k, v = o.split("=", 1)
        flat[k] = toml_value(v)
    return flat


def main():
    ap = Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--divlab", required=True, type=executable,
                    help="the divlab binary (for its defaults)")
    ap.add_argument("--config", required=True, type=existing_file)
    ap.add_argument("--set", nargs="*", default=[], type=key_value,
                    help="KEY=VALUE overrides, as divlab's")
    ap.add_argument("--mode", default="default", choices=MODES,
                    help=" | ".join(MODES) + " (each with +deterministic too)")
    ap.add_argument("--steps", type=at_least(1), default=10)
    ap.add_argument("--warmup", type=at_least(0), default=8)
    ap.add_argument("--top", type=at_least(1), default=12)
    ap.add_argument("--gemm-shapes", action="store_true",
                    help="also each GEMM call's device time by operand shapes (aten::mm and "
                    "kin; host activity recorded too)")
    args = ap.parse_args()
    cfg = load_config(args.divlab, args.config, args.set)
    B, T = int(cfg["train.batch"]), int(cfg["model.seq_len"])
    bf16 = cfg["train.precision"] == "bf16"
    tokens, step = torch_step(cfg, args.mode)
    for _ in range(args.warmup):
        step(tokens())
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.gemm_shapes else [])
    with profile(activities=activities, record_shapes=args.gemm_shapes) as prof:
        for _ in range(args.steps):
            step(tokens())
        torch.cuda.synchronize()
    by_cat, by_name, kernels = collections.Counter(), collections.Counter(), 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.device_time_total <= 0:
            continue
        if "memcpy" in e.name.lower() or "memset" in e.name.lower():
            cat = "other"
        else:
            cat = category(e.name)
            kernels += 1
        by_cat[cat] += e.device_time_total
        by_name[e.name] += e.device_time_total
    n = args.steps
    total = sum(by_cat.values()) / 1000 / n
    flash = torch.backends.cuda.flash_sdp_enabled()
    cudnn = getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)()
    print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name()}, mode {args.mode}, "
          f"{B} x {T} tokens, {'bf16' if bf16 else 'fp32'}; SDPA backends enabled: flash {flash}, "
          f"cuDNN {cudnn}")
    print(f"kernels seen: {kernels / n:.0f} per step; device time {total:.2f} ms per step")
    for cat in ("GEMM", "attention", "other"):
        print(f"  {cat:10s} {by_cat[cat] / 1000 / n:8.2f} ms per step")
    print(f"top {args.top} kernels (ms per step):")
    for name, t in by_name.most_common(args.top):
        print(f"  {t / 1000 / n:8.3f}  [{category(name)}] {name[:110]}")
    if args.gemm_shapes:
        print("GEMM calls by operand shapes (device us per call, calls per step):")
        rows = [e for e in prof.key_averages(group_by_input_shape=True)
                if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")]
        for e in sorted(rows, key=lambda e: -e.device_time_total):
            print(f"  {e.device_time_total / e.count:9.1f} us  x{e.count / n:5.1f}  {e.key} "
                  f"{e.input_shapes}")


if __name__ == "__main__":
    main()
