"""A task of your own, with nothing added to rookgrpo: two-number sums, an exact-answer reward, and a dataset format.

Named from a recipe by file path (``task.py:exact``, ``task.py:sums_format``), so held-out evaluation
(``heldout_eval``), the held-out guard and the SFT anchor work for it as they do for the chess pack
(docs/howto.md, "A task of your own"). ``python task.py DIR`` writes the data files.
"""

import random
from pathlib import Path


def sums_format(dataset, prompt_column="prompt", tasks=None):
    """Dataset format: a ``text`` column of lines ``12+7=19`` becomes ``prompt`` (``12+7=``), ``answer`` (``19``,
    which the reward reads: TRL passes every column but prompt and completion to rewards) and ``completion`` (the
    reference answer the SFT anchor and ``heldout/nll`` score)."""

    def split(row):
        prompt, _, answer = row["text"].partition("=")
        return {"prompt": prompt + "=", "answer": answer, "completion": answer}

    return dataset.map(split, remove_columns=[c for c in dataset.column_names if c != "text"])


def exact(completions, answer, **kwargs):
    """1.0 when the completion's first word is the sum, else 0.0 (``answer`` is the dataset column of that name)."""
    out = []
    for text, reference in zip(completions, answer):
        words = text.strip().split()
        out.append(1.0 if words and words[0] == reference else 0.0)
    return out


def write_data(folder, n_train=256, n_val=64, seed=0):
    """``train.txt`` and ``val.txt``: lines ``a+b=c`` with a, b < 50, disjoint prompts."""
    rng = random.Random(seed)
    pairs = rng.sample([(a, b) for a in range(50) for b in range(50)], n_train + n_val)
    lines = [f"{a}+{b}={a + b}" for a, b in pairs]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text("\n".join(lines[:n_train]) + "\n")
    (folder / "val.txt").write_text("\n".join(lines[n_train:]) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write train.txt and val.txt (lines a+b=c) into FOLDER")
    parser.add_argument("folder", nargs="?", default=".")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_data(args.folder, seed=args.seed)
