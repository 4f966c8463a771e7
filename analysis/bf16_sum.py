"""How wrong is a sum accumulated in bf16, against the noise the minibatch already carries?

An embedding row that receives d contributions per step (the dose) is summed the way the
reported kernel sums it: each term rounded to bf16, then added to a bf16 accumulator with round
to nearest even (hardware bf16 atomicAdd; the order does not change the statistics). Terms are
N(mu, sigma) per element, mu / sigma = the signal-to-noise of one contribution. Printed per dose:

  err / noise   RMS error of the bf16 sum against the exact sum, over sqrt(d) * sigma: the
                sampling noise of the minibatch's own sum. Below ~0.3 the bug adds little to
                what SGD already sees; near 1 and above it dominates the row's gradient.
  kept          bf16 sum / exact sum, projected on the mean direction (1 = unbiased; < 1: the
                accumulator stalls and drops terms, a systematic shrink of the row's gradient)

    python3 analysis/bf16_sum.py [--doses 600,2500,10000,40000,160000,640000] [--snr 0,0.01,0.1]
"""
import argparse
import math
import sys

import numpy as np


def to_bf16(x):
    """float32 -> nearest bf16 (ties to even), returned as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def bf16_sum(terms):
    """terms: [d, columns] float32; sequential bf16 accumulation down the first axis."""
    acc = np.zeros(terms.shape[1], dtype=np.float32)
    for row in to_bf16(terms):
        acc = to_bf16(acc + row)
    return acc


class Parser(argparse.ArgumentParser):
    """A bad command line: one line naming the option and value, exit 2 (as divlab's)."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message}\n")
        sys.exit(2)


def number_list(convert, least, what):
    """A comma-separated list of numbers, each at least `least`, as an argparse type."""
    def parse(text):
        try:
            values = [convert(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or not all(math.isfinite(v) and v >= least for v in values):
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return values
    return parse


def one_number(convert, least, what):
    """One number of at least `least`, as an argparse type."""
    many = number_list(convert, least, what)

    def parse(text):
        values = many(text)
        if len(values) != 1:
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return values[0]
    return parse


def main():
    ap = Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--doses", default="600,2500,10000,40000,160000,640000",
                    type=number_list(int, 1, "positive integers, comma-separated"))
    ap.add_argument("--snr", default="0,0.01,0.1", help="mu / sigma of one contribution",
                    type=number_list(float, 0, "non-negative numbers, comma-separated"))
    ap.add_argument("--columns", default=64, help="independent elements per dose",
                    type=one_number(int, 1, "a positive integer"))
    ap.add_argument("--seed", default=0, type=one_number(int, 0, "a non-negative integer"))
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    sigma = 1e-6  # the scale of a mean-loss gradient term; bf16 has fp32's exponent range
    print(f"{'dose':>8} {'mu/sigma':>9} {'err / noise':>12} {'kept':>7}")
    for d in a.doses:
        for snr in a.snr:
            terms = rng.normal(snr * sigma, sigma, size=(d, a.columns)).astype(np.float32)
            exact = terms.astype(np.float64).sum(axis=0)
            low = bf16_sum(terms).astype(np.float64)
            err = np.sqrt(np.mean((low - exact) ** 2)) / (np.sqrt(d) * sigma)
            kept = np.sum(low * exact) / np.sum(exact * exact) if snr > 0 else float("nan")
            print(f"{d:8d} {snr:9.3g} {err:12.3f} {kept:7.3f}")


if __name__ == "__main__":
    main()
