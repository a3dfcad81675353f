"""Prompt selection on real training runs: completions per signal-bearing group and held-out quality, per arm.

The packaged chess model (``rookgrpo/tiny-rookworld``) trains on ``--n-prompts`` of its positions (few, so the budget
passes over them several times: selection needs a history) with a sparse binary reward. Two regimes (``--regime``):

- ``top5``: P: positions, 1 when the B: move is in the engine's top 5 (``chess_move_rank > 0``), else 0. Many
  positions are too hard for the model, so their groups are all-fail (flat) again and again;
- ``env_exact``: A: positions, 1 when the whole next-state line is exact (``chess_env == 1``), else 0. Most moves are
  easy for the model, so their groups are all-pass (flat) again and again: the strong-model regime.

Every arm runs until it has generated the same number of completions (``--budget``); arms:

- ``vanilla``: TRL as it is (flat groups are trained on, with zero advantage);
- ``dapo``: DAPO's dynamic sampling as verl runs it (``filter_groups``): a generation batch of 3x the trained
  batch's prompts, groups without reward spread dropped, the first informative ones trained on and the excess
  dropped; another 3x batch when too few were informative (``zero_std_resampling`` with ``oversample: 3``, at most
  2 extra rounds);
- ``resampling``: ``zero_std_resampling`` (max 2 extra rounds, drawing as many prompts as groups came out flat);
- ``greso+resampling``: ``prompt_selection`` with GRESO's rule, then resampling for what still comes out flat;
- ``posterior+resampling``: ``prompt_selection`` with the posterior rule, then resampling;
- ``passrate+resampling``: ``prompt_selection`` with the pass-rate rule (both rewards here are binary), then
  resampling;
- ``passrate-target+resampling``: the pass-rate rule as a threshold on the chance of signal, moved to hold the flat
  share at 0.25 (``target_flat``, GRESO's target), then resampling.

Per arm, mean ± standard error over seeds: completions generated per signal-bearing group trained on (the groups
of the optimised batches with reward spread; lower is better), generate calls and wall seconds per signal group,
optimizer steps taken within the budget, and held-out quality after the run (greedy on the held-out positions of
the regime's task: top-5 accuracy for P:, exact next state for A:). Ratios are paired by seed.

    python benchmarks/bench_selection.py [--regime top5] [--seeds 3] [--first-seed 1] [--budget 1600] [--arms dapo,...]
        [--diagnostics]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time

from common import finish  # benchmarks/common.py

ARMS = {
    "vanilla": [],
    "dapo": [{"name": "zero_std_resampling", "max_rounds": 2, "oversample": 3}],
    "resampling": [{"name": "zero_std_resampling", "max_rounds": 2}],
    "greso+resampling": [{"name": "prompt_selection", "rule": "greso", "target_flat": 0.25},
                         {"name": "zero_std_resampling", "max_rounds": 2}],
    "posterior+resampling": [{"name": "prompt_selection", "rule": "posterior"},
                             {"name": "zero_std_resampling", "max_rounds": 2}],
    "passrate+resampling": [{"name": "prompt_selection", "rule": "passrate"},
                            {"name": "zero_std_resampling", "max_rounds": 2}],
    "passrate-target+resampling": [{"name": "prompt_selection", "rule": "passrate", "target_flat": 0.25},
                                   {"name": "zero_std_resampling", "max_rounds": 2}],
}


class Top5Binary:
    """1.0 when the B: move is in the engine's top 5 (``chess_move_rank > 0``), else 0.0; None on A: rows."""

    __name__ = "top5_binary"

    def __init__(self, inner=None):
        from rookgrpo.chess.rewards import ChessMoveRank

        self.inner = inner or ChessMoveRank()

    def setup(self, args):
        return Top5Binary(self.inner.setup(args))

    def __call__(self, prompts, completions, **kwargs):
        return [None if r is None else float(r > 0) for r in self.inner(prompts, completions, **kwargs)]


class EnvExactBinary:
    """1.0 when the A: completion is exactly the next state (``chess_env == 1``), else 0.0; None on P: rows."""

    __name__ = "env_exact_binary"

    def __init__(self):
        from rookgrpo.chess.rewards import ChessEnv

        self.inner = ChessEnv()

    def setup(self, args):
        return self

    def __call__(self, prompts, completions, **kwargs):
        return [None if r is None else float(r == 1.0) for r in self.inner(prompts, completions, **kwargs)]


REGIMES = {"top5": ("P", Top5Binary), "env_exact": ("A", EnvExactBinary)}


def run(arm: str, seed: int, budget: int, out: str, n_prompts: int, regime: str = "top5",
        diagnostics: bool = False) -> dict:
    from transformers import TrainerCallback

    from bench_resampling import Counter
    from rookgrpo import RookGRPOConfig, RookGRPOTrainer
    from rookgrpo.callbacks import RookCallback
    from rookgrpo.callbacks.zero_std import no_signal_groups
    from rookgrpo.chess.data import load_rookworld

    task, reward = REGIMES[regime]
    data = load_rookworld("rookgrpo/tiny-rookworld-train", tasks=[task])
    data = data.select(range(min(n_prompts, len(data))))
    args = RookGRPOConfig(output_dir=out, seed=seed, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                          learning_rate=5e-5, lr_scheduler_type="constant", beta=0.0, num_generations=8,
                          per_device_train_batch_size=32, max_completion_length=96, temperature=0.8,
                          loss_type="dapo", max_steps=10_000, logging_steps=5, disable_tqdm=True,
                          disable_dropout=True, stockfish_depth=8)
    signal = {"groups": 0}

    class SignalCount(RookCallback):  # an observer: runs after resampling, on the batch that is optimised
        state_key = "signal_count"

        def on_scored_batch(self, trainer, scored):
            if trainer.model.training:
                flat = no_signal_groups(trainer, scored.output, scored.rewards_per_func)
                signal["groups"] += int((~flat).sum())

    class Budget(TrainerCallback):
        def on_step_end(self, a, state, control, **kwargs):
            if counter.completions >= budget:
                control.should_training_stop = True

    trainer = RookGRPOTrainer(model="rookgrpo/tiny-rookworld", reward_funcs=[reward()], args=args,
                              train_dataset=data, callbacks=[*(["diagnostics", "doctor"] if diagnostics else []), *ARMS[arm],
                                                             SignalCount()])
    counter = Counter(trainer)
    trainer.add_callback(Budget())
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(out)
    last = [h for h in trainer.state.log_history if "select/flat_after_flat" in h]
    persistence = {k: last[-1].get(f"select/flat_after_{k}") for k in ("flat", "signal")} if last else None
    return {"arm": arm, "seed": seed, "steps": trainer.state.global_step, "completions": counter.completions,
            "flat_after": persistence,
            "generate_calls": counter.calls, "signal_groups": signal["groups"], "seconds": seconds,
            "model": out}


def _mean_se(values: list[float]) -> str:
    if not all(math.isfinite(v) for v in values):  # a run without signal (inf) or a ratio of two such runs (nan)
        return "/".join(f"{v:.3g}" for v in values) + " (per seed)"
    mean = statistics.mean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return f"{mean:.3g} ± {se:.2g}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1, help="seeds run from this one on")
    ap.add_argument("--budget", type=int, default=1600)
    ap.add_argument("--n-prompts", type=int, default=48,
                    help="training positions: few enough that the budget passes over them several times, as it must "
                         "for a history to exist")
    ap.add_argument("--regime", choices=sorted(REGIMES), default="top5")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated subset of {', '.join(ARMS)} (runs are deterministic per seed, so an arm "
                         "measured alone matches its numbers in a full run)")
    ap.add_argument("--eval_depth", type=int, default=8)
    ap.add_argument("--diagnostics", action="store_true",
                    help="add the diagnostics and doctor callbacks to every arm (they do not change a run): the "
                         "doctor's findings, e.g. completions running on to max_completion_length, go to the log")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.diagnostics:
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        ap.error(f"--arms: {unknown} not among {list(ARMS)}")

    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.evaluate import evaluate

    settings = EngineSettings(depth=args.eval_depth)
    held_out = "rookgrpo/tiny-rookworld-eval"
    base = evaluate("rookgrpo/tiny-rookworld", held_out, settings=settings, progress=False)
    quality, quality_label = (("top5_accuracy", "held-out top-5 accuracy") if args.regime == "top5" else
                              ("env_exact_accuracy", "held-out A: exact accuracy"))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for arm in arms:  # interleaved, so machine load drifts over all arms alike
                r = run(arm, seed, args.budget, f"{tmp}/{arm}-{seed}", args.n_prompts, args.regime, args.diagnostics)
                m = evaluate(r.pop("model"), held_out, settings=settings, progress=False)
                r.update(quality=m[quality], legal=m.get("legal_move_rate", float("nan")))
                runs.append(r)
                print(r, flush=True)
    lines = ["| arm | completions per signal group | generate calls per signal group | seconds per signal group | "
             f"steps in budget | {quality_label} | held-out legal-move rate |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    per_arm = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]
        # A run that trained on no signal group spent its whole budget for nothing: infinite cost, not its total.
        per = {k: [r[k] / r["signal_groups"] if r["signal_groups"] else float("inf") for r in rs]
               for k in ("completions", "generate_calls", "seconds")}
        per_arm[arm] = per
        lines.append(f"| {arm} | {_mean_se(per['completions'])} | {_mean_se(per['generate_calls'])} | "
                     f"{_mean_se(per['seconds'])} | {_mean_se([r['steps'] for r in rs])} | "
                     f"{_mean_se([r['quality'] for r in rs])} | {_mean_se([r['legal'] for r in rs])} |")
    after = [r["flat_after"] for r in runs if r.get("flat_after") and None not in r["flat_after"].values()]
    ratios = []
    selectors = [arm for arm in arms if arm.endswith("+resampling")]
    pairs = [("dapo", arm) for arm in ["resampling", *selectors]] + [("resampling", arm) for arm in selectors]
    pairs += [(a, b) for i, a in enumerate(selectors) for b in selectors[i + 1:]]
    for base_arm, arm in [(a, b) for a, b in pairs if a in arms and b in arms]:
        paired = [a / b for a, b in zip(per_arm[base_arm]["completions"], per_arm[arm]["completions"])]
        ratios.append(f"{base_arm} / {arm}: {_mean_se(paired)}")
    lines += ["", f"Start (packaged model): {quality_label} {base[quality]:.3f} ± {base[quality + '_se']:.3f}. "
              "Completions per signal group, paired by seed (above 1: the second arm spends fewer; the target is 2 "
              "against dapo): " + "; ".join(ratios) + "."]
    if after:
        lines += ["", "How predictable flatness was (selection arms, end of run): a redrawn prompt's group came out flat "
                  f"again in {_mean_se([a['flat'] for a in after])} of redraws after a flat group and in "
                  f"{_mean_se([a['signal'] for a in after])} after a group with signal."]
    result = {
        "title": f"Prompt selection on real training runs, {args.regime} regime: completions per signal group "
                 f"({args.seeds} seeds"
                 + (f" from {args.first_seed}" if args.first_seed != 1 else "")
                 + (f", arms {', '.join(arms)}" if arms != list(ARMS) else "") + f", {args.budget} completions each)",
        "description": (f"tiny-rookworld on {args.n_prompts} of its {'P' if args.regime == 'top5' else 'A'}: "
                        f"positions with a binary reward ({args.regime}: "
                        f"{'B: in the engine top 5' if args.regime == 'top5' else 'exact next state'}), "
                        f"batches of 4 prompts x 8 completions, each arm stopped after {args.budget} generated "
                        "completions; mean ± standard error over seeds. Held-out: greedy on the held-out positions, "
                        f"Stockfish depth {args.eval_depth}."),
        "runs": runs, "regime": args.regime, "start": {quality: base[quality]},
        "table": "\n".join(lines),
        "command": f"python benchmarks/bench_selection.py --regime {args.regime} --seeds {args.seeds} "
                   + (f"--first-seed {args.first_seed} " if args.first_seed != 1 else "") +
                   f"--budget {args.budget} --n-prompts {args.n_prompts}"
                   + (f" --arms {args.arms}" if arms != list(ARMS) else ""),
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main()
    sys.exit(0)
