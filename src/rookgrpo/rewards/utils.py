"""Helpers shared by reward functions."""

from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """Plain text of a completion, whether standard (a string) or conversational (a list of message dicts).

    Never raises: anything else becomes ``""`` so a reward can give it the floor.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return ""
