"""``rookgrpo evaluate``: greedy (or seeded, sampled) completions on RookWorld prompts, scored by the training rewards.

Metrics (``P:`` rows): best-move accuracy (B: equals the engine's best), top-5 accuracy (B: among the engine's top 5),
legal-move rate (B: legal), format rate (all of M:, E:, B: well-formed), mean move-rank and best-move rewards, and
the share of the most frequent B: move (a policy collapsing onto one generic move shows there first). ``A:`` rows: exact
next-state accuracy and mean environment reward, and two ways an answer earns 0 that the reward does not tell apart:
the input board copied although the move changes it, and a board that is not one (not 8 ranks of 8 squares). Each
metric comes with its standard error over positions, so a before/after difference can be told from noise. The same
reward code scores training, so the numbers agree. Every answer is kept (``completions``, per task), and the ill-formed
P: answers are counted by kind (``format_failures``), so two evaluations show which answers a run broke, and how.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .engine import EngineSettings, get_pool
from .formats import board_from_fen, format_failures, is_legal, parse_policy
from ..errors import ConfigError
from ..evaluation import complete, generate_completions  # noqa: F401 (complete: re-exported)
from ..evaluation import mean_se, pick_device, prompt_clusters, reference_nll
from .rewards import ChessBestMove, ChessEnv, ChessFormat, ChessMoveRank, env_failure


# The per-row entries of an evaluation: what a summary (build_info.json, a benchmark's record) leaves out.
PER_ROW_KEYS = ("per_row", "per_row_cluster", "completions")


def score(prompts: Sequence[str], completions: Sequence[str], tasks: Sequence[str],
          settings: EngineSettings = EngineSettings()) -> dict[str, Any]:
    """Compute the evaluation metrics for given completions (no model needed)."""
    p_idx = [i for i, t in enumerate(tasks) if t == "P"]
    a_idx = [i for i, t in enumerate(tasks) if t == "A"]
    metrics: dict[str, Any] = {"n_policy": len(p_idx), "n_env": len(a_idx)}
    per_metric: dict[str, list[float]] = {}
    if p_idx:
        pp = [prompts[i] for i in p_idx]
        pc = [completions[i] for i in p_idx]
        fens = [parse_policy(p + " M:").fen for p in pp]
        bests = [parse_policy(" " + c.split("\n", 1)[0]).best for c in pc]
        analyses = get_pool(settings).analyse_many(fens)
        legal = [float(is_legal(board_from_fen(f), b)) for f, b in zip(fens, bests)]
        per_metric["best_move_accuracy"] = [float(b == a.best and bool(b)) for b, a in zip(bests, analyses)]
        per_metric["top5_accuracy"] = [float(bool(b) and b in a.moves) for b, a in zip(bests, analyses)]
        per_metric["legal_move_rate"] = legal
        per_metric["format_rate"] = [float(x == 1.0) for x in ChessFormat()(pp, pc)]
        per_metric["best_move_reward"] = [float(x) for x in ChessBestMove(settings)(pp, pc)]
        per_metric["move_rank_reward"] = [float(x) for x in ChessMoveRank(settings)(pp, pc)]
        # Collapse check: a policy that answers most positions with one generic move (say a2a3) can raise legality
        # and best-move reward while best-move accuracy falls; this share makes that visible.
        counts = Counter(b for b in bests if b)
        top_move, _ = counts.most_common(1)[0] if counts else (None, 0)
        per_metric["top_move_share"] = [float(bool(b) and b == top_move) for b in bests]
        metrics.update(top_move=top_move, distinct_moves=len(counts))
        # Why the ill-formed answers fail, by kind (an answer counts once per kind): the format rate alone cannot tell
        # a repeated M: move from a missing B: field.
        metrics["format_failures"] = dict(Counter(k for c in pc for k in format_failures(c)).most_common())
    if a_idx:
        env = ChessEnv()([prompts[i] for i in a_idx], [completions[i] for i in a_idx])
        per_metric["env_exact_accuracy"] = [float(x == 1.0) for x in env]
        per_metric["env_reward"] = [float(x) for x in env]
        kinds = [env_failure(prompts[i], completions[i]) for i in a_idx]
        per_metric["env_copied_rate"] = [float(k == "copied") for k in kinds]
        per_metric["env_broken_rate"] = [float(k == "broken") for k in kinds]
    # A data set can hold one prompt several times (a generator that replays an opening writes the same A: line
    # again): greedy decoding answers every copy alike, so the errors count each distinct prompt once (mean_se).
    clusters = {"P": prompt_clusters([prompts[i] for i in p_idx]), "A": prompt_clusters([prompts[i] for i in a_idx])}
    per_cluster = {name: clusters["A" if name.startswith("env_") else "P"] for name in per_metric}
    for name, values in per_metric.items():
        mean, se = mean_se(values, per_cluster[name])
        metrics[name] = mean
        metrics[f"{name}_se"] = se
    metrics.update(n_policy_distinct=len(set(clusters["P"])), n_env_distinct=len(set(clusters["A"])))
    # Per-row values, so two evaluations of the same prompts compare position by position (format_comparison).
    metrics["per_row"] = per_metric
    metrics["per_row_cluster"] = per_cluster
    metrics["prompts_sha1"] = hashlib.sha1("\n".join(prompts).encode()).hexdigest()
    # Every answer, per task in the order of its per-row values (format_failure_changes reads them).
    metrics["completions"] = {"P": [str(completions[i]) for i in p_idx], "A": [str(completions[i]) for i in a_idx]}
    return metrics


def evaluate(model: str, data: str, n: int | None = None, batch_size: int = 32, max_new_tokens: int | None = None,
             settings: EngineSettings = EngineSettings(), progress: bool = True, temperature: float = 0.0,
             seed: int = 0, device: str | None = None) -> dict[str, Any]:
    """Complete the RookWorld prompts in ``data`` (greedy, or sampled at ``temperature``) and score the completions;
    the model runs on ``device`` (:func:`pick_device`: a GPU when there is one)."""
    from transformers import AutoTokenizer

    from ..assets import resolve_model
    from .data import load_rookworld

    rows = load_rookworld(data)
    if n is not None:
        rows = rows.select(range(min(n, len(rows))))
    if max_new_tokens is None:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
        longest = max(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in rows["completion"])
        max_new_tokens = int(longest * 1.25) + 4
    completions = generate_completions(model, rows["prompt"], max_new_tokens, batch_size, progress, temperature, seed,
                                       device)
    metrics = score(rows["prompt"], completions, rows["task"], settings)
    add_reference_nll(metrics, model, rows["prompt"], rows["completion"], rows["task"], batch_size, device=device)
    metrics.update(model=model, data=str(data), max_new_tokens=max_new_tokens, engine_depth=settings.depth,
                   engine_nodes=settings.nodes, temperature=temperature, seed=seed, device=str(pick_device(device)))
    metrics["samples"] = [
        {"prompt": p, "completion": c} for p, c in list(zip(rows["prompt"], completions))[:5]
    ]
    return metrics


# What a sample passes, per task, for headroom(): a P: answer's best move, its move in the engine's top 5, a legal move,
# a well-formed line; an A: answer's exact next state.
HEADROOM_METRICS = {"P": ("best_move_accuracy", "top5_accuracy", "legal_move_rate", "format_rate"),
                    "A": ("env_exact_accuracy",)}


def headroom(model: str, data: str, samples: int = 8, temperatures: dict[str, float] | None = None,
             n: int | None = None, batch_size: int = 32, max_new_tokens: int | None = None,
             settings: EngineSettings = EngineSettings(), progress: bool = True, seed: int = 0,
             device: str | None = None) -> dict[str, Any]:
    """What GRPO can sharpen: per task and metric, greedy pass@1 against pass@1 and pass@k of ``samples`` completions
    sampled at the task's temperature (``temperatures``, e.g. the recipe's ``task_generation_kwargs``; 1.0 where a
    task has none), on the prompts of ``data``.

    pass@k is the share of prompts with at least one passing sample among ``k``; with ``samples`` draws it is the
    unbiased estimator ``1 - C(n - c, k) / C(n, k)`` for every k up to ``samples`` (``n`` draws, ``c`` passing).
    A metric whose pass@k is far above greedy pass@1 has answers the policy samples but does not choose: sharpening
    can raise it. One whose pass@k is near greedy has little there for GRPO to find.
    """
    if samples < 1:
        raise ConfigError(f"--samples: expected at least 1, got {samples}.")
    from .data import load_rookworld

    rows = load_rookworld(data)
    if n is not None:
        rows = rows.select(range(min(n, len(rows))))
    greedy = evaluate(model, data, n=n, batch_size=batch_size, max_new_tokens=max_new_tokens, settings=settings,
                      progress=progress, device=device)
    temperatures = {"P": 1.0, "A": 1.0, **(temperatures or {})}
    out: dict[str, Any] = {"samples": samples, "temperatures": temperatures, "greedy": {}, "sampled": {}}
    for task, names in HEADROOM_METRICS.items():
        idx = [i for i, t in enumerate(rows["task"]) if t == task]
        if not idx:
            continue
        prompts = [rows["prompt"][i] for i in idx]
        # One seeded call for all draws: every copy of a prompt is sampled independently.
        flat = generate_completions(model, prompts * samples, greedy["max_new_tokens"], batch_size, progress,
                                    temperatures[task], seed, device)
        rows_passed = score(prompts * samples, flat, [task] * len(flat), settings)["per_row"]
        for name in names:
            passes = [[rows_passed[name][k * len(prompts) + j] for k in range(samples)] for j in range(len(prompts))]
            sampled = {"pass@1": sum(map(sum, passes)) / (samples * len(prompts))}
            for k in (2, 4, 8, 16, 32):
                if k <= samples:
                    sampled[f"pass@{k}"] = sum(pass_at_k(samples, int(sum(p)), k) for p in passes) / len(passes)
            out["greedy"][name] = greedy[name]
            out["sampled"][name] = sampled
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of ``c`` passing samples among ``n`` (Chen et al. 2021).

    >>> pass_at_k(8, 0, 4), pass_at_k(8, 8, 1), round(pass_at_k(8, 1, 4), 3)
    (0.0, 1.0, 0.5)
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def format_headroom(result: dict[str, Any]) -> str:
    """The table :func:`headroom` returns, one line per metric."""
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= result["samples"]]
    head = f"{'metric':24s} {'greedy':>8s} " + " ".join(f"{f'pass@{k}':>8s}" for k in ks)
    lines = [head, "-" * len(head)]
    for name, value in result["greedy"].items():
        sampled = result["sampled"][name]
        lines.append(f"{name:24s} {value:8.3f} " + " ".join(f"{sampled[f'pass@{k}']:8.3f}" for k in ks))
    temps = ", ".join(f"{t}: T={v:g}" for t, v in result["temperatures"].items())
    lines.append(f"({result['samples']} samples per prompt; {temps})")
    return "\n".join(lines)


def add_reference_nll(metrics: dict[str, Any], model: Any, prompts: Sequence[str], references: Sequence[str],
                      tasks: Sequence[str], batch_size: int = 64, tokenizer: Any = None,
                      device: str | None = None) -> None:
    """Add ``nll_P`` and ``nll_A`` (:func:`reference_nll` of the rows' reference completions, per task, with standard
    errors and per-row values) to ``metrics``; ``model`` is a loaded model (with ``tokenizer``), or a path loaded
    onto ``device`` (:func:`pick_device`)."""
    if tokenizer is None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..assets import resolve_model

        path = resolve_model(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).to(pick_device(device)).eval()
    for task in ("P", "A"):
        idx = [i for i, t in enumerate(tasks) if t == task]
        if not idx:
            continue
        values = reference_nll(model, tokenizer, [prompts[i] for i in idx], [references[i] for i in idx], batch_size)
        clusters = prompt_clusters([prompts[i] for i in idx])
        name = f"nll_{task}"
        metrics[name], metrics[f"{name}_se"] = mean_se(values, clusters)
        if "per_row" in metrics:
            metrics["per_row"][name] = values
            metrics["per_row_cluster"][name] = clusters


METRIC_ROWS = [
    ("best_move_accuracy", "best-move accuracy (B: = engine best)"),
    ("top5_accuracy", "top-5 accuracy (B: in engine top 5)"),
    ("legal_move_rate", "legal-move rate (B: legal)"),
    ("format_rate", "format rate (M:, E:, B: well-formed)"),
    ("move_rank_reward", "mean move-rank reward (chess_move_rank)"),
    ("best_move_reward", "mean best-move reward (chess_best_move)"),
    ("top_move_share", "most frequent B: move's share"),
    ("env_exact_accuracy", "A: next-state exact accuracy"),
    ("env_reward", "A: mean environment reward"),
    ("env_copied_rate", "A: input board copied (move not made)"),
    ("env_broken_rate", "A: board not 8 ranks of 8 squares"),
    ("nll_P", "P: reference answer NLL (nats/token)"),
    ("nll_A", "A: reference answer NLL (nats/token)"),
]


def _rows(metrics: dict[str, Any], task: str) -> str:
    """``"64"``, or ``"64 (47 distinct)"`` when some prompts repeat (their copies count once in the errors)."""
    n, distinct = metrics[f"n_{task}"], metrics.get(f"n_{task}_distinct")
    return f"{n}" if distinct is None or distinct == n else f"{n} ({distinct} distinct)"


def _kinds(counts: dict[str, int]) -> str:
    """``"M: repeated move (3), B: missing move (1)"``."""
    return ", ".join(f"{k} ({n})" for k, n in counts.items())


def format_table(metrics: dict[str, Any]) -> str:
    lines = [f"{'metric':44s} {'value':>8s} {'± se':>8s}", "-" * 62]
    for key, label in METRIC_ROWS:
        if key in metrics:
            lines.append(f"{label:44s} {metrics[key]:8.3f} {metrics[key + '_se']:8.3f}")
    if metrics.get("format_failures"):
        lines.append(f"ill-formed P: answers by kind: {_kinds(metrics['format_failures'])}")
    decoding = f"sampled at T={metrics['temperature']}, seed {metrics.get('seed', 0)}" \
        if metrics.get("temperature") else "greedy"
    lines.append(f"(P: rows {_rows(metrics, 'policy')}, A: rows {_rows(metrics, 'env')}; {decoding})")
    return "\n".join(lines)


def _same_rows(before: dict[str, Any], after: dict[str, Any], key: str) -> tuple[list, list] | None:
    """Both evaluations' per-row values of ``key`` when they are of the same prompts, else ``None``."""
    rows_b, rows_a = (m.get("per_row", {}).get(key) for m in (before, after))
    if rows_b and rows_a and len(rows_b) == len(rows_a) and before.get("prompts_sha1") == after.get("prompts_sha1"):
        return rows_b, rows_a
    return None


def paired(before: dict[str, Any], after: dict[str, Any], key: str) -> tuple[float, float, str]:
    """``(change, standard error of the change, how)`` for one metric of two evaluations.

    Paired when both hold per-row values for the same prompts (``per_row``, ``prompts_sha1``): the standard error of
    the mean per-row difference, which is what "did this model change on these positions" needs, with copies of one
    prompt counted as one draw (``per_row_cluster`` from either side; an evaluation written before it had none).
    Otherwise the two are treated as independent samples, which overstates the error for the same positions.
    """
    diff = after[key] - before[key]
    rows = _same_rows(before, after, key)
    if rows is not None:
        rows_b, rows_a = rows
        clusters = after.get("per_row_cluster", {}).get(key) or before.get("per_row_cluster", {}).get(key)
        _, se = mean_se([a - b for a, b in zip(rows_a, rows_b)], clusters)
        return diff, se, "paired"
    return diff, math.sqrt(before[key + "_se"] ** 2 + after[key + "_se"] ** 2), "independent"


def format_comparison(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Before → after per metric, with the change in units of its standard error (|z| >= 2: likely signal).

    Evaluations of the same prompts compare row by row (:func:`paired`); the last line says which was used.
    """
    lines = [f"{'metric':44s} {'before':>8s} {'after':>8s} {'change':>8s} {'z':>6s}", "-" * 78]
    hows = set()
    for key, label in METRIC_ROWS:
        if key in before and key in after:
            diff, se, how = paired(before, after, key)
            hows.add(how)
            z = diff / se if se > 0 else float("nan")
            lines.append(f"{label:44s} {before[key]:8.3f} {after[key]:8.3f} {diff:+8.3f} {z:6.1f}")
    how = ("paired by position" if hows == {"paired"} else
           "the evaluations treated as independent (not the same prompts, or no per-row values)")
    lines.append(f"(P: rows {_rows(after, 'policy')}, A: rows {_rows(after, 'env')}; z = change / standard error of "
                 f"the change, {how})")
    changes = format_failure_changes(before, after)
    if changes is not None:
        lines.append(f"P: answers well-formed before, ill-formed after: {len(changes['broke'])}"
                     + (f"; after's errors: {_kinds(changes['broke_kinds'])}" if changes["broke_kinds"] else ""))
        lines.append(f"P: answers ill-formed before, well-formed after: {len(changes['fixed'])}")
    return "\n".join(lines)


def format_failure_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """The P: answers whose greedy format changed between two evaluations of the same prompts, row by row.

    ``broke`` / ``fixed``: the row indices that were well-formed before and not after / the other way round;
    ``broke_kinds``: the after side's error kinds (:func:`~rookgrpo.chess.formats.format_failures`) on the broken rows,
    counted once per row. ``None`` when either evaluation has no per-row format values, the after side has no answers
    (an evaluation written before they were kept), or the prompts differ.

    >>> row = lambda ok, answers: {"prompts_sha1": "s", "per_row": {"format_rate": ok}, "completions": {"P": answers}}
    >>> good, repeated = " M: e2e4 E: 0.3 B: e2e4", " M: e2e4 e2e4 E: 0.3 0.3 B: e2e4"
    >>> format_failure_changes(row([1.0, 1.0], [good, good]), row([1.0, 0.0], [good, repeated]))
    {'broke': [1], 'fixed': [], 'broke_kinds': {'M: repeated move': 1}}
    """
    rows = _same_rows(before, after, "format_rate")
    answers = after.get("completions", {}).get("P")
    if rows is None or answers is None or len(answers) != len(rows[1]):
        return None
    ok_b, ok_a = rows
    broke = [i for i, (b, a) in enumerate(zip(ok_b, ok_a)) if b == 1.0 and a == 0.0]
    fixed = [i for i, (b, a) in enumerate(zip(ok_b, ok_a)) if b == 0.0 and a == 1.0]
    kinds = Counter(k for i in broke for k in format_failures(answers[i]))
    return {"broke": broke, "fixed": fixed, "broke_kinds": dict(kinds.most_common())}


def write_json(metrics: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(metrics, indent=2))
