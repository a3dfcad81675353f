#!/usr/bin/env python
"""Check that the packaged model's card (``src/rookgrpo/assets/tiny-rookworld/README.md``) prints what
``rookgrpo evaluate`` prints today, panel by panel.

The card has three tables: the held-out positions, the GRPO positions and lines SFT trained on; each says the command
that made it. ``make test`` checks the held-out panel on every run (about 30 s on 2 cores); the other two take about
4 minutes together, so they are checked here: run this after a change to evaluation, rewards, decoding or the model.

    python scripts/check_model_card.py                          # all three panels
    python scripts/check_model_card.py --panel tiny-rookworld-eval

Exit status 1, with the card's table and today's side by side, where a panel differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CARD = Path(__file__).resolve().parents[1] / "src" / "rookgrpo" / "assets" / "tiny-rookworld" / "README.md"
#: (heading of the card's section, packaged dataset the section's table was evaluated on)
PANELS = [("## Numbers (held-out", "tiny-rookworld-eval"),
          ("## Numbers on the GRPO positions", "tiny-rookworld-train"),
          ("## Numbers on lines it was trained on", "tiny-rookworld-sft-sample")]
COMMAND = "rookgrpo evaluate --model rookgrpo/tiny-rookworld --data rookgrpo/{data} --depth 8"


def card_table(data: str, card: str | None = None) -> str:
    """The card's table for panel ``data``; raises ``ValueError`` where the section or its command is missing.

    >>> card_table("tiny-rookworld-eval").split()[0]
    'metric'
    """
    card = CARD.read_text() if card is None else card
    heading = dict((d, h) for h, d in PANELS)[data]
    if heading not in card:
        raise ValueError(f"{CARD}: no section {heading!r}")
    section = card.split(heading)[1].split("\n## ")[0]
    if COMMAND.format(data=data) not in section:
        raise ValueError(f"{CARD}: section {heading!r} does not say `{COMMAND.format(data=data)}`")
    return section.split("```")[1].strip()


def evaluated_table(data: str, progress: bool = False) -> str:
    """What the card's command prints for panel ``data`` today (Stockfish at depth 8)."""
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.evaluate import evaluate, format_table

    metrics = evaluate("rookgrpo/tiny-rookworld", f"rookgrpo/{data}", settings=EngineSettings(depth=8),
                       progress=progress)
    return format_table(metrics)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--panel", choices=[d for _, d in PANELS], action="append",
                        help="check only this panel (repeatable; default: all three)")
    args = parser.parse_args(argv)
    differ = []
    for data in args.panel or [d for _, d in PANELS]:
        print(f"{data}: evaluating ...", flush=True)
        card, today = card_table(data), evaluated_table(data, progress=True)
        if card == today:
            print(f"{data}: the card's table is today's")
        else:
            differ.append(data)
            print(f"{data}: DIFFERS\n-- the card --\n{card}\n-- today --\n{today}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
