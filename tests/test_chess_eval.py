"""chess_eval: held-out chess logged next to the training reward, without changing the training run."""

import pytest

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import ChessEval


def _trainer(tmp_path, generated_lines, callbacks, **overrides):
    from rookgrpo.chess.data import load_rookworld

    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(generated_lines) + "\n")
    args = tiny_grpo_args(tmp_path / "out", max_steps=4, logging_steps=2, stockfish_depth=6, **overrides)
    return RookGRPOTrainer(model="rookgrpo/tiny-random", reward_funcs=["chess_format", "chess_legality"], args=args,
                           train_dataset=load_rookworld(str(data)), callbacks=callbacks), str(data)


def test_heldout_metrics_are_logged_at_step_0_and_every_n_steps(tmp_path, generated_lines):
    trainer, data = _trainer(tmp_path, generated_lines, None)
    evaluator = ChessEval(data=data, n_policy=8, n_env=4, every=2)
    trainer.add_callback(evaluator)
    trainer.train()
    entries = [h for h in trainer.state.log_history if "heldout/best_move_accuracy" in h]
    assert [h["step"] for h in entries] == [0, 2, 4]
    for h in entries:
        for key in ("heldout/top5_accuracy", "heldout/legal_move_rate", "heldout/format_rate",
                    "heldout/env_exact_accuracy", "heldout/env_copied_rate", "heldout/env_broken_rate",
                    "timing/heldout"):
            assert key in h and h[key] >= 0, key
    assert "loss" in entries[1]  # in the same entry as that step's training metrics


def test_the_evaluation_does_not_change_the_training_run(tmp_path, generated_lines):
    plain, _ = _trainer(tmp_path / "a", generated_lines, None)
    plain.train()
    watched, data = _trainer(tmp_path / "b", generated_lines, None)
    evaluator = ChessEval(data=data, n_policy=8, n_env=4, every=2)
    watched.add_callback(evaluator)
    watched.train()

    def numbers(trainer):
        return [(h["loss"], h["reward"]) for h in trainer.state.log_history if "loss" in h]

    assert numbers(plain) == numbers(watched)


def test_every_must_land_on_a_logged_step(tmp_path, generated_lines):
    trainer, data = _trainer(tmp_path, generated_lines, None)
    with pytest.raises(ConfigError, match="multiple of logging_steps"):
        ChessEval(data=data, every=3).bind(trainer)


def test_the_subset_holds_each_prompt_once(tmp_path, generated_lines):
    """The packaged held-out file repeats some A: lines; the subset takes the first n distinct prompts, in order."""
    a_lines = [l for l in generated_lines if l.startswith("A: ")]
    copied = [a_lines[0]] * 3 + generated_lines
    trainer, data = _trainer(tmp_path, copied, None)
    evaluator = ChessEval(data=data, n_policy=2, n_env=3, every=2)
    evaluator.bind(trainer)
    prompts = [r["prompt"] for r in evaluator.rows]
    env = [p for p in prompts if p.startswith("A: ")]
    assert len(env) == 3 == len(set(env)) and len(prompts) == 5
    from rookgrpo.chess.data import load_rookworld

    in_file = [r["prompt"] for r in load_rookworld(data) if r["task"] == "A"]
    assert in_file[:3] == [in_file[0]] * 3  # the copies come first in the file
    assert env == list(dict.fromkeys(in_file))[:3]
