"""PNG plots for `divlab analyze DIR`: per verdict the loss curves and the gap against the control
band; gap against dose (max row contributions) across groups; shadow-mode error by
token-frequency bucket. Reads DIR/summary.h5 and DIR/cells/*.h5. Debian's python3-matplotlib."""
import glob
import os
import sys
import textwrap

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

BUCKETS = ["1", "2-3", "4-15", "16-63", "64-255", "256-1023", "1024+"]


def verdict_plots(out, summary):
    for key in summary["verdicts"]:
        g = summary["verdicts"][key]
        a = g.attrs
        if g["gap_curve"].shape[0] == 0:
            continue
        steps = np.arange(g["gap_curve"].shape[0])
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        top.plot(steps, g["ref_curve"][:], label="reference", color="black")
        top.plot(steps, g["variant_curve"][:], label=a["variant"], color="tab:red")
        top.set_ylabel("training loss (smoothed, mean over seeds)")
        top.legend(fontsize=8)
        band = g["band_curve"][:]
        bottom.fill_between(steps, -band, band, color="tab:gray", alpha=0.3, label="control band")
        bottom.plot(steps, g["gap_curve"][:], color="tab:red", label="variant - reference")
        if a["onset_step"] >= 0:
            bottom.axvline(a["onset_step"], color="tab:red", linestyle=":", label="onset")
        bottom.axhline(0, color="black", linewidth=0.5)
        bottom.set_xlabel("step")
        bottom.set_ylabel("loss gap")
        bottom.legend(fontsize=8)
        # Group labels carry every differing key: wrap them to the figure's width.
        title = f"{a['group']}: {a['variant']} -> {a['verdict']} (p = {a['p_welch']:.2g})"
        fig.suptitle("\n".join(textwrap.wrap(title, 100)), fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"verdict-{key}.png"), dpi=90)
        plt.close(fig)


def dose_plot(out, summary):
    fig, ax = plt.subplots(figsize=(6, 4))
    seen = set()
    for key in summary["verdicts"]:
        a = summary["verdicts"][key].attrs
        label = a["variant"] + (" (control)" if a["control"] else "")
        marker = "o" if "sgd" in a["group"] else "s" if "adamw" in a["group"] else "^"
        ax.scatter(a["max_row_contributions"], a["gap"], marker=marker,
                   label=label if label not in seen else None,
                   color="tab:gray" if a["control"] else None)
        seen.add(label)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xscale("symlog")
    ax.set_xlabel("max contributions to one embedding row per step (dose)")
    ax.set_ylabel("final loss gap (variant - reference)")
    ax.set_title("gap against dose (o: sgd, s: adamw)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "dose.png"), dpi=90)
    plt.close(fig)


def shadow_plot(out):
    errors = {}  # (op/variant) -> per-bucket errors pooled over cells
    for path in sorted(glob.glob(os.path.join(out, "cells", "*.h5"))):
        with h5py.File(path, "r", swmr=True) as f:
            if "shadow" not in f:
                continue
            for op in f["shadow"]:
                for variant in f["shadow"][op]:
                    b = f["shadow"][op][variant]["bucket_rel_l2"]
                    row = errors.setdefault(f"{op}={variant}", {k: [] for k in BUCKETS})
                    for k in BUCKETS:
                        row[k].extend(v for v in b[k][:] if np.isfinite(v))
    if not errors:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(BUCKETS))
    for name, row in errors.items():
        ax.plot(x, [np.mean(row[k]) if row[k] else np.nan for k in BUCKETS], marker="o", label=name)
    ax.set_xticks(x, BUCKETS)
    ax.set_yscale("log")
    ax.set_xlabel("occurrences of the row's token in the step's batch")
    ax.set_ylabel("relative L2 error vs fp64")
    ax.set_title("shadow mode: error by token-frequency bucket", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "shadow.png"), dpi=90)
    plt.close(fig)


def main(out):
    with h5py.File(os.path.join(out, "summary.h5"), "r") as summary:
        verdict_plots(out, summary)
        dose_plot(out, summary)
    shadow_plot(out)


if __name__ == "__main__":
    main(sys.argv[1])
