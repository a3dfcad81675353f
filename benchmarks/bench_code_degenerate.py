"""What degenerate programs earn under ``code_exec`` on the 164 HumanEval problems, before and after partial credit
counted on non-trivial tests only; canonical and mutated canonical solutions beside them.

Per problem, each program runs once against the problem's tests (as TRL calls the reward, through the runner pool) and
its verdict is scored two ways: ``0.5 x pass fraction`` (the partial credit before) and ``0.5 x`` the share of
non-trivial tests passed (:class:`rookgrpo.code.reward.CodeExec` now). Programs:

- ``constants and echoes``: programs that ignore their input: every constant and echo of the filter family, other
  constants the filter does not run (2, 100, 0.5, 'abc', '0', [1], [[]]), ``pass``, raising, an empty block and the
  prompt copied back (the issue's degenerate set; the target is on its best program per problem);
- ``simple transforms``: the filter family's transforms of the arguments (length, sorted, reversed, ...) and a few it
  does not run; some of them are a problem's real solution (``sorted`` for a sorting problem), which keeps 1.0;
- ``canonical``: HumanEval's solutions (must keep 1.0);
- ``mutated canonical``: canonical solutions with one AST mutation (an integer constant off by one, a comparison
  flipped, an ``if`` test negated, a ``return`` dropped), kept where the mutant loads and fails a test: real partial
  solutions, which must keep partial credit.

    python benchmarks/bench_code_degenerate.py [--out RESULT.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import finish  # benchmarks/common.py

from rookgrpo.code.degenerate import degenerate_program, mutants

# Programs the trivial filter does not run (bodies of the entry point; ``a``: the positional arguments).
HELD_OUT_CONSTANTS = ["return 2", "return 'abc'", "return [1]", "return [[]]", "return '0'", "return 100",
                      "return 0.5", "pass", "raise ValueError()"]
HELD_OUT_TRANSFORMS = ["return a[0][:1]", "return type(a[0])()", "return sorted(a[0], reverse=True)",
                       "return a[0] if a[0] else None", "return a"]


ECHOES = ("a[0]", "a[-1]", "a[1]", "list(a)")  # the filter family's expressions that hand the input back


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--n", type=int, default=None, help="only the first N problems")
    args = ap.parse_args(argv)
    from rookgrpo.code import trivial
    from rookgrpo.code.problems import humaneval_rows
    from rookgrpo.code.pool import get_pool
    from rookgrpo.code.reward import CodeExec, _spec

    import os
    import tempfile

    os.environ["ROOKGRPO_CACHE"] = tempfile.mkdtemp(prefix="rookgrpo-bench-")  # the tables' cost, not the cache's
    rows = humaneval_rows()[: args.n]
    reward = CodeExec()
    pool = reward.pool()
    specs = [_spec(r["tests"]) for r in rows]
    start = time.perf_counter()
    tables = reward.trivial_tests(specs, pool)
    table_seconds = time.perf_counter() - start
    programs: list[tuple[int, str, str]] = []  # (problem, group, program)
    for p, (row, spec) in enumerate(zip(rows, specs)):
        entry = spec["entry_point"]
        code, names = trivial.function_variants()
        for name, expr in zip(names, trivial.EXPRESSIONS):
            group = "constants and echoes" if expr in trivial.CONSTANTS or expr in ECHOES else "simple transforms"
            programs.append((p, group, code + f"\n{entry} = {name}\n"))
        for body in HELD_OUT_CONSTANTS:
            programs.append((p, "constants and echoes", degenerate_program(entry, body)))
        for body in HELD_OUT_TRANSFORMS:
            programs.append((p, "simple transforms", degenerate_program(entry, body)))
        programs.append((p, "constants and echoes", row["prompt"]))  # the prompt copied back (no body)
        programs.append((p, "constants and echoes", ""))  # an empty block
        programs.append((p, "canonical", row["canonical_solution"]))
        for _, mutated in mutants(row["canonical_solution"]):
            programs.append((p, "mutated canonical", mutated))
    start = time.perf_counter()
    verdicts = pool.map([(code, specs[p]) for p, _, code in programs])
    run_seconds = time.perf_counter() - start

    def old(v) -> float:  # the partial credit before: 0.5 x pass fraction
        if v.timed_out or not v.loaded or v.counted == 0:
            return 0.0
        return 1.0 if v.passed == v.counted else 0.5 * v.passed / v.counted

    scores: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for (p, group, _), v in zip(programs, verdicts):
        scores.setdefault(group, {}).setdefault(p, []).append((old(v), reward._score(v, tables[p])))
    rows_out = []
    summary = {}
    for group in ("constants and echoes", "simple transforms", "canonical", "mutated canonical"):
        per_problem = scores.get(group, {})
        if group in ("canonical",):
            values = [s for ps in per_problem.values() for s in ps]
            stats = {"before": statistics.mean(s[0] for s in values), "after": statistics.mean(s[1] for s in values),
                     "min_after": min(s[1] for s in values), "n": len(values)}
            rows_out.append(f"| {group} | mean {stats['before']:.3f} | mean {stats['after']:.3f} (min "
                            f"{stats['min_after']:.3f}) | {len(values)} programs |")
        elif group == "mutated canonical":
            failing = [s for ps in per_problem.values() for s in ps if s[0] < 1.0]
            stats = {"before": statistics.mean(s[0] for s in failing), "after": statistics.mean(s[1] for s in failing),
                     "credited_after": sum(s[1] > 0 for s in failing) / len(failing), "n": len(failing)}
            rows_out.append(f"| {group} (failing a test) | mean {stats['before']:.3f} | mean {stats['after']:.3f} "
                            f"({stats['credited_after']:.0%} above 0) | {len(failing)} programs |")
        else:
            best = {p: (max(s[0] for s in ps), max(s[1] for s in ps)) for p, ps in per_problem.items()}
            stats = {"before": statistics.mean(b[0] for b in best.values()),
                     "after": statistics.mean(b[1] for b in best.values()),
                     "problems_above_0_before": sum(b[0] > 0 for b in best.values()),
                     "problems_above_0_after": sum(b[1] > 0 for b in best.values()),
                     "problems_at_least_0.1_before": sum(b[0] >= 0.1 for b in best.values()),
                     "problems_at_least_0.1_after": sum(b[1] >= 0.1 for b in best.values()),
                     "problems_full_after": sum(b[1] == 1.0 for b in best.values()), "n": len(best)}
            rows_out.append(
                f"| {group}, best per problem | mean {stats['before']:.3f}; > 0 on {stats['problems_above_0_before']}, "
                f">= 0.1 on {stats['problems_at_least_0.1_before']} | mean {stats['after']:.3f}; > 0 on "
                f"{stats['problems_above_0_after']}, >= 0.1 on {stats['problems_at_least_0.1_after']} (1.0 on "
                f"{stats['problems_full_after']}) | {len(best)} problems |")
        summary[group] = stats
    table = "\n".join(["| programs | `0.5 x pass fraction` (before) | `0.5 x non-trivial pass fraction` (now) | n |",
                       "| --- | --- | --- | --- |", *rows_out])
    trivial_counts = [len(t) for t in tables]
    result = {
        "title": f"Code reward: what degenerate programs earn on {len(rows)} HumanEval problems, before and now",
        "description": f"Each program run once against its problem's tests through the runner pool and scored both "
                       f"ways (full credit 1.0 either way). Trivial tests per problem: mean "
                       f"{statistics.mean(trivial_counts):.1f} (the filter's {len(trivial.EXPRESSIONS)} programs, "
                       f"one sandbox per problem: {table_seconds:.1f} s for all, cached after). {len(programs)} "
                       f"programs in {run_seconds:.1f} s.",
        "table": table,
        "command": "python benchmarks/bench_code_degenerate.py" + (f" --n {args.n}" if args.n else ""),
        "summary": summary,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
