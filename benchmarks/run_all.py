"""Run every benchmark listed in BENCHMARKS and rewrite docs/benchmarks.md from their results.

    python benchmarks/run_all.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks.md"
RESULTS = HERE / "results"
# The packaged chess model: a result whose runs start from it describes the model of the commit it was measured at.
PACKAGED_MODEL = "src/rookgrpo/assets/tiny-rookworld/model.safetensors"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the scripts share benchmarks/common.py

from common import provenance  # noqa: E402

# (result name, script, arguments), in report order. Each script exposes main(argv) -> {"title", "table", ...}.
# Measurements only: the GRPO grids that chose the recipes live in experiments/ (experiments/README.md).
BENCHMARKS: list[tuple[str, str, list[str]]] = [
    ("chess_rewards_model_like", "bench_chess_rewards", ["--mix", "model-like"]),
    ("chess_rewards_random", "bench_chess_rewards", ["--mix", "random"]),
    ("stockfish_depth", "bench_stockfish_depth", ["--n", "500"]),
    ("env_conventions", "bench_env_conventions", []),
    ("code_exec", "bench_code_exec", []),
    ("code_degenerate", "bench_code_degenerate", []),
    ("sandbox_corpus", "bench_sandbox_corpus", []),
    # The partial-credit change's cost on code_exec's throughput, against the commit before it.
    ("code_exec_change", "bench_code_exec", ["--against", "ca2f1d1", "--repeats", "9"]),
    # Failing closed (no sandbox without bubblewrap unless reduced isolation is accepted): its cost, against the commit
    # before it.
    ("code_exec_fail_closed", "bench_code_exec", ["--against", "ba210ac", "--repeats", "9"]),
    ("step_time", "bench_step_time", ["--max-blocks", "200"]),  # stops once the interval decides
    ("guards", "bench_guards", ["--rounds", "3"]),
    ("reward_isolation", "bench_reward_isolation", []),  # stops once the interval decides
    ("preflight", "bench_preflight", []),  # the embedded recipe's whole run (about 15 minutes)
    ("precision", "bench_precision", []),
    ("position_gap", "bench_position_gap", []),
    ("resampling_cost", "bench_resampling", []),
    ("judge", "bench_judge", ["--seeds", "5"]),
    ("selection", "bench_selection", ["--seeds", "3"]),
    ("selection_env_exact", "bench_selection", ["--regime", "env_exact", "--seeds", "3"]),
    # The pass-rate rule against DAPO in the all-fail regime (runs are deterministic per seed: the DAPO arm repeats
    # its numbers above), and both rules on three more seeds of the mixed regime, where DAPO's cost varies by seed.
    ("selection_env_exact_passrate", "bench_selection",
     ["--regime", "env_exact", "--seeds", "3", "--arms", "dapo,passrate+resampling"]),
    ("selection_more_seeds", "bench_selection",
     ["--seeds", "3", "--first-seed", "11", "--arms", "dapo,greso+resampling,passrate+resampling"]),
    # The pass-rate rule's threshold mode (target_flat 0.25) against DAPO: twice the budget, where the first pass over
    # the prompts (no history yet) is an eighth of it rather than a quarter, with vanilla and GRESO (and on seeds 11-13
    # without vanilla); and at the budget above on both sets of seeds.
    ("selection_long", "bench_selection",
     ["--seeds", "3", "--budget", "3200", "--arms", "vanilla,dapo,greso+resampling,passrate-target+resampling"]),
    ("selection_long_resampling", "bench_selection", ["--seeds", "3", "--budget", "3200", "--arms", "dapo,resampling"]),
    ("selection_long_more_seeds", "bench_selection",
     ["--seeds", "3", "--first-seed", "11", "--budget", "3200",
      "--arms", "dapo,greso+resampling,passrate-target+resampling"]),
    ("selection_target", "bench_selection", ["--seeds", "3", "--arms", "dapo,passrate-target+resampling"]),
    ("selection_target_more_seeds", "bench_selection",
     ["--seeds", "3", "--first-seed", "11", "--arms", "dapo,passrate-target+resampling"]),
    ("selection_env_exact_target", "bench_selection",
     ["--regime", "env_exact", "--seeds", "3", "--arms", "dapo,passrate-target+resampling"]),
    ("shapes", "bench_shapes", []),
    # vLLM generation on vLLM's CPU build (it runs itself in .venv-vllm, which make test-vllm builds): the sampler
    # against the trainer, RookGRPOTrainer's step time against TRL's under vLLM, vLLM against transformers generation.
    ("vllm", "bench_vllm", []),
    # vLLM's layouts on CPU: server mode against colocate, TRL's async GRPO against synchronous GRPO (.venv-vllm too).
    ("vllm_layouts", "bench_vllm_layouts", []),
    # The GPU check (a GPU owner runs it without arguments), here on CPU at the full 124M shape with bf16 autocast and
    # 8 completions per step: what the CPU could rule out about the NaN gradient of the first GPU run.
    ("gpu_check_cpu", "bench_gpu_check",
     ["--arms", "vanilla", "recipe", "recipe+heldout", "recipe+heldout/eager", "bare", "+task_sampling", "+doctor",
      "+sft_anchor", "--steps", "2", "--bisect-steps", "2", "--batch", "8"]),
    ("doctor", "bench_doctor", []),
    # Real public training logs with verdicts read by hand (../shared/doctor-validation), rldoctor beside.
    ("doctor_validation", "bench_doctor_validation", []),
    ("doctor_cost", "bench_doctor_cost", ["--max-blocks", "30"]),
    ("doctor_cost_recipe", "bench_doctor_cost", ["--setting", "recipe", "--min-blocks", "10", "--max-blocks", "20"]),
]
# Further runs of a benchmark that has its own section above (other seeds, budgets or arms): the report puts them in
# an appendix, so that each benchmark reads as one current table.
APPENDIX = {"selection_env_exact_passrate", "selection_more_seeds", "selection_long", "selection_long_resampling",
            "selection_long_more_seeds", "selection_target", "selection_target_more_seeds",
            "selection_env_exact_target", "code_exec_change", "code_exec_fail_closed", "doctor_cost_recipe"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    for name, script, script_args in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        _load(script).main([*script_args, "--out", str(RESULTS / f"{name}.json")])
    write_report()
    return 0


def _git(repo: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)


def last_model_change(repo: Path = HERE.parent) -> str | None:
    """The commit that last changed the packaged chess model's weights; None when git cannot tell."""
    last = _git(repo, "log", "-1", "--format=%h", "--", PACKAGED_MODEL)
    if last.returncode:
        return None
    return last.stdout.strip() or None


def packaged_model_changed_since(commit: str, repo: Path = HERE.parent, last: str | None = None) -> str | None:
    """The commit that last changed the packaged chess model's weights (``last``, looked up when not given), if it is
    not an ancestor of ``commit``.

    ``commit`` is a result's stamp (``abc1234`` or ``abc1234+changes``). None when the weights are the same, or when
    git cannot tell (no repository, an unknown commit).
    """
    return missing_from(commit, last or last_model_change(repo), repo)


def missing_from(commit: str, change: str | None, repo: Path = HERE.parent) -> str | None:
    """``change`` if it is not in the history of ``commit`` (a result's stamp); None when it is, or git cannot tell."""
    if change is None:
        return None
    return change if _git(repo, "merge-base", "--is-ancestor", change, commit.split("+")[0]).returncode == 1 else None


# Scripts that train with GRPO: a result of theirs measured before position_ids_from_mask scored GPT-2 completions at
# shifted positions (docs/dynamics.md), which changes what those runs learned.
TRAINS_GRPO = {"bench_judge", "bench_precision", "bench_resampling", "bench_selection", "bench_shapes",
               "bench_step_time"}
POSITIONS_MODULE = "src/rookgrpo/positions.py"  # where it was added (it is rookgrpo/dynamics/positions.py now)


def positions_fix(repo: Path = HERE.parent) -> str | None:
    """The commit that added position_ids_from_mask; None when git cannot tell."""
    added = _git(repo, "log", "--diff-filter=A", "--format=%h", "--", POSITIONS_MODULE)
    return (added.stdout.strip().splitlines() or [None])[-1] if not added.returncode else None


def _section(name: str, script: str, level: str, model_changed: str | None, fix: str | None) -> list[str]:
    """One result's section of the report: title, description, table, command, where it was measured, and the flags
    for a packaged model that has changed since or a GRPO run trained before the scoring correction."""
    result = json.loads((RESULTS / f"{name}.json").read_text())
    lines = [f"{level} {result['title']}", "", result.get("description", ""), "", result["table"], ""]
    for note in result.get("notes", []):  # the same command's figures from other machines, each with its source
        lines += [note, ""]
    if result.get("command"):
        lines += [f"Command: `{result['command']}`", ""]
    if result.get("measured"):
        m = result["measured"]
        lines += [f"Measured at commit `{m['commit']}` on {m['date']} ({m['machine']}).", ""]
        if set(result.get("run_commits") or [m["commit"]]) != {m["commit"]}:  # a grid resumed across commits
            lines += [f"Its runs were measured at commits {', '.join(f'`{c}`' for c in result['run_commits'])}.", ""]
        for part in result.get("added", []):  # arms a later command trained and tabled with these
            a = part["measured"]
            lines += [f"Arms {', '.join(f'`{arm}`' for arm in part['arms'])} added by `{part['command']}` at "
                      f"commit `{a['commit']}` on {a['date']} ({a['machine']}).", ""]
        changed = (packaged_model_changed_since(m["commit"], last=model_changed)
                   if model_changed and "tiny-rookworld" in json.dumps(result) else None)
        if changed:
            lines += [f"**The packaged chess model has changed since** (commit `{changed}`): every number in this "
                      f"section describes the model and positions of commit `{m['commit']}`, not the ones "
                      "packaged now.", ""]
        if script in TRAINS_GRPO and missing_from(m["commit"], fix):
            lines += [f"**Trained before commit `{fix}`** (`position_ids_from_mask`): GPT-2 completions of "
                      "left-padded prompts were scored at shifted positions, as TRL scores them "
                      "(docs/dynamics.md). The numbers describe that trainer.", ""]
    return lines


def write_report() -> None:
    now = provenance()
    model_changed = last_model_change()
    fix = positions_fix()
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`benchmarks/run_all.py`); do not edit by hand. Each table compares rookgrpo with",
        "its baseline in one run on one machine; see `benchmarks/README.md` for the rules.",
        "",
        f"Report written at commit `{now['commit']}`, {now['machine']}, Python {now['python']}, {now['date']}; each "
        "section says where it was measured when it was stamped.",
        "",
    ]
    if not BENCHMARKS:
        lines.append("No benchmarks yet.")
    main = [(n, script) for n, script, _ in BENCHMARKS if n not in APPENDIX and (RESULTS / f"{n}.json").exists()]
    more = [(n, script) for n, script, _ in BENCHMARKS if n in APPENDIX and (RESULTS / f"{n}.json").exists()]
    for name, script in main:
        lines += _section(name, script, "##", model_changed, fix)
    if more:
        lines += ["## Appendix: further runs", "",
                  "Runs of the benchmarks above on other seeds, budgets or arms, each with its command.", ""]
        for name, script in more:
            lines += _section(name, script, "###", model_changed, fix)
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {DOCS}")


if __name__ == "__main__":
    sys.exit(main())
