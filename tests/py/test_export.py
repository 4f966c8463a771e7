"""Getting data out for an independent twin: weights kept in the trace (trace.initial_weights,
trace.final_weights), `divlab export` to safetensors, `divlab data --dump-batch`. The proof that
they are enough: PyTorch, given only the exported initial weights and the dumped batch,
computes the trace's first loss."""
import importlib.util
import json
import os
import struct
import tomllib
import unittest

import h5py
import numpy as np

from cli import run, tmpdir

SETTINGS = ["model.vocab=64", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
            "model.seq_len=16", "train.batch=4", "data=zipf:1.2"]


def read_safetensors(path):
    """The format by its specification: u64 header length, JSON header, raw bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    body = raw[8 + n:]
    tensors = {}
    for name, t in header.items():
        dtype = {"F32": "<f4", "F64": "<f8"}[t["dtype"]]
        a, b = t["data_offsets"]
        tensors[name] = np.frombuffer(body[a:b], dtype=dtype).reshape(t["shape"])
    return meta, list(header), tensors


class Export(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tmpdir()
        cls.seed = int.from_bytes(os.urandom(2), "little")
        cls.trace = os.path.join(cls.d, "run.h5")
        run("train", "--quiet", "--set", *SETTINGS, f"train.seed={cls.seed}", "train.steps=5",
            "checkpoint.every=2", "trace.initial_weights=true", "trace.final_weights=true",
            "--out", cls.trace, check=True)

    def test_trace_keeps_named_shaped_weights_in_parameter_order(self):
        with h5py.File(self.trace, "r", swmr=True) as f:
            self.assertEqual(f["weights/initial/wte.weight"].shape, (64, 32))
            self.assertEqual(f["weights/final/blocks.1.attn.qkv.weight"].shape, (96, 32))
            self.assertEqual(f["weights/final_step"][0], 5)
            # RMSNorm gains start at one and moved; the initial weights are not the final ones.
            self.assertTrue(np.all(f["weights/initial/ln_f.weight"][:] == 1.0))
            self.assertFalse(np.array_equal(f["weights/initial/wte.weight"][:],
                                            f["weights/final/wte.weight"][:]))
            initial = {k: f["weights/initial"][k][:] for k in f["weights/initial"]}
            final = {k: f["weights/final"][k][:] for k in f["weights/final"]}
        meta, order, tensors = read_safetensors(self.export("final", "f64"))
        self.assertEqual(meta["step"], "5")
        self.assertEqual(order[:3], ["wte.weight", "wpe.weight", "blocks.0.ln1.weight"])
        self.assertEqual(order[-2:], ["ln_f.weight", "lm_head.weight"])
        self.assertEqual(set(order), set(final))
        for name in order:
            np.testing.assert_array_equal(tensors[name], final[name], err_msg=name)
        _, _, f32 = read_safetensors(self.export("initial", "f32"))
        for name in order:
            np.testing.assert_array_equal(f32[name], initial[name].astype(np.float32))

    def test_checkpoint_weights_export_with_their_step(self):
        meta, _, _ = read_safetensors(self.export("checkpoint", "f32"))
        self.assertEqual(meta["weights"], "checkpoint")
        self.assertEqual(meta["step"], "4")  # checkpoints before steps 2 and 4; none at the end

    def test_a_trace_without_kept_weights_says_how_to_keep_them(self):
        bare = os.path.join(self.d, "bare.h5")
        run("train", "--quiet", "--set", *SETTINGS, "train.steps=2", "--out", bare, check=True)
        r = run("export", bare, "--out", os.path.join(self.d, "w.safetensors"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("--set trace.final_weights=true", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.d, "w.safetensors")))

    def test_resumed_run_keeps_the_initial_weights(self):
        d = tmpdir()
        full, cut = os.path.join(d, "full.h5"), os.path.join(d, "cut.h5")
        common = [*SETTINGS, "checkpoint.every=2", "trace.initial_weights=true",
                  "trace.final_weights=true"]
        run("train", "--quiet", "--set", *common, "train.steps=6", "--out", full, check=True)
        run("train", "--quiet", "--set", *common, "train.steps=3", "--out", cut, check=True)
        run("train", "--quiet", "--resume", cut, "--set", "train.steps=6", check=True)
        with h5py.File(full, "r") as a, h5py.File(cut, "r") as b:
            for group in ("weights/initial", "weights/final"):
                for name in a[group]:
                    np.testing.assert_array_equal(a[group][name][:], b[group][name][:])

    @unittest.skipUnless(importlib.util.find_spec("torch"), "no torch")
    def test_pytorch_twin_from_exported_weights_and_dumped_batch(self):
        torch = __import__("torch")
        from divlab_torch import Transformer
        _, _, weights = read_safetensors(self.export("initial", "f64"))
        batch = os.path.join(self.d, "batch0.h5")
        run("data", "--dataset", "zipf:1.2", "--vocab", "64", "--batch", "4", "--seq", "16",
            "--seed", str(self.seed), "--dump-batch", "0", "--out", batch, "--force", check=True)
        with h5py.File(batch, "r") as f:
            inputs, targets = f["inputs"][:], f["targets"][:]
        self.assertEqual(inputs.shape, (4, 16))
        # The next token is the target: a sequence's targets are its inputs shifted by one.
        np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
        model = Transformer(64, 32, 2, 2, 16).double()
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
        loss = float(model(torch.from_numpy(inputs), torch.from_numpy(targets)))
        with h5py.File(self.trace, "r", swmr=True) as f:
            recorded = float(f["metrics/loss"][0])
        self.assertAlmostEqual(loss, recorded, delta=1e-5, msg=f"seed {self.seed}")

    def export(self, which, dtype):
        out = os.path.join(self.d, f"{which}-{dtype}.safetensors")
        run("export", self.trace, "--weights", which, "--dtype", dtype, "--out", out, "--force",
            check=True)
        return out


class ExportEveryArchitecture(unittest.TestCase):
    """Every model the config can describe exports in its own layout: before, export read five
    [model] keys and laid out the default gpt2, so a llama trace failed ('cannot read dataset
    /weights/final/wpe.weight') and so did a tied head."""
    MODELS = {
        "llama, grouped kv heads, soft-cap, tied": ["model.arch=llama", "model.n_heads=4",
                                                    "model.n_kv_heads=2", "model.logit_softcap=5",
                                                    "model.tied_embeddings=true"],
        "llama, its own MLP width": ["model.arch=llama", "model.mlp_hidden=40"],
        "gpt2, tied": ["model.tied_embeddings=true"],
    }

    def test_names_shapes_and_values_are_the_traces_and_the_twin_computes_its_first_loss(self):
        seed = int.from_bytes(os.urandom(2), "little")
        for name, model in self.MODELS.items():
            with self.subTest(name):
                d = tmpdir()
                trace, out = os.path.join(d, "run.h5"), os.path.join(d, "w.safetensors")
                run("train", "--quiet", "--set", *SETTINGS, *model, f"train.seed={seed}",
                    "train.steps=2", "trace.initial_weights=true", "--out", trace, check=True)
                run("export", trace, "--weights", "initial", "--dtype", "f64", "--out", out,
                    check=True)
                _, order, tensors = read_safetensors(out)
                with h5py.File(trace, "r", swmr=True) as f:
                    kept = {k: f["weights/initial"][k][:] for k in f["weights/initial"]}
                    recorded = float(f["metrics/loss"][0])
                    config = tomllib.loads(f.attrs["config_toml"])
                self.assertEqual(set(order), set(kept), f"seed {seed}")
                for tensor in order:
                    np.testing.assert_array_equal(tensors[tensor], kept[tensor],
                                                  err_msg=f"{tensor}, seed {seed}")
                if importlib.util.find_spec("torch") is None:
                    continue
                self.assertAlmostEqual(twin_first_loss(config, tensors, d, seed), recorded,
                                       delta=1e-5, msg=f"seed {seed}")


def twin_first_loss(config, weights, d, seed):
    """The PyTorch twin's loss on the run's first batch, from the exported weights alone."""
    torch = __import__("torch")
    from divlab_torch import from_config
    batch = os.path.join(d, "batch0.h5")
    run("data", "--dataset", config["data"], "--vocab", str(config["model"]["vocab"]), "--batch",
        str(config["train"]["batch"]), "--seq", str(config["model"]["seq_len"]), "--seed",
        str(seed), "--dump-batch", "0", "--out", batch, check=True)
    with h5py.File(batch, "r") as f:
        inputs, targets = f["inputs"][:], f["targets"][:]
    model = from_config(config["model"]).double()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
    return float(model(torch.from_numpy(inputs), torch.from_numpy(targets)))


if __name__ == "__main__":
    unittest.main()
