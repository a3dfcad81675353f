"""``rookgrpo doctor`` on real public training logs (``../shared/doctor-validation``, read there, never copied here):
every pinned verdict met, no pinned false alarm, severities as pinned; and docs/doctor.md's table is what the doctor
says of them now."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, load_script

LOGS = REPO.parent / "shared" / "doctor-validation"
pytestmark = pytest.mark.skipif(not (LOGS / "expect.json").is_file(),
                                reason=f"the validation logs are not here ({LOGS}: ../shared/doctor-validation)")
bench = load_script(REPO / "benchmarks" / "bench_doctor_validation.py")
EXPECT = json.loads((LOGS / "expect.json").read_text()) if (LOGS / "expect.json").is_file() else {}
RUNS = sorted(n for n in EXPECT if not n.startswith("_"))


@pytest.mark.parametrize("run", RUNS)
def test_each_real_log_gets_its_pinned_verdict(run):
    findings = bench.diagnose_run(LOGS / run)
    result = bench.check(findings, EXPECT[run], EXPECT.get("_same", []))
    said = bench.findings_text(findings)
    assert not result["missed"], f"{run}: missed {result['missed']}; the doctor said: {said}"
    assert not result["false_alarms"], f"{run}: false alarm {result['false_alarms']}; the doctor said: {said}"
    assert not result["severity_errors"], f"{run}: {result['severity_errors']}; the doctor said: {said}"


def test_the_docs_table_is_what_the_doctor_says_now():
    """docs/doctor.md carries the table of `python benchmarks/bench_doctor_validation.py` (rldoctor's column aside)."""
    rows = bench.validate(LOGS, rldoctor=False)
    text = (REPO / "docs" / "doctor.md").read_text()
    for name, row in rows.items():
        line = next((line for line in text.splitlines() if line.startswith(f"| {name} |")), None)
        assert line is not None, f"docs/doctor.md has no row for {name}"
        assert f"| {bench.findings_text(row['findings'])} | yes |" in line, (name, line)
