"""The code pack's packaged datasets (registered in :mod:`rookgrpo.code.pack`)."""

from __future__ import annotations


def _rows(source: str, chat: bool):
    from datasets import Dataset

    from .problems import builtin_rows, humaneval_rows

    rows = humaneval_rows() if source == "humaneval" else builtin_rows()
    if chat:  # conversational prompts, for instruct models (TRL applies the chat template)
        rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    return Dataset.from_list(rows)


def humaneval():
    return _rows("humaneval", chat=False)


def humaneval_chat():
    return _rows("humaneval", chat=True)


def builtin():
    return _rows("builtin", chat=False)


def builtin_chat():
    return _rows("builtin", chat=True)
