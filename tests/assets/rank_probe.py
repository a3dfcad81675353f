"""Test reward named by file path: records which distributed rank called it, then scores like uci_charset."""

import os
from pathlib import Path


def rank_probe(completions, **kwargs):
    probe_dir = os.environ.get("ROOKGRPO_TEST_PROBE_DIR")
    if probe_dir:
        rank = os.environ.get("RANK", "0")
        world = os.environ.get("WORLD_SIZE", "1")
        with open(Path(probe_dir) / f"rank-{rank}.txt", "a") as fh:
            fh.write(f"{world} {len(completions)}\n")
    allowed = set("abcdefgh12345678qrbn ")
    return [sum(c in allowed for c in x) / len(x) if x else 0.0 for x in completions]
