"""The bad command lines of the tools beside divlab (the Python benchmarks through
bench/bench_args.py, analysis/bf16_sum.py, scripts/*.sh): each is refused before any GPU work,
build or install, with one line on stderr naming the script and what is wrong, exit code 2, and
nothing written where it ran. Runs on the CPU: every refusal comes before CUDA is touched."""
import os
import subprocess
import sys
import unittest

from cli import BIN, ROOT, tmpdir

CONFIG = os.path.join(ROOT, "configs", "bench-gpu.toml")


class ToolCommandLines(unittest.TestCase):
    def refused(self, script, args, needle):
        """`script`: bench/NAME.py, or FOLDER/NAME.py from the repository's root."""
        path = os.path.join(ROOT, script if "/" in script else os.path.join("bench", script))
        script = os.path.basename(script)
        work = tmpdir()
        shell = ["bash"] if script.endswith(".sh") else [sys.executable]
        r = subprocess.run([*shell, path, *args], cwd=work, capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, OUT=os.path.join(work, "out")))
        said = r.stderr.strip()
        self.assertEqual(r.returncode, 2, f"{script} {args}: {r.stdout}{r.stderr}")
        self.assertEqual(len(said.splitlines()), 1, f"{script} {args}: {said}")
        self.assertTrue(said.startswith(f"{script}: "), said)
        self.assertIn(needle, said, f"{script} {args}")
        self.assertEqual(r.stdout, "", f"{script} {args}")
        self.assertEqual(os.listdir(work), [], f"{script} {args} wrote there")

    def each_refused(self, script, args, needle):
        with self.subTest(script=script, args=args):
            self.refused(script, args, needle)

    def test_gpu_vs_torch(self):
        good = ["--divlab", BIN, "--config", CONFIG]
        for args, needle in [
                (["--steps", "5", *good], "--steps: expected an integer of at least 6, got '5'"),
                (["--steps", "ten", *good], "--steps: expected an integer of at least 6"),
                (["--shadow-steps", "-1", *good], "--shadow-steps: expected an integer of at"),
                (["--torch-timeout", "0", *good], "--torch-timeout: expected a positive number"),
                (["--torch-timeout", "nan", *good], "--torch-timeout: expected a positive"),
                (["--set", "train.steps", *good], "--set: expected KEY=VALUE, got 'train.steps'"),
                (["--torch-modes", "eager,fast", *good], "unknown mode 'fast'"),
                (["--torch-modes", "default+determinism", *good], "default+determinism"),
                (["--shadow-references", "fp16", *good], "unknown reference 'fp16'"),
                (["--llmc", ROOT, *good], "is no llm.c checkout"),
                (["--divlab", "/no/such/divlab", "--config", CONFIG], "not an executable file"),
                (["--divlab", BIN, "--config", "/no/such.toml"], "no such file: '/no/such.toml'"),
                (["--divlab", BIN], "--divlab and --config are required"),
                (["--bogus", "1", *good], "unrecognized arguments: --bogus 1"),
                (["--steps", *good[1:]], "argument --steps: expected an integer")]:
            self.each_refused("gpu_vs_torch.py", args, needle)

    def test_torch_gemm(self):
        for args, needle in [(["--tokens", "0"], "--tokens: expected an integer of at least 1"),
                             (["--d-model", "12x"], "--d-model: expected an integer"),
                             (["--reps", "-3"], "--reps: expected an integer of at least 1"),
                             (["--layers", "2"], "unrecognized arguments: --layers 2")]:
            self.each_refused("torch_gemm.py", args, needle)

    def test_torch_profile(self):
        good = ["--divlab", BIN, "--config", CONFIG]
        for args, needle in [
                (["--mode", "fast", *good], "argument --mode: invalid choice: 'fast'"),
                (["--steps", "0", *good], "--steps: expected an integer of at least 1"),
                (["--warmup", "-1", *good], "--warmup: expected an integer of at least 0"),
                (["--set", "model.vocab", *good], "--set: expected KEY=VALUE"),
                (["--config", CONFIG], "the following arguments are required: --divlab"),
                (["--divlab", BIN, "--config", ROOT], "no such file"),
                (["--divlab", CONFIG, "--config", CONFIG], "not an executable file")]:
            self.each_refused("torch_profile.py", args, needle)

    def test_data_parallel(self):
        for args, needle in [(["--ranks", "1"], "--ranks: expected an integer of at least 2"),
                             (["--steps", "4"], "--steps: expected an integer of at least 5"),
                             (["--batch", "15"], "15 sequences do not split over --ranks 2"),
                             (["--batch", "0"], "--batch: expected an integer of at least 1")]:
            with self.subTest(args=args):
                self.refused("data_parallel.py", ["--divlab", BIN, *args], needle)
        self.refused("data_parallel.py", ["--ranks", "2"], "required: --divlab")

    def test_bf16_sum(self):
        for args, needle in [(["--doses", "100,abc"], "--doses: expected positive integers"),
                             (["--doses", "0"], "--doses: expected positive integers"),
                             (["--snr", "nan"], "--snr: expected non-negative numbers"),
                             (["--snr", "-0.1"], "--snr: expected non-negative numbers"),
                             (["--columns", "3,4"], "--columns: expected a positive integer"),
                             (["--seed", "1.5"], "--seed: expected a non-negative integer")]:
            with self.subTest(args=args):
                self.refused("analysis/bf16_sum.py", args, needle)


    def test_scripts(self):
        for script, args, needle in [
                ("scripts/gpu.sh", ["--gpt2_small"], "unknown option '--gpt2_small'"),
                ("scripts/test.sh", ["--quick"], "takes no arguments (got: --quick)"),
                ("scripts/quickstart.sh", ["now"], "takes no arguments"),
                ("scripts/setup.sh", ["-y"], "takes no arguments"),
                ("scripts/fetch-deps.sh", ["all"], "takes no arguments"),
                ("scripts/fuzz.sh", ["0"], "one positive number of seconds per target, got: 0"),
                ("scripts/fuzz.sh", ["10", "20"], "got: 10 20"),
                ("scripts/build.sh", ["cpu", "cuda"], "at most one preset, got: cpu cuda")]:
            with self.subTest(script=script, args=args):
                self.refused(script, args, needle)


if __name__ == "__main__":
    unittest.main()
