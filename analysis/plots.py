"""PNG plots for `divlab analyze DIR [DIR...]`: the story figure (per row of the grid the loss curves of
reference, candidates and controls, and the dose-response); per verdict the loss curves and the
gap against the control band; the gap against the dose, per seed; shadow-mode error by
token-frequency bucket. `plots.py OUT [SWEEP...]` reads OUT/summary.h5 and the SWEEPs' cells/*.h5
(default: OUT's own, a sweep folder); writes the PNGs into OUT. Debian's python3-matplotlib."""
import glob
import hashlib
import os
import sys
import textwrap
import tomllib

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

BUCKETS = ["1", "2-3", "4-15", "16-63", "64-255", "256-1023", "1024+"]


# One colour per kernel role, the same in every plot: the reference black, candidates warm,
# benign controls cool (a control is never drawn in a bug's red).
REFERENCE_COLOR = "black"
CANDIDATE_COLORS = ["tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
CONTROL_COLORS = ["tab:blue", "tab:cyan", "tab:green", "tab:gray"]
BAND_COLOR = "lightgray"  # the control band: the noise floor, no kernel's colour


class Palette:
    """variant name -> colour, fixed for one analysis folder (candidates and controls in
    sorted order, so every figure of the folder agrees)."""

    def __init__(self, variants):
        self.colors = {"reference": REFERENCE_COLOR}
        cand = sorted(v for v, control in variants.items() if not control and v != "reference")
        ctrl = sorted(v for v, control in variants.items() if control)
        for i, v in enumerate(cand):
            self.colors[v] = CANDIDATE_COLORS[i % len(CANDIDATE_COLORS)]
        for i, v in enumerate(ctrl):
            self.colors[v] = CONTROL_COLORS[i % len(CONTROL_COLORS)]

    def __call__(self, variant):
        """A variant the summary does not name (a shadow-only one) gets the next candidate
        colour once, and keeps it."""
        if variant not in self.colors:
            taken = sum(c in CANDIDATE_COLORS for c in self.colors.values())
            self.colors[variant] = CANDIDATE_COLORS[taken % len(CANDIDATE_COLORS)]
        return self.colors[variant]


def short(variant):
    """embed_rmsnorm_backward=bf16_accum -> bf16_accum (several swaps stay joined)."""
    return "+".join(part.split("=", 1)[-1] for part in variant.split("+"))


def wrap(title, width=80):
    return "\n".join(textwrap.wrap(title, width, break_long_words=False))


def verdict_figure(g, palette):
    """One verdict: reference and variant loss above; below their gap with the seeds' spread
    (always) and the control band (when the group has benign controls besides this variant)."""
    a = g.attrs
    steps = np.arange(g["gap_curve"].shape[0])
    color = palette(a["variant"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(steps, g["ref_curve"][:], label="reference", color=REFERENCE_COLOR)
    top.plot(steps, g["variant_curve"][:], label=short(a["variant"]), color=color)
    top.set_ylabel("training loss (nats)\nsmoothed, mean over seeds")
    top.legend(fontsize=8)
    gap, band = g["gap_curve"][:], g["band_curve"][:]
    if "spread_curve" in g:
        spread = g["spread_curve"][:]
        bottom.fill_between(steps, gap - spread, gap + spread, color=color, alpha=0.2,
                            linewidth=0, label=f"seeds' spread (+-1 s.d., {a['seeds']} seeds)")
    if np.any(band > 0):
        bottom.fill_between(steps, -band, band, color=BAND_COLOR, alpha=0.3, linewidth=0,
                            label="control band (3 s.e.)")
    else:
        bottom.text(0.01, 0.95, "no other benign control in this group: no control band",
                    transform=bottom.transAxes, fontsize=7, va="top")
    bottom.plot(steps, gap, color=color, label="variant - reference")
    if a["verdict"] == "diverged" and a["onset_step"] >= 0:
        bottom.axvline(a["onset_step"], color=color, linestyle=":", label="onset")
    bottom.axhline(0, color="black", linewidth=0.5)
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss gap (nats)")
    bottom.legend(fontsize=8)
    title = f"{a['group']}: {short(a['variant'])} -> {a['verdict']} (p = {a['p_welch']:.2g})"
    fig.suptitle(wrap(title, 90), fontsize=9)
    fig.tight_layout()
    return fig


def verdict_figures(summary, palette):
    """verdict key -> figure, for every verdict with curves (a NaN row has none)."""
    return {key: verdict_figure(summary["verdicts"][key], palette) for key in summary["verdicts"]
            if summary["verdicts"][key]["gap_curve"].shape[0] > 0}


def dose_axes(ax, summary, palette):
    """Gap against dose: every paired seed as a dot, each group's mean gap with its 95 %
    interval, points of one dose series joined, the control band shaded."""
    drawn = set()
    series = {}
    for key in summary["verdicts"]:
        g = summary["verdicts"][key]
        a = g.attrs
        if a["seeds"] < 1:
            continue
        color = palette(a["variant"])
        label = short(a["variant"]) + (" (control)" if a["control"] else "")
        ax.scatter(g["seed_doses"][:], g["seed_gaps"][:], s=10, alpha=0.45, color=color,
                   linewidths=0)
        ax.errorbar([a["dose"]], [a["gap"]],
                    yerr=[[a["gap"] - a["gap_ci_low"]], [a["gap_ci_high"] - a["gap"]]],
                    fmt="o", color=color, capsize=3, markersize=5,
                    label=None if label in drawn else label)
        drawn.add(label)
        series.setdefault((a["series"], a["variant"]), []).append(
            (a["dose"], a["gap"], a["control_band"], a["tokens_per_step"]))
    for (name, variant), points in series.items():
        points.sort()
        d = [p[0] for p in points]
        band = np.array([p[2] for p in points])
        if len({p[3] for p in points}) < 2:
            # One dose: the band as a box around zero at that dose, so it shows without a line.
            for dose, b in zip(d, band):
                if b > 0:
                    ax.fill_between([dose / 1.2, dose * 1.2], -b, b, color=BAND_COLOR,
                                    alpha=0.4, linewidth=0)
            continue
        ax.plot(d, [p[1] for p in points], color=palette(variant), linewidth=1)
        if np.any(band > 0):
            ax.fill_between(d, -band, band, color=BAND_COLOR, alpha=0.4, linewidth=0)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("dose: most additions to one embedding row per step")
    ax.set_ylabel("final loss gap, variant - reference (nats)")
    ax.legend(fontsize=7)


def has_gaps(summary):
    """Whether any row has a paired seed to draw (a grid of reference runs has none)."""
    return any(summary["verdicts"][k].attrs["seeds"] >= 1 for k in summary["verdicts"])


def dose_figure(summary, palette):
    if not has_gaps(summary):
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    dose_axes(ax, summary, palette)
    ax.set_title("gap against dose: dots are seeds, bars the 95 % interval of the mean;\n"
                 "grey: control band", fontsize=9)
    fig.tight_layout()
    return fig


def flatten(table, prefix=""):
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def plugins_build(identity):
    """The libraries' identity from a trace's /@plugins, as analysis/analyze.cpp computes it."""
    text = identity.decode() if isinstance(identity, bytes) else str(identity)
    digests = sorted(line.split()[1] for line in text.splitlines() if len(line.split()) >= 3)
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:12]


def cell_paths(sweeps):
    """Every cell trace of the sweep folders, folder by folder."""
    return [p for d in sweeps for p in sorted(glob.glob(os.path.join(d, "cells", "*.h5")))]


def load_cells(sweeps):
    """Completed cells: (cell number, config dict, variant, seed, loss array)."""
    cells = []
    for path in cell_paths(sweeps):
        try:
            with h5py.File(path, "r", swmr=True) as f:
                if f.attrs.get("status") != "completed":
                    continue
                cfg = flatten(tomllib.loads(f.attrs["config_toml"]))
                # The token stream splits groups as analyze does (analysis/analyze.cpp).
                stream = f["dataset"].attrs.get("tokens_sha256") if "dataset" in f else None
                if stream is not None:
                    cfg["data.tokens"] = str(stream.decode() if isinstance(stream, bytes)
                                             else stream)[:12]
                # Another build of the plug-ins splits groups too (analysis/analyze.cpp).
                if "plugins" in f.attrs:
                    cfg["plugins.build"] = plugins_build(f.attrs["plugins"])
                loss = f["metrics/loss"][:]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            continue
        kernels = sorted(f"{k[8:]}={v}" for k, v in cfg.items()
                         if k.startswith("kernels.") and v != "reference")
        variant = "+".join(kernels) or "reference"
        number = int(os.path.basename(path).split(".")[0]) if path[-8:-3].isdigit() else 0
        cells.append((number, cfg, variant, cfg.get("train.seed", 0), loss))
    return cells


def grouped_by(key):
    """Whether a config key defines a cell's group: the rule of analysis/verdicts.cpp."""
    return (not key.startswith(("kernels.", "shadow.", "trace.", "debug."))
            and key not in ("train.seed", "train.threads", "plugins"))


def group_key(cfg, drop_dose=False):
    dose = ("train.batch", "model.seq_len") if drop_dose else ()
    return tuple(sorted((k, str(v)) for k, v in cfg.items() if grouped_by(k) and k not in dose))


def title_of(cfg, differing):
    words = [f"{k.split('.')[-1]} {cfg[k]}" for k in differing if k in cfg]
    tokens = cfg.get("train.batch", 0) * cfg.get("model.seq_len", 0)
    if tokens:
        words.append(f"{tokens:,} tokens/step")
    return ", ".join(words)


def story_figure(sweeps, summary, palette, max_panels=5):
    """The whole story on one page: per row of the grid (each dose series at its highest dose),
    the loss of reference, candidates and controls (seed mean with a +-1 standard deviation
    band), and the dose-response."""
    cells = load_cells(sweeps)
    if not cells:
        return None
    groups = {}
    for number, cfg, variant, seed, loss in cells:
        g = groups.setdefault(group_key(cfg), {"first": number, "cfg": cfg, "runs": {}})
        g["first"] = min(g["first"], number)
        g["runs"].setdefault(variant, []).append(loss)
    # One panel per dose series: its group with the most tokens per step.
    best = {}
    for key, g in groups.items():
        series = group_key(g["cfg"], drop_dose=True)
        tokens = g["cfg"].get("train.batch", 0) * g["cfg"].get("model.seq_len", 0)
        if series not in best or tokens > best[series][0]:
            best[series] = (tokens, g)
    panels = sorted((g for _, g in best.values()), key=lambda g: g["first"])[:max_panels]
    all_keys = set().union(*(g["cfg"].keys() for g in panels))
    # A title names what tells its panel from the others; keys that do not define a group
    # (threads, seeds) may differ inside one, so they would mislabel it.
    differing = sorted(k for k in all_keys
                       if len({str(g["cfg"].get(k)) for g in panels}) > 1
                       and grouped_by(k) and k not in ("train.batch", "model.seq_len"))
    n = len(panels) + (1 if has_gaps(summary) else 0)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    for ax, g in zip(axes.flat, panels):
        # The reference last, on top: a control identical to it would otherwise hide it.
        for variant in sorted(g["runs"], key=lambda v: (v == "reference", v)):
            runs = g["runs"][variant]
            steps = min(len(r) for r in runs)
            if steps == 0:
                continue
            window = max(1, steps // 20)
            curves = np.array([np.convolve(r[:steps], np.ones(window) / window, mode="valid")
                               for r in runs])
            x = np.arange(curves.shape[1]) + window - 1
            mean, sd = curves.mean(axis=0), curves.std(axis=0)
            color = palette(variant)
            ax.plot(x, mean, color=color, linewidth=1.0 if variant == "reference" else 1.5,
                    zorder=3 if variant == "reference" else 2,
                    label=f"{short(variant)} ({len(runs)} seeds)")
            ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=0.15, linewidth=0)
        ax.set_title(wrap(title_of(g["cfg"], differing), 60), fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats)")
        ax.legend(fontsize=7)
    if n > len(panels):
        dose_ax = axes.flat[len(panels)]
        dose_axes(dose_ax, summary, palette)
        dose_ax.set_title("gap against dose (dots: seeds; bars: 95 % CI)", fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("reference, candidates and controls: loss (seed mean, band +-1 s.d.)"
                 + (" and the dose-response" if n > len(panels) else ""), fontsize=10)
    fig.tight_layout()
    return fig


def shadow_figure(sweeps, palette):
    errors = {}  # (op/variant) -> per-bucket errors pooled over cells
    references = set()  # what the cells' metrics were measured against (the trace says)
    for path in cell_paths(sweeps):
        with h5py.File(path, "r", swmr=True) as f:
            if "shadow" not in f:
                continue
            reference = f["shadow"].attrs.get("reference", "fp64")
            if isinstance(reference, bytes):
                reference = reference.decode()
            references.add(reference.split(":")[0])
            for op in f["shadow"]:
                for variant in f["shadow"][op]:
                    b = f["shadow"][op][variant]["bucket_rel_l2"]
                    row = errors.setdefault(f"{op}={variant}", {k: [] for k in BUCKETS})
                    for k in BUCKETS:
                        row[k].extend(v for v in b[k][:] if np.isfinite(v))
    if not errors:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(BUCKETS))
    for name, row in errors.items():
        ax.plot(x, [np.mean(row[k]) if row[k] else np.nan for k in BUCKETS], marker="o",
                color=palette(name), label=name)
    ax.set_xticks(x, BUCKETS)
    ax.set_yscale("log")
    ax.set_xlabel("occurrences of the row's token in the step's batch")
    ax.set_ylabel("relative L2 error vs " + " / ".join(sorted(references)))
    ax.set_title("shadow mode: error by token-frequency bucket", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def figures(out, sweeps=None):
    """file name -> figure, every plot of the analysis folder `out` (its summary.h5) and the cells
    of `sweeps` (default: `out` itself, a sweep folder); one palette for all."""
    sweeps = sweeps or [out]
    with h5py.File(os.path.join(out, "summary.h5"), "r") as summary:
        variants = {summary["verdicts"][k].attrs["variant"]:
                    bool(summary["verdicts"][k].attrs["control"]) for k in summary["verdicts"]}
        palette = Palette(variants)
        figs = {f"verdict-{key}.png": fig
                for key, fig in verdict_figures(summary, palette).items()}
        figs["dose.png"] = dose_figure(summary, palette)
        figs["story.png"] = story_figure(sweeps, summary, palette)
    figs["shadow.png"] = shadow_figure(sweeps, palette)
    return {name: fig for name, fig in figs.items() if fig is not None}


def main(out, sweeps):
    for name, fig in figures(out, sweeps).items():
        fig.savefig(os.path.join(out, name), dpi=90)
        plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
