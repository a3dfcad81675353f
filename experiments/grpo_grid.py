"""Held-out chess for the same generation budget: vanilla GRPOTrainer against rookgrpo's recipe, seed by seed.

Every arm starts from the packaged ``rookgrpo/tiny-rookworld``, trains on its shipped positions with the recipe's
chess rewards (the same reward objects, the same Stockfish settings) and stops at the same number of generated
completions, resampling rounds included. "The recipe" is ``recipes/rookworld-tiny.yaml`` as it was when the grid ran
(learning rate 5e-5, constant; :func:`grid_base`), not the one shipped since. Arms:

- ``vanilla``: TRL's ``GRPOTrainer`` with the recipe's fields, its fixed beta and one temperature (the recipe's
  ``temperature``), no resampling, TRL's own mixed-task batches; TRL scores a left-padded completion at positions
  shifted by its pad count on GPT-2 (docs/dynamics.md, "Scoring at the positions that sampled");
- ``vanilla_positions``: ``vanilla`` with the one correction rookgrpo turns on by default
  (``position_ids_from_mask``: :class:`rookgrpo.dynamics.positions.MaskPositions` on TRL's trainer), so the recipe's other
  components are compared with vanilla on the same scoring;
- ``rookgrpo``: ``RookGRPOTrainer`` with the recipe (zero-std resampling, adaptive beta, per-task
  sampling: task-homogeneous batches with the P: task a little cooler);
- ``rookgrpo_one_temperature``: the recipe without ``task_generation_kwargs``, so sampling is vanilla's (one
  temperature, mixed batches) and only resampling and adaptive beta differ: the confound between the first two.

The held-out evaluation is greedy, on the packaged evaluation positions (``rookgrpo/tiny-rookworld-eval``), at the
evaluation's Stockfish depth. Per arm: mean ± standard error over seeds; per seed, the change against vanilla's run
with the same seed (paired). The A: groups' zero-std share is measured on the reward calls themselves: a group of
A: completions is flat when its weighted A: rewards (``chess_env``, plus ``chess_env_board`` where the recipe has
it) have zero spread (TRL's ``isclose(std, 0)``); "before" counts the first generation of each step, "after" the
groups the loss optimised (after resampling; vanilla keeps them all).
The held-out callback (``chess_eval``) is left out of every arm (it does not change training, only the time), and so
is the guard that selects a checkpoint on it: an arm is judged by its last step's weights.

    python experiments/grpo_grid.py [--steps 100] [--seeds 1 2 3 4 5] [--arms vanilla rookgrpo ...]
    python experiments/grpo_grid.py --steps 200 --train_panel --arms vanilla rookgrpo lr1e-5-cosine ... \
        --out experiments/results/grpo_grid.json     (the grid of docs/experiments/2026-11-27-grpo-grid-plan.md)

With ``--out``, each finished run is also written to ``OUT.partial``; the same command run again (same steps, same
start) skips the runs it holds, so a grid can run over several sessions.
    python experiments/grpo_grid.py --from_result experiments/results/tiny_grpo_quality.json --out ...   (re-table)
    python experiments/grpo_grid.py --add_to RESULT --arms rookgrpo_one_temperature --out ...   (one more arm)

``--add_to`` trains only the arms named, at the saved result's steps and seeds, and tables them with its arms. It
refuses when the start's evaluation differs from the saved one (another model or evaluation), and the result keeps
each part's provenance: ``measured`` is the saved run's, ``added`` lists each later command with its own stamp.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # for benchmarks/common.py
from common import STARTED_AT, finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "rookworld-tiny.yaml"
# The arms are changes to the recipe as it was when the grid ran (commit f5efa08, before the grid's winner shipped):
# the shipped recipe with the shipped arm's changes undone (grid_base). The shipped arm is the GRPO grid's winner
# (docs/experiments/2026-11-27-grpo-grid-plan.md) with the best-move grid's pick (learning rate 2e-6 in place of 1e-5,
# docs/experiments/2026-11-27-best-move-grid-plan.md) and the B:-only anchor grid's (the anchor also on P: lines'
# B: move, the guard on the fresh panel selecting on best move too: docs/experiments/2026-11-29-b-anchor-grid-plan.md).
# Since the format-gate grid (docs/experiments/2026-12-01-format-gate-grid-plan.md; shipped by the reward rule,
# docs/experiments/2026-12-06-format-gate-ships.md) the guard holds greedy format as a floor, and the chess rewards
# charge ill-formed answers by default (so every arm run at a later commit does too).
# A test checks that it is the shipped recipe, held-out evaluation and guard included, so the two cannot drift apart.
SHIPPED_ARM = "lr2e-6-cosine+anchor-PB-0.1+guard-format-floor"
BEFORE_GRID = {"learning_rate": 5e-5, "lr_scheduler_type": "constant_with_warmup"}  # what SHIPPED_ARM's fields were
# Each arm: how it differs from the recipe before the grid (grid_base). ``set`` overrides recipe fields, ``drop``
# removes recipe keys, ``callbacks`` adds recipe callback entries, ``remove`` drops the recipe's callbacks of those
# names, ``weights`` sets every reward weight (0: no reward signal). The two vanilla arms train TRL's GRPOTrainer on
# the recipe's fields.
ANCHOR = {"name": "sft_anchor", "data": "rookgrpo/tiny-rookworld-grpo", "tasks": ["A"], "batch_size": 16}
ANCHOR_PB = {**ANCHOR, "tasks": ["P", "A"], "coef": 0.1, "score": "rookworld_best_move"}
# The held-out evaluation and guard of the B:-only anchor grid: the fresh validation panel, all of it, every 20 steps.
FRESH_GUARD = [
    {"name": "chess_eval", "data": "rookgrpo/tiny-rookworld-val-fresh", "n_policy": 288, "n_env": 32, "every": 20},
    {"name": "heldout_guard", "metric": {"heldout/best_move_accuracy": 1.0, "heldout/format_rate": 1.0,
                                         "heldout/move_rank_reward": 1.0, "heldout/env_exact_accuracy": 1.0}},
]
# The same guard choosing only among evaluations whose greedy format is not below the start's.
FLOOR_GUARD = [FRESH_GUARD[0], {**FRESH_GUARD[1], "floor": "heldout/format_rate"}]
ARM_SPECS: dict[str, dict] = {
    "vanilla": {},
    "vanilla_positions": {},
    "rookgrpo": {},
    "rookgrpo_one_temperature": {"drop": ["task_generation_kwargs"]},
    "lr5e-5-cosine": {"set": {"learning_rate": 5e-5, "lr_scheduler_type": "cosine"}},
    "lr1e-5-cosine": {"set": {"learning_rate": 1e-5, "lr_scheduler_type": "cosine"}},
    "lr2e-6-cosine": {"set": {"learning_rate": 2e-6, "lr_scheduler_type": "cosine"}},
    "scale-none": {"set": {"scale_rewards": "none"}},
    "dr-grpo": {"set": {"loss_type": "dr_grpo"}},
    "entropy-0.2": {"set": {"top_entropy_quantile": 0.2}},
    "anchor-0.1": {"callbacks": [{**ANCHOR, "coef": 0.1}]},
    "anchor-0.3": {"callbacks": [{**ANCHOR, "coef": 0.3}]},
    # The anchor's data and steps with no reward signal: what supervised steps alone give (no resampling, since
    # every group is flat).
    "sft-only": {"callbacks": [{**ANCHOR, "coef": 0.3}], "weights": 0.0, "remove": ["zero_std_resampling"]},
    # The best-move grid's levers (docs/experiments/2026-11-27-best-move-grid-plan.md), each a change to the shipped
    # recipe: the anchor on P: and A: lines; a reward paying the engine's best move apart from the rest of the top 5;
    # the format term weighted 4 times as much; TRL's entropy bonus; a hotter P: sample.
    "anchor-PA-0.1": {"callbacks": [{**ANCHOR, "tasks": ["P", "A"], "coef": 0.1}]},
    "best-hit-1.0": {"rewards": {f"{REPO / 'experiments' / 'levers.py'}:ChessBestHit": 1.0}},
    "format-1.0": {"reward_weights": {"chess_format": 1.0}},
    "entropy-0.01": {"set": {"entropy_coef": 0.01}},
    "p-temp-1.0": {"task_kwargs": {"P": {"temperature": 1.0}}},
    # The P:+A: anchor's lines, steps and schedule with every reward weighted 0: its supervised-only control.
    "sft-only-PA": {"set": {"learning_rate": 1e-5, "lr_scheduler_type": "cosine"},
                    "callbacks": [{**ANCHOR, "tasks": ["P", "A"], "coef": 0.1}], "weights": 0.0,
                    "remove": ["zero_std_resampling"]},
    # The B:-only anchor grid's levers (docs/experiments/2026-11-29-b-anchor-grid-plan.md): the anchor on P: lines
    # scored on their B: move alone and on A: lines whole; the held-out evaluation on the fresh validation panel with
    # the guard selecting on best move, format, move-rank reward and A: exact (an arm then runs as make train does and
    # is judged by the guard's weights); and the anchor's supervised-only control, with the guard.
    "anchor-PB-0.1": {"callbacks": [ANCHOR_PB]},
    "guard": {"heldout": FRESH_GUARD},
    "guard-format-floor": {"heldout": FLOOR_GUARD},
    "sft-only-PB": {"set": {"learning_rate": 1e-5, "lr_scheduler_type": "cosine"}, "callbacks": [ANCHOR_PB],
                    "weights": 0.0, "remove": ["zero_std_resampling"], "heldout": FRESH_GUARD},
    # The format-gate grid's (docs/experiments/2026-12-01-format-gate-grid-plan.md) reference: TRL's GRPOTrainer at
    # the shipped recipe's learning rate and schedule.
    "vanilla-shipped": {"set": {"learning_rate": 2e-6, "lr_scheduler_type": "cosine"}},
}
ARMS = tuple(ARM_SPECS)
# Arms whose lever lost its grid and was removed from the package: their saved runs still table (ARM_TEXT), but they
# no longer run. Each names its grid and how to find a commit that runs it: the lever's own file (the commit before
# the one that removed it, `git log -1 --format=%h -- FILE`), or the commit itself.
RETIRED = {"reference-credit": ("docs/experiments/2026-11-27-grpo-grid-plan.md",
                                "the commit before `git log -1 --format=%h -- src/rookgrpo/callbacks/reference_credit.py`"),
           "negative-A-0.25": ("docs/experiments/2026-11-27-grpo-grid-plan.md",
                               "the commit before `git log -1 --format=%h -- src/rookgrpo/callbacks/advantage_weights.py`"),
           # Not lost: on by default since docs/experiments/2026-12-06-format-gate-ships.md, so no longer a lever.
           "format-gate": ("docs/experiments/2026-12-01-format-gate-grid-plan.md", "081c42d")}
VANILLA_ARMS = ("vanilla", "vanilla_positions", "vanilla-shipped")  # TRL's GRPOTrainer: no resampling, so budget and
# flat share are fixed
ARM_TEXT = {
    "vanilla": "TRL's `GRPOTrainer` as it is (on GPT-2 it scores left-padded completions at shifted positions)",
    "vanilla_positions": "vanilla with rookgrpo's `position_ids_from_mask` hook, its one default-on correction",
    "rookgrpo": "`RookGRPOTrainer` with the recipe before the grid (learning rate 5e-5, constant; resampling, "
                "adaptive beta, per-task sampling)",
    "rookgrpo_one_temperature": "the recipe without `task_generation_kwargs` (vanilla's sampling)",
    "lr5e-5-cosine": "the recipe at learning rate 5e-5, cosine decay",
    "lr1e-5-cosine": "the recipe at learning rate 1e-5, cosine decay",
    "lr2e-6-cosine": "the recipe at learning rate 2e-6, cosine decay",
    "scale-none": "the recipe with `scale_rewards: none`",
    "dr-grpo": "the recipe with `loss_type: dr_grpo`",
    "entropy-0.2": "the recipe with `top_entropy_quantile: 0.2`",
    "reference-credit": "the recipe plus `reference_credit` on A:",
    "negative-A-0.25": "the recipe plus `advantage_weights` with A:'s negative advantages times 0.25",
    "anchor-0.1": "the recipe plus `sft_anchor` (A: lines, 16 per loss) at coef 0.1",
    "anchor-0.3": "the recipe plus `sft_anchor` (A: lines, 16 per loss) at coef 0.3",
    "sft-only": "`sft_anchor` at coef 0.3 with every reward weighted 0 and no resampling (supervised steps alone)",
    "anchor-PA-0.1": "the recipe plus `sft_anchor` on P: and A: lines (16 per loss) at coef 0.1",
    "best-hit-1.0": "the recipe plus `ChessBestHit` (experiments/levers.py: 1 for the engine's best move) at weight 1",
    "format-1.0": "the recipe with `chess_format` weighted 1.0 (not 0.25)",
    "entropy-0.01": "the recipe with TRL's `entropy_coef: 0.01`",
    "p-temp-1.0": "the recipe sampling P: at temperature 1.0 (not 0.5)",
    "sft-only-PA": "`sft_anchor` on P: and A: lines at coef 0.1, learning rate 1e-5 cosine, every reward weighted 0 "
                   "and no resampling (the P:+A: anchor's supervised steps alone)",
    "anchor-PB-0.1": "the recipe plus `sft_anchor` on P: lines scored on the B: move alone and on A: lines whole "
                     "(16 per loss, coef 0.1; `score: rookworld_best_move`)",
    "guard": "`chess_eval` on the fresh validation panel (288 P:, 32 A:) every 20 steps and `heldout_guard` on best "
             "move + format + move-rank reward + A: exact: judged by the guard's weights",
    "guard-format-floor": "`guard` choosing only among evaluations whose greedy format is not below the start's "
                          "(`floor: heldout/format_rate`): judged by the guard's weights",
    "sft-only-PB": "`sft_anchor` scored on the B: move (P:) and whole A: lines at coef 0.1, learning rate 1e-5 cosine, "
                   "every reward weighted 0 and no resampling, with the guard (the B:-only anchor's supervised steps "
                   "alone)",
    "format-gate": "the chess P: components (legality, move rank, candidates, evals) with `format_gate: true`: an "
                   "ill-formed answer keeps only `chess_format`'s credit",
    "vanilla-shipped": "TRL's `GRPOTrainer` with the shipped recipe's fields (learning rate 2e-6, cosine; its beta, "
                       "one temperature, no resampling, anchor or guard): judged by its last step's weights",
}
# The levers an arm can combine with ``+`` (e.g. ``lr1e-5-cosine+anchor-0.1``: the grid's ``best`` arm, named by what it
# combines): the recipe's changes, not the vanilla arms, the recipe itself or the supervised control.
BASELINES = ("vanilla", "vanilla_positions", "rookgrpo", "rookgrpo_one_temperature", "vanilla-shipped")  # what the
# grid's levers change
CONTROLS = ("sft-only", "sft-only-PA", "sft-only-PB")  # supervised steps alone: arms of their own, not levers
LEVERS = tuple(a for a in ARMS if a not in (*BASELINES, *CONTROLS))


def arm_spec(arm: str) -> dict:
    """An arm's spec; ``a+b`` combines the levers' changes: fields set, keys dropped, callbacks added and removed.
    Two levers that set the same field (two learning rates) or add the same callback do not combine.

    >>> arm_spec("lr1e-5-cosine+anchor-0.1")["set"]["learning_rate"]
    1e-05
    """
    if arm in ARM_SPECS:
        return ARM_SPECS[arm]
    if retired := [p for p in arm.split("+") if p in RETIRED]:
        grid, commit = RETIRED[retired[0]]
        raise ValueError(f"arm {arm!r}: {', '.join(retired)} is no longer a lever (it lost its grid and was removed, "
                         f"or became the package's default: {grid}); to rerun its arms, check out {commit}")
    parts = arm.split("+")
    unknown = [p for p in parts if p not in LEVERS]
    if len(parts) < 2 or unknown:
        raise ValueError(f"arm {arm!r}: not an arm, nor levers joined by '+' (not levers: {', '.join(unknown)}); arms: "
                         f"{', '.join(ARMS)}; levers: {', '.join(LEVERS)}")
    if len(set(parts)) < len(parts):
        raise ValueError(f"arm {arm!r}: a lever named twice; name each once")
    spec: dict = {"set": {}, "drop": [], "callbacks": [], "remove": [], "rewards": {}, "reward_weights": {},
                  "task_kwargs": {}}
    for part in parts:
        s = ARM_SPECS[part]
        for key in ("heldout", "gate"):
            if key in s:
                spec[key] = s[key]
        for key in ("set", "rewards", "reward_weights", "task_kwargs"):
            if clash := set(s.get(key, {})) & set(spec[key]):
                raise ValueError(f"arm {arm!r}: {part} sets {', '.join(sorted(clash))}, which another part sets too")
            spec[key].update(s.get(key, {}))
        names = {c["name"] for c in spec["callbacks"]}
        if clash := {c["name"] for c in s.get("callbacks", ())} & names:
            raise ValueError(f"arm {arm!r}: {part} adds {', '.join(sorted(clash))}, which another part adds too")
        spec["callbacks"] += list(s.get("callbacks", ()))
        spec["drop"] += list(s.get("drop", ()))
        spec["remove"] += list(s.get("remove", ()))
    return spec


def arm_text(arm: str) -> str:
    """An arm's description; a combination's names its parts."""
    if arm in ARM_TEXT:
        return ARM_TEXT[arm]
    return "the recipe with every change of " + " and ".join(f"`{p}`" for p in arm.split("+"))


def arm_name(text: str) -> str:
    """``--arms`` values: an arm, or levers joined by '+' (checked here, before anything trains)."""
    try:
        arm_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


METRICS = [("move_rank_reward", "move-rank reward"), ("best_move_accuracy", "best move"), ("top5_accuracy", "top-5"), ("legal_move_rate", "legal"),
           ("env_exact_accuracy", "A: exact"), ("best_move_reward", "best-move reward"), ("format_rate", "greedy format"),
           ("env_broken_rate", "A: not a board")]


class CompletionBudget(TrainerCallback):
    """Stops training once the completions generated (extra resampling rounds included) reach ``budget``."""

    def __init__(self, budget: int, trainer):
        self.budget, self.generated, self.trainer = budget, 0, trainer
        self._seen_extra = 0

    def on_step_end(self, args, state, control, **kwargs):
        metrics = self.trainer._metrics["train"]
        extra = sum(metrics.get("resample/extra_completions", [])[self._seen_extra:])
        self._seen_extra = len(metrics.get("resample/extra_completions", []))
        self.generated += args.per_device_train_batch_size * args.world_size + int(extra)
        if self.generated >= self.budget:
            control.should_training_stop = True

    def on_log(self, args, state, control, **kwargs):
        self._seen_extra = 0  # TRL clears its metric lists after logging


class FlatGroups:
    """Wraps the A: reward; counts A: groups with zero reward spread, first generation of a step vs. resampled.

    The spread is that of the weighted sum of the recipe's A: rewards (``chess_env``, and ``chess_env_board`` where
    the recipe has it: ``others`` as ``(reward, weight)``), which is what TRL normalises."""

    def __init__(self, reward, num_generations: int, weight: float = 1.0, others=()):
        self.reward, self.G, self.weight, self.others = reward, num_generations, weight, list(others)
        self.__name__ = getattr(reward, "__name__", type(reward).__name__)
        self.trainer, self.step = None, -1
        self.first = [0, 0]  # [flat, all] A: groups in each step's first generation
        self.resampled = [0, 0]
        self.a_steps: set[int] = set()  # global steps whose first generation had A: groups

    def __getattr__(self, name):  # setup(), name, ... of the wrapped reward
        return getattr(self.reward, name)

    def __call__(self, prompts, completions, **kwargs):
        scores = self.reward(prompts, completions, **kwargs)
        total = [None if s is None else self.weight * s for s in scores]
        for reward, weight in self.others:
            total = [t if t is None or o is None else t + weight * o
                     for t, o in zip(total, reward(prompts, completions, **kwargs))]
        step = self.trainer.state.global_step if self.trainer else 0
        first = step != self.step
        count = self.first if first else self.resampled
        self.step = step
        for start in range(0, len(scores) - self.G + 1, self.G):
            group = total[start:start + self.G]
            if any(s is None for s in group):
                continue
            if first:
                self.a_steps.add(step)
            mean = sum(group) / self.G
            std = math.sqrt(sum((s - mean) ** 2 for s in group) / (self.G - 1))
            count[0] += std <= 1e-8
            count[1] += 1
        return scores


# The held-out evaluation and the guard that selects a checkpoint on it: no arm runs them (an arm is judged by its last
# step's weights); the shipped recipe adds them to the winning arm.
HELDOUT_CALLBACKS = ("chess_eval", "heldout_guard")


def _name(entry) -> str:
    return entry if isinstance(entry, str) else entry.get("name")


def grid_base() -> dict:
    """The recipe the grid's arms change: the shipped recipe with :data:`SHIPPED_ARM`'s changes undone (its fields set
    back to :data:`BEFORE_GRID`, the callbacks it adds taken out)."""
    recipe = yaml.safe_load(RECIPE.read_text())
    added = {c["name"] for c in arm_spec(SHIPPED_ARM).get("callbacks", ())}
    recipe["callbacks"] = [c for c in recipe.get("callbacks", []) if _name(c) not in added]
    recipe.update(BEFORE_GRID)
    return recipe


def arm_recipe(arm: str, tmp: str) -> str:
    """The recipe an arm runs: :func:`grid_base` changed as the arm's spec says, without the held-out callback and
    the guard that selects on it (an arm is judged by its last step's weights), unless the arm brings its own
    (``heldout``: then it is judged by the guard's weights, as make train's run is)."""
    spec = arm_spec(arm)
    recipe = grid_base()
    removed = (*HELDOUT_CALLBACKS, *spec.get("remove", ()))
    recipe["callbacks"] = [c for c in recipe.get("callbacks", []) if _name(c) not in removed] + list(
        spec.get("callbacks", ())) + list(spec.get("heldout", ()))
    for key in spec.get("drop", ()):
        recipe.pop(key, None)
    recipe.update(spec.get("set", {}))
    for name, weight in spec.get("rewards", {}).items():  # rewards an arm adds, with their weights
        recipe["reward_funcs"] = [*recipe["reward_funcs"], name]
        recipe["reward_weights"] = [*recipe["reward_weights"], weight]
    for name, weight in spec.get("reward_weights", {}).items():
        recipe["reward_weights"][recipe["reward_funcs"].index(name)] = weight
    for task, kwargs in spec.get("task_kwargs", {}).items():  # per-task sampling changed, the rest kept
        recipe["task_generation_kwargs"] = {**recipe["task_generation_kwargs"],
                                            task: {**recipe["task_generation_kwargs"].get(task, {}), **kwargs}}
    if "weights" in spec:
        recipe["reward_weights"] = [spec["weights"]] * len(recipe["reward_funcs"])
    path = Path(tmp) / f"{arm.replace('+', '_')}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def run(arm: str, seed: int, steps: int, tmp: str) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    from rookgrpo.dynamics.positions import MaskPositions
    from rookgrpo.train import build_trainer

    out = f"{tmp}/{arm}-{seed}"
    argv = [arm_recipe(arm, tmp), "--seed", str(seed), "--max_steps", str(steps), "--output_dir", out,
            "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"]
    trainer, _, model_path = build_trainer(argv)
    G = trainer.num_generations
    budget = steps * trainer.args.per_device_train_batch_size * trainer.args.world_size
    names = list(trainer.reward_func_names)
    weights = trainer.reward_weights.tolist()
    flat = FlatGroups(trainer.reward_funcs[names.index("chess_env")], G, weights[names.index("chess_env")],
                      [(trainer.reward_funcs[i], weights[i]) for i, n in enumerate(names) if n == "chess_env_board"])
    # P: groups whose format reward is flat (one score for all 8 samples): where a format term can teach nothing.
    fmt = FlatGroups(trainer.reward_funcs[names.index("chess_format")], G)
    if arm in VANILLA_ARMS:
        fields = {k: getattr(trainer.args, k) for k, f in GRPOConfig.__dataclass_fields__.items()
                  if f.init and hasattr(trainer.args, k)}
        fields.update(output_dir=out)
        fields.pop("generation_batch_size", None)  # derived from steps_per_generation; TRL rejects both
        funcs = [{"chess_env": flat, "chess_format": fmt}.get(name, f) for name, f in zip(names, trainer.reward_funcs)]
        # The recipe's trainer resolved the rewards by name with its Stockfish settings; vanilla gets the same objects.
        trainer = GRPOTrainer(model=model_path, reward_funcs=funcs, args=GRPOConfig(**fields),
                              train_dataset=trainer.train_dataset)
        # TRL loaded the model from its path, a fresh object; vanilla scores as TRL does, and the positions arm
        # gets the one hook.
        hooked = MaskPositions(trainer, enabled=arm == "vanilla_positions")
        if arm == "vanilla_positions" and "policy" not in hooked.installed:
            raise RuntimeError(f"vanilla_positions: the policy did not get the positions hook ({hooked.skipped})")
        budget_cb = None
    else:
        trainer.reward_funcs[names.index("chess_env")] = flat
        trainer.reward_funcs[names.index("chess_format")] = fmt
        budget_cb = CompletionBudget(budget, trainer)
        trainer.add_callback(budget_cb)
    flat.trainer = fmt.trainer = trainer
    logs = LogRecorder()
    trainer.add_callback(logs)
    snapshots = None
    if arm_spec(arm).get("heldout"):  # the weights of every held-out evaluation, for other selection rules
        every = next(c["every"] for c in arm_spec(arm)["heldout"] if c["name"] == "chess_eval")
        snapshots = EvalSnapshots(f"{out}/snapshots", every)
        trainer.add_callback(snapshots)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(out)  # with a guard: the weights it handed back
    guard = [h["heldout_guard/best_step"] for h in trainer.state.log_history if "heldout_guard/best_step" in h]
    heldout = {}
    for h in trainer.state.log_history:
        values = {k: v for k, v in h.items() if k.startswith("heldout/")}
        if values:
            heldout.setdefault(h["step"], {}).update(values)
    return {"model": out, "steps": trainer.state.global_step, "seconds": seconds,
            **({"guard_step": guard[-1]} if guard else {}),
            **({"heldout": {str(k): v for k, v in sorted(heldout.items())}, "snapshots": snapshots.folder}
               if snapshots else {}),
            "generated": budget if budget_cb is None else budget_cb.generated,
            "a_groups": flat.first[1], "a_flat_before": flat.first[0] / flat.first[1] if flat.first[1] else float("nan"),
            "a_flat_after": logs.a_flat_after(arm, flat),
            "p_format_flat": fmt.first[0] / fmt.first[1] if fmt.first[1] else float("nan"), **logs.flat_all()}


class EvalSnapshots(TrainerCallback):
    """Keeps the model's weights at each held-out evaluation (step 0 and every ``every`` steps) in ``folder``
    (``step-N.pt``), so a selection rule other than the run's guard can be judged on the same trajectory."""

    def __init__(self, folder: str, every: int):
        self.folder, self.every = folder, int(every)

    def _save(self, model, step: int) -> None:
        import torch

        Path(self.folder).mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, f"{self.folder}/step-{step}.pt")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self._save(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self._save(model, state.global_step)


def snapshot_model(run: dict, step: int, out: str) -> str:
    """A model folder holding the weights ``run`` had at ``step`` (its :class:`EvalSnapshots`), beside the run's own
    config and tokenizer."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(run["model"], out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("snapshots", "checkpoint-*"))
    model = AutoModelForCausalLM.from_pretrained(run["model"])
    model.load_state_dict(torch.load(f"{run['snapshots']}/step-{step}.pt", weights_only=True))
    model.save_pretrained(out)
    return out


class LogRecorder(TrainerCallback):
    """Keeps each step's logged metrics (logging_steps 1: one entry per step)."""

    def __init__(self):
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "frac_reward_zero_std" in logs:
            # The step this log describes generated its batch at global step state.global_step - 1.
            self.logs.append({**logs, "generated_at": state.global_step - 1})

    def flat_all(self) -> dict:
        """All groups (both tasks): TRL's zero-std share of the sampled batch and of the optimised one."""
        before = [x["frac_reward_zero_std"] for x in self.logs]
        after = [x.get("optimised/frac_reward_zero_std", x["frac_reward_zero_std"]) for x in self.logs]
        return {"flat_before": statistics.mean(before) if before else float("nan"),
                "flat_after": statistics.mean(after) if after else float("nan")}

    def a_flat_after(self, arm: str, flat: FlatGroups) -> float:
        """A: groups flat in the optimised batch. Vanilla optimises what it sampled; the shipped recipe's batches are
        one task each, so its A: steps' optimised share is the A: share; mixed batches (the one-temperature arm)
        do not tell the tasks apart there, so it is not reported (nan)."""
        if arm in VANILLA_ARMS:
            return flat.first[0] / flat.first[1] if flat.first[1] else float("nan")
        if arm == "rookgrpo_one_temperature":
            return float("nan")
        # A: batches as the reward calls saw them: a P: batch's chess_env mean (nan) can reach the logs as None.
        a_steps = [x["optimised/frac_reward_zero_std"] for x in self.logs
                   if x["generated_at"] in flat.a_steps and "optimised/frac_reward_zero_std" in x]
        return statistics.mean(a_steps) if a_steps else float("nan")


def mean_se(values):
    """Mean and standard error over seeds, skipping nan (a run with no A: group, say)."""
    values = [v for v in values if v == v]
    if not values:
        return float("nan"), float("nan")
    mean = statistics.mean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan"))


# Paired comparisons (arm, against): each arm against vanilla; the recipe against vanilla with the positions
# correction, which isolates the recipe's other components (both score alike); the ablation against the same, which
# isolates resampling and adaptive beta (its only differences from it); and the recipe against its ablation, which
# isolates per-task sampling (the only difference between the two).
PAIRS = [("vanilla_positions", "vanilla"), ("rookgrpo", "vanilla"), ("rookgrpo", "vanilla_positions"),
         ("rookgrpo_one_temperature", "vanilla"), ("rookgrpo_one_temperature", "vanilla_positions"),
         ("rookgrpo", "rookgrpo_one_temperature")]
# The grid's levers: each against vanilla and against the recipe it changes; the anchor arms also against the
# supervised steps alone, so a gain is credited to GRPO only beyond what those give.
GRID = [a for a in ARM_TEXT if a not in BASELINES]
PAIRS += [(a, against) for a in GRID for against in ("vanilla", "rookgrpo")]
PAIRS += [(a, "sft-only") for a in ("anchor-0.1", "anchor-0.3")]


PRIMARY = [("move_rank_reward", "move-rank reward"), ("env_exact_accuracy", "A: exact")]  # pre-declared in the plan


def t_stat(mean: float, se: float) -> float:
    """mean / se; with no spread (every seed alike) a change is certain in its direction (±inf) and none is 0, so
    an arm whose seeds all lost the same is not read as undecided."""
    if se != se or mean != mean:
        return float("nan")
    mean, se = round(mean, 12), round(se, 12)  # float noise in differences of equal changes is no spread
    if se == 0:
        return 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return mean / se


def _t(t) -> str:
    return "" if t is None or t != t else f"{t:.1f}"


def decide(base: dict, runs: dict[str, list[dict]]) -> dict:
    """The plan's decision rule, per arm: each primary metric's change against the start (mean ± se over seeds, t),
    t paired by seed against vanilla and the recipe, and whether the arm meets the rule (a primary metric up with
    t ≥ 2 against the start, neither down with t < -1). Arms with fewer than two seeds are left out (no spread).
    For reading, not for the rule: t paired against ``sft-only`` (supervised steps with no reward), which raised the
    held-out move-rank reward too, so what a GRPO arm gains beyond it is what the reward taught."""
    out = {}
    for arm, rs in runs.items():
        if len({r["seed"] for r in rs}) < 2:
            continue
        d = {}
        for k, _ in PRIMARY:
            mean, se = mean_se([r["eval"][k] - base[k] for r in rs])
            d[k] = {"mean": mean, "se": se, "t": t_stat(mean, se)}
            for against, key in (("vanilla", "t_vanilla"), ("rookgrpo", "t_recipe"), ("sft-only", "t_sft")):
                if against in runs and against != arm:
                    other = {r["seed"]: r["eval"][k] for r in runs[against]}
                    m, e = mean_se([r["eval"][k] - other[r["seed"]] for r in rs if r["seed"] in other])
                    d[k][key] = t_stat(m, e)
        ts = [d[k]["t"] for k, _ in PRIMARY]
        d["meets_rule"] = any(t >= 2 for t in ts) and not any(t < -1 for t in ts)
        out[arm] = d
    return out


def report(base: dict, runs: dict[str, list[dict]], steps: int, seeds: list[int], eval_depth: int) -> dict:
    """The result (title, description, table, paired changes) from the start's evaluation and the arms' runs."""
    header = "| arm | " + " | ".join(label for _, label in METRICS) + \
        " | A: groups flat, sampled → optimised | all groups flat, sampled → optimised | steps | completions | minutes |"
    rows = [header, "|" + " --- |" * (len(METRICS) + 6),
            "| start (packaged model) | " + " | ".join(f"{base[k]:.3f}" for k, _ in METRICS) + " | | | 0 | 0 | |"]
    for arm, rs in runs.items():
        cells = []
        for k, _ in METRICS:
            mean, se = mean_se([r["eval"][k] for r in rs])
            cells.append(f"{mean:.3f} ± {se:.3f}")
        share = {k: mean_se([r[k] for r in rs])[0] for k in ("a_flat_before", "a_flat_after", "flat_before",
                                                               "flat_after")}
        rows.append(f"| {arm} | " + " | ".join(cells) + f" | {share['a_flat_before']:.2f} → {share['a_flat_after']:.2f} | "
                    f"{share['flat_before']:.2f} → {share['flat_after']:.2f} | "
                    f"{statistics.mean(r['steps'] for r in rs):.0f} | {statistics.mean(r['generated'] for r in rs):.0f} "
                    f"| {statistics.mean(r['seconds'] for r in rs) / 60:.1f} |")
    paired_rows = ["", "Paired by seed, arm minus the arm it is compared with (mean ± standard error over seeds; "
                   "t = mean / se):", "", "| arm − against | " + " | ".join(label for _, label in METRICS) + " |",
                   "|" + " --- |" * (len(METRICS) + 1)]
    paired = {}
    # A combination against vanilla, the recipe and each lever it combines (and the anchor's supervised control).
    combos = [(arm, against) for arm in runs if arm not in ARM_SPECS
              for against in ("vanilla", "rookgrpo", *arm.split("+"),
                              *(["sft-only"] if any(p.startswith("anchor-") for p in arm.split("+")) else []))]
    for arm, against in PAIRS + combos:
        if arm not in runs or against not in runs:
            continue
        cells = []
        by_seed = {k: {r["seed"]: r["eval"][k] for r in runs[against]} for k, _ in METRICS}
        for k, _ in METRICS:
            mean, se = mean_se([r["eval"][k] - by_seed[k][r["seed"]] for r in runs[arm] if r["seed"] in by_seed[k]])
            # Against vanilla the key is the arm's alone, as results written before the other pairs have it.
            paired[f"{arm}/{k}" if against == "vanilla" else f"{arm}-{against}/{k}"] = {"mean": mean, "se": se}
            cells.append(f"{mean:+.3f} ± {se:.3f} (t {_t(t_stat(mean, se))})" if se == se else f"{mean:+.3f}")
        paired_rows.append(f"| {arm} − {against} | " + " | ".join(cells) + " |")
    if all("eval_train" in r for rs in runs.values() for r in rs) and runs:
        primary = PRIMARY
        paired_rows += ["", "The same runs on the 1,024 GRPO positions (`rookgrpo/tiny-rookworld-train`; trained on, "
                        "so this measures fit, not transfer), primary metrics, mean ± standard error over seeds:", "",
                        "| arm | " + " | ".join(label for _, label in primary) + " |",
                        "|" + " --- |" * (len(primary) + 1)]
        for arm, rs in runs.items():
            cells = [f"{mean:.3f} ± {se:.3f}" for mean, se in (mean_se([r["eval_train"][k] for r in rs])
                                                               for k, _ in primary)]
            paired_rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    decision = decide(base, runs)
    if decision:
        paired_rows += ["", "The plan's decision rule (docs/experiments/2026-11-27-grpo-grid-plan.md): an arm ships when it "
                        "raises a primary metric with t ≥ 2 against the start and lowers neither with t < −1; it wins "
                        "a metric against vanilla and the recipe when t ≥ 2 against both. Change against the start "
                        "(mean ± standard error over seeds, t), and t paired by seed against vanilla and the recipe (and, "
                        "for reading only, against `sft-only`: supervised steps with no reward):",
                        "", "| arm | " + " | ".join(f"{label} − start | t vs vanilla | t vs recipe | t vs sft-only"
                                                    for _, label in PRIMARY) + " | meets the rule |",
                        "|" + " --- |" * (4 * len(PRIMARY) + 2)]
        for arm, d in decision.items():
            cells = []
            for k, _ in PRIMARY:
                c = d[k]
                cells += [f"{c['mean']:+.3f} ± {c['se']:.3f} (t {c['t']:.1f})", _t(c.get("t_vanilla")),
                          _t(c.get("t_recipe")), _t(c.get("t_sft"))]
            paired_rows.append(f"| {arm} | " + " | ".join(cells) + f" | {'yes' if d['meets_rule'] else 'no'} |")
    n = base["n_policy"] + base["n_env"]
    # The train-panel table needs every run evaluated there: the command that reproduces it names the flag.
    train_flag = " --train_panel" if all("eval_train" in r for rs in runs.values() for r in rs) else ""
    return {
        "title": f"Held-out chess for the same generation budget (tiny-rookworld, {steps} steps, {len(seeds)} seeds "
                 "per arm)",
        "description": "Arms change `recipes/rookworld-tiny.yaml` as it was when the grid ran (learning rate 5e-5, "
                       f"constant; its winner ships since); {steps} steps of vanilla `GRPOTrainer` (fixed beta, one "
                       "temperature, no resampling); arms: " + "; ".join(f"`{a}`: {arm_text(a)}" for a in runs) +
                       ". Every arm stops at vanilla's number of generated completions. Greedy evaluation on the "
                       f"{n} held-out positions ({base['n_policy']} P:, {base['n_env']} A:), Stockfish depth "
                       f"{eval_depth}; mean ± standard error over seeds.",
        "table": "\n".join(rows + paired_rows),
        "command": f"python experiments/grpo_grid.py --steps {steps} --seeds "
                   f"{' '.join(map(str, seeds))}{train_flag} --arms {' '.join(runs)}",
        "start": base, "runs": runs, "paired": paired, "decision": decision,
        # A grid resumed over several sessions: the commits its runs were measured at (each run keeps its stamp).
        "run_commits": sorted({r["measured"]["commit"] for rs in runs.values() for r in rs if "measured" in r}),
    }


def saved_result(path: str, flag: str, ap) -> tuple[dict, int, list[int]]:
    """A result this script wrote, with the steps and seeds its command ran. A grid's ``OUT.partial`` (no command:
    the grid has not finished) gives the seeds it holds; its table is marked as unfinished (each run keeps its stamp:
    the result's ``run_commits``)."""
    saved = json.loads(Path(path).read_text())
    if flag == "--from_result" and "command" not in saved and {"steps", "start", "runs"} <= set(saved):
        runs = {arm: rs for arm, rs in saved["runs"].items() if rs}
        seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
        saved = {**saved, "runs": runs, "partial": sum(map(len, runs.values())),
                 "command": f"python experiments/grpo_grid.py --steps {saved['steps']} --seeds "
                            f"{' '.join(map(str, seeds))} --arms {' '.join(runs)} (unfinished: {path})"}
        return saved, saved["steps"], seeds
    missing = [k for k in ("command", "start", "runs", "measured") if k not in saved]
    if missing:
        ap.error(f"{flag} {path}: no {', '.join(missing)}; pass a result this script wrote with --out "
                 "(experiments/results/tiny_grpo_quality.json)")
    command = saved["command"].split()
    steps = int(command[command.index("--steps") + 1])
    after = command[command.index("--seeds") + 1:]
    seeds = [int(s) for s in after[:next((i for i, s in enumerate(after) if not s.isdigit()), len(after))]]
    return saved, steps, seeds


def same_start(saved: dict, fresh: dict) -> list[str]:
    """The metrics on which a fresh evaluation of the start differs from a saved one (empty when it is the same)."""
    keys = [k for k, _ in METRICS] + ["n_policy", "n_env", "engine_depth"]
    return [f"{k} {saved.get(k)} → {fresh.get(k)}" for k in keys
            if not (isinstance(saved.get(k), (int, float)) and isinstance(fresh.get(k), (int, float))
                    and abs(saved[k] - fresh[k]) <= 1e-9)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="vanilla's steps; the others stop at its completions")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--arms", nargs="+", type=arm_name, default=list(ARMS), metavar="ARM",
                    help=f"arms: {', '.join(ARMS)}; or levers joined by '+' (e.g. lr1e-5-cosine+anchor-0.1)")
    ap.add_argument("--eval_depth", type=int, default=8)
    ap.add_argument("--train_panel", action="store_true",
                    help="also evaluate each run on the 1,024 GRPO positions (trained on: fit, not transfer)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from_result", default=None, metavar="JSON",
                    help="rewrite the table from a result this script wrote (its runs and provenance), training nothing")
    ap.add_argument("--add_to", default=None, metavar="JSON",
                    help="train only --arms, at the steps and seeds of a result this script wrote, and table them "
                         "with its arms")
    args = ap.parse_args(argv)
    if args.from_result:
        saved, steps, seeds = saved_result(args.from_result, "--from_result", ap)
        result = report(saved["start"], saved["runs"], steps, seeds, int(saved["start"]["engine_depth"]))
        for key in ("command", "measured", "added"):  # the numbers are the saved runs', not this rewrite's
            if key in saved:
                result[key] = saved[key]
        if "partial" in saved:  # a grid part way: say so above the table, with how many runs it holds
            held = {arm: len(rs) for arm, rs in saved["runs"].items()}
            result["title"] += f" (unfinished: {saved['partial']} runs)"
            result["table"] = (f"Unfinished grid, {saved['partial']} runs (" +
                               ", ".join(f"{arm} {n}" for arm, n in held.items()) +
                               "): a look, not a result.\n\n" + result["table"])
        return finish(result, args.out)
    saved = None
    if args.add_to:
        saved, args.steps, args.seeds = saved_result(args.add_to, "--add_to", ap)
        args.eval_depth = int(saved["start"]["engine_depth"])
        again = [a for a in args.arms if a in saved["runs"]]
        if again:
            ap.error(f"--arms: {', '.join(again)} already in {args.add_to}; name only arms it does not have")
    elif "vanilla" not in args.arms:
        ap.error("--arms: the comparison is against vanilla; include it")
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.evaluate import PER_ROW_KEYS, evaluate

    settings = EngineSettings(depth=args.eval_depth)
    data = "rookgrpo/tiny-rookworld-eval"
    runs: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    with tempfile.TemporaryDirectory() as tmp:
        base = evaluate("rookgrpo/tiny-rookworld", data, settings=settings, progress=False)
        base = {k: v for k, v in base.items() if k not in ("samples", *PER_ROW_KEYS)}
        if saved is not None and (changed := same_start(saved["start"], base)):
            ap.error(f"--add_to {args.add_to}: the packaged model's evaluation differs from the saved start "
                     f"({'; '.join(changed)}); its arms describe another model or evaluation, rerun them all")
        partial = Path(f"{args.out}.partial") if args.out else None
        others: dict[str, list[dict]] = {}
        if partial is not None and partial.exists():  # a grid stopped part way: keep the runs it finished
            done = json.loads(partial.read_text())
            # Another grid's runs (other steps, or a start that evaluates differently) are never mixed in, nor
            # silently overwritten: the user moves the file or changes --out.
            if done.get("steps") != args.steps:
                ap.error(f"--out {args.out}: {partial} holds runs of --steps {done.get('steps')}, not {args.steps}; "
                         "pass its steps to resume it, or move it away to start another grid")
            if changed := same_start(done.get("start", {}), base):
                ap.error(f"--out {args.out}: the packaged model's evaluation differs from the start {partial} was "
                         f"measured from ({'; '.join(changed)}); move it away to start another grid")
            def named(arm: str, r: dict) -> bool:  # a run this command would train
                return arm in runs and r["seed"] in args.seeds

            for arm, rs in done["runs"].items():
                if arm in runs:
                    runs[arm] = [r for r in rs if named(arm, r)]
            # Runs of arms or seeds this command does not name stay in the file.
            others = {arm: [r for r in rs if not named(arm, r)] for arm, rs in done["runs"].items()}
            print(f"resuming {partial}: {sum(map(len, runs.values()))} runs done", flush=True)
        for seed in args.seeds:  # arms interleaved per seed, so machine load drifts alike
            for arm in args.arms:
                if any(r["seed"] == seed for r in runs[arm]):
                    continue
                r = run(arm, seed, args.steps, tmp)
                keep = ("samples", "model", *PER_ROW_KEYS)
                m = evaluate(r["model"], data, settings=settings, progress=False)
                r.update(seed=seed, eval={k: m[k] for k in m if k not in keep}, measured=STARTED_AT)
                if args.train_panel:
                    t = evaluate(r["model"], "rookgrpo/tiny-rookworld-train", settings=settings, progress=False)
                    r["eval_train"] = {k: t[k] for k in t if k not in keep}
                runs[arm].append(r)
                print(f"seed {seed} {arm}: " + ", ".join(f"{k} {m[k]:.3f}" for k, _ in METRICS), flush=True)
                if partial is not None:
                    every = {a: sorted(others.get(a, []) + runs.get(a, []), key=lambda r: r["seed"])
                             for a in dict.fromkeys([*ARMS, *runs, *others]) if others.get(a) or runs.get(a)}
                    partial.write_text(json.dumps({"steps": args.steps, "start": base, "runs": every}, indent=1))
    if saved is None:
        return finish(report(base, runs, args.steps, args.seeds, args.eval_depth), args.out)
    every = {arm: (saved["runs"].get(arm) or runs[arm]) for arm in dict.fromkeys([*ARMS, *saved["runs"], *runs])
             if arm in saved["runs"] or arm in runs}
    result = report(saved["start"], every, args.steps, args.seeds, args.eval_depth)
    result["command"], result["measured"] = saved["command"], saved["measured"]  # the saved arms' own
    added = {"arms": list(args.arms), "measured": STARTED_AT,
             "command": f"python experiments/grpo_grid.py --add_to {args.add_to} --arms {' '.join(args.arms)}"
                        + (" --train_panel" if args.train_panel else "")}
    result["added"] = saved.get("added", []) + [added]
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
