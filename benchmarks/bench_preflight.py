"""``rookgrpo preflight`` on the embedded recipe: what it measures, how long it takes, and how close its estimate of
the run's time comes to the run.

One command runs ``python -m rookgrpo recipes/rookworld-tiny.yaml --preflight on`` (the preflight, then the recipe's
whole run, one process, CPU) and reads ``preflight.json`` (the worst case's peak memory and step time, the typical
step, the estimate) and ``trainer_state.json`` (the run's ``train_runtime``). The target: the estimate within 25% of
the measured training time. ``--max_steps`` shortens the run (the estimate is for the steps run).

    python benchmarks/bench_preflight.py [--max-steps 200] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_features, finish

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.25


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/rookworld-tiny.yaml")
    ap.add_argument("--max-steps", type=int, default=None, help="the run's steps (default: the recipe's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-preflight-") as tmp:
        cmd = [sys.executable, "-m", "rookgrpo", args.recipe, "--preflight", "on", "--output_dir", tmp,
               "--save_strategy", "no"]
        if args.max_steps:
            cmd += ["--max_steps", str(args.max_steps)]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=REPO)
        wall = time.perf_counter() - start
        report = json.loads((Path(tmp) / "preflight.json").read_text())
        history = json.loads((Path(tmp) / "trainer_state.json").read_text())["log_history"]
    runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
    error = report["estimate_seconds"] / runtime - 1
    s = report["shape"]
    table = "\n".join([
        "| measured | value |",
        "| --- | --- |",
        f"| worst case | {s['prompts_per_step']} prompts x {s['num_generations']} completions, prompts up to "
        f"{s['prompt_tokens']} tokens, completions {s['completion_tokens']} tokens |",
        f"| peak memory of the worst case (process's peak resident set) | {report['peak_mib']:.0f} MiB |",
        f"| worst-case step | {report['worst_step_seconds']:.2f} s |",
        f"| typical step (mean of steps 2-8) | {report['typical_step_seconds']:.2f} s |",
        f"| step read at the dataset's mean batch width | {report['step_seconds']:.2f} s |",
        f"| held-out evaluations x time | {report['evaluations']} x {report['evaluation_seconds'] or 0:.1f} s |",
        f"| estimate of the run's training time | {report['estimate_seconds']:.0f} s |",
        f"| measured training time (`train_runtime`, {report['run_steps']} steps) | {runtime:.0f} s |",
        f"| estimate / measured | **{1 + error:.3f}** |",
        f"| the preflight's own time | {report['preflight_seconds']:.0f} s |",
        "",
        f"Estimate within {TARGET:.0%} of the run: {'met' if abs(error) <= TARGET else 'missed'}.",
    ])
    result = {
        "title": "Preflight on the embedded recipe: its figures and its estimate of the run's time",
        "description": (f"`{args.recipe}`, one process, CPU ({cpu_features()}): the preflight's worst case (the "
                        "dataset's longest prompts, every completion at max_completion_length, two steps), eight typical "
                        "steps, then the recipe's run; the estimate against the run's `train_runtime`."),
        "table": table,
        "command": "python benchmarks/bench_preflight.py" + (f" --max-steps {args.max_steps}" if args.max_steps else ""),
        "estimate_seconds": report["estimate_seconds"], "train_runtime": runtime, "relative_error": error,
        "wall_seconds": wall, "preflight": report,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
