"""Prompt selection: the sampler's decisions, their bounds, the history they come from, and training with them.

The reward ``mostly_flat`` makes the odd prompts' groups always flat (a constant) and the even ones graded, so a
selector that works skips the odd prompts once it has seen them and keeps drawing the even ones.
"""

import json
import sys
from math import exp, lgamma

import pytest

from conftest import REPO, tiny_grpo_args
from rookgrpo import RookGRPOTrainer, ZeroStdResampling
from rookgrpo.callbacks.selection import PROMPT_ID_COLUMN, PromptSelection
from rookgrpo.errors import ConfigError
from rookgrpo.dynamics.selection import (DPASS, STREAK, GresoRule, PassRateRule, PosteriorRule, PromptHistory, SelectingSampler,
                                SelectionState)

sys.path.insert(0, str(REPO / "tests" / "assets"))
from flat_reward import mostly_flat  # noqa: E402


@pytest.fixture()
def flat_dataset(smoke_dataset):
    return smoke_dataset.map(lambda row, i: {"signal": i % 2 == 0}, with_indices=True)


def _history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def _sampler(history, rule, n=16, batch_size=4, seed=0, max_skips=2, tasks=None):
    return SelectingSampler(list(range(n)), history, rule, SelectionState(seed), mini_repeat_count=2,
                            batch_size=batch_size, repeat_count=1, seed=seed, tasks=tasks, max_skips=max_skips)


def _chunks(sampler):
    indices = list(sampler)
    assert len(indices) == len(sampler)  # the trainer's step accounting holds, skips or not
    flat = indices[::2]
    return [flat[i:i + sampler.batch_size] for i in range(0, len(flat), sampler.batch_size)]


def test_unseen_prompts_are_drawn_like_trls_sampler_and_flat_ones_are_skipped():
    history, rule = PromptHistory(), GresoRule(p_start=0.05)
    sampler = _sampler(history, rule)
    first = _chunks(sampler)
    assert sorted(i for c in first for i in c) == list(range(16))  # nothing known: every prompt once, in G pairs
    assert sampler.state.take_counts() == (0, 0, 16)
    for i in range(16):
        history.observe(i, flat=i % 2 == 1, side="low", step=1)
    second = _chunks(sampler)  # odd prompts flat once: each kept with probability 0.05
    drawn = [i for c in second for i in c]
    assert sum(i % 2 == 1 for i in drawn) <= 2 and sum(i % 2 == 0 for i in drawn) >= 8
    skipped, skipped_flat, kept = sampler.state.take_counts()
    assert skipped > 0 and skipped_flat == skipped and kept == len(drawn)


def test_a_prompt_that_turns_informative_is_drawn_again_within_max_skips_plus_one_passes():
    history, rule = PromptHistory(), GresoRule(p_start=0.05, p_min=0.05)
    sampler = _sampler(history, rule, n=8, batch_size=2, max_skips=2)
    for i in range(8):
        for _ in range(6):
            history.observe(i, flat=i != 0, side="low", step=1)  # prompt 0 informative, the others long flat
    passes_until_drawn = {}
    for epoch in range(3):
        for i in sampler:  # lazily: the pass is read when the prompt's generation batch is handed out
            passes_until_drawn.setdefault(i, sampler.state.passes.get("", 0))
    assert set(passes_until_drawn) == set(range(8))  # everyone comes back
    # Chosen within max_skips + 1 passes however flat its past; its generation batch may fill up in the next pass.
    assert max(passes_until_drawn.values()) <= 2 + 1 + 1
    # Once drawn and informative, its streak is 0: always kept from then on.
    history.observe(5, flat=False, side=None, step=9)
    assert history.record(5)[STREAK] == 0 and rule.keep_probability(history.record(5)) == 1.0


def test_decisions_depend_only_on_seed_and_history():
    def run(seed):
        history = PromptHistory()
        for i in range(16):
            history.observe(i, flat=i % 3 == 0, side="high", step=1)
        return _chunks(_sampler(history, GresoRule(p_start=0.5), seed=seed))

    assert run(3) == run(3) and run(3) != run(4)


def test_task_homogeneous_batches_stay_homogeneous():
    tasks = ["P"] * 8 + ["A"] * 8
    history = PromptHistory()
    for i in range(16):
        history.observe(i, flat=i % 2 == 0, side="low", step=1)
    sampler = _sampler(history, PosteriorRule(explore=0.2), tasks=tasks)
    for chunk in _chunks(sampler) + _chunks(sampler):
        assert len({tasks[i] for i in chunk}) == 1


def test_greso_p_follows_the_flat_share_target():
    rule, history = GresoRule(target_flat=0.25, p_start=0.5, step=0.1, p_min=0.1), PromptHistory()
    for _ in range(3):
        rule.after_batch(0.6, history)  # too many flat groups: skip more
    assert rule.p[1] == pytest.approx(0.2)
    for _ in range(20):
        rule.after_batch(0.0, history)
    assert rule.p[1] == 1.0


def test_pass_rate_rule_ranks_prompts_by_their_chance_of_a_flat_group():
    history, rule = PromptHistory(discount=0.7, group_size=8), PassRateRule(explore=0.0)
    rule.bind(history)
    for prompt, passed in enumerate([0, 1, 4, 7, 8]):
        history.observe(prompt, passed in (0, 8), "low" if passed == 0 else "high", 1, pass_rate=passed / 8)
    keep = [rule.keep_probability(history.record(i)) for i in range(5)]
    assert keep[2] > keep[1] > keep[0] and keep[2] > keep[3] > keep[4]
    assert keep[0] == pytest.approx(keep[4]) and keep[1] == pytest.approx(keep[3])  # symmetric in pass and fail
    # Exact Beta moments: 0 of 8 under Jeffreys' prior is Beta(0.5, 8.5); P(flat) = E[q^8] + E[(1-q)^8].
    def moment(a, b, k):
        return exp(lgamma(a + k) + lgamma(a + b) - lgamma(a) - lgamma(a + b + k))

    assert keep[0] == pytest.approx(1 - moment(0.5, 8.5, 8) - moment(8.5, 0.5, 8))
    assert rule.keep_probability(None) == 1.0
    # More of the same evidence: more confident. A prompt that turns informative is believed quickly (discount).
    history.observe(0, True, "low", 2, pass_rate=0.0)
    assert rule.keep_probability(history.record(0)) < keep[0]
    for _ in range(3):
        history.observe(9, True, "low", 1, pass_rate=0.0)
    history.observe(9, False, None, 2, pass_rate=0.5)
    assert rule.keep_probability(history.record(9)) > keep[1]
    explorer = PassRateRule(explore=0.3)
    explorer.bind(history)
    assert explorer.keep_probability(history.record(0)) == 0.3


def test_pass_rate_target_keeps_the_likeliest_to_have_signal_and_moves_its_threshold():
    history = PromptHistory(discount=0.7, group_size=8)
    rule = PassRateRule(explore=0.1, target_flat=0.25, step=0.2, max_threshold=0.9)
    rule.bind(history)
    for prompt, passed in enumerate([0, 1, 4]):  # signal chances about 0.29, 0.65, 0.95
        history.observe(prompt, passed == 0, "low", 1, pass_rate=passed / 8)
    chances = [rule.signal_chance(history.record(i)) for i in range(3)]
    assert chances[0] < 0.35 < 0.6 < chances[1] < 0.7 < 0.9 < chances[2]
    assert rule.signal_threshold == 0.0 and [rule.keep_probability(history.record(i)) for i in range(3)] == [1.0] * 3
    rule.after_batch(0.5, history)
    rule.after_batch(0.5, history)  # flat share above the target twice: threshold 0.4
    assert rule.signal_threshold == pytest.approx(0.4)
    assert [rule.keep_probability(history.record(i)) for i in range(3)] == [0.1, 1.0, 1.0]
    for _ in range(3):
        rule.after_batch(0.5, history)
    assert rule.signal_threshold == pytest.approx(0.9)  # capped: some prompts always pass it
    assert [rule.keep_probability(history.record(i)) for i in range(3)] == [0.1, 0.1, 1.0]
    assert rule.keep_probability(None) == 1.0
    assert rule.metrics() == {"select/signal_threshold": pytest.approx(0.9)}
    restored = PassRateRule(target_flat=0.25)
    restored.load_state_dict(rule.state_dict())
    assert restored.signal_threshold == pytest.approx(0.9)
    for _ in range(10):
        rule.after_batch(0.25, history)  # at the target counts as not above it: the threshold falls to 0
    assert rule.signal_threshold == 0.0
    plain = PassRateRule(explore=0.1)  # off by default: keep with probability 1 - P(flat), no state, no metric
    plain.bind(history)
    plain.after_batch(1.0, history)
    assert plain.keep_probability(history.record(0)) == pytest.approx(chances[0])
    assert plain.state_dict() == {} and plain.metrics() == {}


def test_history_saved_before_pass_rates_loads():
    history = PromptHistory()
    history.load_state_dict({"records": {"3": [2, 1, 1, 1, 5, 0, 1.0, 1.7]}, "flat_total": 1, "drawn_total": 2})
    assert history.record(3)[DPASS] == 0.0 and len(history.record(3)) == DPASS + 1
    history.observe(3, False, None, 6, pass_rate=0.25)
    assert history.record(3)[DPASS] == 0.25


def test_resampling_draws_its_replacements_with_the_selectors_keep_probabilities():
    from types import SimpleNamespace

    selection = PromptSelection(rule="greso", p_start=0.05)
    for i in range(8):
        selection.history.observe(i, i % 2 == 1, "low", step=0)
    weights = selection.replacement_weights(list(range(8)) + [100])
    assert weights[0] == 1.0 and weights[1] == pytest.approx(0.05) and weights[8] == 1.0  # never drawn: kept
    trainer = SimpleNamespace(args=SimpleNamespace(seed=0), state=SimpleNamespace(global_step=3))
    picks = ZeroStdResampling()._draw(trainer, 9, 4000, weights)
    odd = sum(p % 2 == 1 for p in picks if p < 8) / len(picks)
    assert odd == pytest.approx(4 * 0.05 / (5 + 4 * 0.05), abs=0.015)  # uniform would give 4/9
    # Identical on every rank (same seed, step and draw count), and uniform without a selector.
    again = ZeroStdResampling()._draw(trainer, 9, 4000, weights)
    assert picks == again
    uniform = ZeroStdResampling()._draw(trainer, 9, 4000)
    assert sum(p % 2 == 1 for p in uniform if p < 8) / 4000 == pytest.approx(4 / 9, abs=0.03)


def test_training_with_selection_skips_the_flat_prompts_and_logs_it(tiny_model_dir, flat_dataset, tmp_path):
    selection = PromptSelection(rule="greso", p_start=0.05, target_flat=0.0)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat,
                              args=tiny_grpo_args(tmp_path, max_steps=12, per_device_train_batch_size=16),
                              train_dataset=flat_dataset, callbacks=[selection, ZeroStdResampling(max_rounds=1)])
    assert PROMPT_ID_COLUMN in trainer.train_dataset.column_names
    assert trainer._batch_hooks[0] is selection  # it judges the batch as generated, before resampling
    trainer.train()
    flat = _history(trainer, "select/flat_share")
    assert len(flat) == 12
    assert sum(flat[:8]) / 8 == pytest.approx(0.5, abs=0.2)  # the first pass (32 prompts, 4 a batch): half flat
    assert sum(flat[-4:]) / 4 < 0.25  # once seen, flat prompts are mostly skipped
    assert sum(_history(trainer, "select/skipped")) > 0
    assert all(p == 1.0 for p in _history(trainer, "select/predicted_flat_precision"))  # GRESO skips only those
    # The odd prompts are flat every time, the even ones never: flatness is fully predictable here.
    assert _history(trainer, "select/flat_after_flat")[-1] == 1.0
    assert _history(trainer, "select/flat_after_signal")[-1] == 0.0
    history = selection.history
    assert all(history.record(i)[STREAK] == history.record(i)[1] for i in range(1, 32, 2) if history.record(i))
    # The history holds every group generated: the sampled ones and resampling's replacements.
    extra_groups = sum(_history(trainer, "resample/extra_completions")) / trainer.num_generations
    assert extra_groups > 0 and history.drawn_total == 12 * 4 + extra_groups


@pytest.mark.parametrize("threshold", [{}, {"target_flat": 0.25, "step": 0.1}], ids=["plain", "target_flat"])
def test_training_with_the_pass_rate_rule(tiny_model_dir, flat_dataset, tmp_path, threshold):
    """Binary reward: odd prompts always fail (flat), even ones pass about half the time. The rule learns the group
    size from the trainer and each prompt's pass rate from its groups, and skips the always-failing prompts; in its
    threshold mode the threshold rises while the flat share is above the target."""

    def binary(completions, signal, **kwargs):
        return [float(s and sum(map(ord, x)) % 2 == 0) for x, s in zip(completions, signal)]

    selection = PromptSelection(rule="passrate", **threshold)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=binary,
                              args=tiny_grpo_args(tmp_path, max_steps=12, per_device_train_batch_size=16),
                              train_dataset=flat_dataset, callbacks=[selection])
    assert selection.history.group_size == trainer.num_generations == 4
    trainer.train()
    history = selection.history
    odd = [history.record(i) for i in range(1, 32, 2) if history.record(i)]
    even = [history.record(i) for i in range(0, 32, 2) if history.record(i)]
    assert odd and all(r[DPASS] == 0.0 for r in odd)
    assert sum(r[DPASS] > 0 for r in even) >= len(even) // 2
    flat = _history(trainer, "select/flat_share")
    assert sum(flat[-4:]) / 4 < sum(flat[:8]) / 8  # once seen, the always-failing prompts are mostly skipped
    assert sum(_history(trainer, "select/skipped")) > 0
    thresholds = _history(trainer, "select/signal_threshold")
    if threshold:
        assert thresholds and max(thresholds) >= 0.3  # above an all-fail prompt's chance of signal (0.29 after one)
        assert selection.state_dict()["rule"] == {"signal_threshold": selection.rule.signal_threshold}
    else:
        assert not thresholds


def test_resume_restores_history_rule_and_sampler_position(tiny_model_dir, flat_dataset, tmp_path):
    def trainer_for(out, max_steps):
        args = tiny_grpo_args(out, max_steps=max_steps, per_device_train_batch_size=16, save_strategy="steps",
                              save_steps=3)
        return RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat, args=args,
                               train_dataset=flat_dataset, callbacks=[PromptSelection(p_start=0.3)])

    first = trainer_for(tmp_path / "a", 3)
    first.train()
    saved = json.loads((tmp_path / "a" / "checkpoint-3" / "rookgrpo_callbacks.json").read_text())["prompt_selection"]
    assert saved["history"]["records"] and saved["sampler"]["generator"]
    resumed = trainer_for(tmp_path / "a", 5)
    selection = next(cb for cb in resumed.callback_handler.callbacks if isinstance(cb, PromptSelection))
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    assert resumed.args.ignore_data_skip  # the restored position is not replayed
    drawn = {int(k): v[0] for k, v in saved["history"]["records"].items()}
    for k, count in drawn.items():  # the restored counts only grow
        assert selection.history.record(k)[0] >= count
    assert selection.history.drawn_total > sum(drawn.values())


def test_bad_settings_fail_before_training(tiny_model_dir, smoke_dataset, tmp_path):
    with pytest.raises(ConfigError, match="rule 'best' is not one of"):
        PromptSelection(rule="best")
    with pytest.raises(ConfigError, match="prompt_selection: .*unexpected keyword"):
        PromptSelection(rule="greso", explore=0.1)
    with pytest.raises(ConfigError, match="prompt_selection: prior must be > 0, got 0 .rule 'passrate'"):
        PromptSelection(rule="passrate", prior=0)
    with pytest.raises(ConfigError, match="prompt_selection: target_flat must be in .0, 1. .or None: off., got 1.5"):
        PromptSelection(rule="passrate", target_flat=1.5)


def test_streaming_data_is_refused_with_the_reason(tiny_model_dir, smoke_dataset, tmp_path):
    stream = smoke_dataset.to_iterable_dataset()
    with pytest.raises(ConfigError, match="prompt_selection: needs a map-style train_dataset"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path),
                        train_dataset=stream, callbacks=[PromptSelection()])


def test_without_selection_the_sampler_is_trls(tiny_model_dir, smoke_dataset, tmp_path):
    from trl.trainer.utils import RepeatSampler

    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path),
                              train_dataset=smoke_dataset)
    sampler = trainer._get_train_sampler()
    assert type(sampler) is RepeatSampler and PROMPT_ID_COLUMN not in trainer.train_dataset.column_names
    again = RepeatSampler(smoke_dataset, 4, 2, 1, True, 7)
    assert list(sampler) == list(again)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_processes_choose_the_same_prompts(tmp_path):
    from conftest import launch_two_cpu_processes, read_json, write_flat_recipe

    recipe = write_flat_recipe(tmp_path, 32, 12, [{"name": "prompt_selection", "p_start": 0.2},
                                                  "selection_probe:SelectionProbe"])
    ranks = launch_two_cpu_processes(recipe, tmp_path / "probe")
    assert len(ranks[0]) == len(ranks[1]) == 12
    for a, b in zip(*ranks):
        assert a["history"] == b["history"] and a["skipped"] == b["skipped"]  # same decisions, same history
        assert not set(a["local_ids"]) & set(b["local_ids"])  # each rank its own groups of the chosen prompts
    assert sum(a["skipped"] for a in ranks[0]) > 0
    assert read_json(tmp_path / "out" / "trainer_state.json")["global_step"] == 12


@pytest.mark.parametrize("layout", [dict(steps_per_generation=2), dict(num_iterations=2),
                                    dict(gradient_accumulation_steps=2)])
def test_selection_in_trls_other_batch_layouts(tiny_model_dir, flat_dataset, tmp_path, layout):
    """A generation batch reused over several optimizer steps (steps_per_generation, num_iterations) or micro-batches:
    the sampler repeats each chosen chunk as TRL's does, and selection records one observation per generated group."""
    selection = PromptSelection(p_start=0.05)
    args = tiny_grpo_args(tmp_path, max_steps=4, per_device_train_batch_size=8, **layout)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat, args=args,
                              train_dataset=flat_dataset, callbacks=[selection])
    sampler = trainer._get_train_sampler()
    repeat = trainer.num_iterations * trainer.args.steps_per_generation
    assert sampler.repeat_count == repeat and sampler.batch_size == trainer.args.generation_batch_size // 4
    indices = list(sampler)[: sampler.batch_size * 4 * repeat]
    chunk = indices[: sampler.batch_size * 4]
    assert indices == chunk * repeat  # each generation batch's prompts, repeated for every step that reuses them
    trainer.train()
    generations = len(_history(trainer, "select/flat_share"))
    groups = trainer.args.generation_batch_size // 4
    assert generations >= 1 and selection.history.drawn_total == generations * groups


def test_selection_with_resampling_around_evaluation_and_a_wrapped_model(tiny_model_dir, flat_dataset, tmp_path):
    """Selection and resampling together, with a generation batch reused over two steps, an evaluation between
    steps and a LoRA-wrapped policy: the history records every training group once (sampled and resampled), none
    of the evaluation's, and the resampler's draws follow the selector's weights."""
    from peft import LoraConfig

    selection = PromptSelection(p_start=0.05)
    resampling = ZeroStdResampling(max_rounds=1)
    weights_seen = []
    keep = selection.replacement_weights

    def recorded(pool):
        weights_seen.append(keep(pool))
        return weights_seen[-1]

    selection.replacement_weights = recorded
    args = tiny_grpo_args(tmp_path, max_steps=4, per_device_train_batch_size=8, steps_per_generation=2,
                          eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat, args=args,
                              train_dataset=flat_dataset, eval_dataset=flat_dataset.select(range(8)),
                              callbacks=[selection, resampling],
                              peft_config=LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"))
    trainer.train()
    assert [h for h in trainer.state.log_history if "eval_loss" in h]
    generations = len(_history(trainer, "select/flat_share"))
    groups = trainer.args.generation_batch_size // trainer.num_generations
    extra_groups = resampling.totals["extra_completions"] // trainer.num_generations
    assert generations == 2 and extra_groups > 0
    assert selection.history.drawn_total == generations * groups + extra_groups
    assert weights_seen and all(len(w) == len(trainer.train_dataset) for w in weights_seen)
