"""Task-agnostic rewards: a smoke-test reward that any model, even a random one, gets a graded signal from."""

from __future__ import annotations

from .registry import register_reward
from .utils import completion_text

UCI_CHARS = frozenset("abcdefgh12345678qrbn ")


@register_reward()
def uci_charset(completions: list[str], **kwargs) -> list[float]:
    """Share of completion characters that can appear in a list of UCI moves (``a-h``, ``1-8``, ``qrbn``, space).

    Range [0, 1]; an empty completion earns 0. It checks no chess, so it is a smoke test for the training loop: a
    random character-level model starts near 0.2 and GRPO visibly raises it within a few dozen steps.

    Example:
        >>> uci_charset(["e2e4 g1f3", "e2e4!!", ""])
        [1.0, 0.6666666666666666, 0.0]
    """
    return [sum(ch in UCI_CHARS for ch in c) / len(c) if c else 0.0 for c in map(completion_text, completions)]

