"""``chess_eval``: held-out chess next to the training reward, every ``every`` steps, greedy: the chess pack's
:class:`~rookgrpo.callbacks.heldout_eval.HeldoutEval` (same schedule and logging, chess scoring).

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
  (:func:`rookgrpo.evaluation.reference_nll`). It needs no sampling and moves before greedy accuracy does: a policy
  whose updates push down the tokens of right answers shows it here first.

Greedy decoding draws no random numbers and the engine clears its hash before every search, so turning the callback
on does not change the training run, only its time (``timing/heldout``: seconds per evaluation).
"""

from __future__ import annotations

import chess  # noqa: F401  (the pack's dependency: without the extra, naming chess_eval fails with its name)

from ..callbacks.heldout_eval import HeldoutEval
from ..callbacks.registry import register_callback
from ..errors import ConfigError
from .assets import VAL_ENV, VAL_POLICY

LOGGED = ("best_move_accuracy", "top5_accuracy", "legal_move_rate", "format_rate", "move_rank_reward", "top_move_share",
          "env_exact_accuracy", "env_copied_rate", "env_broken_rate", "nll_P", "nll_A")


@register_callback("chess_eval")
class ChessEval(HeldoutEval):
    """Evaluate held-out RookWorld positions every ``every`` steps (see the module docstring).

    Args:
        data: RookWorld lines (a packaged name, file or hub id); the first ``n_policy`` distinct ``P:`` and
            ``n_env`` distinct ``A:`` prompts are the fixed subset (greedy decoding answers copies of a prompt alike,
            so a copy would only weigh one position more). The default is the packaged model's validation panel,
            disjoint from the GRPO positions a run with ``rookgrpo/tiny-rookworld-grpo`` trains on and from the
            panel ``rookgrpo evaluate`` reports on (``rookgrpo/tiny-rookworld-eval``).
        every: steps between evaluations; a multiple of ``logging_steps`` so each lands in a logged step.
        n_policy: how many distinct ``P:`` prompts the subset holds (default: as many as the packaged validation
            panel has: ``rookgrpo.chess.assets.VAL_POLICY``).
        n_env: how many distinct ``A:`` prompts the subset holds (default: as many as the packaged validation panel
            has: ``rookgrpo.chess.assets.VAL_ENV``).
        batch_size: prompts per greedy generation call.
        max_new_tokens: default: 1.25 x the longest reference completion's tokens, plus 4.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"chess_eval": {"every": 40, "n_policy": 32}})
        >>> type(cb).__name__, cb.data, cb.every, cb.n_policy, cb.n_env
        ('ChessEval', 'rookgrpo/tiny-rookworld-val', 40, 32, 32)
    """

    state_key = "chess_eval"

    def __init__(self, data: str = "rookgrpo/tiny-rookworld-val", n_policy: int = VAL_POLICY, n_env: int = VAL_ENV,
                 every: int = 20, batch_size: int = 64, max_new_tokens: int | None = None):
        super().__init__(data=data, format="rookworld", every=every, batch_size=batch_size,
                         max_new_tokens=max_new_tokens)
        self.n_policy, self.n_env = int(n_policy), int(n_env)

    def guard_metric(self, trainer) -> dict[str, float]:
        """``heldout_guard``'s metric when the recipe names none: ``heldout/move_rank_reward``, the greedy B: move's
        rank among the engine's top 5 (it moves with best-move accuracy and is less noisy on a small panel)."""
        return {"heldout/move_rank_reward": 1.0}

    def load_rows(self) -> list[dict]:
        from .data import load_rookworld
        from .evaluate import prompt_clusters

        rows = load_rookworld(self.data)
        rows = [rows[i] for i, first in enumerate(prompt_clusters(rows["prompt"])) if first == i]  # first copies
        policy = [r for r in rows if r["task"] == "P"][: self.n_policy]
        env = [r for r in rows if r["task"] == "A"][: self.n_env]
        if not policy and not env:
            raise ConfigError(f"chess_eval: {self.data!r} has no P: or A: rows.")
        return policy + env

    def setup(self, trainer) -> None:
        from .engine import EngineSettings

        self.settings = EngineSettings().with_args(trainer.args)  # the training rewards' settings, as they are

    def score(self, model, tokenizer) -> dict[str, float]:
        from .evaluate import add_reference_nll, complete, score

        prompts, tasks = [r["prompt"] for r in self.rows], [r["task"] for r in self.rows]
        completions = complete(model, tokenizer, prompts, self.max_new_tokens, self.batch_size)
        metrics = score(prompts, completions, tasks, self.settings)
        add_reference_nll(metrics, model, prompts, [r["completion"] for r in self.rows], tasks, self.batch_size,
                          tokenizer=tokenizer)
        return {k: float(metrics[k]) for k in LOGGED if k in metrics}
