"""``reference_credit``: where a task has one right answer, a wrong completion is charged only at its first wrong token.

GRPO gives each completion one advantage and spreads it over every token. On a task whose answer the trainer can
compute itself (RookWorld's ``A:`` rows: the board, reward and flags after a move, from python-chess), that charges a
wrong answer's right tokens too: a copied board's ranks before the moved piece, which the right answer writes the
same way. On the packaged chess model, 50 ``A:``-only steps charged like that broke boards on ranks the move does not
touch (A: exact -0.141, z -2.9); charged only at the first wrong token, A: exact held in those steps (+0.000), and in
the whole `make train` recipe it fell less but still fell (docs/experiments/2026-11-23-tiny-model-builds.md, "Where the broken boards break").

After resampling, on each training batch, for every row of the listed tasks whose answer is not the reference:

- advantage < 0 (the group charges it): only its first token whose text departs from the reference stays in the loss;
- advantage > 0 (a wrong answer its group pays, e.g. a better partial answer): only the tokens before that one;
- advantage 0: unchanged (it carries no policy gradient).

Right answers, rows of other tasks, answers with no departing token (one that stops early or is cut off by the length
limit) and evaluation batches keep every token. A token taken out of the loss leaves its KL term too (``beta`` > 0),
as any masked token does in TRL's loss. The batch's loss-token count (TRL's ``num_items_in_batch``) is recounted,
so the remaining tokens carry the loss's normalisation as TRL would have given it for this mask. Logged per training batch
that has rows of the listed tasks: ``reference_credit/masked_frac``, the share of their completion tokens taken out
of the loss, and ``reference_credit/wrong_frac``, the share of their rows that were wrong.

Example recipe entry (the RookWorld ``A:`` task is the one with a reference so far)::

    callbacks:
      - {name: zero_std_resampling, max_rounds: 2}
      - {name: reference_credit, tasks: [A]}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..dynamics import batch as B
from ..errors import ConfigError
from .base import RookCallback
from .registry import register_callback


def _chess_env_answer(prompt: str, completion: str) -> tuple[str, str] | None:
    """``(ground truth, answer)`` of a RookWorld ``A:`` row, read as ``chess_env`` reads it (``None`` when the prompt's
    FEN is unreadable)."""
    from ..rewards.chess import env_answer

    row = env_answer(prompt, completion)
    return None if row is None else row[1:]


# Task → function giving (the one right completion, the completion's answer as the task's reward reads it).
REFERENCES: dict[str, Callable[[str, str], tuple[str, str] | None]] = {"A": _chess_env_answer}


def first_departure(pieces: Sequence[str], reference: str) -> int | None:
    """Index of the first token whose text makes the completion depart from ``reference``; ``None`` when it never does
    (the completion is the reference, or a prefix of it). ``pieces`` are the texts of the completion's tokens in order;
    leading whitespace of the completion is ignored, as the ``A:`` rewards read it.

    >>> first_departure(["r1", "b", "q", "k"], "r1b1kb1r")
    2
    >>> first_departure(["r1", "b"], "r1b1kb1r") is None
    True
    >>> first_departure([" ", "r1b1"], "r1b1") is None
    True
    """
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        if not reference.startswith(text.lstrip()):
            return i
    return None


@register_callback("reference_credit")
class ReferenceCredit(RookCallback):
    """Charges a wrong answer of a task with a computable answer only at its first wrong token (module docstring).

    Args:
        tasks: the tasks it applies to; each must have a reference (``A``: the RookWorld environment step).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"reference_credit": {"tasks": ["A"]}})
        >>> type(cb).__name__, list(cb.tasks), cb.changes_mask
        ('ReferenceCredit', ['A'], True)
    """

    state_key = "reference_credit"
    changes_mask = True  # after the hooks that replace rows (resampling), before the observers

    def __init__(self, tasks: Sequence[str] = ("A",)):
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        unknown = [t for t in tasks if t not in REFERENCES]
        if not tasks or unknown:
            raise ConfigError(f"reference_credit: tasks {unknown or tasks!r} have no reference answer; tasks with "
                              f"one: {sorted(REFERENCES)}.")
        self.tasks = tasks
        self._pieces: dict[int, str] = {}

    def _piece(self, tokenizer, token: int) -> str:
        """The text of one token, decoded once per token id."""
        if token not in self._pieces:
            self._pieces[token] = tokenizer.decode([token], skip_special_tokens=True)
        return self._pieces[token]

    def on_scored_batch(self, trainer, scored) -> None:
        if not trainer.model.training:
            return
        from ..chess.formats import task_of

        out, tokenizer = scored.output, trainer.processing_class
        mask = out["completion_mask"]
        prompts = tokenizer.batch_decode(out["prompt_ids"], skip_special_tokens=True)
        seen = masked = rows = wrong = 0
        for i, prompt in enumerate(prompts):
            task = task_of(prompt)
            if task not in self.tasks:
                continue
            rows += 1
            n = int(mask[i].sum())
            seen += n
            ids = out["completion_ids"][i][:n].tolist()
            pieces = [self._piece(tokenizer, t) for t in ids]
            row = REFERENCES[task](prompt.strip(), "".join(pieces))
            if row is None or row[1] == row[0]:
                continue
            reference = row[0]
            wrong += 1
            first = first_departure(pieces, reference)
            advantage = float(out["advantages"][i])
            if first is None or advantage == 0:
                continue
            keep = mask[i].clone()
            if advantage < 0:
                keep[:first] = 0
                keep[first + 1:] = 0
            else:
                keep[first:] = 0
            masked += int(mask[i].sum() - keep.sum())
            mask[i] = keep
        if "num_items_in_batch" in out:  # a cross-process count: every rank recounts, with or without rows of its own
            out["num_items_in_batch"] = B.count_loss_tokens(out, trainer.accelerator)
        if rows:  # a batch of other tasks only (per-task sampling's P: batches) says nothing about the rule
            metrics = trainer._metrics["train"]
            metrics["reference_credit/masked_frac"].append(masked / seen if seen else 0.0)
            metrics["reference_credit/wrong_frac"].append(wrong / rows)
