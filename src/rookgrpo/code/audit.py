"""``rookgrpo rewards audit CODE_RECIPE``: what degenerate programs earn under a code recipe's rewards and weights.

For each problem of the recipe's data set (rows with ``tests`` and a ``canonical_solution``: the packaged HumanEval
and builtin problems have them), fixed answers are scored with the recipe's reward functions, summed the way TRL
sums them (weighted, ``None`` skipped), and reported as the mean over problems and as a share of what the canonical
solution earns:

- ``canonical``: the problem's solution (the reference);
- the degenerate answers of :data:`rookgrpo.code.degenerate.DEGENERATE` (constants, an echo, ``pass``, raising);
- ``empty block``: a fenced block with nothing in it; ``prompt copied back``: the problem's function signature and
  docstring, fenced, with no body;
- ``mutated canonical``: each one-mutation variant of the solution that fails a test
  (:func:`rookgrpo.code.degenerate.mutants`): real partial solutions, which should keep some credit.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..code.degenerate import DEGENERATE, degenerate_program, mutants
from ..errors import ConfigError

REFERENCE = "canonical"


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def answers(row: dict) -> list[tuple[str, str]]:
    """(label, completion) of every fixed answer for one problem row."""
    import json

    spec = json.loads(row["tests"]) if isinstance(row["tests"], str) else row["tests"]
    entry = spec.get("entry_point")
    out = [(REFERENCE, fence(row["canonical_solution"]))]
    if entry:
        out += [(label, fence(degenerate_program(entry, body))) for label, body in DEGENERATE]
    out += [("empty block", fence("")), ("prompt copied back", fence(row.get("function_signature") or ""))]
    out += [("mutated canonical", fence(m)) for _, m in mutants(row["canonical_solution"])] if entry else []
    return out


def code_audit(reward_funcs: Sequence[Callable], weights: Sequence[float], rows: Sequence[dict],
               n: int | None = None) -> dict[str, Any]:
    """Mean weighted reward of each fixed answer over the problems (mutants: over those failing a test), its share of
    the canonical solution's, and on how many problems it earns more than 0."""
    rows = [r for r in rows if r.get("tests") and r.get("canonical_solution")][:n]
    if not rows:
        raise ConfigError("rewards audit: the recipe's data has no rows with 'tests' and 'canonical_solution' to audit.")
    labels, prompts, completions, tests, owners = [], [], [], [], []
    for i, row in enumerate(rows):
        for label, completion in answers(row):
            labels.append(label)
            prompts.append(row["prompt"])
            completions.append(completion)
            tests.append(row["tests"])
            owners.append(i)
    per_func = [func(prompts=prompts, completions=completions, completion_ids=[[0]] * len(completions), tests=tests)
                for func in reward_funcs]  # as TRL calls them
    names = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs]
    totals = []
    for j in range(len(completions)):
        parts = [w * f[j] for w, f in zip(weights, per_func) if f[j] is not None]
        totals.append(sum(parts) if parts else 0.0)
    exec_scores = per_func[names.index("code_exec")] if "code_exec" in names else None
    by_label: dict[str, list[int]] = {}
    for j, label in enumerate(labels):
        by_label.setdefault(label, []).append(j)
    reference = statistics.mean(totals[j] for j in by_label[REFERENCE])
    table = []
    for label, index in by_label.items():
        if label == "mutated canonical" and exec_scores is not None:  # real partial solutions: those failing a test
            index = [j for j in index if (exec_scores[j] or 0.0) < 1.0]
        if not index:
            continue
        mean = statistics.mean(totals[j] for j in index)
        table.append({"answer": label, "mean": mean, "share": mean / reference if reference else float("nan"),
                      "n": len(index), **{f"{name}/mean": statistics.mean((per_func[k][j] or 0.0) for j in index)
                                         for k, name in enumerate(names)},
                      **{f"{name}/above_zero": sum((per_func[k][j] or 0.0) > 0 for j in index)
                         for k, name in enumerate(names)}})
    return {"problems": len(rows), "reference": reference, "rewards": names, "rows": table}


def format_code_audit(result: dict[str, Any], title: str = "") -> str:
    """The audit as a table: the weighted total and its share of the canonical solution's, then each reward's mean and
    on how many answers it is above 0."""
    names = result["rewards"]
    head = f"{'answer':24s} {'total':>7s} {'share':>6s} " + " ".join(f"{n + ' (> 0)':>22s}" for n in names)
    lines = [f"{title}{result['problems']} problems: weighted reward of each answer (mean over problems), its share of "
             "the canonical solution's, and each reward's mean (answers above 0)", head, "-" * len(head)]
    for row in result["rows"]:
        cells = " ".join(f"{row[n + '/mean']:>9.3f} ({row[n + '/above_zero']:>4d} of {row['n']:>3d})" for n in names)
        lines.append(f"{row['answer']:24s} {row['mean']:7.3f} {row['share']:6.3f} {cells}")
    return "\n".join(lines)


def audit_command(args: argparse.Namespace, recipe: dict, funcs: list, weights: list[float]) -> int:
    """The code branch of `rewards audit`: degenerate programs on the recipe's problems (its dataset_name)."""
    from ..data import load_recipe_dataset

    data = recipe.get("dataset_name")
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    print(f"recipe {args.recipe}: rewards {', '.join(f'{n} x {w:g}' for n, w in zip(names, weights))}; data {data}\n")
    rows = list(load_recipe_dataset(data))
    result = code_audit(funcs, weights, rows, n=args.n)
    print(format_code_audit(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"recipe": args.recipe, "weights": weights, "rewards": names,
                                               "data": data, **result}, indent=2))
        print(f"wrote {args.json}")
    return 0
