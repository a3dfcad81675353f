"""The chess task pack (RookWorld): what it registers with rookgrpo's core, by import path, so loading this module
imports neither python-chess nor Stockfish's wrappers (the extra ``rookgrpo[chess]`` brings python-chess; Stockfish
is a system binary the rewards look for when a run starts).

- rewards: ``chess_format``, ``chess_legality``, ``chess_best_move``, ``chess_move_rank``, ``chess_candidates``,
  ``chess_evals``, ``chess_env``, ``chess_env_board`` (:mod:`rookgrpo.chess.rewards`);
- dataset format ``rookworld`` (a ``text`` column of P:/A: lines; ``dataset_format: auto`` picks it for such data);
- the completion part ``rookworld_best_move`` (a P: line's B: move), for ``sft_anchor``'s ``score``;
- held-out evaluation: the ``chess_eval`` callback (:class:`rookgrpo.chess.heldout.ChessEval`), which the held-out
  guard selects on;
- packaged files: the model ``rookgrpo/tiny-rookworld`` and its positions (``-train``, ``-eval``, ``-sft-sample``,
  and the ``-grpo`` / ``-val`` split of the training positions; ``-val-fresh``, a larger validation panel of fresh
  positions).
"""

from ..assets import TINY_ROOKWORLD, register_dataset, register_model
from ..registry import register, register_format_detector

REWARDS = ("chess_format", "chess_legality", "chess_best_move", "chess_move_rank", "chess_candidates", "chess_evals",
           "chess_env", "chess_env_board")

for _name in REWARDS:
    register("reward", _name, f"rookgrpo.chess.rewards:{_name}")
register("callback", "chess_eval", "rookgrpo.chess.heldout:ChessEval")
register("format", "rookworld", "rookgrpo.chess.data:rookworld_format")
# The part of a P: reference line the SFT anchor can be scored on: its B: move (sft_anchor's score).
register("part", "rookworld_best_move", "rookgrpo.chess.formats:best_move_part")
register_format_detector("rookworld", lambda columns, prompt_column: "text" in columns and prompt_column not in columns)

register_model("tiny-rookworld", "rookgrpo.chess.assets:tiny_rookworld")
# RookWorld lines (compact layout) shipped with the tiny model: GRPO positions, held-out evaluation positions and a
# sample of the lines its SFT stage trained on (to set its held-out numbers against).
register_dataset("tiny-rookworld-train", TINY_ROOKWORLD / "train_positions.txt")
register_dataset("tiny-rookworld-eval", TINY_ROOKWORLD / "eval_positions.txt")
register_dataset("tiny-rookworld-sft-sample", TINY_ROOKWORLD / "sft_sample.txt")
# The GRPO positions split for a run with a held-out guard: it trains on -grpo and selects checkpoints on -val; -eval,
# the reported panel, is disjoint from both.
register_dataset("tiny-rookworld-grpo", "rookgrpo.chess.assets:grpo_positions")
register_dataset("tiny-rookworld-val", "rookgrpo.chess.assets:val_positions")
register_dataset("tiny-rookworld-val-fresh", "rookgrpo.chess.assets:fresh_val_positions")
