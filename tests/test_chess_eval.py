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
                    "heldout/move_rank_reward", "heldout/env_exact_accuracy", "heldout/env_copied_rate",
                    "heldout/env_broken_rate", "timing/heldout"):
            assert key in h and h[key] >= 0, key
        assert h["heldout/nll_P"] > 0 and h["heldout/nll_A"] > 0  # a random model: far from the references

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


def test_reference_nll_is_the_teacher_forced_loss_of_the_answer(tmp_path):
    """Per row: the mean NLL of the completion's tokens and the end-of-text token after the prompt, as a plain
    forward of prompt + completion computes it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.assets import resolve_model
    from rookgrpo.chess.evaluate import reference_nll

    path = resolve_model("rookgrpo/tiny-rookworld")
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = ["P: 4k3/8/8/8/8/8/4P3/4K3 w - - 0 1", "A: 4k3/8/8/8/8/8/4P3/4K3 w - - 0 1+e2e4+e2e4+"]
    answers = [" M: e2e4 e1d1 E: 0.1 0.0 B: e2e4", "4k3/8/8/8/4P3/8/8/4K3 b - - 0 1+0.001+0+0"]
    got = reference_nll(model, tok, prompts, answers, batch_size=2)
    for prompt, answer, value in zip(prompts, answers, got):
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        c = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1]
        expected = torch.nn.functional.cross_entropy(logits, torch.tensor(c)).item()
        assert abs(value - expected) < 1e-4, (value, expected)


def test_headroom_reports_greedy_against_sampled_pass_at_k(engine_settings):
    from rookgrpo.chess.evaluate import format_headroom, headroom

    result = headroom("rookgrpo/tiny-rookworld", "rookgrpo/tiny-rookworld-eval", samples=4, n=24,
                      temperatures={"P": 0.5, "A": 0.6}, settings=engine_settings, progress=False)
    for name in ("best_move_accuracy", "top5_accuracy", "legal_move_rate", "format_rate"):
        sampled = result["sampled"][name]
        assert 0 <= sampled["pass@1"] <= sampled["pass@2"] <= sampled["pass@4"] <= 1, (name, sampled)
    assert result["sampled"]["legal_move_rate"]["pass@4"] > result["sampled"]["legal_move_rate"]["pass@1"]
    table = format_headroom(result)
    assert "pass@4" in table and "P: T=0.5, A: T=0.6" in table
