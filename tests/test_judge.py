"""Judge-scored GRPO: a frozen sequence-classification model, named by its directory, scores the completions.

TRL accepts a reward-model id or directory in ``reward_funcs``; rookgrpo passes it through unchanged. These tests build
a small GPT-2 judge locally, train with it (resampling on), and check that the diagnostics name a judge whose scores
have collapsed to one value, the failure that makes a judge-scored run's loss exactly 0.
"""

import logging

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import Diagnostics, Doctor, RookGRPOTrainer, ZeroStdResampling


def build_judge(base_dir, out_dir, constant: bool = False):
    """A ``GPT2ForSequenceClassification`` judge (one score) with the tiny model's config and tokenizer.

    ``constant``: its score head is zeroed, so it gives every text the same score (0), as a collapsed judge does.
    """
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    config = GPT2Config.from_pretrained(base_dir, num_labels=1)
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    judge = GPT2ForSequenceClassification(config)
    if constant:
        with torch.no_grad():
            judge.score.weight.zero_()
    judge.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_judge_scored_grpo_trains_with_resampling(tiny_model_dir, smoke_dataset, tmp_path):
    judge = build_judge(tiny_model_dir, tmp_path / "judge")
    resampler = ZeroStdResampling(max_rounds=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=str(judge), args=tiny_grpo_args(tmp_path / "out"),
                              train_dataset=smoke_dataset, callbacks=[resampler, Diagnostics()])
    assert trainer.reward_func_names == ["judge"]
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3
    assert all(h["rewards/judge/std"] > 0 for h in logged)  # a random judge still tells completions apart
    assert all(h["optimised/frac_reward_zero_std"] == 0.0 for h in logged)


def test_collapsed_judge_is_named_with_cause_and_fix(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    judge = build_judge(tiny_model_dir, tmp_path / "flat-judge", constant=True)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=str(judge),
                              args=tiny_grpo_args(tmp_path / "out", max_steps=2), train_dataset=smoke_dataset,
                              callbacks=[Diagnostics(), Doctor(thresholds={"min_share_points": 2})])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "same score" in r.getMessage()]
    assert len(warnings) == 1 and "reward 'flat-judge' gave every completion of the batch the same score" in warnings[0]
    assert "a judge (reward model)" in warnings[0] and "Fix:" in warnings[0] and "It is a rule" not in warnings[0]
    assert warnings[0].startswith("doctor: [critical]")  # the only reward, flat at every step: nothing to learn
    assert all(h["loss"] == pytest.approx(0.0, abs=1e-6) for h in trainer.state.log_history if "loss" in h)


# --- the packaged fill-in judge: a judge whose scores vary, trained on a task generated here -----------------------


def test_fill_in_rule_gives_partial_credit_and_the_floor_to_anything_else():
    from rookgrpo.judge.model import destinations, fill_in_prompts, grade

    assert destinations("knight", "g1") == {"e2", "f3", "h3"}
    prompt = "knight on g1 moves to"
    assert [grade(prompt, c) for c in (" f3", "f3", " f3.", " a1", " f3zz", " e", "  f3", "", "zz")] == \
        pytest.approx([1.0, 0.8, 1.0, 0.6, 0.5, 0.15, 0.0, 0.0, 0.0])
    assert grade("not a prompt", " f3") == 0.0 and grade(None, " f3") == 0.0 and grade(prompt, None) == 0.0
    assert len(set(fill_in_prompts(200, seed=1))) > 150 and fill_in_prompts(5, seed=1) == fill_in_prompts(5, seed=1)
    # The audit of docs/rewards.md, pinned: under the rule every degenerate answer earns less than the right one.
    prompts = fill_in_prompts(200, seed=12345)
    mean = lambda make: sum(grade(p, make(p)) for p in prompts) / len(prompts)  # noqa: E731
    parse = lambda p: (p.split()[0], p.split()[2])  # noqa: E731
    best = mean(lambda p: " " + sorted(destinations(*parse(p)))[0])
    degenerate = {"constant": mean(lambda p: " e4"), "copy": mean(lambda p: " " + parse(p)[1]),
                  "list": mean(lambda p: " " + " ".join(sorted(destinations(*parse(p))))), "empty": mean(lambda p: "")}
    assert best == 1.0 and all(v <= 0.7 for v in degenerate.values()), degenerate


def test_a_briefly_trained_judge_ranks_answers_like_the_rule(tmp_path):
    """Trained for a few seconds here: on answers it never saw, its scores follow the rule it imitates."""
    from rookgrpo.judge.model import build_fill_in_judge, training_examples
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = build_fill_in_judge(tmp_path / "judge", steps=250, progress=False)
    judge, tok = AutoModelForSequenceClassification.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    held_out = training_examples(600, seed=99)
    enc = tok([t for t, _ in held_out], return_tensors="pt", padding=True, padding_side="right")
    with torch.no_grad():
        scores = judge(**enc).logits[:, 0]
    grades = torch.tensor([g for _, g in held_out])
    rank = lambda x: x.argsort().argsort().float()  # noqa: E731
    spearman = torch.corrcoef(torch.stack([rank(scores), rank(grades)]))[0, 1].item()
    assert spearman > 0.7, spearman
    assert scores[grades == 1.0].mean() > scores[grades == 0.0].mean() + 0.5
    assert scores.std() > 0.2  # not collapsed: the scores vary, so GRPO gets a signal
    # The longest answers a policy can write still fit the judge's positions (TRL does not truncate its input).
    long = tok(["queen on d4 moves to " + " a1" * 60], return_tensors="pt")
    assert torch.isfinite(judge(**long).logits).all()


def test_packaged_judge_short_name_resolves_to_its_directory(tmp_path, monkeypatch):
    from rookgrpo.judge import model as judge_module
    from rookgrpo.rewards.registry import resolve_reward_func

    built = []

    def fake_build(out_dir, **kwargs):  # the real build is exercised above; here only the name's resolution
        built.append(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir

    monkeypatch.setattr(judge_module, "build_fill_in_judge", fake_build)
    monkeypatch.setenv("ROOKGRPO_CACHE", str(tmp_path))  # the fake directory stays out of the session's cache
    resolved = resolve_reward_func("rookgrpo/fill-in-judge")
    assert built and resolved == str(built[0]) and resolved.endswith("fill-in-judge-v1")
    assert resolve_reward_func("fill_in_grade")(["rook on a1 moves to"], [" h1"]) == [1.0]


def test_judge_recipe_pays_the_judge_and_logs_the_rule_beside_it(tmp_path, monkeypatch):
    from conftest import REPO
    from rookgrpo.train import build_trainer

    monkeypatch.chdir(REPO)
    trainer, _, _ = build_trainer(["recipes/judge.yaml", "--max_steps", "5", "--output_dir", str(tmp_path),
                                   "--disable_tqdm", "true"])
    assert trainer.reward_func_names == ["fill-in-judge-v1", "fill_in_grade"]
    assert trainer.reward_weights.tolist() == [1.0, 0.0]
    trainer.train()
    log = [h for h in trainer.state.log_history if "loss" in h][-1]
    assert log["rewards/fill-in-judge-v1/std"] > 0  # the judge's scores vary: there is a signal
    assert 0.0 <= log["rewards/fill_in_grade/mean"] <= 1.0 and log["memory/loss"] > 0


def test_saturated_judge_is_named_with_cause_and_fix(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """A judge whose scores sit at 50 whatever the text, differing in the fourth digit: group scaling would turn that
    noise into full-size advantages; the diagnostics say so (and do not call it collapsed)."""
    from transformers import GPT2ForSequenceClassification

    path = build_judge(tiny_model_dir, tmp_path / "plateau-judge")
    judge = GPT2ForSequenceClassification.from_pretrained(path)
    with torch.no_grad():  # a tiny text-dependent part plus a large constant along the final layer norm's bias
        judge.score.weight.mul_(1e-2)
        bias = judge.transformer.ln_f.bias
        bias.copy_(torch.ones_like(bias))
        judge.score.weight.add_(50.0 / bias.numel())
    judge.save_pretrained(path)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=str(path),
                              args=tiny_grpo_args(tmp_path / "out", max_steps=1), train_dataset=smoke_dataset,
                              callbacks=[Diagnostics(), Doctor(thresholds={"min_share_points": 1})])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    log = [h for h in trainer.state.log_history if "loss" in h][0]
    assert 0 < log["rewards/plateau-judge/std"] < 1e-3 * abs(log["rewards/plateau-judge/mean"])
    warnings = [r.getMessage() for r in caplog.records if "reward 'plateau-judge' saturated" in r.getMessage()]
    assert len(warnings) == 1 and "reward 'plateau-judge' scored the batch within" in warnings[0], warnings
    assert "scale_rewards: none" in warnings[0]
    assert not [r for r in caplog.records if "same score" in r.getMessage()]
