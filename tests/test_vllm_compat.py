"""rookgrpo.vllm_compat's parts that need no vLLM: head sizes of the recipes' models, which sampling settings truncate
what vLLM samples, and that nothing is asked of vLLM when a trainer does not generate with it. The engine itself is
tested by ``make test-vllm`` (tests/test_vllm.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from rookgrpo import trl_compat, vllm_compat


def test_head_sizes_of_the_recipes_models():
    from transformers import AutoConfig, GPT2Config, Qwen2Config

    from rookgrpo.assets import resolve_model
    from rookgrpo.models.shapes import GPT2_124M, QWEN25_CODER_05B

    assert vllm_compat.head_size(GPT2Config(**GPT2_124M)) == 64  # RookWorld-LM-124M: served on CPU
    assert vllm_compat.head_size(Qwen2Config(**QWEN25_CODER_05B)) == 64  # Qwen2.5-Coder-0.5B
    assert vllm_compat.head_size(AutoConfig.from_pretrained(resolve_model("rookgrpo/tiny-rookworld"))) == 56
    assert vllm_compat.head_size(AutoConfig.from_pretrained(resolve_model("rookgrpo/tiny-random"))) == 16
    assert vllm_compat.head_size(SimpleNamespace(head_dim=80, hidden_size=1, num_attention_heads=1)) == 80
    assert vllm_compat.head_size(SimpleNamespace()) is None


def _trainer(**values):
    settings = dict(use_vllm=True, vllm_importance_sampling_correction=True, top_p=1.0, top_k=0, min_p=None,
                    _task_settings=None, accelerator=SimpleNamespace(is_main_process=True))
    settings.update(values)
    return SimpleNamespace(**settings)


def test_truncated_sampling_is_named_per_task_and_only_under_the_correction(caplog):
    from rookgrpo.dynamics.task_sampling import TaskSettings

    assert vllm_compat.truncated_sampling(_trainer()) == {}
    assert vllm_compat.truncated_sampling(_trainer(top_p=0.9, top_k=20)) == {None: {"top_p": 0.9, "top_k": 20}}
    assert vllm_compat.truncated_sampling(_trainer(top_p=0.9, vllm_importance_sampling_correction=False)) == {}
    assert vllm_compat.truncated_sampling(_trainer(top_p=0.9, use_vllm=False)) == {}
    tasks = TaskSettings.__new__(TaskSettings)
    tasks.per_task, tasks.base = {"P": {"top_p": 0.9}, "A": {"temperature": 0.95}}, {"top_p": 1.0, "top_k": 0}
    trainer = _trainer(_task_settings=tasks)
    assert vllm_compat.truncated_sampling(trainer) == {"P": {"top_p": 0.9}}
    with caplog.at_level(logging.WARNING, logger="rookgrpo.vllm_compat"):
        vllm_compat.warn_truncated_sampling(trainer)
    assert "task P: top_p 0.9" in caplog.text and "token_truncate" in caplog.text


def test_truncation_set_through_generation_kwargs_or_structured_outputs_is_named():
    """TRL's vLLM backend applies generation_kwargs over its own top_p/top_k/min_p, and structured outputs keep only
    the tokens a grammar allows: both truncate what vLLM samples as a recipe's top_p does, and are warned the same."""
    def args(**values):
        return SimpleNamespace(generation_kwargs=values.pop("generation_kwargs", None), **values)

    assert vllm_compat.truncated_sampling(_trainer(args=args(generation_kwargs={"top_p": 0.8}))) == {
        None: {"top_p": 0.8}}
    assert vllm_compat.truncated_sampling(_trainer(top_p=0.9, args=args(generation_kwargs={"top_p": 1.0}))) == {}
    assert vllm_compat.truncated_sampling(_trainer(args=args(generation_kwargs={"min_p": 0.05}))) == {
        None: {"min_p": 0.05}}
    regex = _trainer(args=args(vllm_structured_outputs_regex=r"[a-h][1-8][a-h][1-8]"))
    assert vllm_compat.truncated_sampling(regex) == {None: {"structured_outputs": 1.0}}
    grammar = _trainer(args=args(generation_kwargs={"structured_outputs": {"regex": "e2e4|d2d4"}}))
    assert vllm_compat.truncated_sampling(grammar) == {None: {"structured_outputs": 1.0}}
    assert vllm_compat.truncated_sampling(_trainer(args=args())) == {}


def test_without_vllm_nothing_is_synced_or_wrapped():
    trainer = SimpleNamespace(use_vllm=False)
    assert trl_compat.sync_vllm_weights(trainer) is False
    assert vllm_compat.enable_cpu_weight_reload(trainer) is False
    assert vllm_compat.engine_model(trainer) is None
    vllm_compat.release_engine(trainer)  # nothing to release


def test_a_sync_goes_through_trls_own_and_records_the_step():
    """What the guard calls after a restore: TRL's sync, and the step recorded as synced, as TRL records it."""
    calls = []
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(sync_weights=lambda: calls.append(1)),
                              state=SimpleNamespace(global_step=7), _last_loaded_step=5)
    assert trl_compat.sync_vllm_weights(trainer) is True
    assert calls == [1] and trainer._last_loaded_step == 7


@pytest.mark.parametrize("mode,expected", [("sequence_mask", ("importance_sampling_ratio",)),
                                           ("sequence_truncate", ("importance_sampling_ratio",)),
                                           ("token_mask", ()), ("token_truncate", ())])
def test_the_per_sequence_ratio_keys_follow_trls_mode(mode, expected):
    from rookgrpo.dynamics.batch import per_sequence_keys

    assert per_sequence_keys(mode) == expected
