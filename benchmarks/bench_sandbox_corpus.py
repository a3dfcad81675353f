"""The hostile corpus per isolation mode: what each mode lets a program get away with, counted.

Every program of ``tests/hostile/corpus.py`` (75 hostile, 2 plausible) goes through ``code_exec`` once per mode, with
the same checks as ``tests/test_sandbox.py`` (``tests/hostile/harness.py``): rewarded (a score above 0), survivors
(processes left under a sandbox uid), stray files or IPC objects (outside the work dir, new SysV objects), reward
exceptions, hangs (a reward later than its deadline), and a correct solution's 1.0 right after. Modes: ``full``
(bubblewrap as installed), ``reduced`` (bubblewrap hidden from this process and its runners, reduced isolation
accepted: ``code_sandbox_isolation: reduced``; as root, rookgrpo makes the namespaces itself),
``reduced-no-namespaces`` (the same where root could not make them, as in a container without CAP_SYS_ADMIN or as a
non-root user: Landlock instead) and ``reduced-uid-only`` (neither: an old kernel in such a container). Needs root and
bubblewrap.

    python benchmarks/bench_sandbox_corpus.py [--modes full reduced reduced-no-namespaces reduced-uid-only]
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from common import finish  # benchmarks/common.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

COUNTS = ("rewarded", "survivors", "stray files or IPC objects", "reward exceptions", "hangs",
          "correct solution after < 1")


def count(found: dict) -> dict[str, bool]:
    """Which of :data:`COUNTS` one program's verdict (``hostile.harness.check_hostile``) falls under."""
    return {"rewarded": (found["score"] or 0) > 0, "survivors": bool(found["survivors"]),
            "stray files or IPC objects": bool(found["files"] or found["ipc"]),
            "reward exceptions": found["error"] is not None, "hangs": found["late"],
            "correct solution after < 1": found["solution_after"] != 1.0}


def main(argv=None):
    from hostile.harness import CASES, LIMITS, MODES, check_hostile, isolation_mode
    from rookgrpo.code.pool import _close_pools
    from rookgrpo.code.reward import CodeExec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    rows, details = [], {}
    for mode in args.modes:
        with isolation_mode(mode) as iso:
            if mode == "full" and iso.bwrap is None or not iso.root:
                raise SystemExit(f"mode {mode} needs root and bubblewrap here: {'; '.join(iso.lost)}")
            layers = ("bubblewrap" if iso.bwrap else "namespaces made as root" if iso.namespaces else
                      f"Landlock ABI {iso.landlock}" if iso.landlock else "uid, cgroup, rlimits, removal by uid")
            reward = CodeExec(limits=LIMITS, workers=2, isolation="full" if mode == "full" else "reduced")
            found = {name: check_hostile(name, mode, port, reward) for name in sorted(CASES)}
            _close_pools()  # the next mode's runners start afresh, under that mode's environment
        flags = {name: count(f) for name, f in found.items()}
        totals = {c: sum(f[c] for f in flags.values()) for c in COUNTS}
        rows.append(f"| {mode}: {layers} | {len(found)} | " + " | ".join(str(totals[c]) for c in COUNTS) + " |")
        details[mode] = {name: [c for c, hit in f.items() if hit] for name, f in flags.items() if any(f.values())}
    listener.close()
    table = "\n".join([f"| mode | programs | {' | '.join(COUNTS)} |", "|" + " --- |" * (len(COUNTS) + 2), *rows])
    result = {
        "title": "The hostile corpus per isolation mode",
        "description": "Each program of tests/hostile/corpus.py once through code_exec per mode, judged as "
                       "tests/test_sandbox.py judges it (tests/hostile/harness.py); reduced: bubblewrap hidden "
                       "from the process (empty PATH), reduced isolation accepted; reduced-no-namespaces: also "
                       "without the namespaces rookgrpo makes as root (ROOKGRPO_REDUCED_NAMESPACES=0); "
                       "reduced-uid-only: also without Landlock (ROOKGRPO_REDUCED_LANDLOCK=0).",
        "table": table,
        "command": "python benchmarks/bench_sandbox_corpus.py" + (
            f" --modes {' '.join(args.modes)}" if args.modes != list(MODES) else ""),
        "failures": details,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
