"""``chess_eval``: held-out chess next to the training reward, every ``every`` steps, greedy.

A rising reward says the policy found more of what the rewards pay; only held-out positions say whether that is
chess. Every ``every`` optimizer steps (and once before the first), the policy completes a fixed held-out subset
greedily and the completions are scored by the evaluation code of ``rookgrpo evaluate`` (same rewards, same engine
settings as training). Logged in the same log entry as that step's training metrics (the one before training as its
own entry at step 0), under ``heldout/``:

- ``P:`` rows: ``best_move_accuracy``, ``top5_accuracy``, ``legal_move_rate``, ``format_rate``, ``move_rank_reward``
  (the mean ``chess_move_rank`` of the greedy answers), ``top_move_share`` (the most frequent B: move's share: a policy
  collapsing onto one move shows there first);
- ``A:`` rows: ``env_exact_accuracy``, and the two errors ``chess_env`` pays alike, ``env_copied_rate`` (the input
  board again) and ``env_broken_rate`` (a placement that is not a board): a run trading copies for broken boards
  shows there;
- both: ``nll_P`` and ``nll_A``, the teacher-forced NLL of the rows' reference answers in nats per token
  (:func:`rookgrpo.evaluate.reference_nll`). It needs no sampling and moves before greedy accuracy does: a policy
  whose updates push down the tokens of right answers shows it here first.

Greedy decoding draws no random numbers and the engine clears its hash before every search, so turning the callback
on does not change the training run, only its time (``timing/heldout``: seconds per evaluation).
"""

from __future__ import annotations

import time

from ..errors import ConfigError
from .base import RookCallback
from .registry import register_callback

LOGGED = ("best_move_accuracy", "top5_accuracy", "legal_move_rate", "format_rate", "move_rank_reward", "top_move_share",
          "env_exact_accuracy", "env_copied_rate", "env_broken_rate", "nll_P", "nll_A")


@register_callback("chess_eval")
class ChessEval(RookCallback):
    """Evaluate held-out RookWorld positions every ``every`` steps (see the module docstring).

    Args:
        data: RookWorld lines (a packaged name, file or hub id); the first ``n_policy`` distinct ``P:`` and
            ``n_env`` distinct ``A:`` prompts are the fixed subset (greedy decoding answers copies of a prompt alike,
            so a copy would only weigh one position more). The default is the packaged model's validation panel,
            disjoint from the GRPO positions a run with ``rookgrpo/tiny-rookworld-grpo`` trains on and from the
            panel ``rookgrpo evaluate`` reports on (``rookgrpo/tiny-rookworld-eval``).
        every: steps between evaluations; a multiple of ``logging_steps`` so each lands in a logged step.
        n_policy, n_env: how many distinct ``P:`` and ``A:`` prompts the subset holds.
        batch_size: prompts per greedy generation call.
        max_new_tokens: default: 1.25 x the longest reference completion's tokens, plus 4.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"chess_eval": {"every": 40, "n_policy": 32}})
        >>> type(cb).__name__, cb.data, cb.every, cb.n_policy, cb.n_env
        ('ChessEval', 'rookgrpo/tiny-rookworld-val', 40, 32, 32)
    """

    state_key = "chess_eval"

    def __init__(self, data: str = "rookgrpo/tiny-rookworld-val", n_policy: int = 96, n_env: int = 32,
                 every: int = 20, batch_size: int = 64, max_new_tokens: int | None = None):
        if int(every) < 1:
            raise ConfigError(f"chess_eval: every must be >= 1, got {every}.")
        self.data, self.n_policy, self.n_env = data, int(n_policy), int(n_env)
        self.every, self.batch_size, self.max_new_tokens = int(every), int(batch_size), max_new_tokens
        self.rows: list[dict] = []

    def bind(self, trainer) -> None:
        from ..chess.data import load_rookworld
        from ..chess.engine import EngineSettings
        from ..evaluate import prompt_clusters

        super().bind(trainer)
        if self.every % max(int(trainer.args.logging_steps), 1):
            raise ConfigError(f"chess_eval: every ({self.every}) must be a multiple of logging_steps "
                              f"({trainer.args.logging_steps}), so each evaluation lands in a logged step.")
        rows = load_rookworld(self.data)
        rows = [rows[i] for i, first in enumerate(prompt_clusters(rows["prompt"])) if first == i]  # first copies
        policy = [r for r in rows if r["task"] == "P"][: self.n_policy]
        env = [r for r in rows if r["task"] == "A"][: self.n_env]
        if not policy and not env:
            raise ConfigError(f"chess_eval: {self.data!r} has no P: or A: rows.")
        self.rows = policy + env
        tok = trainer.processing_class
        if self.max_new_tokens is None:
            longest = max(len(tok(r["completion"], add_special_tokens=False)["input_ids"]) for r in self.rows)
            self.max_new_tokens = int(longest * 1.25) + 4
        self.settings = EngineSettings().with_args(trainer.args)  # the training rewards' settings, as they are

    def evaluate(self) -> dict[str, float]:
        from ..evaluate import add_reference_nll, complete, score

        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        prompts, tasks = [r["prompt"] for r in self.rows], [r["task"] for r in self.rows]
        try:
            completions = complete(model, trainer.processing_class, prompts, self.max_new_tokens, self.batch_size)
            metrics = score(prompts, completions, tasks, self.settings)
            add_reference_nll(metrics, model, prompts, [r["completion"] for r in self.rows], tasks, self.batch_size,
                              tokenizer=trainer.processing_class)
        finally:
            model.train(was_training)
        return {f"heldout/{k}": float(metrics[k]) for k in LOGGED if k in metrics}

    def _timed(self) -> dict[str, float]:
        start = time.perf_counter()
        values = self.evaluate()
        values["timing/heldout"] = time.perf_counter() - start
        return values

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            values = self._timed()
            if self.trainer.accelerator.is_main_process:
                state.log_history.append({"step": 0, **values})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            metrics = self.trainer._metrics["train"]
            for key, value in self._timed().items():
                metrics[key].append(value)
