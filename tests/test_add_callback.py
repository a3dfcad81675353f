"""Callbacks added with ``trainer.add_callback`` after the trainer was built: bound, and every hook of theirs called,
as for callbacks passed to the constructor; removed ones stop; one whose ``bind`` refuses is not left half-added."""

import sys

import pytest

from conftest import REPO, tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import AdaptiveBeta, RookCallback
from rookgrpo.callbacks.selection import PROMPT_ID_COLUMN, PromptSelection

sys.path.insert(0, str(REPO / "tests" / "assets"))
from flat_reward import mostly_flat  # noqa: E402


class Recorder(RookCallback):
    """Counts each trainer hook it is called through."""

    state_key = "recorder"

    def __init__(self):
        self.calls = {"bind": 0, "on_scored_batch": 0, "before_log": 0, "on_loss_logps": 0, "extra_loss": 0}

    def bind(self, trainer):
        super().bind(trainer)
        self.calls["bind"] += 1

    def on_scored_batch(self, trainer, scored):
        self.calls["on_scored_batch"] += 1

    def before_log(self, trainer, logs):
        self.calls["before_log"] += 1
        logs["recorder/seen"] = 1.0

    def on_loss_logps(self, trainer, inputs, per_token_logps):
        self.calls["on_loss_logps"] += 1

    def extra_loss(self, trainer, model):
        self.calls["extra_loss"] += 1
        return None


def _trainer(tiny_model_dir, dataset, tmp_path, **overrides):
    args = tiny_grpo_args(tmp_path, beta=0.05, max_steps=2, **overrides)
    return RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args, train_dataset=dataset)


def test_an_added_callback_is_bound_and_every_hook_is_called(tiny_model_dir, smoke_dataset, tmp_path):
    trainer = _trainer(tiny_model_dir, smoke_dataset, tmp_path)
    recorder = Recorder()
    trainer.add_callback(recorder)
    assert recorder.trainer is trainer and recorder.calls["bind"] == 1
    trainer.train()
    # Two steps, one generation batch and one loss each, logged every step.
    assert {k: v for k, v in recorder.calls.items() if k != "bind"} == \
        {"on_scored_batch": 2, "before_log": 3, "on_loss_logps": 2, "extra_loss": 2}
    assert sum("recorder/seen" in h for h in trainer.state.log_history) == 3  # two steps and the closing summary


@pytest.mark.parametrize("layout", [
    {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2, "max_steps": 4},
    {"lora": True, "steps_per_generation": 2, "eval_strategy": "steps", "eval_steps": 1,
     "per_device_eval_batch_size": 8},
], ids=["buffered-batches", "lora-with-evaluation"])
def test_an_added_callback_is_called_as_one_given_to_the_constructor(tiny_model_dir, smoke_dataset, tmp_path, layout):
    """Layouts TRL supports beyond the default: batches reused over steps and iterations with accumulation, and a
    LoRA-wrapped policy with an evaluation (its own generation and loss) after every step."""
    from peft import LoraConfig

    layout = dict(layout)
    peft = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM") if layout.pop("lora", False) else None
    evaluation = smoke_dataset.select(range(8)) if layout.get("eval_strategy") else None

    def run(name, late):
        recorder = Recorder()
        args = tiny_grpo_args(tmp_path / name, beta=0.05, **{"max_steps": 2, **layout})
        trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                                  train_dataset=smoke_dataset, eval_dataset=evaluation, peft_config=peft,
                                  callbacks=None if late else [recorder])
        if late:
            trainer.add_callback(recorder)
        trainer.train()
        return recorder.calls

    given, added = run("given", late=False), run("added", late=True)
    assert added == given and given["bind"] == 1 and given["on_scored_batch"] >= 2 and given["extra_loss"] >= 4


def test_a_callback_added_as_a_class_is_built_and_bound(tiny_model_dir, smoke_dataset, tmp_path):
    trainer = _trainer(tiny_model_dir, smoke_dataset, tmp_path)
    trainer.add_callback(Recorder)
    (recorder,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, Recorder)]
    trainer.train()
    assert recorder.calls["bind"] == 1 and recorder.calls["on_scored_batch"] == 2


@pytest.mark.parametrize("how", ["remove", "pop"])
def test_a_removed_callback_is_called_no_more(tiny_model_dir, smoke_dataset, tmp_path, how):
    recorder = Recorder()
    args = tiny_grpo_args(tmp_path, max_steps=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=[recorder])
    if how == "pop":
        assert trainer.pop_callback(recorder) is recorder
    else:
        trainer.remove_callback(recorder)
    trainer.train()
    assert {k: v for k, v in recorder.calls.items() if k != "bind"} == \
        {"on_scored_batch": 0, "before_log": 0, "on_loss_logps": 0, "extra_loss": 0}


def test_a_refused_callback_is_not_left_in_the_trainer(tiny_model_dir, smoke_dataset, tmp_path):
    args = tiny_grpo_args(tmp_path, beta=0.0, max_steps=1)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset)
    with pytest.raises(ConfigError, match="beta: 0 with the adaptive_beta callback"):
        trainer.add_callback(AdaptiveBeta())
    assert not any(isinstance(cb, AdaptiveBeta) for cb in trainer._rook_callbacks())
    assert [type(cb).__name__ for cb in trainer._rook_callbacks()] == ["SkipNonfinite"]  # the default guard only
    trainer.train()  # the trainer works as if the call had not been made
    assert trainer.state.global_step == 1 and trainer.beta == 0.0


def test_prompt_selection_added_late_numbers_the_prompts_and_selects(tiny_model_dir, smoke_dataset, tmp_path):
    """Selection keeps a history per prompt id; the constructor adds the id column for callbacks given to it, and
    add_callback does the same for one added later, so selection still learns to skip the always-flat prompts."""
    data = smoke_dataset.map(lambda row, i: {"signal": i % 2 == 0}, with_indices=True)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat,
                              args=tiny_grpo_args(tmp_path, max_steps=12, per_device_train_batch_size=16),
                              train_dataset=data)
    assert PROMPT_ID_COLUMN not in trainer.train_dataset.column_names
    selection = PromptSelection(rule="greso", p_start=0.05, target_flat=0.0)
    trainer.add_callback(selection)
    assert PROMPT_ID_COLUMN in trainer.train_dataset.column_names and trainer._batch_hooks == [selection]
    trainer.train()
    flat = [h["select/flat_share"] for h in trainer.state.log_history if "select/flat_share" in h]
    assert len(flat) == 12 and sum(flat[-4:]) / 4 < 0.25  # once seen, flat prompts are mostly skipped
    odd = [selection.history.record(i) for i in range(1, 32, 2)]
    assert sum(r is not None for r in odd) >= 8  # the history is keyed by the ids of the added column


class _Ordered(RookCallback):
    """Appends its name to a shared list on each scored batch; the masker zeroes the advantages the loss reads."""

    def __init__(self, name, seen, **flags):
        self.name, self.seen, self.state_key = name, seen, f"ordered_{name}"
        for flag, value in flags.items():
            setattr(self, flag, value)

    def on_scored_batch(self, trainer, scored):
        advantages = scored.output["advantages"]
        if self.name == "masker":
            scored.output["advantages"] = advantages * 0
        self.seen.append((self.name, bool(advantages.abs().sum() > 0)))


@pytest.mark.parametrize("layout", [
    {},
    {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2, "max_steps": 4},
    {"lora": True, "steps_per_generation": 2, "eval_strategy": "steps", "eval_steps": 1,
     "per_device_eval_batch_size": 8},
], ids=["default", "buffered-batches", "lora-with-evaluation"])
def test_batch_hooks_run_by_their_stage_and_the_loss_reads_a_change_mask_hooks_advantages(
        tiny_model_dir, smoke_dataset, tmp_path, layout):
    """Listed in reverse, the hooks still run first-round, batch-changing, mask-changing, observing on every scored
    batch; the observer sees the advantages the masker zeroed, and so does the loss (beta 0: no gradient at all), in
    the default layout, with batches reused over steps and iterations, and with a LoRA-wrapped policy evaluated
    between steps."""
    from peft import LoraConfig

    layout = dict(layout)
    peft = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM") if layout.pop("lora", False) else None
    evaluation = smoke_dataset.select(range(8)) if layout.get("eval_strategy") else None
    seen = []
    callbacks = [_Ordered("observer", seen), _Ordered("masker", seen, batch_stage="change_mask"),
                 _Ordered("replacer", seen, batch_stage="change_rows"), _Ordered("first", seen, batch_stage="first_round")]
    args = tiny_grpo_args(tmp_path, beta=0.0, logging_steps=1, **{"max_steps": 1, **layout})
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, eval_dataset=evaluation, peft_config=peft,
                              callbacks=callbacks)
    trainer.train()
    names = [name for name, _ in seen]
    assert names and names == ["first", "replacer", "masker", "observer"] * (len(names) // 4)
    assert any(zeroed for name, zeroed in seen if name == "masker")  # there was something to zero
    assert not any(left for name, left in seen if name == "observer")
    norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert norms and all(n == 0.0 for n in norms)


def test_the_old_ordering_flags_still_order_with_a_warning_and_a_bad_stage_is_refused():
    from rookgrpo.callbacks.base import batch_stage
    from rookgrpo.errors import ConfigError

    seen = []
    old = _Ordered("old", seen, changes_batch=True)
    with pytest.warns(FutureWarning, match="batch_stage = 'change_rows'"):
        assert batch_stage(old) == batch_stage(_Ordered("new", seen, batch_stage="change_rows")) == 1
    assert batch_stage(_Ordered("observer", seen)) == 3
    with pytest.raises(ConfigError, match="batch_stage: 'later' is not a stage"):
        batch_stage(_Ordered("bad", seen, batch_stage="later"))
