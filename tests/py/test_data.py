"""Datasets from the command line: divlab data, the tokenizer cache, text traces, bad corpora."""
import os
import re
import unittest

import h5py
import numpy as np

from cli import SMALL, run, tmpdir
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
        # A cache that cannot be written costs the next run the training, and says so.
        not_a_folder = os.path.join(self.dir, "a file")
        open(not_a_folder, "w").close()
        third = run(*args, env={"DIVLAB_CACHE": not_a_folder}, check=True)
        self.assertIn(f"not cached: '{not_a_folder}' cannot be written", third.stderr)
        self.assertEqual(first.stdout, third.stdout)

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


if __name__ == "__main__":
    unittest.main()
