"""Task-conditional sampling: task-homogeneous batches, each generated and scored in the loss at its own temperature."""

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOConfig, RookGRPOTrainer
from rookgrpo.callbacks import RookCallback
from rookgrpo.dynamics.task_sampling import TaskGroupedRepeatSampler

TEMPS = {"P": 0.5, "A": 1.7}


@pytest.fixture()
def two_task_dataset(smoke_dataset):
    return smoke_dataset.map(lambda row, i: {"task": "P" if i % 2 else "A"}, with_indices=True)


def test_sampler_chunks_are_single_task_and_cover_both():
    tasks = ["P"] * 12 + ["A"] * 8
    sampler = TaskGroupedRepeatSampler(list(range(20)), tasks, mini_repeat_count=2, batch_size=4, repeat_count=1, seed=3)
    order = list(sampler)
    assert len(order) == len(sampler) == 5 * 4 * 2
    chunks = [order[i:i + 8] for i in range(0, len(order), 8)]
    assert all(len({tasks[j] for j in chunk}) == 1 for chunk in chunks)
    assert {tasks[c[0]] for c in chunks} == {"P", "A"}
    assert list(TaskGroupedRepeatSampler(list(range(20)), tasks, 2, 4, 1, seed=3)) == order  # seeded


def test_each_batch_is_sampled_and_scored_at_its_task_temperature(tiny_model_dir, two_task_dataset, tmp_path):
    seen = {"batches": [], "losses": []}

    class Probe(RookCallback):
        def on_scored_batch(self, trainer, scored):
            tasks = {row["task"] for row in scored.inputs}
            seen["batches"].append((tasks, trainer.generation_config.temperature))

    args = tiny_grpo_args(tmp_path, max_steps=6, beta=0.04, task_generation_kwargs={t: {"temperature": v} for t, v in TEMPS.items()},
                          steps_per_generation=2, per_device_train_batch_size=4)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=two_task_dataset, callbacks=[Probe()])
    original = trainer._compute_loss

    def checked_compute_loss(model, inputs):
        task = trainer._task_settings.current
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        n = inputs["completion_ids"].size(1)
        trainer.model.eval()  # no dropout, so the two computations see the same network
        with torch.no_grad():
            used, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, n)
            logits = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -n - 1:-1]
            expected = torch.log_softmax(logits.float() / TEMPS[task], dim=-1).gather(
                -1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
            other = torch.log_softmax(logits.float() / TEMPS["A" if task == "P" else "P"], dim=-1).gather(
                -1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        trainer.model.train()
        keep = inputs["completion_mask"].bool()
        seen["losses"].append((task, torch.allclose(used[keep], expected[keep], atol=1e-4),
                               torch.allclose(used[keep], other[keep], atol=1e-4)))
        return original(model, inputs)

    trainer._compute_loss = checked_compute_loss
    trainer.train()
    assert all(len(tasks) == 1 for tasks, _ in seen["batches"])
    assert all(temp == TEMPS[next(iter(tasks))] for tasks, temp in seen["batches"])
    assert {next(iter(t)) for t, _ in seen["batches"]} == {"P", "A"}  # both tasks were trained on
    assert len(seen["losses"]) == 6
    assert all(match and not mismatch for _, match, mismatch in seen["losses"]), seen["losses"]


def test_bad_task_settings_fail_before_training(tiny_model_dir, two_task_dataset, smoke_dataset, tmp_path):
    with pytest.raises(ConfigError, match="unknown setting"):
        tiny_grpo_args(tmp_path, task_generation_kwargs={"P": {"temprature": 0.5}})
    with pytest.raises(ConfigError, match="temperature: got 0"):
        tiny_grpo_args(tmp_path, task_generation_kwargs={"P": {"temperature": 0}})
    args = tiny_grpo_args(tmp_path, task_generation_kwargs={"P": {"temperature": 0.5}})
    with pytest.raises(ConfigError, match="no 'task' column"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args, train_dataset=smoke_dataset)
    args = tiny_grpo_args(tmp_path, task_generation_kwargs={"Q": {"temperature": 0.5}})
    with pytest.raises(ConfigError, match=r"task\(s\) \['Q'\] do not occur"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args, train_dataset=two_task_dataset)


def test_json_on_the_command_line_is_accepted(tmp_path):
    args = RookGRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, num_generations=4,
                          task_generation_kwargs='{"A": {"temperature": 0.95, "top_p": 0.95}}')
    assert args.task_generation_kwargs == {"A": {"temperature": 0.95, "top_p": 0.95}}


# --- the loss temperature in every layout (policy and reference at the temperature that sampled the batch) --------


class EngineLike(torch.nn.Module):
    """Wraps a model the way DeepSpeed's engine (and DDP) do: ``forward`` delegates to ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _frozen_args(tmp_path, **overrides):
    # Learning rate 0 and no dropout: policy and reference stay the same network, so the per-token KL TRL logs is 0
    # exactly when both log-probs use the same temperature, and > 0 when they do not.
    values = dict(max_steps=4, beta=0.04, learning_rate=0.0, disable_dropout=True, per_device_train_batch_size=4,
                  task_generation_kwargs={t: {"temperature": v} for t, v in TEMPS.items()})
    values.update(overrides)
    return tiny_grpo_args(tmp_path, **values)


def _train_kls(trainer):
    trainer.train()
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h and "loss" in h]
    assert kls
    return kls


@pytest.mark.parametrize("layout", [{"steps_per_generation": 2}, {"num_iterations": 2}])
def test_evaluation_between_buffered_steps_leaves_the_training_loss_temperature(tiny_model_dir, two_task_dataset,
                                                                               tmp_path, layout):
    """An eval batch mixing tasks is generated at the base temperature; the next optimizer step reuses buffered
    chunks of a P: or A: training batch and must still compute its log-probs at that batch's temperature."""
    args = _frozen_args(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8, **layout)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=two_task_dataset, eval_dataset=two_task_dataset.select(range(8)))
    kls = _train_kls(trainer)
    assert any("eval_loss" in h for h in trainer.state.log_history)  # evaluation did run between the steps
    assert max(abs(k) for k in kls) < 1e-6, kls


def test_reference_inside_a_deepspeed_style_wrapper_follows_the_task_temperature(tiny_model_dir, two_task_dataset,
                                                                                 tmp_path):
    args = _frozen_args(tmp_path)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=two_task_dataset)
    trainer.ref_model = EngineLike(trainer.ref_model)
    kls = _train_kls(trainer)
    assert max(abs(k) for k in kls) < 1e-6, kls


def test_a_model_in_use_without_the_fused_head_fails_loudly(tiny_model_dir, two_task_dataset, tmp_path):
    from rookgrpo.dynamics.task_sampling import _trl_bakes_temperature

    if not _trl_bakes_temperature():
        pytest.skip("this TRL divides by the temperature at each call (no fused LM head to check)")
    from transformers import AutoModelForCausalLM

    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=_frozen_args(tmp_path),
                              train_dataset=two_task_dataset)
    trainer.ref_model = EngineLike(AutoModelForCausalLM.from_pretrained(tiny_model_dir))  # a model TRL never patched
    with pytest.raises(ConfigError, match="reference model"):
        trainer.train()


def test_innermost_model_sees_through_wrappers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rookgrpo.dynamics.task_sampling import innermost_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    class Compiled(torch.nn.Module):  # torch.compile's OptimizedModule keeps the model as _orig_mod
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

    assert innermost_model(EngineLike(Compiled(EngineLike(model)))) is model
    assert innermost_model(model) is model
