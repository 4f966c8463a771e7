"""analysis/plots.py, checked from the figures' own artists: every legend entry has the colour of
what it labels, a kernel has one colour in every figure of a folder (reference black, controls
never in a candidate's colour), the control band and the seeds' spread are drawn where they
exist, onset lines only for a divergence, and every loss axis says nats. The folder is analysed
by divlab itself from synthetic traces, so the summary's format is the real one."""
import os
import sys
import unittest

import h5py
import numpy as np
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.container import ErrorbarContainer

from cli import ROOT, run, tmpdir
from test_experiments import STEPS, synthetic_grid

sys.path.insert(0, os.path.join(ROOT, "analysis"))
import plots  # noqa: E402

BUG, CONTROL = "bf16_accum", "fp32_reordered"


def artist_colour(artist):
    """The RGBA an artist is drawn in: a line's colour, a collection's first face colour, an
    errorbar's marker line's colour."""
    if isinstance(artist, ErrorbarContainer):
        return to_rgba(artist.lines[0].get_color())
    if hasattr(artist, "get_color") and not isinstance(artist, (PathCollection, PolyCollection)):
        return to_rgba(artist.get_color())
    faces = artist.get_facecolor()
    return tuple(np.asarray(faces).reshape(-1, 4)[0]) if len(faces) else None


def legend_entries(ax):
    """(label, handle colour) for every entry of the axes' legend."""
    legend = ax.get_legend()
    if legend is None:
        return []
    # matplotlib 3.7 renamed legendHandles (Debian 12 ships 3.6).
    handles = getattr(legend, "legend_handles", None) or legend.legendHandles
    return [(text.get_text(), artist_colour(handle))
            for text, handle in zip(legend.get_texts(), handles)]


def labelled_artists(ax):
    return [a for a in ax.lines + ax.collections + ax.containers
            if not str(a.get_label()).startswith("_")]


def same_rgb(a, b):
    return a is not None and b is not None and np.allclose(a[:3], b[:3])


class Plots(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rng = np.random.default_rng()
        cls.seed = int(rng.integers(1 << 31))
        rng = np.random.default_rng(cls.seed)
        cls.d = tmpdir()

        def gap(g, v, s):  # the bug diverges on the skewed data only
            if v != BUG or g != "markov:0.8,0.8":
                return 0
            return np.clip((np.arange(STEPS) - 200) / 100.0, 0, 1) * 0.08

        # One benign control per group: its own verdict has no other control to form a band.
        synthetic_grid(cls.d, ["markov:0.8,0.8", "markov:0,0.8"], [BUG, CONTROL], 3, gap, rng)
        r = run("analyze", cls.d, "--no-plots")
        assert r.returncode == 0, r.stderr
        cls.figures = plots.figures(cls.d)

    def setUp(self):
        self.msg = f"(synthetic traces from seed {self.seed})"

    def axes(self):
        for name, fig in self.figures.items():
            for ax in fig.axes:
                yield name, ax

    def test_every_plot_is_drawn(self):
        names = set(self.figures)
        self.assertTrue({"dose.png", "story.png"} <= names, names)
        self.assertEqual(sum(n.startswith("verdict-") for n in names), 4, names)

    def test_legend_colours_match_what_they_label(self):
        checked = 0
        for name, ax in self.axes():
            artists = labelled_artists(ax)
            for label, colour in legend_entries(ax):
                drawn = [artist_colour(a) for a in artists if a.get_label() == label]
                drawn = [c for c in drawn if c is not None]
                self.assertTrue(drawn, f"{name}: legend '{label}' labels nothing {self.msg}")
                for c in drawn:
                    self.assertTrue(same_rgb(c, colour),
                                    f"{name}: legend '{label}' is {colour}, drawn {c} {self.msg}")
                checked += 1
        self.assertGreater(checked, 10)

    def test_one_colour_per_kernel_in_every_figure(self):
        seen = {}  # kernel short name -> colours it was drawn in
        for name, ax in self.axes():
            for label, colour in legend_entries(ax):
                for kernel in ("reference", BUG, CONTROL):
                    if label.split(" ")[0] == kernel:
                        seen.setdefault(kernel, set()).add(tuple(np.round(colour[:3], 3)))
        self.assertEqual(set(seen), {"reference", BUG, CONTROL}, self.msg)
        for kernel, colours in seen.items():
            self.assertEqual(len(colours), 1, f"{kernel} drawn in {colours} {self.msg}")
        self.assertTrue(same_rgb(to_rgba(plots.REFERENCE_COLOR), (*seen["reference"].pop(), 1)))
        control = (*seen[CONTROL].pop(), 1)
        for c in plots.CANDIDATE_COLORS:
            self.assertFalse(same_rgb(to_rgba(c), control), f"control in a candidate's {c}")

    def bottom_panel(self, variant_short, group_word):
        for name, fig in self.figures.items():
            title = fig._suptitle.get_text() if fig._suptitle else ""
            if name.startswith("verdict-") and variant_short in title and group_word in title:
                return fig.axes[1], title
        self.fail(f"no verdict figure for {variant_short} in {group_word}")

    def test_bands_show_with_a_single_control(self):
        # The bug's gap: the seeds' spread and the control band (from the one control).
        ax, _ = self.bottom_panel(BUG, "markov:0.8,0.8")
        labels = [a.get_label() for a in ax.collections]
        self.assertTrue(any(lb.startswith("seeds' spread") for lb in labels), labels)
        self.assertIn("control band (3 s.e.)", labels)
        # The control's own row has no other control, so only the seeds' spread, and a note.
        ax, _ = self.bottom_panel(CONTROL, "markov:0,0.8")
        spread = [a for a in ax.collections if a.get_label().startswith("seeds' spread")]
        self.assertEqual(len(spread), 1)
        ys = spread[0].get_paths()[0].vertices[:, 1]
        self.assertGreater(ys.max() - ys.min(), 0, "the spread band has no height")
        self.assertTrue(any("no control band" in t.get_text() for t in ax.texts))

    def test_onset_only_where_diverged(self):
        with h5py.File(os.path.join(self.d, "summary.h5"), "r") as f:
            verdicts = {f"verdict-{k}.png": dict(f["verdicts"][k].attrs) for k in f["verdicts"]}
        for name, a in verdicts.items():
            onsets = [ln for ln in self.figures[name].axes[1].lines if ln.get_label() == "onset"]
            # A gap tested against zero (no other control) is a verdict without an onset.
            expected = int(a["verdict"] == "diverged" and a["onset_step"] >= 0)
            self.assertEqual(len(onsets), expected, f"{name}: {a['verdict']} {self.msg}")
            if expected:
                self.assertEqual(onsets[0].get_xdata()[0], a["onset_step"])
        bug = [a for a in verdicts.values()
               if a["variant"].endswith(BUG) and "markov:0.8,0.8" in a["group"]]
        self.assertEqual([a["verdict"] for a in bug], ["diverged"], self.msg)
        self.assertGreaterEqual(bug[0]["onset_step"], 0, self.msg)

    def test_loss_axes_say_nats_and_the_dose_axis_its_unit(self):
        for name, ax in self.axes():
            y = ax.get_ylabel()
            if "loss" in y:
                self.assertIn("nats", y, name)
        dose_ax = self.figures["dose.png"].axes[0]
        self.assertIn("additions to one embedding row", dose_ax.get_xlabel())

    def test_the_control_band_shows_at_a_single_dose(self):
        boxes = [c for c in self.figures["dose.png"].axes[0].collections
                 if isinstance(c, PolyCollection)]
        self.assertTrue(boxes, "no control band in the dose plot")
        for box in boxes:
            self.assertTrue(same_rgb(artist_colour(box), to_rgba(plots.BAND_COLOR)))


class StoryPanels(unittest.TestCase):
    def test_panels_are_analyzes_groups_titled_by_what_tells_them_apart(self):
        # Three sweep folders of one grid: two on one token stream, run at 4 and at 3 threads (a
        # sweep's --jobs decides train.threads), one on another stream. The story figure draws one
        # panel per group analyze judges (by stream; threads never split a group), and a title
        # names the stream, never the threads that differ inside its own group.
        rng = np.random.default_rng()
        seed = int(rng.integers(1 << 31))
        rng = np.random.default_rng(seed)
        root = tmpdir()
        folders = [os.path.join(root, n) for n in ("a", "b", "c")]
        streams = ["0ede028f6b3a" + "0" * 52, "0ede028f6b3a" + "0" * 52, "b6ecf968c0c7" + "1" * 52]
        for i, (d, stream) in enumerate(zip(folders, streams)):
            synthetic_grid(d, ["english"], [BUG, CONTROL], 3,
                           lambda g, v, s: 0.05 if v == BUG else 0, rng, 3 * i,
                           tokens=stream, threads=4 - i % 2)
        out = os.path.join(root, "pooled")
        r = run("analyze", *folders, "--out", out, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stderr)
        story = plots.figures(out, folders)["story.png"]
        panels = {ax.get_title(): sorted(label for label, _ in legend_entries(ax))
                  for ax in story.axes if ax.get_xlabel() == "step"}
        msg = f"(synthetic traces from seed {seed}) {panels}"
        self.assertEqual(sorted(t.split(",")[0] for t in panels),
                         ["tokens 0ede028f6b3a", "tokens b6ecf968c0c7"], msg)
        self.assertFalse(any("threads" in t for t in panels), msg)
        seeds = {t.split(",")[0]: labels for t, labels in panels.items()}
        self.assertIn(f"{BUG} (6 seeds)", seeds["tokens 0ede028f6b3a"], msg)
        self.assertIn(f"{BUG} (3 seeds)", seeds["tokens b6ecf968c0c7"], msg)

    def test_a_grid_of_reference_runs_is_drawn_without_a_dose_panel(self):
        # A sweep over seeds or hyperparameters alone swaps in no kernel: no verdict rows. analyze
        # says so and draws the loss curves; before, plots.py failed on a summary without
        # /verdicts and the report claimed "no candidate diverged".
        rng = np.random.default_rng()
        d = tmpdir()
        synthetic_grid(d, ["zipf:1.1", "markov:0.8,0.8"], [], 3, lambda g, v, s: 0, rng)
        r = run("analyze", d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(plots: ok)", r.stdout)
        with open(os.path.join(d, "report.md")) as f:
            self.assertIn("This grid swaps in no candidate kernel", f.read())
        with h5py.File(os.path.join(d, "summary.h5"), "r") as f:
            self.assertEqual(len(f["verdicts"]), 0)
        figs = plots.figures(d)
        self.assertEqual(set(figs), {"story.png"})
        panels = [ax for ax in figs["story.png"].axes if ax.get_xlabel() == "step"]
        self.assertEqual(len(panels), 2)
        self.assertFalse([ax for ax in figs["story.png"].axes if "dose" in ax.get_xlabel()])


if __name__ == "__main__":
    unittest.main()
