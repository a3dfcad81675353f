"""What every benchmark script does at the end: print its table and write its result JSON (read by run_all.py)."""

from __future__ import annotations

import json


def finish(result: dict, out: str | None) -> dict:
    print(result["table"])
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
    return result
