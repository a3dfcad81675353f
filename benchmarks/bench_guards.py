"""What the numerical and held-out guards cost: step time under DeepSpeed ZeRO-3 on 2 CPU processes, and the host
memory ``heldout_guard`` holds, against the same run without them.

Table 1, ZeRO-3 on 2 CPU processes (the packaged ``zero3`` config through ``rookgrpo train``, as a user without a GPU
runs it): a 4-layer char GPT-2 (width 128), 30 steps per launch, arms launched in turn for ``--rounds`` rounds:

- ``none``: ``skip_nonfinite_updates: false`` (nothing keeps a non-finite step out but DeepSpeed's own check);
- ``skip_nonfinite``: as shipped (a hook on every trainable parameter flags a non-finite gradient, a step pre-hook on
  the optimizer DeepSpeed steps shares the verdict over the ranks: ``rookgrpo.dynamics.nonfinite``);
- ``heldout_eval``: as shipped, plus a held-out evaluation every 5 steps (a scripted score, rising at every one);
- ``heldout_guard``: the same with the guard, which copies each rank's share of the fp32 master weights at every new
  best (here every evaluation: its worst case); the last step is the best, so nothing is restored.

Per launch, TRL's median ``step_time`` (steps 4-30: generation, loss, backward and, under DeepSpeed, the engine's
optimizer step) and the wall time per step (``train_runtime`` / steps, evaluations and callbacks included); the ratio
of each arm to its reference (``none`` for ``skip_nonfinite``, ``heldout_eval`` for ``heldout_guard``) per round, and
the median and range of those ratios over rounds.

Table 2, peak host memory (``memory/process_peak``, the process's peak resident set, rank 0) with and without the
guard, one process and ZeRO-3 on 2 processes, a 6-layer width-512 char GPT-2 (19M parameters: 73 MiB in fp32), 10
steps with an evaluation every 2 whose score rises: the guard's copy is replaced at every evaluation, and the start's
is dropped at the first. What it should hold: one copy of the rank's share of the trainable weights in fp32 (all of
them on one process; half under ZeRO-3 on 2).

    python benchmarks/bench_guards.py [--rounds 3] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
_calls = {"n": 0}


def rising_score(model, tokenizer, rows):
    """A held-out evaluator whose score rises at every evaluation (a forward of the first prompt, as a real one runs):
    every evaluation is a new best, the guard's worst case for copies."""
    import torch

    ids = tokenizer([rows[0]["prompt"]], return_tensors="pt")
    with torch.no_grad():
        model(**ids)
    _calls["n"] += 1
    return {"score": float(_calls["n"])}


def _model(folder: Path, n_layer: int, n_embd: int) -> Path:
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    return build_tiny_gpt2(folder, TinyGPT2Spec(n_layer=n_layer, n_head=4, n_embd=n_embd))


def _launch(tmp: Path, name: str, model: Path, layout: str, steps: int, every: int, arm: dict) -> dict:
    """One training launch; returns its log history (rank 0) and run_info."""
    import yaml

    out = tmp / name
    callbacks = ["diagnostics"]
    if arm.get("eval"):
        callbacks.append({"heldout_eval": {"data": "rookgrpo/smoke-prompts", "every": every, "n": 1,
                                           "evaluator": f"{HERE}:rising_score"}})
    if arm.get("guard"):
        callbacks.append({"heldout_guard": {"metric": "heldout/score"}})
    recipe = {"model_name_or_path": str(model), "dataset_name": "rookgrpo/smoke-prompts",
              "reward_funcs": ["uci_charset"], "callbacks": callbacks, "seed": 3, "use_cpu": True, "bf16": False,
              "report_to": "none", "save_strategy": "no", "learning_rate": 1e-3, "beta": 0.0, "max_steps": steps,
              "per_device_train_batch_size": 8, "num_generations": 8, "max_completion_length": 32,
              "logging_steps": 1, "disable_tqdm": True, "skip_nonfinite_updates": arm.get("skip", True)}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    bin_dir = Path(sys.executable).parent
    if layout == "zero3":
        cmd = [str(bin_dir / "rookgrpo"), "train", str(path), "--accelerate_config", "zero3", "--num_processes", "2"]
    else:
        cmd = [str(bin_dir / "rookgrpo"), "train", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1" if layout == "zero3" else str(os.cpu_count() or 1)}
    proc = subprocess.run([*cmd, "--output_dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {"history": history, "info": json.loads((out / "run_info.json").read_text())}


def _times(run: dict) -> tuple[float, float]:
    history = run["history"]
    steps = [h["step_time"] for h in history if "step_time" in h and h["step"] > 3]
    runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
    return statistics.median(steps), runtime / run["info"]["global_step"]


def step_cost(tmp: Path, rounds: int) -> tuple[str, dict]:
    model = _model(tmp / "model-small", 4, 128)
    arms = {"none": {"skip": False}, "skip_nonfinite": {}, "heldout_eval": {"eval": True},
            "heldout_guard": {"eval": True, "guard": True}}
    measured = {name: [] for name in arms}
    for r in range(rounds):
        for name, arm in arms.items():
            measured[name].append(_times(_launch(tmp, f"cost-{name}-{r}", model, "zero3", 30, 5, arm)))
    pairs = {"skip_nonfinite": "none", "heldout_guard": "heldout_eval"}
    rows, stats = [], {}
    for name in arms:
        step = statistics.median(t for t, _ in measured[name])
        wall = statistics.median(w for _, w in measured[name])
        line = f"| {name} | {step:.4f} | {wall:.4f} |"
        if name in pairs:
            ref = measured[pairs[name]]
            step_r = [a[0] / b[0] for a, b in zip(measured[name], ref)]
            wall_r = [a[1] / b[1] for a, b in zip(measured[name], ref)]
            stats[name] = {"against": pairs[name], "step_time_ratios": step_r, "wall_ratios": wall_r}
            line += (f" {pairs[name]} | **{statistics.median(step_r):.3f}** [{min(step_r):.3f}, {max(step_r):.3f}] |"
                     f" **{statistics.median(wall_r):.3f}** [{min(wall_r):.3f}, {max(wall_r):.3f}] |")
        else:
            line += " | | |"
        rows.append(line)
    table = "\n".join([
        "| arm (ZeRO-3, 2 CPU processes) | median step_time (s) | wall per step (s) | against | step_time ratio "
        "[range over rounds] | wall ratio [range] |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
    ])
    return table, {"seconds": measured, "ratios": stats}


def memory(tmp: Path, rounds: int) -> tuple[str, dict]:
    from transformers import AutoModelForCausalLM

    model = _model(tmp / "model-large", 6, 512)

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
    copy_mib = params * 4 / 2 ** 20
    rows, stats = [], {}
    for layout, share in (("one process", 1), ("zero3", 2)):
        peaks = {"none": [], "guard": []}
        for r in range(rounds):
            for name, arm in (("none", {"eval": True}), ("guard", {"eval": True, "guard": True})):
                run = _launch(tmp, f"mem-{layout.replace(' ', '')}-{name}-{r}", model, layout, 10, 2, arm)
                peaks[name].append(max(h.get("memory/process_peak", 0) for h in run["history"]))
        extra = [g - n for g, n in zip(peaks["guard"], peaks["none"])]
        expected = copy_mib / share
        stats[layout] = {"peak_none_mib": peaks["none"], "peak_guard_mib": peaks["guard"], "extra_mib": extra,
                         "one_copy_of_the_share_mib": expected}
        rows.append(f"| {layout} | {statistics.median(peaks['none']):.0f} | {statistics.median(peaks['guard']):.0f} | "
                    f"**{statistics.median(extra):.0f}** [{min(extra):.0f}, {max(extra):.0f}] | {expected:.0f} |")
    table = "\n".join([
        f"| layout | peak host memory without the guard (MiB, rank 0) | with it | extra [range over rounds] | one fp32 "
        f"copy of the rank's share ({params / 1e6:.1f}M parameters) |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ])
    return table, {"parameters": params, **stats}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="launches per arm, in turn")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cost_table, cost = step_cost(Path(tmp), args.rounds)
        memory_table, mem = memory(Path(tmp), args.rounds)
    result = {
        "title": "What the guards cost: step time under ZeRO-3, and the host memory heldout_guard holds",
        "description": (
            "Table 1: DeepSpeed ZeRO-3 on 2 CPU processes (the packaged zero3 config, fp32), a 4-layer width-128 char "
            "GPT-2, 30 steps per launch, arms launched in turn; TRL's median step_time over steps 4-30 and wall time "
            "per step; each arm's ratio to its reference per round, median and range over rounds. Table 2: peak "
            "resident memory of rank 0 with and without heldout_guard (a held-out evaluation every 2 of 10 steps, its "
            "score rising at each, so the guard's copy is replaced at every one and the start's dropped at the first), "
            "a 6-layer width-512 char GPT-2, one process and ZeRO-3 on 2."),
        "table": cost_table + "\n\n" + memory_table,
        "command": f"python benchmarks/bench_guards.py --rounds {args.rounds}",
        "step_cost": cost,
        "memory": mem,
    }
    from common import finish  # benchmarks/common.py (here: the evaluator is loaded by file path in the launches)

    return finish(result, args.out)


if __name__ == "__main__":
    main()
