"""`divlab sample`: text a trained run's model writes, from the trace's own weights and
tokenizer. The punchline of the mask bug: a model trained with a leaky causal mask reaches a
training loss far below what the data allows, and writes something else entirely once inference
uses the correct mask."""
import os
import subprocess
import unittest

import h5py

from cli import BIN, run, tmpdir
from fixtures import write_fixture

MODEL = ["model.vocab=128", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
         "model.seq_len=32", "train.batch=8", "train.steps=60", "train.optimizer=adamw",
         "train.lr=3e-3"]


class Sample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tmpdir()
        corpus = os.path.join(cls.d, "corpus.txt")
        write_fixture(corpus)
        cls.data = f"data=text:{corpus}"
        env = {"DIVLAB_CACHE": os.path.join(cls.d, "cache")}
        cls.env = env
        cls.clean, cls.leaky = os.path.join(cls.d, "clean.h5"), os.path.join(cls.d, "leaky.h5")
        run("train", "--quiet", "--set", cls.data, *MODEL, "trace.final_weights=true",
            "--out", cls.clean, check=True, env=env)
        run("train", "--quiet", "--set", cls.data, *MODEL, "trace.final_weights=true",
            "kernels.attention_forward=mask_off_by_one", "--out", cls.leaky, check=True, env=env)

    def sample(self, trace, *extra):
        r = run("sample", trace, "--prompt", "ka lo", "--tokens", "30", *extra, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        header, text = r.stdout.split("\n", 1)
        self.assertIn("final weights (after 60 steps)", header)
        return text.strip()

    def test_same_seed_same_text_and_the_prompt_continued(self):
        a, b = self.sample(self.clean, "--seed", "7"), self.sample(self.clean, "--seed", "7")
        self.assertEqual(a, b)
        self.assertTrue(a.startswith("ka lo"), a)
        self.assertGreater(len(a), len("ka lo") + 10)
        self.assertNotEqual(a, self.sample(self.clean, "--seed", "8"))

    def test_the_leaky_model_writes_other_text_under_the_correct_mask(self):
        # Seeing the token it predicts, the leaky model's training loss falls below the clean one's.
        with h5py.File(self.clean, "r") as c, h5py.File(self.leaky, "r") as lk:
            self.assertLess(lk["metrics/loss"][-1], c["metrics/loss"][-1])
        leaky_mask = self.sample(self.leaky, "--seed", "3", "--temperature", "0",
                                 "--kernels", "attention_forward=mask_off_by_one")
        correct_mask = self.sample(self.leaky, "--seed", "3", "--temperature", "0")
        self.assertNotEqual(leaky_mask, correct_mask)

    def test_checkpoint_weights_when_no_final_ones(self):
        bare = os.path.join(self.d, "bare.h5")
        run("train", "--quiet", "--set", "data=zipf:1.2", "model.vocab=64", "model.d_model=16",
            "model.n_heads=2", "model.seq_len=8", "train.batch=2", "train.steps=6",
            "checkpoint.every=4", "--out", bare, check=True)
        r = run("sample", bare, "--prompt", "3 17 5", "--tokens", "5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("the newest checkpoint (after 4 steps", r.stdout)
        ids = r.stdout.splitlines()[1].split()
        self.assertEqual(ids[:3], ["3", "17", "5"])
        self.assertEqual(len(ids), 3 + 5)
        r = run("sample", bare, "--prompt", "3 x", "--tokens", "5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--prompt: 'x' is not a token id", r.stderr)
        # A prompt of no ids, empty or spaces: the model starts from id 0, which is not written
        # (after spaces it was, as if the user had asked for it).
        texts = [run("sample", bare, "--prompt", p, "--tokens", "5").stdout.splitlines()[1]
                 for p in ("", "   ")]
        self.assertEqual(texts[0], texts[1])
        self.assertEqual(len(texts[0].split()), 5)

    def test_a_prompt_that_is_not_utf8_is_refused(self):
        # Bytes no UTF-8 text holds: the tokenizer read them as unknown pieces and wrote on.
        for prompt in (b"ka \xff\xfe lo", b"\xc3"):
            r = subprocess.run([BIN, "sample", self.clean, "--prompt", prompt, "--tokens", "3"],
                               capture_output=True, env=dict(os.environ, **self.env))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(r.stdout, b"")
            self.assertIn(b"--prompt: not UTF-8 text (byte ", r.stderr)
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)

    def test_checkpoint_asked_for_where_the_last_step_wrote_none(self):
        # A run writes no checkpoint at its last step: --weights checkpoint on a run of 4 steps
        # checkpointing every 4 is refused, and points at the final weights where they are kept.
        for final in ("false", "true"):
            trace = os.path.join(self.d, f"last-{final}.h5")
            run("train", "--quiet", "--set", "model.vocab=64", "model.d_model=16",
                "model.n_heads=2", "model.seq_len=8", "train.batch=2", "train.steps=4",
                "checkpoint.every=4", f"trace.final_weights={final}", "--out", trace, check=True)
            for command in (["sample", trace], ["export", trace, "--out",
                                                os.path.join(self.d, "w.safetensors")]):
                r = run(*command, "--weights", "checkpoint")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("holds no checkpoint", r.stderr)
                self.assertEqual(final == "true", "--weights final" in r.stderr, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.d, "w.safetensors")))
        r = run("sample", trace, "--weights", "final", "--tokens", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("final weights (after 4 steps)", r.stdout)


if __name__ == "__main__":
    unittest.main()
