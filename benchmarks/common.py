"""What every benchmark script does at the end: print its table and write its result JSON (read by run_all.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path


def finish(result: dict, out: str | None) -> dict:
    """Print the table and write the result, stamped with where it was measured (a report may mix runs)."""
    result.setdefault("measured", STARTED_AT)
    print(result["table"])
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


def cpu_features() -> str:
    """The CPU's vector extensions that change vLLM's CPU kernels (AMX, AVX-512, AVX2), as /proc/cpuinfo lists them."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown CPU features"
    found = [f for f in ("amx_tile", "avx512_bf16", "avx512f", "avx2") if f in flags]
    kind = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else \
        "no AVX2"
    return f"{kind} ({', '.join(found) or 'none of amx_tile, avx512f, avx2'})"


def provenance() -> dict:
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=repo).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else ""),
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "python": platform.python_version()}


# Taken when the benchmark starts: commits made while a long benchmark runs must not be credited with its numbers.
STARTED_AT = provenance()


def in_vllm_venv(script: str, argv: list[str] | None, out: str | None) -> dict | None:
    """Run ``script`` with ``argv`` (less any ``--out FILE``) in ``.venv-vllm`` (which ``make test-vllm`` builds) when
    vLLM is not importable here, and return its result written to ``out``; ``None`` when vLLM is importable: the
    caller measures in this process, with a GiB of KV cache per engine unless ``VLLM_CPU_KVCACHE_SPACE`` says."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("vllm") is not None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return None
    argv = without_out(argv or [])
    repo = Path(__file__).resolve().parents[1]
    python = repo / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"vLLM is not installed here and {python} does not exist: run `make test-vllm` once (it "
                         "builds the venv), then this command again.")
    with tempfile.TemporaryDirectory() as tmp:
        target = out or f"{tmp}/result.json"
        subprocess.run([str(python), script, *argv, "--out", target], check=True, cwd=repo)
        return json.loads(Path(target).read_text())


def without_out(argv: list[str]) -> list[str]:
    """The command's arguments less ``--out FILE`` (where the result went is not part of what was measured).

    >>> without_out(["--seeds", "3", "--out", "r.json"])
    ['--seeds', '3']
    """
    out = list(argv)
    while "--out" in out:
        i = out.index("--out")
        del out[i:i + 2]
    return out
