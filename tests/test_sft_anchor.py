"""sft_anchor: coef x the reference completions' NLL added to each training loss, scaled for gradient accumulation,
checkpointed, never added to an evaluation loss, and refused on held-out positions."""

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import ChessEval, SFTAnchor


def _data(tmp_path, lines):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _trainer(tmp_path, generated_lines, anchor=None, peft_config=None, **overrides):
    from rookgrpo.chess.data import load_rookworld

    data = _data(tmp_path, generated_lines)
    values = dict(max_steps=4, logging_steps=1, stockfish_depth=6)
    values.update(overrides)
    args = tiny_grpo_args(tmp_path / "out", **values)
    train = load_rookworld(data, tasks=["P"])
    trainer = RookGRPOTrainer(model="rookgrpo/tiny-random", reward_funcs=["chess_format"], args=args,
                              train_dataset=train,
                              eval_dataset=train.select(range(8)) if values.get("eval_strategy", "no") != "no" else None,
                              callbacks=[anchor] if anchor is not None else None, peft_config=peft_config)
    return trainer, data


def _reference_nll(model, tok, prompt, completion):
    """NLL per token of completion + EOS given the prompt, written out by hand."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]
    nll = F.cross_entropy(logits, ids[0, 1:], reduction="none")[len(p) - 1:]
    return nll.sum().item(), len(c)


def test_the_term_is_coef_times_the_completion_nll_scaled_for_accumulation(tmp_path, generated_lines):
    from rookgrpo.chess.data import load_rookworld

    anchor = SFTAnchor(data="placeholder", coef=0.3, batch_size=5)
    trainer, data = _trainer(tmp_path, generated_lines, disable_dropout=True)
    anchor.data = data
    anchor.bind(trainer)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    first = anchor.extra_loss(trainer, model)
    assert anchor.drawn == 5 and first.requires_grad
    rows = load_rookworld(data, tasks=["A"])
    replay = SFTAnchor(data=data, coef=0.3, batch_size=5)  # the same order, replayed from the start
    replay.bind(trainer)
    idx = replay._next_indices()
    total, count = 0.0, 0
    model.eval()  # dropout is off (disable_dropout), so this matches the train-mode forward
    for i in idx:
        s, n = _reference_nll(model, trainer.processing_class, rows[i]["prompt"], rows[i]["completion"])
        total, count = total + s, count + n
    assert first.item() == pytest.approx(0.3 * total / count, rel=1e-4)
    # Under gradient accumulation TRL divides its loss by the micro-batches per step; the anchor does too.
    model.train()
    trainer.current_gradient_accumulation_steps = 4
    replay2 = SFTAnchor(data=data, coef=0.3, batch_size=5)
    replay2.bind(trainer)
    assert replay2.extra_loss(trainer, model).item() == pytest.approx(first.item() / 4, rel=1e-4)


def test_score_puts_the_loss_on_the_b_move_of_p_lines_and_on_whole_a_lines(tmp_path, generated_lines):
    """``score: rookworld_best_move``: a P: line is scored on its B: move and end only, an A: line whole; the term is
    coef x the NLL of exactly those tokens, computed by hand."""
    from rookgrpo.chess.data import load_rookworld

    trainer, data = _trainer(tmp_path, generated_lines, disable_dropout=True)
    anchor = SFTAnchor(data=data, tasks=["P", "A"], coef=0.2, batch_size=6, score="rookworld_best_move")
    anchor.bind(trainer)
    tok = trainer.processing_class
    rows = load_rookworld(data, tasks=["P", "A"])
    for i, row in enumerate(rows):
        line, (start, end) = anchor.lines[i], anchor.spans[i]
        scored = tok.decode(line[start:end])
        if row["task"] == "P":
            assert scored.strip() == row["completion"].rsplit("B:", 1)[1].strip() + tok.eos_token, (i, scored)
        else:
            assert scored == row["completion"] + tok.eos_token
    model = trainer.model
    model.eval()
    trainer.current_gradient_accumulation_steps = 1
    replay = SFTAnchor(data=data, tasks=["P", "A"], coef=0.2, batch_size=6, score="rookworld_best_move")
    replay.bind(trainer)
    idx = replay._next_indices()
    total, count = 0.0, 0
    for i in idx:
        ids = torch.tensor([anchor.lines[i]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        nll = F.cross_entropy(logits, ids[0, 1:], reduction="none")
        start, end = anchor.spans[i]
        total, count = total + nll[start - 1: end - 1].sum().item(), count + end - start
    model.train()
    assert anchor.extra_loss(trainer, model).item() == pytest.approx(0.2 * total / count, rel=1e-4)


def test_score_names_any_tasks_part_by_path_and_a_part_that_selects_nothing_is_refused(tmp_path, generated_lines):
    trainer, data = _trainer(tmp_path, generated_lines)
    parts = tmp_path / "parts.py"
    parts.write_text("def last_char(prompt, completion):\n    return (len(completion) - 1, len(completion))\n\n"
                     "def nothing(prompt, completion):\n    return (0, 0)\n")
    anchor = SFTAnchor(data=data, tasks=["A"], score=f"{parts}:last_char")
    anchor.bind(trainer)
    assert all(end - start == 2 for start, end in anchor.spans)  # the last character's token and EOS
    with pytest.raises(ConfigError, match="selects no token"):
        SFTAnchor(data=data, tasks=["A"], score=f"{parts}:nothing").bind(trainer)
    with pytest.raises(ConfigError, match="sft_anchor.score"):
        SFTAnchor(data=data, tasks=["A"], score="no_such_part").bind(trainer)


def test_nan_logits_at_padding_do_not_reach_the_term(tmp_path, generated_lines):
    """The anchor reads the scored positions by index: a NaN at a pad position (a kernel's fault on a padded row)
    leaves the term and its gradient finite, where multiplying the padding by 0 made both NaN."""
    anchor = SFTAnchor(data="placeholder", coef=0.3, batch_size=8)
    trainer, data = _trainer(tmp_path, generated_lines)
    anchor.data = data
    anchor.bind(trainer)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1

    def poison_padding(module, args, kwargs, output):
        output.logits = output.logits.masked_fill(kwargs["attention_mask"][..., None] == 0, float("nan"))
        return output

    handle = model.register_forward_hook(poison_padding, with_kwargs=True)
    try:
        lengths = {len(anchor.lines[i]) for i in range(anchor.batch_size)}
        assert len(lengths) > 1  # the batch is padded
        term = anchor.extra_loss(trainer, model)
        term.backward()
    finally:
        handle.remove()
    assert torch.isfinite(term)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_no_term_in_an_evaluation_loss(tmp_path, generated_lines):
    anchor = SFTAnchor(data="placeholder")
    trainer, data = _trainer(tmp_path, generated_lines)
    anchor.data = data
    anchor.bind(trainer)
    trainer.model.eval()
    assert anchor.extra_loss(trainer, trainer.model) is None and anchor.drawn == 0
    trainer.model.train()
    with torch.no_grad():
        assert anchor.extra_loss(trainer, trainer.model) is None


@pytest.mark.parametrize("layout", [dict(), dict(gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2)])
def test_training_adds_one_term_per_micro_batch_and_lowers_the_anchor_nll(tmp_path, generated_lines, layout):
    from rookgrpo.chess.data import load_rookworld

    data = _data(tmp_path / "d", generated_lines)
    plain, _ = _trainer(tmp_path / "plain", generated_lines, **layout)
    plain.train()
    anchor = SFTAnchor(data=data, coef=5.0, batch_size=8)
    anchored, _ = _trainer(tmp_path / "anchored", generated_lines, anchor, **layout)
    anchored.train()
    micro = anchored.args.gradient_accumulation_steps * anchored.args.max_steps
    assert anchor.drawn == 8 * micro  # one anchor batch per loss, whatever the layout
    logged = [h for h in anchored.state.log_history if "sft_anchor/nll" in h]
    assert len(logged) == anchored.args.max_steps and all(h["sft_anchor/nll"] > 0 for h in logged)
    assert not any("sft_anchor/nll" in h for h in plain.state.log_history)

    rows = load_rookworld(data, tasks=["A"])
    def nll(trainer):
        trainer.model.eval()
        parts = [_reference_nll(trainer.model, trainer.processing_class, r["prompt"], r["completion"]) for r in rows]
        return sum(s for s, _ in parts) / sum(n for _, n in parts)
    assert nll(anchored) < nll(plain)


def test_an_anchor_added_after_the_trainer_was_built_counts(tmp_path, generated_lines):
    data = _data(tmp_path / "d", generated_lines)
    trainer, _ = _trainer(tmp_path, generated_lines, max_steps=2)
    anchor = SFTAnchor(data=data, batch_size=4)
    trainer.add_callback(anchor)  # bound by add_callback
    trainer.train()
    assert anchor.drawn == 8 and sum("sft_anchor/nll" in h for h in trainer.state.log_history) == 2


def test_a_lora_wrapped_policy_with_evaluation_between_buffered_steps(tmp_path, generated_lines):
    """A PEFT policy, a generation batch optimised over two steps and an evaluation after every step: one anchor batch
    per training loss, none for the evaluation losses, and the adapter is what the anchor trains."""
    from peft import LoraConfig

    data = _data(tmp_path / "d", generated_lines)
    anchor = SFTAnchor(data=data, coef=5.0, batch_size=4)
    trainer, _ = _trainer(tmp_path, generated_lines, anchor,
                          peft_config=LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"),
                          steps_per_generation=2, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evals) == 4 and not any(k.startswith("eval_sft_anchor") for h in evals for k in h)
    assert anchor.drawn == 4 * 4  # four training losses, not the four evaluation losses too
    assert sum("sft_anchor/nll" in h for h in trainer.state.log_history) == 4
    assert any(not torch.equal(p, adapter[n]) for n, p in trainer.model.named_parameters() if n in adapter)


def test_the_order_resumes_from_the_checkpoint(tmp_path, generated_lines):
    data = _data(tmp_path / "d", generated_lines)
    anchor = SFTAnchor(data=data, batch_size=4)
    trainer, _ = _trainer(tmp_path, generated_lines, anchor, save_strategy="steps", save_steps=2)
    trainer.train()
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / "rookgrpo_callbacks.json").read_text())["sft_anchor"]
    assert saved == {"drawn": 8} and anchor.drawn == 16

    resumed = SFTAnchor(data=data, batch_size=4)
    again, _ = _trainer(tmp_path, generated_lines, resumed, save_strategy="steps", save_steps=2)
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert resumed.drawn == 16


@pytest.mark.parametrize("anchor_first", [True, False])
def test_anchoring_on_the_held_out_positions_is_refused_before_training(tmp_path, generated_lines, anchor_first):
    data = _data(tmp_path / "d", generated_lines)
    anchor = SFTAnchor(data=data)
    evaluator = ChessEval(data=data, n_policy=4, n_env=4, every=2)
    trainer, _ = _trainer(tmp_path, generated_lines)
    for cb in ([anchor, evaluator] if anchor_first else [evaluator, anchor]):
        trainer.add_callback(cb)
    with pytest.raises(ConfigError, match="held-out positions"):
        trainer.train()
    assert trainer.state.global_step == 0 and anchor.drawn == 0


@pytest.mark.parametrize("kwargs, match", [({"coef": 0}, "coef must be > 0"), ({"batch_size": 0}, "batch_size")])
def test_bad_settings_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SFTAnchor(**kwargs)


def test_a_file_without_the_tasks_is_a_config_error(tmp_path, generated_lines):
    trainer, _ = _trainer(tmp_path, generated_lines)
    only_p = _data(tmp_path / "p", [l for l in generated_lines if l.startswith("P: ")])
    with pytest.raises(ConfigError, match="no A rows"):
        SFTAnchor(data=only_p).bind(trainer)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_cpu_ranks_train_with_the_anchor(tmp_path):
    """Two gloo ranks train with the anchor: its extra forward and the GRPO loss go through one DDP backward, and
    every loss logs the anchor's NLL."""
    from conftest import read_json, run_cli, venv_bin, write_recipe

    recipe = write_recipe(tmp_path / "r.yaml", max_steps=2, callbacks=[
        {"name": "sft_anchor", "data": "rookgrpo/tiny-rookworld-train", "coef": 1.0, "batch_size": 4}])
    proc = run_cli([venv_bin("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "-m", "rookgrpo",
                    str(recipe), "--use_cpu", "true"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = read_json(tmp_path / "out" / "run_info.json")
    assert info["world_size"] == 2 and info["global_step"] == 2
    state = read_json(tmp_path / "out" / "trainer_state.json")
    logged = [h["sft_anchor/nll"] for h in state["log_history"] if "sft_anchor/nll" in h]
    assert len(logged) == 2 and all(v > 0 for v in logged)
