"""The README's `make train` table: one or several runs' held-out evaluations against one before, as markdown.

Each run column is the change against ``--before`` with its z (``rookgrpo evaluate --baseline`` computes the same,
paired by position); the last column is the mean change over the runs ± its standard error over runs (the spread a
reader of one run should expect), or ± half the difference when there are two runs. When the evaluations kept their
answers, a second table counts the P: answers each run broke and fixed, by what is wrong with the broken ones.

    python experiments/seed_table.py --before runs/eval_before.json \
        --runs s42=runs/fused-s42/eval_after.json s43=runs/fused-s43/eval_after.json

``--save FILE`` keeps each run's change per metric (a small JSON); ``--against FILE`` pairs these runs, by name, with
such a file of another recipe's runs on the same seeds: a third table of the difference, mean ± standard error over
runs and its t.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys

# (evaluation key, row label) in the README's order.
ROWS = (
    ("best_move_accuracy", "best-move accuracy (P:)"),
    ("top5_accuracy", "top-5 accuracy (P:)"),
    ("legal_move_rate", "legal-move rate (P:)"),
    ("format_rate", "format rate (P:, greedy)"),
    ("move_rank_reward", "mean move-rank reward (P:)"),
    ("top_move_share", "most frequent B: move's share"),
    ("env_exact_accuracy", "A: next-state exact"),
    ("env_broken_rate", "A: board not 8 ranks of 8 squares"),
)


def spread_name(n_runs: int) -> str:
    return "± half their difference" if n_runs == 2 else "± its standard error over runs"


def spread(changes: list[float]) -> tuple[float, float]:
    """Mean change over runs and its spread (:func:`spread_name` names it): the standard error over runs, or half the
    difference of two."""
    mean = statistics.fmean(changes)
    if len(changes) == 2:
        return mean, abs(changes[0] - changes[1]) / 2
    return mean, statistics.stdev(changes) / math.sqrt(len(changes))


def t_text(mean: float, err: float) -> str:
    """`` (t X)`` for a mean and its standard error ("" where the error is 0)."""
    return f" (t {mean / err:.1f})" if err > 0 else ""


def changes(before: dict, runs: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each metric's change against ``before``, per run: ``{key: {run: change}}`` (what ``--save`` writes)."""
    from rookgrpo.chess.evaluate import paired

    return {key: {name: paired(before, run, key)[0] for name, run in runs.items()}
            for key, _ in ROWS if all(key in m for m in (before, *runs.values()))}


def against_table(mine: dict[str, dict[str, float]], theirs: dict[str, dict[str, float]], label: str) -> str:
    """These runs' changes minus another recipe's, paired by run name, per metric both have: each pair's difference,
    then the mean ± its standard error over pairs and t.

    >>> print(against_table({"best_move_accuracy": {"s1": 0.02, "s2": 0.03}},
    ...                     {"best_move_accuracy": {"s1": 0.01, "s2": 0.01}}, "old"))
    | metric | s1 | s2 | mean − old (± half their difference) |
    | --- | --- | --- | --- |
    | best-move accuracy (P:) | +0.010 | +0.020 | +0.015 ± 0.005 (t 3.0) |
    """
    keys = [(k, lab) for k, lab in ROWS if k in mine and k in theirs]
    names = [n for n in next(iter(mine.values())) if all(n in theirs[k] for k, _ in keys)]
    if len(names) < 2:
        raise ValueError(f"--against: fewer than two runs named alike in both ({sorted(theirs[keys[0][0]])})")
    lines = ["| metric | " + " | ".join(names) + f" | mean − {label} ({spread_name(len(names))}) |",
             "| --- |" + " --- |" * (len(names) + 1)]
    for key, row in keys:
        diffs = [mine[key][n] - theirs[key][n] for n in names]
        mean, err = spread(diffs)
        lines.append(f"| {row} | " + " | ".join(f"{d:+.3f}" for d in diffs) + f" | {mean:+.3f} ± {err:.3f}"
                     f"{t_text(mean, err)} |")
    return "\n".join(lines)


def table(before: dict, runs: dict[str, dict]) -> str:
    """The markdown table: one run gives before, after and the change (z); several add the mean change over runs.

    >>> before = {"best_move_accuracy": 0.25, "per_row": {"best_move_accuracy": [1, 0, 0, 0]}}
    >>> after = {"best_move_accuracy": 0.5, "per_row": {"best_move_accuracy": [1, 1, 0, 0]}}
    >>> print(table(before, {"seed 42": after}))
    | metric | before | after (seed 42) | change (z) |
    | --- | --- | --- | --- |
    | best-move accuracy (P:) | 0.250 | 0.500 | +0.250 (1.0) |
    """
    from rookgrpo.chess.evaluate import paired

    names = list(runs)
    if len(names) == 1:
        (name,) = names
        lines = [f"| metric | before | after ({name}) | change (z) |", "| --- | --- | --- | --- |"]
        for key, label in ROWS:
            if key in before and key in runs[name]:
                diff, se, _ = paired(before, runs[name], key)
                z = f" ({diff / se:.1f})" if se > 0 else ""
                lines.append(f"| {label} | {before[key]:.3f} | {runs[name][key]:.3f} | {diff:+.3f}{z} |")
        return "\n".join(lines)
    lines = ["| metric | before | " + " | ".join(names) + f" | mean of {len(names)} runs ({spread_name(len(names))}) |",
             "| --- | --- |" + " --- |" * (len(names) + 1)]
    for key, label in ROWS:
        if not all(key in m for m in (before, *runs.values())):
            continue
        cells, changes = [], []
        for name in names:
            diff, se, _ = paired(before, runs[name], key)
            changes.append(diff)
            cells.append(f"{diff:+.3f} ({diff / se:.1f})" if se > 0 else f"{diff:+.3f}")
        mean, err = spread(changes)
        lines.append(f"| {label} | {before[key]:.3f} | " + " | ".join(cells) + f" | {mean:+.3f} ± {err:.3f}"
                     f"{t_text(mean, err)} |")
    return "\n".join(lines)


def failure_table(before: dict, runs: dict[str, dict]) -> str | None:
    """The P: answers each run broke (well-formed before, ill-formed after), by what is wrong with them after
    (:func:`rookgrpo.chess.evaluate.format_failure_changes`), and those it fixed; ``None`` when an evaluation has no
    answers (one written before ``rookgrpo evaluate`` kept them).

    >>> ok, extra = " M: e2e4 d2d4 E: 0.3 0.2 B: e2e4", " M: e2e4 d2d4 E: 0.3 0.2 0.0 B: e2e4"
    >>> ev = lambda *answers: {"prompts_sha1": "s", "completions": {"P": list(answers)},
    ...                        "per_row": {"format_rate": [float(a == ok) for a in answers]}}
    >>> print(failure_table(ev(ok, ok), {"seed 1": ev(ok, extra), "seed 2": ev(ok, ok)}))
    | P: answers | seed 1 | seed 2 | all runs |
    | --- | --- | --- | --- |
    | well-formed before, ill-formed after | 1 | 0 | 1 |
    | … E: N evals for N moves | 1 | 0 | 1 |
    | ill-formed before, well-formed after | 0 | 0 | 0 |
    """
    from rookgrpo.chess.evaluate import format_failure_changes

    changes = {name: format_failure_changes(before, run) for name, run in runs.items()}
    if any(c is None for c in changes.values()):
        return None
    kinds = list(dict.fromkeys(k for c in changes.values() for k in c["broke_kinds"]))
    rows = [("well-formed before, ill-formed after", [len(c["broke"]) for c in changes.values()])]
    rows += [(f"… {k}", [c["broke_kinds"].get(k, 0) for c in changes.values()]) for k in kinds]
    rows.append(("ill-formed before, well-formed after", [len(c["fixed"]) for c in changes.values()]))
    lines = ["| P: answers | " + " | ".join(runs) + " | all runs |", "| --- |" + " --- |" * (len(runs) + 1)]
    lines += [f"| {label} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |" for label, counts in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the start's evaluation (rookgrpo evaluate --out)")
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=EVAL.json",
                    help="each run's evaluation after training, named")
    ap.add_argument("--save", default=None, metavar="FILE", help="write each run's change per metric here (JSON)")
    ap.add_argument("--label", default=None, help="with --save: what these runs are, for a later --against")
    ap.add_argument("--against", default=None, metavar="FILE",
                    help="another recipe's runs' changes (a --save file), paired by run name")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error(f"--runs: expected NAME=EVAL.json, got {item!r}")
        runs[name] = json.loads(open(path).read())
    before = json.loads(open(args.before).read())
    print(table(before, runs))
    failures = failure_table(before, runs)
    if failures:  # what the format changes were, when the evaluations kept their answers
        print("\nGreedy format, answer by answer (a broken answer counts once per kind of error):\n")
        print(failures)
    mine = changes(before, runs)
    if args.save:
        with open(args.save, "w") as fh:
            json.dump({"command": "python experiments/seed_table.py " + shlex.join(argv if argv is not None else
                                                                                 sys.argv[1:]),
                       **({"label": args.label} if args.label else {}), "before": {k: before[k] for k in mine},
                       "changes": mine}, fh, indent=2)
    if args.against:
        theirs = json.loads(open(args.against).read())
        print(f"\nAgainst {theirs.get('label', args.against)}, paired by run:\n")
        print(against_table(mine, theirs["changes"], theirs.get("label", "theirs")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
