"""``sft_anchor``: a supervised term on reference lines added to every training loss, so GRPO keeps a skill it does
not pay for.

GRPO's updates move shared weights. On the embedded default, P: (pick a move) updates alone make the model write
broken boards on the A: task (a rank a square short), which no P: reward sees (docs/experiments/2026-11-23-tiny-model-builds.md). The anchor is
InstructGPT's "PPO-ptx" remedy for such regressions: each training loss gets ``coef`` times the mean negative
log-likelihood per token of a few reference completions (prompt given, the completion and EOS scored, as SFT scores
them), drawn in a fixed shuffled order from ``data``:

    loss = GRPO loss + coef * NLL(reference completions | prompts)

The anchor term is scaled for gradient accumulation the way TRL scales its own loss, so ``coef`` weighs it per
optimizer step whatever ``gradient_accumulation_steps``, ``steps_per_generation`` or ``num_iterations`` are. It is
added only to training losses (never to an evaluation's), and it trains on the reference answers, so a held-out
gain it brings is SFT's, not the reward's: compare with the anchor alone before crediting GRPO (README).

Logged (per training loss, averaged over the logging window): ``sft_anchor/nll``, the anchor batch's NLL per token,
about the anchor's own reference lines, not the GRPO batch.

Any task's reference answers anchor: ``data`` is read with ``format`` like a recipe's dataset (the rows need
``prompt`` and ``completion`` columns after it: a task pack's format such as ``rookworld`` makes them from its lines,
and a prompt/completion file has them already); ``tasks`` keeps the rows of some tasks (a ``task`` column).

``score`` puts the loss on a part of each reference completion, the rest of it staying context: a function
``(prompt, completion) -> (start, end)`` giving the part's character span in the completion (``None``: the whole
completion), named in the registry's grammar. The chess pack's ``rookworld_best_move`` scores a P: line on its B: move
alone (and the line's end): the engine's best move taught without the reference M: and E: lists, whose random order
teaches repeated moves (docs/experiments/2026-11-27-best-move-grid-plan.md, the side probe); an A: line, which has no
B:, is scored whole. A task of your own names its part the same way (``score: my_task.py:answer_span``).

Example recipe entries (A: lines of the packaged chess positions, 16 per loss; a prompt/completion file of your own)::

    callbacks:
      - {name: sft_anchor, data: rookgrpo/tiny-rookworld-train, tasks: [A], coef: 0.1, batch_size: 16}
      - {name: sft_anchor, data: train_answers.jsonl, coef: 0.05}
      - {name: sft_anchor, data: rookgrpo/tiny-rookworld-grpo, tasks: [P, A], score: rookworld_best_move}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..trl_compat import log_metric
from .base import RookCallback
from .registry import register_callback


@register_callback("sft_anchor")
class SFTAnchor(RookCallback):
    """Add ``coef`` x the NLL of ``batch_size`` reference completions to each training loss (module docstring).

    Args:
        data: rows with reference completions (a packaged name, file, directory or hub id), read with ``format``.
        tasks: which tasks' rows anchor (``[A]``: RookWorld's next state only; ``[P, A]``: both); default: all.
        format: the dataset format of ``data`` (``auto``, ``prompt``, a pack's such as ``rookworld``, or your own).
        coef: weight of the NLL term against the GRPO loss; > 0.
        batch_size: reference lines per loss.
        max_length: lines longer than this many tokens are truncated from the right (default: the model's context).
        score: the part of each completion the loss is on: a function ``(prompt, completion) -> (start, end) | None``
            (character span; ``None``: the whole completion), a registered name such as ``rookworld_best_move`` or a
            path (``my_task.py:answer_span``). Default: the whole completion and its end.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"sft_anchor": {"tasks": ["A"], "coef": 0.1}})
        >>> type(cb).__name__, cb.tasks, cb.coef, cb.batch_size
        ('SFTAnchor', ['A'], 0.1, 16)
    """

    state_key = "sft_anchor"

    def __init__(self, data: str = "rookgrpo/tiny-rookworld-train", tasks: list[str] | tuple[str, ...] | None = ("A",),
                 coef: float = 0.1, batch_size: int = 16, max_length: int | None = None, format: str = "auto",
                 score=None):
        if not float(coef) > 0:
            raise ConfigError(f"sft_anchor: coef must be > 0, got {coef} (leave the callback out for no anchor).")
        if int(batch_size) < 1:
            raise ConfigError(f"sft_anchor: batch_size must be >= 1, got {batch_size}.")
        self.data, self.tasks, self.coef = data, list(tasks) if tasks else None, float(coef)
        self.format = format
        self.batch_size, self.max_length = int(batch_size), max_length
        self.score = score
        self.drawn = 0  # reference lines drawn so far (checkpointed: a resumed run continues the same order)

    def bind(self, trainer) -> None:
        super().bind(trainer)
        rows = self.load_rows()
        tok = trainer.processing_class
        if tok.eos_token_id is None:
            raise ConfigError("sft_anchor: the tokenizer has no EOS token; the anchor scores the completion's end.")
        limit = self.max_length or getattr(trainer.model.config, "n_positions", None) or \
            getattr(trainer.model.config, "max_position_embeddings", None) or 1024
        prompts = tok(list(rows["prompt"]), add_special_tokens=False)["input_ids"]
        part = self._part()
        self.lines, self.spans = [], []  # token ids of each line, and the positions the loss scores (start, end)
        for prompt_ids, prompt, completion in zip(prompts, rows["prompt"], rows["completion"]):
            completion_ids, first, last = _scored_tokens(tok, prompt, completion, part)
            line = (prompt_ids + completion_ids + [tok.eos_token_id])[:limit]
            start, end = len(prompt_ids) + first, len(prompt_ids) + last
            self.lines.append(line)
            self.spans.append((min(start, len(line)), min(end, len(line))))
        if not any(end > start for start, end in self.spans):
            raise ConfigError(f"sft_anchor: score {self.score!r} selects no token of any reference completion in "
                              f"{self.data!r}; the anchor would train nothing.")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.seed = int(trainer.args.seed)
        self.prompts = set(rows["prompt"])

    def _part(self):
        """The ``score`` function, or ``None`` for whole completions."""
        if self.score is None:
            return None
        if callable(self.score):
            return self.score
        from ..registry import load

        return load("part", str(self.score))

    def load_rows(self):
        """The reference rows: ``data`` read with ``format``, kept to ``tasks``; prompt and completion columns."""
        from ..data import apply_format, load_recipe_dataset

        rows = apply_format(load_recipe_dataset(self.data), self.format, "prompt", self.tasks)
        columns = rows.column_names or []
        if self.tasks and "task" in columns:
            rows = rows.filter(lambda r: r["task"] in self.tasks)
        # Before the column check: a format that kept no row may leave the input's columns only.
        if len(rows) == 0:
            raise ConfigError(f"sft_anchor: {self.data!r} has no {'/'.join(self.tasks or ['any'])} rows to anchor on.")
        missing = [c for c in ("prompt", "completion") if c not in columns]
        if missing:
            raise ConfigError(f"sft_anchor: {self.data!r} has no {' or '.join(missing)} column after format "
                              f"{self.format!r} (columns: {', '.join(columns)}); the anchor needs reference answers.")
        if not all(isinstance(p, str) for p in rows["prompt"][:1]):
            raise ConfigError(f"sft_anchor: {self.data!r} has conversational prompts; the anchor takes text "
                              "prompt/completion rows (apply the chat template to the data first).")
        return rows

    def check_held_out(self, callbacks) -> None:
        """Refuse anchor lines whose prompts another callback evaluates as held out (``chess_eval``'s rows)."""
        held_out = {r["prompt"] for cb in callbacks if cb is not self for r in getattr(cb, "rows", ())
                    if isinstance(r, dict) and "prompt" in r}
        leaked = len(self.prompts & held_out)
        if leaked:
            raise ConfigError(f"sft_anchor: {leaked} of {self.data!r}'s prompts are held-out positions another "
                              "callback evaluates (heldout_eval, chess_eval); anchoring on them would train on the test. Use "
                              "training lines for the anchor.")

    def on_train_begin(self, args, state, control, **kwargs):
        # Here, not in bind: every callback is bound by now, whatever order the recipe lists them in.
        self.check_held_out(self.trainer.callback_handler.callbacks)

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = int(state.get("drawn", 0))

    def _next_indices(self) -> list[int]:
        """The next ``batch_size`` lines of a fixed order: one shuffle of all lines per pass, seeded by the pass."""
        n, out = len(self.lines), []
        while len(out) < self.batch_size:
            epoch, pos = divmod(self.drawn, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
            take = min(self.batch_size - len(out), n - pos)
            out += order[pos:pos + take].tolist()
            self.drawn += take
        return out

    def extra_loss(self, trainer, model) -> torch.Tensor | None:
        """The anchor term for one training loss, already scaled for gradient accumulation (None outside training)."""
        if not (model.training and torch.is_grad_enabled()):
            return None
        idx = self._next_indices()
        width = max(len(self.lines[i]) for i in idx)
        # The unwrapped module, so a wrapper's forward bookkeeping (DDP, DeepSpeed) sees one forward per loss; the two
        # terms' gradients meet in one backward, which the wrapper reduces once (two gloo ranks: tested).
        model = trainer.accelerator.unwrap_model(model)
        device = next(model.parameters()).device
        ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(idx), width), dtype=torch.long)
        scored = torch.zeros((len(idx), width), dtype=torch.bool)
        for row, i in enumerate(idx):
            line = self.lines[i]
            ids[row, : len(line)] = torch.tensor(line)
            attention[row, : len(line)] = 1
            start, end = self.spans[i]
            scored[row, start:end] = True
        ids, attention, scored = ids.to(device), attention.to(device), scored.to(device)
        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1]
        target, mask = ids[:, 1:], scored[:, 1:]
        # The scored positions by index, not padding multiplied by 0: a pad position's logits may be NaN (a kernel's
        # fault on a padded row), and 0 x NaN is NaN in the loss and in every gradient.
        if not bool(mask.any()):  # every drawn line's completion cut off by max_length: nothing to anchor on
            return None
        nll = F.cross_entropy(logits[mask].float(), target[mask])
        log_metric(trainer, "sft_anchor/nll", float(nll.detach()))
        return self.coef * nll / trainer.current_gradient_accumulation_steps


def _scored_tokens(tok, prompt: str, completion: str, part) -> tuple[list[int], int, int]:
    """A completion's token ids and the range of them the loss scores, ``(ids, first, last)``, counting the EOS that
    follows the completion as index ``len(ids)``: with no ``part`` (or a part that is ``None`` for this completion)
    every completion token and the EOS; else the tokens that overlap the part's character span, and the EOS when the
    part runs to the completion's end. Character offsets come from a fast tokenizer; a slow one tokenizes the text
    before the part, the part and the rest one after the other."""
    span = part(prompt, completion) if part is not None else None
    if span is None:
        ids = tok(completion, add_special_tokens=False)["input_ids"]
        return ids, 0, len(ids) + 1
    start, end = int(span[0]), int(span[1])
    to_end = end >= len(completion.rstrip())
    if getattr(tok, "is_fast", False):
        enc = tok(completion, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        inside = [i for i, (a, b) in enumerate(offsets) if b > start and a < end]
    else:
        head, middle = (tok(text, add_special_tokens=False)["input_ids"] for text in (completion[:start],
                                                                                    completion[start:end]))
        tail = tok(completion[end:], add_special_tokens=False)["input_ids"]
        ids = head + middle + tail
        inside = list(range(len(head), len(head) + len(middle)))
    if not inside:
        return ids, len(ids), len(ids) + (1 if to_end else 0)
    return ids, inside[0], (len(ids) + 1) if to_end else inside[-1] + 1
