"""PyTorch's GEMMs at the linear layers' shapes, beside build/cuda/bench/bench_gemm_tuning's
(divlab's cuBLASLt choices), on operands of the same kind, so that a per-GEMM ratio compares
algorithms and not inputs.

    python3 bench/torch_gemm.py [--tokens 16384 --d-model 768 --vocab 50304 --reps 20]

A GEMM's time on an H100 or H200 depends on its operands: the tensor cores draw less power
on values with few bits set or repeating (zeros, a constant), so the clocks stay higher. A
training step's LM-head gradient early in training is nearly constant (the softmax of small
logits is about 1/V everywhere), and timings from a profiled step (bench/torch_profile.py
--gemm-shapes) are of such operands; bench_gemm_tuning's are uniform in [-1, 1). This prints,
for each layer's forward, input gradient and weight gradient (bf16 operands, as divlab's bf16
mode: the weight gradient written in bf16, PyTorch's autocast), the mean us per call on uniform
operands and, for the LM head's two gradients, on a softmax-like gradient (1/V plus noise a
hundredth of it), which is what a profiled early step feeds them.
"""
import torch

from bench_args import Parser, at_least  # bench/, beside this file


def mean_us(call, reps=20, warmups=3):
    for _ in range(warmups):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        call()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


def uniform(*shape):
    return (torch.rand(*shape, device="cuda") * 2 - 1).to(torch.bfloat16)


def main():
    ap = Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=at_least(1), default=16384)
    ap.add_argument("--d-model", type=at_least(1), default=768)
    ap.add_argument("--vocab", type=at_least(1), default=50304)
    ap.add_argument("--reps", type=at_least(1), default=20)
    args = ap.parse_args()
    N, C, V = args.tokens, args.d_model, args.vocab
    print(f"PyTorch {torch.__version__} GEMMs on {torch.cuda.get_device_name()}: tokens {N}, C {C},"
          f" V {V}, {args.reps} reps, bf16 operands (us per call)")
    print(f"{'layer':10s} {'gemm':8s} {'uniform':>10s} {'softmax-like dy':>16s}")
    layers = [("qkv", C, 3 * C), ("attn proj", C, C), ("mlp up", C, 4 * C),
              ("mlp down", 4 * C, C), ("lm head", C, V)]
    for name, fan_in, fan_out in layers:
        x, w, dy = uniform(N, fan_in), uniform(fan_out, fan_in), uniform(N, fan_out)
        # Each GEMM of the output gradient g (the forward ignores it).
        gemms = {"forward": lambda g: x @ w.t(), "dx": lambda g: g @ w, "dW": lambda g: g.t() @ x}
        soft = None
        if name == "lm head":
            soft = (1.0 / V) * (1 + 0.01 * torch.randn(N, fan_out, device="cuda"))
            soft = soft.to(torch.bfloat16)
        for gemm, call in gemms.items():
            t = mean_us(lambda: call(dy), args.reps)
            extra = ""
            if soft is not None and gemm != "forward":
                extra = f"{mean_us(lambda: call(soft), args.reps):16.1f}"
            print(f"{name:10s} {gemm:8s} {t:10.1f} {extra}")
        x = w = dy = soft = None  # the layer's tensors freed before the next layer's
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
