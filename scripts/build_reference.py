#!/usr/bin/env python
"""Rewrite the generated tables of docs/reference.md from the code: every built-in callback's fields, rookgrpo's
config and recipe fields, the registered rewards and the CLI's commands.

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``; the prose around them is written by
hand. ``--check`` rewrites nothing and exits 1 when the page is out of date (the test suite runs it), so the
reference cannot drift from the signatures and help texts it describes::

    python scripts/build_reference.py           # rewrite docs/reference.md
    python scripts/build_reference.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def callbacks_section() -> str:
    """The core's callbacks, then each built-in task pack's (chess: ``chess_eval``), by pack."""
    import rookgrpo
    from rookgrpo import registry
    from rookgrpo.callbacks.registry import available_callbacks, callback_fields_markdown

    core = sorted(rookgrpo.BUILTIN_CALLBACKS)
    builtin_packs = {module.split(".")[1] for module in registry.BUILTIN_PACKS}
    packs = [n for n in available_callbacks() if n not in core and registry.pack_of("callback", n) in builtin_packs]
    parts = [callback_fields_markdown(name) for name in core]
    parts += [callback_fields_markdown(name).replace("### ", "### task pack: ", 1) for name in packs]
    return "\n\n".join(parts)


def fields_table(cls, base) -> str:
    """The dataclass fields ``cls`` adds to ``base``, with their defaults and help texts.

    >>> from rookgrpo.config import RookGRPOConfig
    >>> from trl import GRPOConfig
    >>> fields_table(RookGRPOConfig, GRPOConfig).splitlines()[2].startswith("| `stockfish_path` | `None` |")
    True
    """
    inherited = {f.name for f in dataclasses.fields(base)}
    rows = ["| field | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if f.name in inherited and f.default == next(g.default for g in dataclasses.fields(base) if g.name == f.name):
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        rows.append(f"| `{f.name}` | `{default!r}` | {_cell(f.metadata.get('help', ''))} |")
    return "\n".join(rows)


def config_section() -> str:
    from trl import GRPOConfig, ScriptArguments

    from rookgrpo.config import RookGRPOConfig, RookScriptArguments

    return ("`RookGRPOConfig` (every `GRPOConfig` field, plus):\n\n" + fields_table(RookGRPOConfig, GRPOConfig)
            + "\n\nRecipe-level keys (`RookScriptArguments`: TRL's `ScriptArguments` fields, plus):\n\n"
            + fields_table(RookScriptArguments, ScriptArguments))


def rewards_section() -> str:
    from rookgrpo.rewards.registry import available_rewards, get_reward

    rows = ["| reward | what it pays (first line of its docstring) |", "| --- | --- |"]
    for name in available_rewards():
        doc = (get_reward(name).__doc__ or "").strip().split("\n\n")[0]
        rows.append(f"| `{name}` | {_cell(doc.replace('``', '`'))} |")
    return "\n".join(rows)


def cli_section() -> str:
    from rookgrpo.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = ["| command | what it does |", "| --- | --- |"]
    for action in sub._choices_actions:
        rows.append(f"| `rookgrpo {action.dest}` | {_cell(action.help)} |")
    return "\n".join(rows) + "\n\n`rookgrpo COMMAND --help` lists each command's options."


SECTIONS = {"callbacks": callbacks_section, "config": config_section, "rewards": rewards_section, "cli": cli_section}


def render(text: str) -> str:
    """``text`` with every generated section replaced by its current content."""
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n)(?:.*?\n)?(<!-- end: {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{REFERENCE}: no '<!-- generated: {name} -->' ... '<!-- end: {name} -->' block")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/reference.md is out of date; write nothing")
    args = ap.parse_args(argv)
    old = REFERENCE.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print(f"{REFERENCE} is out of date: run `python scripts/build_reference.py`", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(new)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
