"""The Python benchmarks' command lines, read the way divlab and the C++ benchmarks
(bench/int_options.h) read theirs: a bad one is refused before any GPU work or file is touched,
with one line on stderr naming the script, the option and the value, and exit code 2
(tests/py/test_bench_args.py holds every script to it)."""
import argparse
import math
import os
import sys


class Parser(argparse.ArgumentParser):
    """argparse with its errors (an unknown option, a missing or malformed value) on one line:
    `SCRIPT: argument --steps: expected ...`, exit 2, no usage block."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message}\n")
        sys.exit(2)


def at_least(least):
    """An integer of at least `least`, as an argparse type."""
    def parse(text):
        try:
            value = int(text, 10)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, "
                                             f"got '{text}'")
        return value
    return parse


def positive_seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got '{text}'")
    return value


def existing_file(text):
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: '{text}'")
    return text


def executable(text):
    if not (os.path.isfile(text) and os.access(text, os.X_OK)):
        raise argparse.ArgumentTypeError(f"not an executable file: '{text}'")
    return text


def key_value(text):
    """A divlab --set override, KEY=VALUE."""
    key, eq, _ = text.partition("=")
    if not key or not eq:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{text}'")
    return text
