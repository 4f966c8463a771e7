"""llm.c (github.com/karpathy/llm.c) as a speed peer: build `train_gpt2cu` from a user's checkout
and time it at a divlab config's shape.

llm.c trains GPT-2 (LayerNorm, biases, tied head, AdamW) at the shapes its `d<depth>`
descriptors name; divlab's gpt2 model differs in detail (RMSNorm, no biases, SGD) but not in
its matmul shapes, which is what the comparison is about. A checkout is copied to a scratch
folder and built there with cuDNN attention, never modified in place. Two local changes make
the code of 2024 build with CUDA 13 and the cuDNN frontend headers of 2026, applied to the
copy: `cudaMemAdvise` takes a `cudaMemLocation` instead of a device id, and the frontend's
run-time compilation needs `-lnvrtc -lcuda` at link time.
"""
import os
import re
import shutil
import statistics
import subprocess

import numpy as np

# llm.c's GPT-2 depths and their widths and head counts (train_gpt2.cu, gpt2_set_hyperparameters)
DEPTHS = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
PADDED_VOCAB = 50304  # llm.c pads GPT-2's 50 257 tokens to a multiple of 128
MAX_T = 1024
TOKEN_MAGIC, TOKEN_VERSION = 20240520, 1  # its data loader's 256-int header


def descriptor(L, C, H, V, T, arch, tied):
    """llm.c's `-e` model descriptor for this shape, or why there is none."""
    if arch != "gpt2":
        return None, f"llm.c trains GPT-2 only (model.arch = {arch})"
    if not tied:
        # Same GEMMs either way, but an untied head is 38.6 M more parameters (at V 50 304) for
        # the optimizer, its norms and the weights' bf16 copy to move: not llm.c's model.
        return None, ("llm.c's GPT-2 ties its LM head to the token embedding "
                      "(model.tied_embeddings = true)")
    if DEPTHS.get(L) != (C, H) or V != PADDED_VOCAB or T > MAX_T:
        shapes = ", ".join(f"L {d} C {c} heads {h}" for d, (c, h) in DEPTHS.items())
        return None, (f"llm.c has no model of this shape (V {PADDED_VOCAB}, T <= {MAX_T} and one "
                      f"of: {shapes})")
    return f"d{L}", None


def _patch_for_cuda13(root):
    path = os.path.join(root, "llmc", "cuda_utils.cuh")
    with open(path) as f:
        text = f.read()
    old = "cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)"
    new = "cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})"
    if old in text:
        with open(path, "w") as f:
            f.write(text.replace(old, new))


def build(checkout, frontend, scratch, preexec, timeout):
    """Builds train_gpt2cu in a copy of `checkout` under `scratch`; returns its path."""
    root = os.path.join(scratch, "llm.c")
    shutil.copytree(checkout, root, ignore=shutil.ignore_patterns(".git", "build"))
    _patch_for_cuda13(root)
    # Its Makefile looks for the headers in ~/cudnn-frontend or ./cudnn-frontend only.
    os.makedirs(os.path.join(root, "cudnn-frontend"), exist_ok=True)
    os.symlink(frontend, os.path.join(root, "cudnn-frontend", "include"))
    cmd = ["make", "train_gpt2cu", "USE_CUDNN=1", f"CUDNN_FRONTEND_PATH={frontend}",
           "NO_MULTI_GPU=1", "NO_USE_MPI=1", "NVCC_LDLIBS=-lnvrtc -lcuda"]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec)
    if done.returncode != 0:
        raise RuntimeError(f"building llm.c failed: {done.stderr.strip()[-2000:]}")
    return os.path.join(root, "train_gpt2cu")


def write_tokens(path, count, vocab, seed=0):
    """Uniform random GPT-2 token ids in llm.c's token-file format."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (TOKEN_MAGIC, TOKEN_VERSION, count)
    tokens = np.random.default_rng(seed).integers(0, vocab, size=count, dtype=np.uint16)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \|")


def run(binary, model, B, T, steps, scratch, preexec, timeout):
    """Median ms/step of `steps` steps after the first quarter (at least 5), and its log tail."""
    tokens = os.path.join(scratch, "tokens.bin")
    write_tokens(tokens, B * T * 8 + 1, 50257)
    # -v and -s (validation, sampling intervals) must be non-zero: past the last step they never
    # run inside the timed steps. Everything else stays at llm.c's defaults.
    far = str(10 * steps)
    cmd = [binary, "-i", tokens, "-j", tokens, "-e", model, "-b", str(B), "-t", str(T),
           "-x", str(steps), "-v", far, "-s", far]
    done = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec)
    if done.returncode != 0:
        raise RuntimeError(f"llm.c exited {done.returncode}: {done.stdout.strip()[-1500:]}")
    ms = {}
    for line in done.stdout.splitlines():
        m = STEP_LINE.match(line)
        if m:
            ms[int(m.group(1))] = float(m.group(2))
    kept = [ms[s] for s in sorted(ms) if s > max(5, steps // 4)]
    if not kept:
        raise RuntimeError(f"no step times in llm.c's output: {done.stdout.strip()[-1500:]}")
    return statistics.median(kept) / 1e3
