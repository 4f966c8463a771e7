"""Datasets from the command line: divlab data, the tokenizer cache, text traces, bad corpora."""
import os
import re
import unittest

import h5py
import numpy as np

from cli import SMALL, assert_rejected, run, tmpdir
from fixtures import write_fixture


class DataCommand(unittest.TestCase):
    def setUp(self):
        self.dir = tmpdir()
        self.corpus = os.path.join(self.dir, "corpus.txt")
        write_fixture(self.corpus)
        self.env = {"DIVLAB_CACHE": os.path.join(self.dir, "cache")}

    def test_statistics_and_cache_reuse_in_the_log(self):
        args = ["data", "--dataset", "text:" + self.corpus, "--vocab", "300", "--batch", "8",
                "--seq", "32"]
        first = run(*args, env=self.env, check=True)
        self.assertIn("tokenizer: trained BPE model (vocab 300)", first.stderr)
        second = run(*args, env=self.env, check=True)
        self.assertIn("tokenizer: reusing cached BPE model", second.stderr)
        self.assertNotIn("trained", second.stderr)
        self.assertEqual(first.stdout, second.stdout)
        for needle in ("tokens (training split)", "top-1 share", "top-10 share",
                       "fitted Zipf exponent", "max contributions to one row per step (B*T=256)"):
            self.assertIn(needle, first.stdout)

    def test_data_parallel_ranks_cut_the_dose_per_kernel_call(self):
        # Each of four ranks sees a quarter of the batch: its hottest row gets about a quarter
        # of the additions (a little more: the largest of four shards).
        out = run("data", "--dataset", "markov:0.8,0.8", "--vocab", "64", "--batch", "512",
                  "--seq", "32", "--ranks", "4", check=True).stdout
        whole = float(re.search(r"per step \(B\*T=16384\)\s+([0-9.]+)", out)[1])
        shard = float(re.search(r"over 4 ranks \(B\*T=4096 each\)\s+([0-9.]+)", out)[1])
        self.assertGreater(shard, 0.24 * whole)
        self.assertLess(shard, 0.30 * whole)

    def test_zipf_statistics(self):
        out = run("data", "--dataset", "zipf:1.1", "--vocab", "1000", check=True).stdout
        self.assertIn("fitted Zipf exponent                         1.100", out)
        self.assertIn("entropy rate (nats/token: the loss floor)", out)

    def test_text_trace_is_self_contained(self):
        path = os.path.join(self.dir, "t.h5")
        run("train", "--set", *SMALL, "model.vocab=300", "data=text:" + self.corpus,
            "--out", path, env=self.env, check=True)
        with h5py.File(path, "r") as f:
            ds = f["dataset"]
            self.assertEqual(ds.attrs["kind"], "text")
            self.assertEqual(len(ds.attrs["corpus_sha256"]), 64)
            self.assertGreater(ds.attrs["zipf_exponent"], 0.3)
            model = ds["tokenizer_model"][:].tobytes()
            self.assertGreater(len(model), 1000)
            self.assertEqual(ds["token_counts"][:].sum(), 20 * 64)
            mrc = f["metrics/max_row_contributions"][:]
            np.testing.assert_allclose(f["metrics/top1_share"][:], mrc / 64)


class BadCorpus(unittest.TestCase):
    def check(self, spec, needle, setup=None, extra=()):
        # The tokenizer cache is inside the checked folder: a rejected corpus leaves nothing.
        cache = lambda d: {"DIVLAB_CACHE": os.path.join(d, "cache")}  # noqa: E731
        for command in (["train", "--set", *SMALL, "data=" + spec, *extra, "--out", "{d}/r.h5"],
                        ["data", "--dataset", spec, *[e.replace("model.vocab=", "--vocab=")
                                                      for e in extra]]):
            assert_rejected(self, command, needle, setup, env=cache)

    def write(self, name, data):
        def setup(d):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        return setup

    def test_missing_corpus(self):
        self.check("text:{d}/nothing.txt", "nothing.txt")

    def test_empty_corpus(self):
        self.check("text:{d}/empty.txt", "empty", self.write("empty.txt", b"\n  \n"))

    def test_binary_file(self):
        self.check("text:{d}/b.bin", "NUL byte", self.write("b.bin", b"abc\x00\x01\x02def"))

    def test_not_utf8(self):
        self.check("text:{d}/latin1.txt", "invalid UTF-8 at byte 3",
                   self.write("latin1.txt", "caf\u00e9 au lait\n".encode("latin-1")))

    def test_vocab_larger_than_corpus_supports(self):
        def setup(d):
            with open(os.path.join(d, "small.txt"), "w") as f:
                f.write("the cat sat on the mat\nthe dog sat on the log\n" * 20)
        # sentencepiece's own bound, said in the config's words.
        self.check("text:{d}/small.txt",
                   "model.vocab = 5000 is larger than this corpus supports (at most ", setup,
                   ("model.vocab=5000",))

    def test_a_corpus_of_lines_too_long_to_train_on(self):
        # One 2 MB line: the tokenizer trainer skips lines past 1 000 000 bytes, so it had
        # nothing to learn from and said only "Internal: ... [!sentences_.empty()]".
        self.check("text:{d}/one.txt", "every line is longer than the 1000000 bytes",
                   self.write("one.txt", b"word " * 400000 + b"\n"), ("model.vocab=64",))

    def test_corpus_too_small_for_seq_len(self):
        self.check("text:{d}/tiny.txt", "model.seq_len", self.write("tiny.txt", b"a b a b\n"),
                   ("model.vocab=5",))  # a, b, the space marker, unk and end-of-line

    def test_zipf_exponent_negative(self):
        self.check("zipf:-1", "must be > 0")

    def test_unknown_kind(self):
        self.check("imagenet", "unknown dataset kind")

    def test_brown_missing(self):
        r = run("data", "--dataset", "brown", env={"DIVLAB_DATA": tmpdir()})
        self.assertEqual(r.returncode, 2)
        self.assertIn("scripts/setup.sh", r.stderr)


if __name__ == "__main__":
    unittest.main()
