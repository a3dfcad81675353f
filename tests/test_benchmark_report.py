"""docs/benchmarks.md says when a section's numbers describe a packaged chess model that has since been replaced."""

import subprocess

from conftest import REPO, load_script


def _run_all():
    return load_script(REPO / "benchmarks" / "run_all.py")


def test_a_result_measured_before_the_model_changed_is_flagged(tmp_path):
    run_all = _run_all()

    def git(*args):
        out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()

    git("init", "-q")
    weights = tmp_path / run_all.PACKAGED_MODEL
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"v2")
    git("add", "-A")
    git("commit", "-qm", "v2")
    measured = git("rev-parse", "--short", "HEAD")
    (tmp_path / "other.txt").write_text("x")
    git("add", "-A")
    git("commit", "-qm", "unrelated")
    unrelated = git("rev-parse", "--short", "HEAD")
    # Only the weights count: a later commit that leaves them alone changes nothing.
    assert run_all.packaged_model_changed_since(measured, tmp_path) is None
    assert run_all.packaged_model_changed_since(unrelated + "+changes", tmp_path) is None
    weights.write_bytes(b"v3")
    git("add", "-A")
    git("commit", "-qm", "v3")
    v3 = git("rev-parse", "--short", "HEAD")
    assert run_all.packaged_model_changed_since(measured, tmp_path) == v3
    assert run_all.packaged_model_changed_since(unrelated + "+changes", tmp_path) == v3
    assert run_all.packaged_model_changed_since(v3, tmp_path) is None
    # A stamp git does not know (a result copied from another clone) is not guessed at.
    assert run_all.packaged_model_changed_since("0000000", tmp_path) is None
