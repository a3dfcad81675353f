"""``rookgrpo rewards audit``: what fixed degenerate answers earn under a recipe's own rewards and weights.

GRPO optimises what a reward pays. If a constant move, an exhaustive move list or a copy of the input earns a good
share of what the right answer earns, a policy finds that answer and the reward rises while the model gets worse.
The audit scores fixed policies on real positions with the recipe's reward functions, weights and engine settings,
summed the way TRL sums them (weighted, ``None`` skipped), and reports each as a share of the right answer's reward.

Policy task (``P:`` rows), each a full completion (``M: ... E: ... B: ...``):

- ``engine best``: M: the engine's top 5 with its evals, B: its best move (the reference answer);
- ``engine 2nd`` / ``engine 5th``: the same M: and E:, B: the engine's 2nd / 5th move;
- ``random legal``: M: up to 5 random legal moves with E: 0.0, B: the first of them;
- ``constant pawn move``: ``a2a3`` (white to move) or ``a7a6`` (black), as M: and B:, E: 0.0;
- ``constant knight move``: ``g1f3`` (white) or ``g8f6`` (black), as M: and B:, E: 0.0: the generic opening move
  GRPO on the packaged model drifts towards (README.md), legal and often among the engine's top 5 in an opening;
- ``all legal moves``: M: every legal move with E: 0.0, B: the engine's best;
- ``best move repeated``: M: the engine's best five times with its eval, B: the best (what a model writes that has
  not learned to leave out a listed move, under greedy decoding);
- ``legal move repeated``: M: the ``random legal`` answer's first move five times with E: 0.0, B: that move;
- ``constant evals``: the reference with every eval replaced by 0.0;
- ``one eval too many``: the reference with a ``0.0`` eval after the last (E: one longer than M:): every ill-formed
  answer GRPO added in the shipped recipe's ``make train`` runs had an E: list one longer or shorter than its M: list
  (docs/results.md);
- ``one eval too few``: the reference with its last eval left out (E: one shorter than M:);
- ``an eval not a number``: the reference with its last eval written ``-``;
- ``a sixth move``: the reference with a sixth M: move (a legal one outside the engine's top 5) and its ``0.0``
  eval: a list one longer than RookWorld's five (twice among the broken answers of those runs); in a position with
  no legal move outside the top 5, the best move again.

Environment task (``A:`` rows; when the data has none, one per ``P:`` position playing its B: label), split into
rows whose move is legal and rows whose move is illegal:

- ``exact``: the ground truth; ``copy FEN``: the input FEN with ``+0.001+0+0``; ``copy FEN, side flipped``;
- ``board right, rest copied``: the new piece placement with the input's side, castling, en passant and clocks,
  and ``+0.001+0+0``;
- ``wrong flags``: the exact new FEN with a wrong reward and terminated flag;
- ``ranks run together``: the exact answer with the placement's first ``/`` left out (seven ranks, not a FEN; read
  square by square it is the right board);
- ``one rank a square short``: the exact answer with the last square of black's second rank left out (``8``
  becomes ``7``): the broken board GRPO on the packaged model wrote most (docs/experiments/2026-11-23-tiny-model-builds.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import chess

from ..chess.engine import MATE_SCORE, Analysis, EngineSettings, get_pool
from ..chess.formats import (
    env_step,
    format_eval,
    is_legal,
    parse_env,
    parse_policy,
    split_env,
    split_policy,
    task_of,
)
from ..errors import ConfigError

REFERENCE = "engine best"
ENV_REFERENCE = "exact"


def _eval_text(cp: int) -> str:
    if abs(cp) >= MATE_SCORE - 1000:  # mate in n: ±(1000 - n/100) pawns, as RookWorld writes mates (±999.xx)
        return format_eval(math.copysign(1000 - (MATE_SCORE - abs(cp)) / 100, cp))
    return format_eval(cp / 100)


def _line(moves: Sequence[str], evals: Sequence[str], best: str) -> str:
    return f" M: {' '.join(moves)} E: {' '.join(evals)} B: {best}"


def policy_answers(fen: str, analysis: Analysis, rng: random.Random) -> dict[str, str]:
    """The degenerate ``P:`` completions for one position (see the module docstring)."""
    board = chess.Board(fen)
    legal = [m.uci() for m in board.legal_moves]
    top, evals = list(analysis.moves), [_eval_text(cp) for cp in analysis.scores]
    sample = rng.sample(legal, min(5, len(legal)))
    pawn, knight = ("a2a3", "g1f3") if board.turn == chess.WHITE else ("a7a6", "g8f6")
    sixth = next((m for m in legal if m not in top), top[0])  # a legal move the top 5 leaves out, else the best again
    return {
        REFERENCE: _line(top, evals, top[0]),
        "engine 2nd": _line(top, evals, top[min(1, len(top) - 1)]),
        "engine 5th": _line(top, evals, top[min(4, len(top) - 1)]),
        "random legal": _line(sample, ["0.0"] * len(sample), sample[0]),
        "constant pawn move": _line([pawn], ["0.0"], pawn),
        "constant knight move": _line([knight], ["0.0"], knight),
        "all legal moves": _line(legal, ["0.0"] * len(legal), top[0]),
        "best move repeated": _line([top[0]] * 5, [evals[0]] * 5, top[0]),
        "legal move repeated": _line([sample[0]] * 5, ["0.0"] * 5, sample[0]),
        "constant evals": _line(top, ["0.0"] * len(top), top[0]),
        "one eval too many": _line(top, [*evals, "0.0"], top[0]),
        "one eval too few": _line(top, evals[:-1], top[0]),
        "an eval not a number": _line(top, [*evals[:-1], "-"], top[0]),
        "a sixth move": _line([*top, sixth], [*evals, "0.0"], top[0]),
    }


def env_answers(prompt: str) -> dict[str, str]:
    """The degenerate ``A:`` completions for one prompt (see the module docstring)."""
    fields = parse_env(prompt)
    truth = env_step(fields.fen, fields.move, fields.history)
    parts, new = fields.fen.split(), truth.new_fen.split()
    flipped = " ".join([parts[0], "b" if parts[1] == "w" else "w", *parts[2:]])
    wrong = "+0.001+0+0" if truth.terminated == "1" or truth.truncated == "1" else "+1.0+1+0"
    return {
        ENV_REFERENCE: truth.completion(),
        "copy FEN": f"{fields.fen}+0.001+0+0",
        "copy FEN, side flipped": f"{flipped}+0.001+0+0",
        "board right, rest copied": " ".join([new[0], *parts[1:]]) + "+0.001+0+0",
        "wrong flags": truth.new_fen + wrong,
        "ranks run together": truth.completion().replace("/", "", 1),
        "one rank a square short": truth.completion().replace(new[0], _rank_short(new[0], 1), 1),
    }


def _rank_short(placement: str, rank: int) -> str:
    """``placement`` with the last square of its ``rank``-th rank (0 = black's back rank) left out.

    >>> _rank_short("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR", 1), _rank_short("8/8/8/8/8/8/8/K6k", 1)
    ('rnbqkbnr/ppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR', '8/7/8/8/8/8/8/K6k')
    """
    ranks = placement.split("/")
    last = ranks[rank][-1:]
    ranks[rank] = ranks[rank][:-1] + (str(int(last) - 1) if last in "2345678" and last else "")
    return "/".join(ranks)


@dataclass
class AuditTable:
    """Mean reward per component and weighted total, per degenerate policy, on one set of rows."""

    title: str
    n_rows: int
    components: list[str]
    reference: str
    rows: dict[str, dict[str, float]] = field(default_factory=dict)  # policy -> component (and "total") -> mean

    def share(self, policy: str) -> float:
        """The policy's weighted reward as a share of the reference answer's (NaN when the reference earns 0)."""
        ref = self.rows[self.reference]["total"]
        return self.rows[policy]["total"] / ref if ref > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "n_rows": self.n_rows, "components": self.components,
                "reference": self.reference, "rows": self.rows,
                "share": {p: self.share(p) for p in self.rows}}


def score_policies(reward_funcs: Sequence[Callable], weights: Sequence[float], prompts: Sequence[str],
                   answers: Sequence[dict[str, str]], title: str, reference: str) -> AuditTable:
    """Score every policy's answers with every reward; weighted totals summed the way TRL does (``None`` skipped)."""
    names = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs]
    table = AuditTable(title=title, n_rows=len(prompts), components=[], reference=reference)
    if not prompts:
        return table
    for policy in answers[0]:
        completions = [a[policy] for a in answers]
        totals = [0.0] * len(prompts)
        row: dict[str, float] = {}
        for name, func, weight in zip(names, reward_funcs, weights):
            values = func(prompts=list(prompts), completions=completions, completion_ids=None)
            if all(v is None for v in values):
                continue  # not this task's reward
            if name not in table.components:
                table.components.append(name)
            row[name] = sum(v for v in values if v is not None) / len(values)
            totals = [t + weight * v if v is not None else t for t, v in zip(totals, values)]
        row["total"] = sum(totals) / len(totals)
        table.rows[policy] = row
    return table


def derive_env_prompts(policy_prompts: Sequence[str], labels: Sequence[str]) -> list[str]:
    """``A:`` prompts from ``P:`` positions: each plays its labelled move (legal or not), history = that move."""
    out = []
    for prompt, move in zip(policy_prompts, labels):
        fen = parse_policy(prompt + " M:").fen
        if move:
            out.append(f"A: {fen}+{move}+{move}+")
    return out


def audit(reward_funcs: Sequence[Callable], weights: Sequence[float] | None, lines: Sequence[str],
          settings: EngineSettings, n: int | None = None, seed: int = 0, title: str = "") -> list[AuditTable]:
    """Audit ``reward_funcs`` (with ``weights``) on RookWorld ``lines`` (full ``P:``/``A:`` lines).

    Returns three tables: ``P:`` rows, ``A:`` rows with a legal move, ``A:`` rows with an illegal move. ``settings``
    is the engine used to build the reference answers (the recipe's, so the reference is what its rewards call best).
    """
    weights = list(weights) if weights is not None else [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(reward_funcs)} reward_funcs.")
    p_lines = [line for line in lines if task_of(line) == "P"][:n]
    a_lines = [line for line in lines if task_of(line) == "A"][:n]
    p_prompts = [split_policy(line)[0] for line in p_lines]
    rng = random.Random(seed)
    tables = []
    if p_prompts:
        fens = [parse_policy(line).fen for line in p_lines]
        analyses = get_pool(settings).analyse_many(fens)
        keep = [i for i, a in enumerate(analyses) if a.moves]  # finished games have no move to judge
        answers = [policy_answers(fens[i], analyses[i], rng) for i in keep]
        tables.append(score_policies(reward_funcs, weights, [p_prompts[i] for i in keep], answers,
                                     f"{title}P: rows", REFERENCE))
    if a_lines:
        env_prompts = [split_env(line)[0] for line in a_lines]
        source = "A: rows"
    else:
        env_prompts = derive_env_prompts(p_prompts, [parse_policy(line).best for line in p_lines])
        source = "A: rows derived from the P: positions and their B: labels"
    legal, illegal = [], []
    for prompt in env_prompts:
        fields = parse_env(prompt)
        (legal if is_legal(chess.Board(fields.fen), fields.move) else illegal).append(prompt)
    for group, label in ((legal, "legal move"), (illegal, "illegal move")):
        if group:
            tables.append(score_policies(reward_funcs, weights, group, [env_answers(p) for p in group],
                                         f"{title}{source}, {label}", ENV_REFERENCE))
    return tables


def format_tables(tables: Sequence[AuditTable]) -> str:
    """Markdown tables: per policy, each component's mean, the weighted total and its share of the reference."""
    out = []
    for table in tables:
        if not table.rows:
            continue
        header = ["answer", *table.components, "weighted", "share of reference"]
        out.append(f"{table.title} ({table.n_rows})\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
        for policy, row in table.rows.items():
            cells = [f"{row[c]:.3f}" for c in table.components]
            out.append("| " + " | ".join([policy, *cells, f"{row['total']:.3f}", f"{table.share(policy):.0%}"]) + " |")
        out.append("")
    return "\n".join(out)


def recipe_rewards(recipe: dict[str, Any]) -> tuple[list[Callable], list[float], EngineSettings]:
    """The recipe's reward functions (configured as the trainer would), weights and engine settings."""
    from ..config import RookGRPOConfig
    from ..trainer import _setup_reward
    from ..rewards.registry import resolve_reward_func

    entries = recipe.get("reward_funcs")
    if not entries:
        raise ConfigError("reward_funcs: the recipe names no reward functions to audit.")
    entries = entries if isinstance(entries, list) else [entries]
    defaults = {f: RookGRPOConfig.__dataclass_fields__[f].default for f in
                ("stockfish_path", "stockfish_depth", "stockfish_nodes", "stockfish_workers")}
    args = _Args(**{k: recipe.get(k, v) for k, v in defaults.items()})
    funcs = []
    for entry in entries:
        func = resolve_reward_func(entry)
        if isinstance(func, str):
            raise ConfigError(f"reward_funcs: {entry!r} is a reward model; the audit scores reward functions only.")
        funcs.append(_setup_reward(func, args))
    weights = recipe.get("reward_weights") or [1.0] * len(funcs)
    settings = EngineSettings().with_args(args)
    return funcs, [float(w) for w in weights], settings


@dataclass
class _Args:
    """The config fields rewards read in ``setup(args)``."""

    stockfish_path: str | None
    stockfish_depth: int | None
    stockfish_nodes: int | None
    stockfish_workers: int | None
