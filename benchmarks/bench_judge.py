"""Judge-scored GRPO (``recipes/judge.yaml``): does the judge's reward rise, and does the task's rule rise with it?

Runs the shipped recipe for several seeds: the tiny random char model fills in where a piece moves, paid by the
packaged fill-in judge (a ``GPT2ForSequenceClassification`` trained to imitate the rule); the rule itself
(``fill_in_grade``) is logged with weight 0. Reported per seed and as mean ± standard error over seeds: the judge's
mean score and the rule's mean grade in the first logging window, at the recipe's length (60 steps) and after a
longer run (300 steps), where a policy that learned the judge's mistakes shows the two parting.

Also the audit every reward ships with: what fixed degenerate answers earn under the judge and under the rule on
held-out prompts (a constant square, the piece's own square, a list of squares, an empty answer, random text), next
to the rule's best answer.

    python benchmarks/bench_judge.py [--seeds 5] [--steps 60] [--long-steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")


def run(seed: int, steps: int, out: Path) -> dict:
    from rookgrpo.train import build_trainer

    trainer, _, _ = build_trainer([str(REPO / "recipes" / "judge.yaml"), "--seed", str(seed), "--max_steps", str(steps),
                                   "--output_dir", str(out), "--disable_tqdm", "true"])
    judge_name = trainer.reward_func_names[0]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {"seed": seed, "judge_name": judge_name, "step": [h["step"] for h in logs],
            "judge": [h[f"rewards/{judge_name}/mean"] for h in logs],
            "rule": [h["rewards/fill_in_grade/mean"] for h in logs]}


def _at(run: dict, key: str, step: int) -> float:
    """The logging window that ends at ``step`` (the recipe logs every 5 steps)."""
    return run[key][run["step"].index(step)]


def audit(n: int = 200) -> list[dict]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rookgrpo.assets import resolve_model
    from rookgrpo.judge.model import _parse_prompt, destinations, fill_in_prompts, grade

    path = resolve_model("rookgrpo/fill-in-judge")
    judge, tok = AutoModelForSequenceClassification.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    prompts = fill_in_prompts(n, seed=12345)  # the training prompts use seed 0
    answers = {
        "the rule's best (a reachable square)": lambda p: " " + sorted(destinations(*_parse_prompt(p)))[0],
        "constant ' e4'": lambda p: " e4",
        "constant ' a1'": lambda p: " a1",
        "the piece's own square (copied from the prompt)": lambda p: " " + _parse_prompt(p)[1],
        "every reachable square listed": lambda p: " " + " ".join(sorted(destinations(*_parse_prompt(p)))),
        "empty answer": lambda p: "",
        "random text ' qzx!'": lambda p: " qzx!",
    }
    rows = []
    for name, make in answers.items():
        completions = [make(p) for p in prompts]
        enc = tok([p + c for p, c in zip(prompts, completions)], return_tensors="pt", padding=True,
                  padding_side="right", add_special_tokens=False)
        with torch.inference_mode():
            scores = judge(**enc).logits[:, 0]
        rows.append({"answer": name, "judge": scores.mean().item(),
                     "rule": statistics.mean(grade(p, c) for p, c in zip(prompts, completions))})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60, help="the recipe's length, reported as its own column")
    ap.add_argument("--long-steps", type=int, default=300, help="how long each run goes on (the judge and rule part)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench_judge_"))
    runs = [run(seed, args.long_steps, tmp / f"seed{seed}") for seed in range(args.seeds)]
    first, short, last = runs[0]["step"][0], args.steps, args.long_steps
    points = {name: {k: [_at(r, k, step) for r in runs] for k in ("judge", "rule")}
              for name, step in (("first", first), ("short", short), ("last", last))}
    fmt = lambda v: f"{statistics.mean(v):.3f} ± {_se(v):.3f}"  # noqa: E731
    change = {k: [b - a for a, b in zip(points["first"][k], points["short"][k])] for k in ("judge", "rule")}
    peak_rule = [max(r["rule"]) for r in runs]
    lines = [f"| reward | step {first} (first window) | step {short} (the recipe's length) | step {last} | "
             "change to the recipe's length |", "| --- | --- | --- | --- | --- |"]
    for k, label in (("judge", "judge score (paid)"), ("rule", "rule grade (weight 0)")):
        lines.append(f"| {label} | {fmt(points['first'][k])} | {fmt(points['short'][k])} | {fmt(points['last'][k])} | "
                     f"{statistics.mean(change[k]):+.3f} ± {_se(change[k]):.3f} |")
    lines += ["", f"Mean ± standard error over {args.seeds} seeds, each window the mean over 5 steps. The rule's best "
              f"window in each run: {fmt(peak_rule)}; the judge's score at step {last} minus the rule's: "
              f"{fmt([a - b for a, b in zip(points['last']['judge'], points['last']['rule'])])}."]
    rows = audit()
    lines += ["", "What fixed answers earn on 200 held-out prompts:", "",
              "| answer | judge score (mean) | rule grade (mean) |", "| --- | --- | --- |"]
    lines += [f"| {r['answer']} | {r['judge']:.3f} | {r['rule']:.3f} |" for r in rows]
    result = {
        "title": f"Judge-scored GRPO: judge score and task rule over a run ({args.seeds} seeds, {args.long_steps} steps)",
        "description": ("`recipes/judge.yaml`: tiny random char GPT-2 paid by the packaged fill-in judge "
                        "(`rookgrpo/fill-in-judge`); the rule the judge imitates (`fill_in_grade`) logged with weight "
                        f"0. Windows are the recipe's logging windows (5 steps). Judge: `{runs[0]['judge_name']}`."),
        "runs": runs, "audit": rows, "change": change, "table": "\n".join(lines),
        "command": f"python benchmarks/bench_judge.py --seeds {args.seeds} --steps {args.steps} --long-steps {args.long_steps}",
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main()
    sys.exit(0)
