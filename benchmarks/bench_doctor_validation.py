"""``rookgrpo doctor`` on real training logs nobody here wrote, against verdicts read from their curves by hand, with
rldoctor's findings on the same files beside it.

    python benchmarks/bench_doctor_validation.py [--logs ../shared/doctor-validation] [--no-rldoctor] [--out FILE]

The logs and their verdicts live outside the project (``../shared/doctor-validation/``: README, MANIFEST with each
log's repository and commit, ``expect.json``); nothing of them is copied here. Per run, the doctor's findings
(:func:`rookgrpo.doctor.load_histories`, then :func:`rookgrpo.doctor.diagnose` on each phase) are checked against the
pinned verdict (:func:`check`): every ``must`` kind named at warning or critical, no ``must_not`` kind (``*``: no
finding at warning or critical), one of ``any_of``, and the severities ``critical`` / ``not_critical`` pin. Kinds in one
``_same`` group name the same fact, so either meets the other's verdict. rldoctor 0.2.0 (PyPI, in a venv of its own, as
``bench_doctor.py`` installs it) reads the same files; its findings of severity WARNING or above are listed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import finish  # noqa: E402

LOGS = REPO.parent / "shared" / "doctor-validation"
ALARM = ("warning", "critical")  # an info finding is no alarm

RLDOCTOR_DRIVER = r"""
import json, sys
from rl_doctor.diagnosis import diagnose
from rl_doctor.detectors.base import Severity
from rl_doctor.ingest.base import load_run
out = {}
for name, path in json.load(open(sys.argv[1])).items():
    try:
        result = diagnose(load_run(path))
        out[name] = sorted({f"{f.detector} ({f.severity.name.lower()})" for f in result.findings
                            if f.severity >= Severity.WARNING})
    except Exception as err:
        out[name] = ["could not read it: " + type(err).__name__ + ": " + str(err).splitlines()[0][:80]]
print(json.dumps(out))
"""


def log_file(folder: Path) -> Path:
    """The file the doctor reads in a run's folder (rldoctor is given the same one)."""
    from rookgrpo.doctor.history import _find_log

    found = _find_log(folder)
    if found is None:
        raise SystemExit(f"{folder}: no log in it")
    return found


def diagnose_run(folder: Path) -> list[dict]:
    """The doctor's findings on a run (every phase), as dicts."""
    from rookgrpo.doctor import Thresholds, diagnose, load_histories

    out = []
    for history in load_histories(folder):
        findings, _ = diagnose(history, Thresholds(reward_weights=history.reward_weights, judges=history.judges))
        out += [f.to_dict() for f in findings]
    return out


def check(findings: list[dict], verdict: dict, same: list[list[str]]) -> dict:
    """A run's findings against its pinned verdict: which pinned kinds were named (at warning or critical), which pinned
    false alarms fired, which severities are off.

    >>> v = {"must": ["reward_dead"], "must_not": ["grad_spike"], "not_critical": ["nonfinite"]}
    >>> fs = [{"kind": "reward_collapsed", "severity": "warning"}, {"kind": "grad_spike", "severity": "info"},
    ...       {"kind": "nonfinite", "severity": "warning"}]
    >>> r = check(fs, v, [["reward_dead", "reward_collapsed"]])
    >>> r["met"], r["missed"], r["false_alarms"], r["severity_errors"]
    (['reward_dead'], [], [], [])
    """
    groups = {k: set(g) for g in same for k in g}
    alarms = {f["kind"]: f["severity"] for f in findings if f["severity"] in ALARM}

    def named(kind: str) -> str | None:  # the kind (or one of its group) the doctor named at warning or critical
        return next((k for k in sorted(groups.get(kind, {kind})) if k in alarms), None)

    met = [k for k in verdict.get("must", []) if named(k)]
    missed = [k for k in verdict.get("must", []) if not named(k)]
    any_of = verdict.get("any_of", [])
    if any_of:
        hit = [k for k in any_of if named(k)]
        (met if hit else missed).append("any of " + "/".join(any_of))
    must_not = verdict.get("must_not", [])
    false_alarms = sorted(alarms) if "*" in must_not else [k for k in must_not if named(k)]
    severity_errors = [f"{k} not critical" for k in verdict.get("critical", []) if named(k) and alarms[named(k)] != "critical"]
    severity_errors += [f"{k} critical" for k in verdict.get("not_critical", []) if named(k)
                        and alarms[named(k)] == "critical"]
    return {"met": met, "missed": missed, "false_alarms": false_alarms, "severity_errors": severity_errors,
            "pinned": len(verdict.get("must", [])) + bool(any_of)}


def verdict_text(verdict: dict) -> str:
    parts = []
    if verdict.get("must"):
        parts.append("names " + ", ".join(verdict["must"]))
    if verdict.get("any_of"):
        parts.append("one of " + "/".join(verdict["any_of"]))
    if verdict.get("must_not"):
        parts.append("no " + ("finding" if "*" in verdict["must_not"] else ", no ".join(verdict["must_not"])))
    for key, word in (("critical", "critical"), ("not_critical", "not critical")):
        if verdict.get(key):
            parts.append(", ".join(verdict[key]) + " " + word)
    return "; ".join(parts) or "-"


def findings_text(findings: list[dict]) -> str:
    return ", ".join(f"{f['kind']} ({f['severity']})" for f in findings) or "none"


def run_rldoctor(files: dict[str, Path]) -> dict[str, list[str]]:
    from bench_doctor import rldoctor_env

    python = rldoctor_env()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({k: str(v) for k, v in files.items()}, fh)
    proc = subprocess.run([str(python), "-c", RLDOCTOR_DRIVER, fh.name], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def validate(logs: Path, rldoctor: bool = True) -> dict:
    """Every run of the validation folder: the doctor's findings, the verdict check, and rldoctor's findings."""
    expect = json.loads((logs / "expect.json").read_text())
    same = expect.get("_same", [])
    runs = {name: v for name, v in expect.items() if not name.startswith("_")}
    rows, files = {}, {}
    for name, verdict in runs.items():
        folder = logs / name
        files[name] = log_file(folder)
        findings = diagnose_run(folder)
        rows[name] = {"verdict": verdict, "findings": findings, **check(findings, verdict, same)}
    rld = run_rldoctor(files) if rldoctor else {}
    for name in rows:
        rows[name]["rldoctor"] = rld.get(name)
    return rows


def table(rows: dict) -> str:
    lines = ["| run | verdict (expect.json) | rookgrpo doctor | met | rldoctor 0.2.0 (WARNING and above) |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        ok = "yes" if not (r["missed"] or r["false_alarms"] or r["severity_errors"]) else "**no**: " + "; ".join(
            [f"missed {', '.join(r['missed'])}"] * bool(r["missed"])
            + [f"false alarm {', '.join(r['false_alarms'])}"] * bool(r["false_alarms"]) + r["severity_errors"])
        rld = "-" if r.get("rldoctor") is None else ", ".join(r["rldoctor"]) or "none"
        lines.append(f"| {name} | {verdict_text(r['verdict'])} | {findings_text(r['findings'])} | {ok} | {rld} |")
    return "\n".join(lines)


def totals(rows: dict) -> dict:
    return {"pinned": sum(r["pinned"] for r in rows.values()), "met": sum(len(r["met"]) for r in rows.values()),
            "false_alarms": sum(len(r["false_alarms"]) for r in rows.values()),
            "severity_errors": sum(len(r["severity_errors"]) for r in rows.values())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", default=str(LOGS), help="the validation folder (default: ../shared/doctor-validation)")
    ap.add_argument("--no-rldoctor", action="store_true", help="leave rldoctor out (no venv, no download)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logs = Path(args.logs)
    if not (logs / "expect.json").is_file():
        raise SystemExit(f"{logs}: no expect.json; give the doctor-validation folder with --logs")
    rows = validate(logs, rldoctor=not args.no_rldoctor)
    t = totals(rows)
    result = {
        "title": "rookgrpo doctor on real public training logs, against verdicts read by hand",
        "description": (f"{len(rows)} real training logs from public repositories (../shared/doctor-validation: "
                        "MANIFEST.txt says where each comes from), verdicts read from their curves by hand "
                        f"(expect.json). Pinned findings named: {t['met']}/{t['pinned']}; pinned false alarms: "
                        f"{t['false_alarms']}; severity errors: {t['severity_errors']}. An info finding is no alarm. "
                        "rldoctor 0.2.0 read the same files (its findings of WARNING and above)."),
        "table": table(rows),
        "command": "python benchmarks/bench_doctor_validation.py" + (" --no-rldoctor" if args.no_rldoctor else ""),
        "rows": rows,
        "totals": t,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main()
