"""Text fixtures made by the tests (no third-party text in the repository)."""
import random


def fixture_lines(n_lines, seed):
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "tur", "en", "sa", "vo", "ré", "qu", "ix", "na", "do", "be"]
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(500)]
    weights = [1 / (r + 1) ** 1.1 for r in range(len(lexicon))]
    return [" ".join(rng.choices(lexicon, weights, k=rng.randint(4, 16))) + "."
            for _ in range(n_lines)]


def write_fixture(path, n_lines=2000, seed=5):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(fixture_lines(n_lines, seed)) + "\n")
