"""Judge-scored GRPO (``recipes/judge.yaml``): does the judge's reward rise, and does the task's rule rise with it?

Runs the shipped recipe for several seeds: the tiny random char model fills in where a piece moves, paid by the
packaged fill-in judge (a ``GPT2ForSequenceClassification`` trained to imitate the rule); the rule itself
(``fill_in_grade``) is logged with weight 0. Reported per seed and as mean ± standard error over seeds: the judge's
mean score and the rule's mean grade over the first and the last logging windows, and their change.

Also the audit every reward ships with: what fixed degenerate answers earn under the judge and under the rule on
held-out prompts (a constant square, the piece's own square, a list of squares, an empty answer, random text), next
to the rule's best answer.

    python benchmarks/bench_judge.py [--seeds 3] [--steps 60]
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
    judge = [h[f"rewards/{judge_name}/mean"] for h in logs]
    rule = [h["rewards/fill_in_grade/mean"] for h in logs]
    return {"seed": seed, "judge": judge, "rule": rule, "judge_name": judge_name,
            "first": {"judge": judge[0], "rule": rule[0]}, "last": {"judge": judge[-1], "rule": rule[-1]}}


def audit(n: int = 200) -> list[dict]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rookgrpo.assets import resolve_model
    from rookgrpo.judge import _parse_prompt, destinations, fill_in_prompts, grade

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
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench_judge_"))
    runs = [run(seed, args.steps, tmp / f"seed{seed}") for seed in range(args.seeds)]
    change = {k: [r["last"][k] - r["first"][k] for r in runs] for k in ("judge", "rule")}
    lines = ["| seed | judge score: first window → last | rule grade: first → last |", "| --- | --- | --- |"]
    for r in runs:
        lines.append(f"| {r['seed']} | {r['first']['judge']:.3f} → {r['last']['judge']:.3f} | "
                     f"{r['first']['rule']:.3f} → {r['last']['rule']:.3f} |")
    lines.append(f"| mean ± se | change {statistics.mean(change['judge']):+.3f} ± {_se(change['judge']):.3f} | "
                 f"change {statistics.mean(change['rule']):+.3f} ± {_se(change['rule']):.3f} |")
    rows = audit()
    lines += ["", "What fixed answers earn on 200 held-out prompts:", "",
              "| answer | judge score (mean) | rule grade (mean) |", "| --- | --- | --- |"]
    lines += [f"| {r['answer']} | {r['judge']:.3f} | {r['rule']:.3f} |" for r in rows]
    result = {
        "title": f"Judge-scored GRPO: judge score and task rule over a run ({args.seeds} seeds, {args.steps} steps)",
        "description": ("`recipes/judge.yaml`: tiny random char GPT-2 paid by the packaged fill-in judge "
                        "(`rookgrpo/fill-in-judge`); the rule the judge imitates (`fill_in_grade`) logged with weight "
                        f"0. Windows are the recipe's logging windows (5 steps). Judge: `{runs[0]['judge_name']}`."),
        "runs": runs, "audit": rows, "change": change, "table": "\n".join(lines),
        "command": f"python benchmarks/bench_judge.py --seeds {args.seeds} --steps {args.steps}",
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main()
    sys.exit(0)
