"""``rookgrpo doctor`` against rldoctor on the same recorded runs: failures caught, false alarms, steps to detection.

    python benchmarks/bench_doctor.py [--record] [--seeds 3] [--steps 40]

The runs are the real short GRPO runs of ``benchmarks/doctor_scenarios.py`` (the tiny GPT-2; each built to fail one
way, and healthy ones), recorded as ``trainer_state.json`` files under ``benchmarks/results/doctor_runs/`` (``--record``
trains them again). Both tools read the same files after the fact: rookgrpo through :func:`rookgrpo.doctor.diagnose`,
rldoctor 0.2.0 installed from PyPI into a venv of its own (``build/bench-doctor/venv``) through its own
``load_run``/``diagnose``, counting its findings of severity WARNING or above.

A failure counts as caught when a tool reports one of the findings that name it (``CATCH``: rookgrpo's kinds,
rldoctor's detectors; generous to rldoctor, e.g. its advantage_collapse counts for KL-only groups). Any finding on a
healthy run is a false alarm (rookgrpo's ``info`` tier, a real change too small to matter, is no alarm, as rldoctor's
findings below WARNING are not counted). Steps to detection: the first logged step at which the tool, reading the run's log only
up to that step, catches the failure (the median over the runs that caught it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import finish  # noqa: E402
import doctor_scenarios  # noqa: E402

RUNS = HERE / "results" / "doctor_runs"
VENV = REPO / "build" / "bench-doctor" / "venv"
RLDOCTOR = "rldoctor==0.2.0"

#: scenario -> (rookgrpo finding kinds, rldoctor detectors) that name its failure; None for a healthy run.
CATCH: dict[str, tuple[set[str], set[str]] | None] = {
    "healthy": None,
    "healthy-kl": None,
    "constant": ({"zero_gradient", "zero_std"}, {"advantage_collapse", "gradient_pathology"}),
    "constant-kl": ({"kl_only_groups"}, {"advantage_collapse", "kl_drift"}),
    "plateau-judge": ({"reward_plateau"}, {"plateau"}),
    "diverging": ({"entropy_collapse", "grad_growth", "nonfinite", "kl_runaway"},
                  {"entropy_collapse", "gradient_pathology", "kl_drift"}),
    "length": ({"length_hacking"}, {"length_pathology"}),
    "heldout-drop": ({"heldout_drop"}, {"reward_hacking"}),
}

# Run inside rldoctor's venv: for each run, the detectors (severity >= WARNING) on every prefix of its log.
RLDOCTOR_DRIVER = r"""
import json, os, sys, tempfile
from rl_doctor.diagnosis import diagnose
from rl_doctor.detectors.base import Severity
from rl_doctor.ingest.base import load_run
runs = json.load(open(sys.argv[1]))
out = {}
tmp = tempfile.mkdtemp()
for name, history in runs.items():
    steps = sorted({e["step"] for e in history if "loss" in e})
    per_prefix = []
    for end in steps:
        path = os.path.join(tmp, "trainer_state.json")
        json.dump({"log_history": [e for e in history if e["step"] <= end]}, open(path, "w"))
        try:
            result = diagnose(load_run(path))
            fired = sorted({f.detector for f in result.findings if f.severity >= Severity.WARNING})
        except Exception as err:
            fired = ["error: " + type(err).__name__]
        per_prefix.append([end, fired])
    out[name] = per_prefix
print(json.dumps(out))
"""


def record(seeds: list[int], steps: int) -> None:
    """Train every scenario on every seed and keep its log history as a trainer_state.json."""
    from rookgrpo.models.tiny_model import build_tiny_gpt2

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt2(Path(tmp) / "model")
        for name in doctor_scenarios.LABELS:
            for seed in seeds:
                start = time.perf_counter()
                history = doctor_scenarios.run_scenario(name, model, Path(tmp) / f"{name}-{seed}", steps=steps,
                                                        seed=seed)
                folder = RUNS / f"{name}-s{seed}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}, indent=0))
                print(f"recorded {folder.name} in {time.perf_counter() - start:.0f} s", flush=True)


def rldoctor_env() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", RLDOCTOR], check=True)
    return python


def run_rldoctor(histories: dict[str, list[dict]]) -> dict[str, list]:
    python = rldoctor_env()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(histories, fh)
    proc = subprocess.run([str(python), "-c", RLDOCTOR_DRIVER, fh.name], capture_output=True, text=True, check=True)
    os.unlink(fh.name)
    return json.loads(proc.stdout)


def run_rookgrpo(histories: dict[str, list[dict]]) -> tuple[dict[str, list], list[float]]:
    from rookgrpo.doctor import History, diagnose

    out, seconds = {}, []
    for name, history in histories.items():
        steps = sorted({e["step"] for e in history if "loss" in e})
        per_prefix = []
        for end in steps:
            findings, _ = diagnose(History([e for e in history if e["step"] <= end]))
            per_prefix.append([end, sorted({f.kind for f in findings if f.severity != "info"})])
        start = time.perf_counter()
        diagnose(History(history))
        seconds.append(time.perf_counter() - start)
        out[name] = per_prefix
    return out, seconds


def score(per_prefix: list, catch: set[str] | None) -> dict:
    """Caught / false alarm and the first step it was caught at, from one tool's findings on each prefix of a run."""
    final = set(per_prefix[-1][1]) if per_prefix else set()
    if catch is None:
        return {"false_alarm": bool(final), "findings": sorted(final)}
    first = next((end for end, fired in per_prefix if catch & set(fired)), None)
    return {"caught": bool(catch & final), "first_step": first, "findings": sorted(final)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="train the scenario runs again before diagnosing them")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="steps per recorded run (with --record)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds))
    if args.record or not RUNS.exists():
        record(seeds, args.steps)
    histories = {}
    for folder in sorted(RUNS.iterdir()):
        scenario, _, seed = folder.name.rpartition("-s")
        if scenario in CATCH and int(seed) in seeds:
            histories[folder.name] = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    rook, seconds = run_rookgrpo(histories)
    rld = run_rldoctor(histories)
    per_run = {}
    for name in histories:
        scenario = name.rpartition("-s")[0]
        catch = CATCH[scenario]
        per_run[name] = {"scenario": scenario,
                         "rookgrpo": score(rook[name], catch[0] if catch else None),
                         "rldoctor": score(rld[name], catch[1] if catch else None)}
    rows = ["| run (what went wrong) | runs | rookgrpo doctor: caught | steps to detection | rldoctor 0.2.0: caught "
            "| steps to detection |", "|---|---|---|---|---|---|"]
    totals = {"rookgrpo": [0, 0, 0], "rldoctor": [0, 0, 0]}  # caught, labelled, false alarms
    for scenario, catch in CATCH.items():
        runs = [r for r in per_run.values() if r["scenario"] == scenario]
        if not runs:
            continue
        cells = []
        for tool in ("rookgrpo", "rldoctor"):
            if catch is None:
                alarms = sum(r[tool]["false_alarm"] for r in runs)
                totals[tool][2] += alarms
                seen = sorted({f for r in runs for f in r[tool]["findings"]})
                cells += [f"{alarms} false alarm(s)" + (f" ({', '.join(seen)})" if seen else ""), "-"]
            else:
                caught = [r for r in runs if r[tool]["caught"]]
                totals[tool][0] += len(caught)
                totals[tool][1] += len(runs)
                firsts = [r[tool]["first_step"] for r in caught]
                cells += [f"{len(caught)}/{len(runs)}", f"{statistics.median(firsts):.0f}" if firsts else "-"]
        what = "healthy" if catch is None else ", ".join(sorted(doctor_scenarios.LABELS[scenario]))
        rows.append(f"| {scenario} ({what}) | {len(runs)} | " + " | ".join(cells) + " |")
    r, d = totals["rookgrpo"], totals["rldoctor"]
    rows.append(f"| **all** | {len(per_run)} | {r[0]}/{r[1]} caught, {r[2]} false alarm(s) | | {d[0]}/{d[1]} caught, "
                f"{d[2]} false alarm(s) | |")
    table = "\n".join(rows)
    result = {
        "title": "rookgrpo doctor against rldoctor: recorded runs built to fail, and healthy ones",
        "description": (
            f"{len(per_run)} real short GRPO runs of the tiny GPT-2 ({len(seeds)} seeds per scenario, "
            "`benchmarks/doctor_scenarios.py`), each built to fail one way or healthy, recorded as trainer_state.json "
            "files in benchmarks/results/doctor_runs/. Both tools read the same files after the fact; rldoctor "
            f"{RLDOCTOR.split('==')[1]} from PyPI in its own venv, its findings of severity WARNING or above. Caught: "
            "a finding that names the failure (the CATCH table in the script; rldoctor's advantage_collapse counts "
            "for KL-only groups, its reward_hacking for a held-out fall). Steps to detection: the first logged step "
            "at which the tool, reading the log up to that step, catches it (median over the runs it caught). "
            f"rookgrpo's diagnosis of a whole run took a median {statistics.median(seconds) * 1000:.0f} ms."),
        "table": table,
        "command": "python benchmarks/bench_doctor.py" + (" --record" if args.record else ""),
        "per_run": per_run,
        "totals": totals,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main()
