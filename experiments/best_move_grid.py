"""The best-move grid: which change to the shipped recipe raises held-out best-move accuracy and holds greedy format?

The plan (arms, metrics, seeds, decision rule) was written before the runs: docs/experiments/2026-11-27-best-move-grid-plan.md.
Every arm is ``recipes/rookworld-tiny.yaml`` as shipped when the grid ran (the control, :data:`CONTROL`) or that
recipe with one change, trained by :func:`grpo_grid.run` (the same reward objects, Stockfish settings and
completions budget as the last grid: 200 steps of 32 completions, resampling rounds counted), without the held-out
evaluation and guard (an arm is judged by its last step's weights), then evaluated greedily on the 256 reported
held-out positions (``rookgrpo/tiny-rookworld-eval``, Stockfish depth 8). Seeds 1-5, arms interleaved per seed.

    python experiments/best_move_grid.py --out experiments/results/best_move_grid.json     (run or resume)
    python experiments/best_move_grid.py --from_result experiments/results/best_move_grid.json    (re-table)

The extension (seeds 42-46, make train's, for the three arms that could ship), tabled with seeds 1-5 as one grid::

    python experiments/best_move_grid.py --out experiments/results/best_move_grid_more_seeds.json \
        --arms lr1e-5-cosine+anchor-0.1 lr2e-6-cosine+anchor-0.1 lr1e-5-cosine+anchor-0.1+p-temp-1.0 \
        --seeds 42 43 44 45 46
    python experiments/best_move_grid.py --from_result experiments/results/best_move_grid.json \
        experiments/results/best_move_grid_more_seeds.json \
        --arms lr1e-5-cosine+anchor-0.1 lr2e-6-cosine+anchor-0.1 lr1e-5-cosine+anchor-0.1+p-temp-1.0

Each finished run is kept in ``OUT.partial``; the same command again skips the runs it holds, so the grid can run
over several sessions (run it from a ``git worktree`` pinned at one commit, so edits on main cannot change what it
measures). ``--from_result`` also reads a ``.partial`` file: the table then says the grid is unfinished.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # for benchmarks/common.py
import grpo_grid as grid  # experiments/grpo_grid.py: the arms' recipes, run(), mean_se, t_stat
from common import STARTED_AT, finish  # benchmarks/common.py
from rookgrpo.chess.assets import VAL_POLICY  # the guard's validation panel's P: positions

CONTROL = "lr1e-5-cosine+anchor-0.1"  # the recipe as shipped when the grid ran (less its held-out evaluation and guard)
ARMS = [
    CONTROL,
    f"{CONTROL.split('+')[0]}+anchor-PA-0.1",  # the anchor on P: and A: lines (in place of A: lines only)
    "sft-only-PA",  # ... and its supervised-only control
    "lr2e-6-cosine+anchor-0.1",
    f"{CONTROL}+best-hit-1.0",
    f"{CONTROL}+format-1.0",
    f"{CONTROL}+entropy-0.01",
    f"{CONTROL}+p-temp-1.0",
]
SUPERVISED = {"sft-only-PA": f"{CONTROL.split('+')[0]}+anchor-PA-0.1"}  # a control: never shipped
STEPS, SEEDS, DEPTH = 200, [1, 2, 3, 4, 5], 8
DATA = "rookgrpo/tiny-rookworld-eval"
PRIMARY = [("best_move_accuracy", "best move"), ("format_rate", "greedy format")]
SECONDARY = [("move_rank_reward", "move-rank reward"), ("top5_accuracy", "top-5"), ("legal_move_rate", "legal"),
             ("env_exact_accuracy", "A: exact"), ("top_move_share", "top-move share"), ("nll_P", "NLL P:"),
             ("nll_A", "NLL A:")]
METRICS = PRIMARY + SECONDARY
# Kept per row (reported panel, P: rows in order) so a change can be paired by position: the validation panel's size
# is set from these (docs/experiments/2026-11-27-best-move-grid-plan.md, "The validation panel").
PER_ROW = ("best_move_accuracy", "format_rate")


@dataclass(frozen=True)
class Grid:
    """One pre-declared grid of this harness: its arms, its control and supervised controls, its rule, and where its
    plan is. ``up``: metrics that must rise with t ≥ 2 against the start; ``held``: metrics whose change must be above
    −1 standard error. With no arm meeting the rule, the GRPO arm that best holds greedy format is kept, among those
    whose best move rises with t ≥ 2 when ``fallback_best_up`` (else among all)."""

    script: str
    plan: str
    title: str
    control: str
    arms: list
    supervised: dict
    up: tuple = ("best_move_accuracy",)
    held: tuple = ("format_rate", "move_rank_reward", "env_exact_accuracy")
    fallback_best_up: bool = False
    metrics: list = field(default_factory=lambda: list(METRICS))
    panel: int = VAL_POLICY  # the guard's validation panel's P: positions, for the panel sizing table
    #: metrics that must not fall by more than ``-guard_t`` standard errors (t > guard_t), apart from ``held``
    guards: tuple = ()
    guard_t: float = -1.5
    #: metrics for which a rise is the bad direction (a rate of broken answers): their t is read with its sign flipped
    lower_better: tuple = ()
    #: arms that are references, never shipped (vanilla TRL)
    references: tuple = ()
    #: with no arm meeting the rule, the arm closest to it by the rule's order (best move up, then format held, then
    #: the most guards held, then the largest best-move gain), saying which condition it misses
    order_fallback: bool = False
    #: arms judged on another arm's trajectories by another selection rule: name -> (trained arm, floor metric): the
    #: guard's score, among the evaluated steps whose floor metric is not below the start's
    derived: dict = field(default_factory=dict)


BEST_MOVE = Grid(script="experiments/best_move_grid.py", plan="docs/experiments/2026-11-27-best-move-grid-plan.md",
                 title="Best-move grid: changes to the recipe as shipped before it", control=CONTROL, arms=ARMS,
                 supervised=SUPERVISED)


def rule(base: dict, rs: list[dict], spec: Grid = BEST_MOVE) -> dict:
    """The pre-declared rule on one arm's runs: best move up with t ≥ 2 against the start, greedy format's change
    above −1 standard error (t > −1), move-rank reward and A: exact not down (t > −1) (the best-move grid's; another
    grid's ``spec`` says its own)."""
    d = {}
    for k, _ in spec.metrics:
        mean, se = grid.mean_se([r["eval"][k] - base[k] for r in rs])
        d[k] = {"mean": mean, "se": se, "t": grid.t_stat(mean, se)}
    good = lambda k: -d[k]["t"] if k in spec.lower_better else d[k]["t"]  # noqa: E731  (t in the good direction)
    conditions = {f"{k} up (t ≥ 2)": good(k) >= 2 for k in spec.up}
    conditions.update({f"{k} held (t > -1)": good(k) > -1 for k in spec.held})
    conditions.update({f"{k} held (t > {spec.guard_t:g})": good(k) > spec.guard_t for k in spec.guards})
    d["conditions"] = conditions
    d["meets_rule"] = all(conditions.values())
    return d


def paired(runs: dict, arm: str, against: str, key: str) -> dict:
    by_seed = {r["seed"]: r["eval"][key] for r in runs.get(against, [])}
    mean, se = grid.mean_se([r["eval"][key] - by_seed[r["seed"]] for r in runs[arm] if r["seed"] in by_seed])
    return {"mean": mean, "se": se, "t": grid.t_stat(mean, se)}


def decide(base: dict, runs: dict, spec: Grid = BEST_MOVE) -> dict:
    """The arm the rule ships: of the GRPO arms that meet it, the largest mean best-move gain; if none does, the
    GRPO arm that best holds greedy format (largest mean format change; best-move gain breaks a tie), among those whose
    best move rises with t ≥ 2 where the grid's fallback asks it."""
    rules = {a: rule(base, rs, spec) for a, rs in runs.items() if len({r["seed"] for r in rs}) >= 2}
    candidates = [a for a in rules if a not in spec.supervised and a not in spec.references]
    meeting = [a for a in candidates if rules[a]["meets_rule"]]
    rising = [a for a in candidates if rules[a]["best_move_accuracy"]["t"] >= 2]
    if meeting:
        pick = max(meeting, key=lambda a: rules[a]["best_move_accuracy"]["mean"])
        why = "meets the rule with the largest best-move gain"
    elif candidates and spec.order_fallback:
        def closeness(a):
            met = list(rules[a]["conditions"].values())
            ups, helds = len(spec.up), len(spec.up) + len(spec.held)
            # the gain rounded: seeds' means summed in another order differ in the 17th digit, which is no lead
            return (all(met[:ups]), all(met[ups:helds]), sum(met[helds:]),
                    round(rules[a]["best_move_accuracy"]["mean"], 9))

        pick = max(candidates, key=closeness)  # on a tie, the first in the grid's order (the control first)
        missed = [c for c, ok in rules[pick]["conditions"].items() if not ok]
        why = f"no arm meets the rule: the closest by the rule's order, missing {'; '.join(missed)}"
        tied = [a for a in candidates if a != pick and closeness(a) == closeness(pick)]
        if tied:
            why += (f"; tied on every step of the order with {', '.join(tied)}, and first in the grid's order"
                    + (" (the control: nothing new ships)" if pick == spec.control else ""))
    elif candidates:
        pool = rising if spec.fallback_best_up and rising else candidates
        pick = max(pool, key=lambda a: (rules[a]["format_rate"]["mean"], rules[a]["best_move_accuracy"]["mean"]))
        why = ("no arm meets the rule: the arm that best holds greedy format" +
               (" with best move up" if spec.fallback_best_up and rising else ""))
    else:
        pick, why = None, "no arm measured"
    return {"rules": rules, "pick": pick, "why": why}


def floor_pick(heldout: dict, weights: dict, floor: str) -> int:
    """The step a guard with ``floor`` as a floor picks on one trajectory: the best guard score (``weights``: metric
    -> weight) among the evaluated steps whose ``floor`` metric is not below the start's; the earliest on a tie, as the
    guard keeps a step until another beats it. ``heldout``: step (as text) -> that evaluation's ``heldout/*``.

    >>> h = {"0": {"heldout/f": 0.9, "heldout/s": 1.0}, "20": {"heldout/f": 0.8, "heldout/s": 3.0},
    ...      "40": {"heldout/f": 0.95, "heldout/s": 2.0}}
    >>> floor_pick(h, {"heldout/s": 1.0}, "heldout/f")
    40
    """
    steps = sorted(int(s) for s in heldout)
    start = heldout[str(steps[0])][floor]
    eligible = [s for s in steps if heldout[str(s)][floor] >= start]
    score = lambda s: sum(w * heldout[str(s)][k] for k, w in weights.items())  # noqa: E731
    best = max(score(s) for s in eligible)
    return next(s for s in eligible if score(s) == best)


def derived_run(r: dict, floor: str, arm: str, settings, evaluate, per_row_keys) -> dict:
    """``r``'s trajectory judged by the weights a guard with ``floor`` as a floor picks (:func:`floor_pick`, with the
    run's guard's own metric), evaluated like the trained arms; the guard's own evaluation when it picks the same."""
    guard = next(c for c in grid.arm_spec(arm)["heldout"] if c["name"] == "heldout_guard")
    step = floor_pick(r["heldout"], guard["metric"], floor)
    out = {k: r[k] for k in ("seed", "measured", "steps", "seconds", "generated") if k in r}
    out["guard_step"] = step
    if step == r.get("guard_step"):
        return {**out, "eval": r["eval"], "per_row": r["per_row"], "same_as_guard": True}
    m = evaluate(grid.snapshot_model(r, step, f"{r['model']}-floor"), DATA, settings=settings, progress=False)
    return {**out, "eval": {k: v for k, v in m.items() if k not in ("samples", "model", *per_row_keys)},
            "per_row": {k: m["per_row"][k] for k in PER_ROW}, "same_as_guard": False}


def _arm_text(arm: str, spec: Grid) -> str:
    if arm in spec.derived:
        trained, floor = spec.derived[arm]
        return (f"the runs of `{trained}`, judged by the weights its guard picks with `{floor}` as a floor (the "
                "best guard score among the evaluated steps whose floor metric is not below the start's)")
    return grid.arm_text(arm)


def _cell(c: dict) -> str:
    return f"{c['mean']:+.3f} ± {c['se']:.3f} (t {c['t']:.1f})" if c["se"] == c["se"] else f"{c['mean']:+.3f}"


def panel_size(base: dict, rs: list[dict], key: str = "best_move_accuracy", panel: int = VAL_POLICY) -> dict | None:
    """How many P: positions a validation panel needs to see an arm's gain in ``key`` at 2 standard errors.

    A checkpoint is compared with the start on the same positions, so the noise is that of a paired change: per
    position the difference ``d`` in {-1, 0, 1}; its standard error on ``n`` positions is ``sd(d) / sqrt(n)``. From
    the arm's runs (the reported panel's per-row outcomes against the start's): the mean change ``m``, the per-position
    ``sd(d)``, the standard error at the guard's ``panel`` positions, and ``n = (2 sd / m)^2``, the positions for
    ``m`` to stand 2 standard errors out. ``None`` without per-row outcomes or with no mean gain."""
    start = base.get("per_row", {}).get(key)
    diffs = [[a - b for a, b in zip(r["per_row"][key], start)] for r in rs if "per_row" in r and start]
    if not diffs:
        return None
    flat = [d for ds in diffs for d in ds]
    mean = sum(flat) / len(flat)
    sd = statistics.pstdev(flat)
    need = math.ceil((2 * sd / mean) ** 2) if mean > 0 else None
    return {"mean": mean, "sd": sd, "se_at_panel": sd / math.sqrt(panel), "positions_needed": need,
            "flipped": sum(d != 0 for d in flat) / len(flat)}


def seed_text(seeds) -> str:
    """Seeds as runs of consecutive numbers.

    >>> seed_text([5, 1, 2, 3, 4, 42, 43, 44, 45, 46, 50])
    '1-5, 42-46, 50'
    """
    spans: list[list[int]] = []
    for s in sorted(set(seeds)):
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def command_text(argv: list[str], spec: Grid = BEST_MOVE) -> str:
    """The command as a user types it from the repository's root (paths under it made relative)."""
    root = Path(__file__).resolve().parents[1]

    def rel(a: str) -> str:
        p = Path(a)
        return str(p.resolve().relative_to(root)) if p.is_absolute() and p.resolve().is_relative_to(root) else a

    return " ".join([f"python {spec.script}", *map(rel, argv)])


def report(base: dict, runs: dict, partial: str | None = None, command: str | None = None,
           spec: Grid = BEST_MOVE) -> dict:
    """The tables, decision and panel sizing of ``runs``; ``command``: the one that made them (:func:`command_text`)."""
    METRICS, CONTROL, SUPERVISED, VAL_POLICY = spec.metrics, spec.control, spec.supervised, spec.panel  # noqa: N806
    decision = decide(base, runs, spec)
    rules = decision["rules"]
    lines = []
    guarded = any("guard_step" in r for rs in runs.values() for r in rs)
    if partial:
        lines += [f"Unfinished grid ({partial}): " + ", ".join(f"{a} {len(rs)}" for a, rs in runs.items()) +
                  " runs; a look, not a result.", ""]
    lines += ["Change against the start (mean ± standard error over seeds, t = mean / se); start: " +
              ", ".join(f"{label} {base[k]:.3f}" for k, label in METRICS) + ".", "",
              "| arm | seeds | " + " | ".join(label for _, label in METRICS) + " | P: groups format-flat"
              + (" | guard's step" if guarded else "") + " | meets the rule |",
              "|" + " --- |" * (len(METRICS) + 4 + guarded)]
    for arm, rs in runs.items():  # an arm with one seed is shown (a look), and judged from two
        if not rs:
            continue
        d = rules.get(arm) or rule(base, rs, spec)
        flat, _ = grid.mean_se([r.get("p_format_flat", float("nan")) for r in rs])
        meets = "yes" if d["meets_rule"] else "no" if arm in rules else "(one seed)"
        guard = [r["guard_step"] for r in rs if "guard_step" in r]
        guard_cell = f" | {', '.join(map(str, guard))}" if any("guard_step" in r for r_ in runs.values() for r in r_) else ""
        lines.append(f"| {arm} | {len(rs)} | " + " | ".join(_cell(d[k]) for k, _ in METRICS) + f" | {flat:.2f}"
                     + guard_cell + f" | {meets} |")
    lines += ["", f"Paired by seed against the control (`{CONTROL}`, the recipe as shipped when the grid ran) and, "
              "for the anchor arm, against its supervised-only control:", "",
              "| arm − against | " + " | ".join(label for _, label in METRICS) + " |", "|" + " --- |" * (len(METRICS) + 1)]
    pairs = {}
    for arm in runs:
        for against in ([CONTROL] if arm != CONTROL else []) + [a for a, g in SUPERVISED.items()
                                                                 if arm in (g if isinstance(g, tuple) else (g,))]:
            if runs[arm] and runs.get(against):
                cells = {k: paired(runs, arm, against, k) for k, _ in METRICS}
                pairs[f"{arm} − {against}"] = cells
                lines.append(f"| {arm} − {against} | " + " | ".join(_cell(cells[k]) for k, _ in METRICS) + " |")
    lines += ["", f"Decision: {decision['pick']} ({decision['why']})."]
    sizes = {a: panel_size(base, runs[a], panel=VAL_POLICY) for a in runs if a in rules}
    if any(sizes.values()):
        lines += ["", f"The validation panel (the guard's, {VAL_POLICY} P: positions): each arm's best-move change per "
                  "position against the start, on the reported panel; the standard error of that paired change at "
                  f"{VAL_POLICY} positions, and the positions a panel needs for the arm's mean gain to stand 2 "
                  "standard errors out:",
                  "", f"| arm | mean change | positions that flipped | se at {VAL_POLICY} | positions needed |",
                  "| --- | --- | --- | --- | --- |"]
        for arm, z in sizes.items():
            if z:
                lines.append(f"| {arm} | {z['mean']:+.3f} | {z['flipped']:.2f} | {z['se_at_panel']:.3f} | "
                             f"{z['positions_needed'] if z['positions_needed'] else 'no gain to resolve'} |")
    seeds = seed_text(r["seed"] for rs in runs.values() for r in rs)
    return {"title": f"{spec.title} (tiny-rookworld, 200 steps, seeds {seeds})",
            "description": f"Arms: " + "; ".join(f"`{a}`: {_arm_text(a, spec)}" for a in runs) + ". Greedy evaluation on "
                           f"the {base['n_policy']} P: and {base['n_env']} A: reported held-out positions ({DATA}), "
                           f"Stockfish depth {DEPTH}. Plan and rule: {spec.plan}.",
            "table": "\n".join(lines), "command": command, "start": base, "runs": runs, "paired": pairs,
            "decision": decision, "panel_size": sizes,
            "run_commits": sorted({r["measured"]["commit"] for rs in runs.values() for r in rs if "measured" in r})}


def main(argv=None, spec: Grid = BEST_MOVE, description: str | None = None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ARMS = spec.arms  # noqa: N806
    METRICS = spec.metrics  # noqa: N806
    ap = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--from_result", nargs="+", default=None, metavar="JSON",
                    help="re-table a result or its .partial; several (same start) are tabled as one, each arm's "
                         "runs joined (more seeds of some arms)")
    ap.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS, metavar="ARM", help="a subset, in this order")
    ap.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    args = ap.parse_args(argv)
    if args.from_result:
        saved = [json.loads(Path(f).read_text()) for f in args.from_result]
        for f, other in zip(args.from_result[1:], saved[1:]):
            if changed := grid.same_start(saved[0]["start"], other["start"]):
                ap.error(f"--from_result {f}: its start evaluates differently from {args.from_result[0]}'s "
                         f"({'; '.join(changed)}); only runs from one start can be tabled together")
        names = [*args.arms, *(d for d, (a, _) in spec.derived.items() if a in args.arms)]
        runs = {a: [r for s in saved for r in s["runs"].get(a, [])] for a in names}
        for arm, rs in runs.items():
            if len({r["seed"] for r in rs}) < len(rs):
                ap.error(f"--from_result: arm {arm} has a seed twice across {', '.join(args.from_result)}")
        unfinished = ", ".join(f for f, s in zip(args.from_result, saved) if "command" not in s) or None
        result = report(saved[0]["start"], {a: rs for a, rs in runs.items() if rs}, unfinished,
                        command_text(argv, spec), spec)
        result["measured"] = saved[0].get("measured", STARTED_AT)
        return finish(result, args.out)
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.evaluate import PER_ROW_KEYS, evaluate

    settings = EngineSettings(depth=DEPTH)
    partial = Path(f"{args.out}.partial") if args.out else None
    runs: dict[str, list[dict]] = {a: [] for a in [*ARMS, *spec.derived]}
    base = evaluate("rookgrpo/tiny-rookworld", DATA, settings=settings, progress=False)
    base = {k: v for k, v in base.items() if k not in ("samples", "per_row_cluster", "completions")}
    if partial is not None and partial.exists():
        done = json.loads(partial.read_text())
        if changed := grid.same_start(done["start"], base):
            ap.error(f"--out {args.out}: the start evaluates differently from {partial}'s ({'; '.join(changed)}); "
                     "move it away to start another grid")
        runs.update(done["runs"])
        print(f"resuming {partial}: {sum(map(len, runs.values()))} runs done", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # arms interleaved per seed, so machine load drifts alike
            for arm in args.arms:
                if any(r["seed"] == seed for r in runs[arm]):
                    continue
                r = grid.run(arm, seed, STEPS, tmp)
                m = evaluate(r["model"], DATA, settings=settings, progress=False)
                r.update(seed=seed, measured=STARTED_AT,
                         eval={k: v for k, v in m.items() if k not in ("samples", "model", *PER_ROW_KEYS)},
                         per_row={k: m["per_row"][k] for k in PER_ROW})
                runs[arm].append(r)
                print(f"seed {seed} {arm}: " + ", ".join(f"{label} {m[k]:.3f}" for k, label in METRICS), flush=True)
                for name, (trained, floor) in spec.derived.items():
                    if trained == arm and not any(x["seed"] == seed for x in runs.setdefault(name, [])):
                        d = derived_run(r, floor, arm, settings, evaluate, PER_ROW_KEYS)
                        runs[name].append(d)
                        print(f"seed {seed} {name} (step {d['guard_step']}): " +
                              ", ".join(f"{label} {d['eval'][k]:.3f}" for k, label in METRICS), flush=True)
                if partial is not None:
                    partial.write_text(json.dumps({"start": base, "runs": runs}, indent=1))
    return finish(report(base, {a: runs[a] for a in [*ARMS, *spec.derived] if runs.get(a)},
                         command=command_text(argv, spec), spec=spec),
                  args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
