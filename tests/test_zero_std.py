"""ZeroStdResampling: zero-std groups leave the optimised batch, ranks agree, vanilla numbers when off."""

import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import (REPO, launch_two_cpu_processes, losses_and_rewards, read_json, tiny_grpo_args, vanilla_args,
                      write_flat_recipe)
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.dynamics.batch import batch_advantages, loss_mask, take_rows, zero_std_groups
from rookgrpo.callbacks import Diagnostics, ZeroStdResampling

sys.path.insert(0, str(REPO / "tests" / "assets"))
from flat_reward import mostly_flat  # noqa: E402


@pytest.fixture()
def flat_dataset(smoke_dataset):
    # Half the prompts carry signal; a random batch then has about half its groups at zero std.
    return smoke_dataset.map(lambda row, i: {"signal": i % 2 == 0}, with_indices=True)


def _trainer(model, dataset, tmp_path, callbacks, **overrides):
    args = tiny_grpo_args(tmp_path, **overrides)
    return RookGRPOTrainer(model=str(model), reward_funcs=mostly_flat, args=args, train_dataset=dataset,
                           callbacks=callbacks)


def _history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_zero_std_share_falls_to_zero(tiny_model_dir, flat_dataset, tmp_path):
    vanilla = _trainer(tiny_model_dir, flat_dataset, tmp_path / "v", None, max_steps=4)
    vanilla.train()
    assert sum(_history(vanilla, "frac_reward_zero_std")) / 4 >= 0.25  # the reward really makes zero-std groups

    cb = ZeroStdResampling(max_rounds=8)
    trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path / "r", [cb], max_steps=4)
    trainer.train()
    before, after = _history(trainer, "resample/frac_zero_std_before"), _history(trainer, "resample/frac_zero_std_after")
    assert len(after) == 4 and all(a == 0.0 for a in after)
    assert max(before) > 0 and sum(_history(trainer, "resample/rounds")) > 0
    assert sum(_history(trainer, "resample/extra_completions")) == cb.totals["extra_completions"] > 0
    assert cb.totals["groups_replaced"] > 0 and cb.totals["groups_kept"] == 0


def test_groups_without_signal_after_the_cap_are_kept_and_counted(tiny_model_dir, smoke_dataset, tmp_path):
    flat = smoke_dataset.map(lambda row: {"signal": False})
    cb = ZeroStdResampling(max_rounds=2)
    trainer = _trainer(tiny_model_dir, flat, tmp_path, [cb], max_steps=2)
    trainer.train()
    assert _history(trainer, "resample/frac_zero_std_after") == [1.0, 1.0]
    assert _history(trainer, "resample/rounds") == [2.0, 2.0]
    assert cb.totals["groups_kept"] == 4 and cb.totals["groups_replaced"] == 0


def test_dapo_style_rounds_draw_a_fixed_multiple_of_the_batch(tiny_model_dir, smoke_dataset, tmp_path):
    # All groups flat: DAPO (oversample 3) draws two more batches' worth in its first extra round and three in each
    # later one, whatever the flat count; the default draws as many groups as are flat.
    flat = smoke_dataset.map(lambda row: {"signal": False})
    for oversample, expected in ((3, [2 * 8, 3 * 8]), (0, [8, 8])):
        cb = ZeroStdResampling(max_rounds=2, oversample=oversample)
        trainer = _trainer(tiny_model_dir, flat, tmp_path / str(oversample), [cb], max_steps=1)
        trainer.train()
        assert _history(trainer, "resample/extra_completions") == [float(sum(expected))]
    with pytest.raises(ConfigError, match="oversample: got 1"):
        ZeroStdResampling(oversample=1)


def test_observing_callbacks_and_zero_rounds_train_exactly_like_vanilla(tiny_model_dir, flat_dataset, tmp_path):
    from trl import GRPOTrainer

    plain = vanilla_args(tiny_grpo_args(tmp_path / "v", max_steps=3, beta=0.04), tmp_path / "v")
    vanilla = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat, args=plain, train_dataset=flat_dataset)
    vanilla.train()
    rook = _trainer(tiny_model_dir, flat_dataset, tmp_path / "r", [ZeroStdResampling(max_rounds=0), Diagnostics()],
                    max_steps=3, beta=0.04, position_ids_from_mask=False)  # TRL's scoring (tests/test_positions.py)
    rook.train()
    assert losses_and_rewards(rook.state.log_history) == losses_and_rewards(vanilla.state.log_history)
    assert _history(rook, "timing/generation")  # the diagnostics ran


@pytest.mark.parametrize("overrides", [
    dict(scale_rewards="batch", gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2, beta=0.04),
    dict(scale_rewards="none", per_device_train_batch_size=4, steps_per_generation=2),
    dict(multi_objective_aggregation="normalize_then_sum"),
    # DAPO-style rounds score more rows than TRL's completions table keeps, in a multi-step generation batch.
    dict(gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2, beta=0.04, oversample=3),
])
def test_resampling_works_across_batch_layouts(tiny_model_dir, flat_dataset, tmp_path, overrides):
    overrides = dict(overrides)
    oversample = overrides.pop("oversample", 0)
    seen = []

    class Check(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            super().on_scored_batch(trainer, scored)
            seen.append(scored.output)

    trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path, [Check(max_rounds=8, oversample=oversample)],
                       max_steps=4, **overrides)
    trainer.train()
    assert _history(trainer, "resample/frac_zero_std_after") and set(_history(trainer, "resample/frac_zero_std_after")) == {0.0}
    for out in seen:  # every group of every optimised batch carries signal, and the batch is consistent
        G = trainer.num_generations
        assert (out["advantages"].view(-1, G).abs().amax(dim=1) > 0).all()
        assert out["completion_ids"].shape == out["completion_mask"].shape
        assert out["prompt_ids"].shape == out["prompt_mask"].shape
        assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
        # Log-probs computed at scoring time match the spliced batch's padding (else the KL compares shifted
        # positions): recomputing them on the final tensors gives the same numbers.
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        keep = out["completion_mask"].bool()
        # (The reference model is fixed; the policy has moved on since, so only the reference can be re-checked.)
        if "ref_per_token_logps" in out:
            with torch.no_grad():
                fresh, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask,
                                                                         out["completion_ids"].size(1))
            torch.testing.assert_close(out["ref_per_token_logps"][keep], fresh[keep], rtol=1e-4, atol=1e-4)


def test_batch_advantages_match_trl(tiny_model_dir, flat_dataset, tmp_path):
    captured = []

    class Capture(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            captured.append((scored.rewards_per_func.clone(), scored.output["advantages"].clone()))

    for scale in ("group", "batch", "none"):
        trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path / scale, [Capture()], max_steps=1,
                           scale_rewards=scale)
        trainer.train()
        rewards, advantages = captured.pop()
        ours = batch_advantages(rewards, trainer.reward_weights, trainer.num_generations, scale)
        torch.testing.assert_close(ours, advantages, rtol=1e-5, atol=1e-6)


def test_take_rows_repads_left_and_right():
    a = {"prompt_ids": torch.tensor([[9, 1, 2]]), "prompt_mask": torch.tensor([[0, 1, 1]]),
         "completion_ids": torch.tensor([[5, 6]]), "completion_mask": torch.tensor([[1, 1]]),
         "advantages": torch.tensor([0.5])}
    b = {"prompt_ids": torch.tensor([[3]]), "prompt_mask": torch.tensor([[1]]),
         "completion_ids": torch.tensor([[7, 8, 4, 9]]), "completion_mask": torch.tensor([[1, 1, 1, 0]]),
         "advantages": torch.tensor([-1.0])}
    out = take_rows([a, b], [(1, 0), (0, 0)], pad_token_id=9)
    assert out["prompt_ids"].tolist() == [[9, 9, 3], [9, 1, 2]] and out["prompt_mask"].tolist() == [[0, 0, 1], [0, 1, 1]]
    assert out["completion_ids"].tolist() == [[7, 8, 4, 9], [5, 6, 9, 9]]
    assert out["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert out["advantages"].tolist() == [-1.0, 0.5]


def test_take_rows_pads_each_tensor_with_trls_own_value():
    """Importance-sampling ratios are 1 where TRL pads (a masked log-prob difference of 0); 0 there would zero the
    weight of a whole row under VESPO, whose log-ratio sum has no mask."""
    def batch(width, ratio):
        return {"prompt_ids": torch.ones(1, 2, dtype=torch.long), "prompt_mask": torch.ones(1, 2, dtype=torch.long),
                "completion_ids": torch.ones(1, width, dtype=torch.long),
                "completion_mask": torch.ones(1, width, dtype=torch.long), "advantages": torch.tensor([1.0]),
                "importance_sampling_ratio": torch.full((1, width), ratio),
                "sampling_per_token_logps": torch.full((1, width), -0.5)}

    out = take_rows([batch(4, 1.02), batch(2, 0.97)], [(0, 0), (1, 0)], pad_token_id=0)
    torch.testing.assert_close(out["importance_sampling_ratio"], torch.tensor([[1.02] * 4, [0.97, 0.97, 1.0, 1.0]]))
    assert out["sampling_per_token_logps"].tolist() == [[-0.5] * 4, [-0.5, -0.5, 0.0, 0.0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_zero_std_groups_ignores_unscored_rows():
    nan = float("nan")
    rewards = torch.tensor([[1.0], [1.0], [0.0], [1.0], [nan], [0.3], [nan], [nan]])
    assert zero_std_groups(rewards, torch.ones(1), 2).tolist() == [True, False, True, True]


def test_groups_spanning_processes_are_rejected():
    fake = SimpleNamespace(num_generations=4, train_dataset=[{}] * 8,
                           args=SimpleNamespace(per_device_train_batch_size=2, steps_per_generation=1))
    with pytest.raises(ConfigError, match=r"multiple of num_generations=4.*span processes"):
        ZeroStdResampling().bind(fake)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_process_resampling_ranks_agree(tmp_path):
    recipe = write_flat_recipe(tmp_path, 64, 4, [{"name": "zero_std_resampling", "max_rounds": 8},
                                                 "resample_probe:ResampleProbe"])
    ranks = launch_two_cpu_processes(recipe, tmp_path / "probe")
    assert len(ranks[0]) == len(ranks[1]) == 4
    assert [x["resample/rounds"] for x in ranks[0]] == [x["resample/rounds"] for x in ranks[1]]
    assert all(x["zero_groups_local"] == 0 and x["local_rows"] == 8 for rank in ranks for x in rank)
    state = read_json(tmp_path / "out" / "trainer_state.json")
    before = [h["resample/frac_zero_std_before"] for h in state["log_history"] if "resample/frac_zero_std_before" in h]
    assert max(before) > 0 and state["global_step"] == 4


# --- vLLM importance sampling on spliced batches -----------------------------------------------------------------


def _fake_vllm(trainer, mode):
    """Make TRL take its vLLM importance-sampling path on CPU: completions come from TRL's own transformers
    generation (use_vllm off inside ``_generate``), and the per-token sampling log-probs vLLM would return are stand-in
    values, so TRL computes old log-probs and the importance-sampling ratio exactly as it does under vLLM."""
    generate = trainer._generate

    def fake(prompts):
        trainer.use_vllm = False
        try:
            out = list(generate(prompts))
        finally:
            trainer.use_vllm = True
        # Near the tiny random model's own log-probs (about -4.6: nearly uniform over its vocabulary), so ratios
        # land on both sides of the clip bounds the tests use.
        out[4] = [[-4.3 - 0.1 * ((i + j) % 7) for j in range(len(ids))] for i, ids in enumerate(out[1])]
        return tuple(out)

    trainer._generate = fake
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_our_importance_ratio_is_trls(tiny_model_dir, flat_dataset, tmp_path, mode):
    """Pins :func:`rookgrpo.dynamics.batch.vllm_importance_sampling_ratio` to the ratio TRL itself computed (unspliced)."""
    from rookgrpo.dynamics.batch import vllm_importance_sampling_ratio

    seen = []

    class Capture(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            seen.append(scored.first_output)

    trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path, [Capture(max_rounds=0)], max_steps=1, beta=0.04,
                       vllm_importance_sampling_clip_min=0.8, vllm_importance_sampling_clip_max=1.25)
    _fake_vllm(trainer, mode)
    trainer.train()
    out = seen[0]
    ours = vllm_importance_sampling_ratio(out["old_per_token_logps"], out["sampling_per_token_logps"], loss_mask(out),
                                          mode, 0.8, 1.25)
    torch.testing.assert_close(ours, out["importance_sampling_ratio"])
    raw = vllm_importance_sampling_ratio(out["old_per_token_logps"], out["sampling_per_token_logps"], loss_mask(out),
                                         mode.split("_")[0] + "_mask", None, None)  # unclipped
    assert ((raw > 0.8) & (raw < 1.25)).any() and ((raw < 0.8) | (raw > 1.25)).any()  # both branches exercised


@pytest.mark.parametrize("loss_type", ["vespo", "dapo"])
def test_spliced_vllm_batches_keep_trls_ratio_semantics(tiny_model_dir, flat_dataset, tmp_path, loss_type):
    """Padding of the ratio is 1 (TRL's value; VESPO sums log-ratios without a mask, so 0 there zeroed a row's
    weight), and rows whose padding changed get old log-probs and ratio recomputed on the final tensors."""
    from rookgrpo.dynamics.batch import vllm_importance_sampling_ratio

    seen = []

    class Check(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            super().on_scored_batch(trainer, scored)
            out = scored.output
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                fresh, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask,
                                                                         out["completion_ids"].size(1))
            seen.append((out, fresh))

    cb = Check(max_rounds=8)
    trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path, [cb], max_steps=3, beta=0.04, loss_type=loss_type,
                       disable_dropout=True)
    _fake_vllm(trainer, "token_truncate")
    trainer.train()
    assert cb.rescored_rows > 0  # some rows came from a narrower round: the comparison below is not vacuous
    for out, fresh in seen:
        keep = out["completion_mask"].bool()
        padded = ~keep
        assert (out["importance_sampling_ratio"][padded] == 1.0).all()
        torch.testing.assert_close(out["old_per_token_logps"][keep], fresh[keep], rtol=1e-4, atol=1e-4)
        expected = vllm_importance_sampling_ratio(fresh, out["sampling_per_token_logps"], loss_mask(out),
                                                  "token_truncate", trainer.vllm_importance_sampling_clip_min,
                                                  trainer.vllm_importance_sampling_clip_max)
        torch.testing.assert_close(out["importance_sampling_ratio"][keep], expected[keep], rtol=1e-4, atol=1e-4)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


# --- hook order, metrics of the optimised batch, what counts as signal ---------------------------------------------


def test_batch_changing_hooks_run_before_observers_whatever_the_listed_order(tiny_model_dir, flat_dataset, tmp_path):
    """Listed as every recipe lists them (diagnostics first): resampling still runs first, so the diagnostics book
    the extra rounds' time to the batch that spent it and measure the batch that is optimised."""
    calls, leftovers = [], []

    class Observer(Diagnostics):
        def on_scored_batch(self, trainer, scored):
            super().on_scored_batch(trainer, scored)
            calls.append("diagnostics")
            leftovers.append({k: v for k, v in trainer._phases.pending().items() if k not in ('loss', 'optimizer')})  # phase time no observer took: booked to the next batch

    class Resampler(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            calls.append("resampling")
            super().on_scored_batch(trainer, scored)

    resampler = Resampler(max_rounds=8)
    trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path, [Observer(), resampler], max_steps=4)
    assert trainer._batch_hooks[0] is resampler
    trainer.train()
    assert calls == ["resampling", "diagnostics"] * 4
    assert resampler.totals["rounds"] > 0
    assert all(not left for left in leftovers), leftovers
    # Every optimised batch had a group with a reward spread (the rounds replaced flat ones), so no step was
    # advantage-free; the loss saw tokens of it.
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["optimised/frac_reward_zero_std"] < 1.0 and h["completions/loss_tokens"] > 0 for h in logs), logs


@pytest.mark.parametrize("oversample", [0, 3])
def test_metrics_name_the_batch_they_describe(tiny_model_dir, flat_dataset, tmp_path, oversample):
    """TRL's reward metrics describe the sampled batch; optimised/* the batch the loss saw; the completions table
    holds the optimised rows with their final advantages. DAPO-style rounds (``oversample``) score more rows than
    TRL's table keeps: the replacements trained on must still be the rows it shows."""
    from rookgrpo.dynamics.batch import combined_rewards

    optimised = []

    class Capture(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            super().on_scored_batch(trainer, scored)
            optimised.append((combined_rewards(scored.rewards_per_func, trainer.reward_weights),
                              [row["prompt"] for row in scored.inputs], scored.output["advantages"].tolist()))

    trainer = _trainer(tiny_model_dir, flat_dataset, tmp_path, [Capture(max_rounds=8, oversample=oversample)],
                       max_steps=4)
    trainer.train()
    assert trainer._logs["prompt"].maxlen == trainer.args.generation_batch_size
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == len(optimised) == 4
    for h, (rewards, _, _) in zip(logged, optimised):
        assert h["optimised/reward"] == pytest.approx(rewards.mean().item(), abs=1e-6)
        assert h["optimised/frac_reward_zero_std"] == 0.0 == h["resample/frac_zero_std_after"]
        assert "optimised/rewards/mostly_flat/mean" in h and "optimised/completions/mean_length" in h
    assert max(h["frac_reward_zero_std"] for h in logged) > 0  # TRL's own: the sampled batch, flat groups and all
    assert any(h["reward"] != pytest.approx(h["optimised/reward"]) for h in logged)
    _, prompts, advantages = optimised[-1]
    assert list(trainer._logs["prompt"]) == prompts
    assert list(trainer._logs["advantages"]) == pytest.approx(advantages)
    assert list(trainer._logs["rewards"]["mostly_flat"]) == pytest.approx(
        [r for r in optimised[-1][0].tolist()])


def test_groups_with_no_loss_tokens_count_as_no_signal(tiny_model_dir, smoke_dataset, tmp_path):
    """With mask_truncated_completions, a group whose completions were all cut off has nothing to learn from,
    whatever its rewards: resampling must count it as flat, not deliver it as a signal group."""
    empty_delivered, after = [], []

    class Check(ZeroStdResampling):
        def on_scored_batch(self, trainer, scored):
            super().on_scored_batch(trainer, scored)
            G = trainer.num_generations
            tokens = loss_mask(scored.output).view(-1, G * scored.output["completion_mask"].size(1)).sum(dim=1)
            empty_delivered.append(int((tokens == 0).sum()))
            after.append(trainer._metrics["train"]["resample/frac_zero_std_after"][-1] * tokens.numel())

    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=4, mask_truncated_completions=True),
                              train_dataset=smoke_dataset, callbacks=[Check(max_rounds=2)])
    trainer.train()
    assert sum(empty_delivered) > 0  # the tiny model rarely stops within 8 tokens: empty groups do occur
    assert all(kept >= empty for kept, empty in zip(after, empty_delivered))  # every one counted as kept flat


def test_zero_std_criterion_matches_trls_advantages_for_each_aggregation():
    # Two reward functions: their weighted sum varies in group 0 but each standardises to [+1, -1] and [-1, +1],
    # so normalize_then_sum gives the whole group one advantage; group 1 is the reverse case.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, 1.0], [1.0, 0.0]])
    weights = torch.ones(2)
    assert zero_std_groups(rewards, weights, 2).tolist() == [False, False]
    assert zero_std_groups(rewards, weights, 2, "normalize_then_sum").tolist() == [True, False]
    generator = torch.Generator().manual_seed(0)
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        rpf = torch.randint(0, 3, (64, 3), generator=generator).float() / 2
        for g in (0, 5, 9):  # a few groups whose completions all earned the same rewards
            rpf[4 * g:4 * g + 4] = rpf[4 * g]
        rpf[4:8] = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.5, 0.0], [1.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
        advantages = batch_advantages(rpf, torch.tensor([1.0, 0.5, 2.0]), 4, "group", aggregation).view(-1, 4)
        flat_advantages = (advantages - advantages[:, :1]).abs().amax(dim=1) < 1e-3
        assert zero_std_groups(rpf, torch.tensor([1.0, 0.5, 2.0]), 4, aggregation).tolist() == flat_advantages.tolist()
        assert 0 < int(flat_advantages.sum()) < 16


def test_optimised_zero_std_share_uses_trls_definition(tiny_model_dir, smoke_dataset, tmp_path):
    """optimised/frac_reward_zero_std compares with TRL's frac_reward_zero_std: groups whose rewards differ only by
    float noise (a judge scoring identical texts 1e-7 apart) have spread under TRL's definition and no signal under the
    resampler's (resample/frac_zero_std_*), and each metric keeps its own definition."""
    from rookgrpo.dynamics.batch import trl_frac_zero_std, zero_std_groups

    def noise_only(completions, **kwargs):
        return [0.5 + (1e-7 if i % 4 == 1 else 0.0) for i in range(len(completions))]

    rpf = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.5, 0.5 + 1e-7, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0]).unsqueeze(1)
    assert trl_frac_zero_std(rpf, torch.tensor([1.0]), 4) == pytest.approx(1 / 3)  # only the exact ties
    assert zero_std_groups(rpf, torch.tensor([1.0]), 4).tolist() == [True, True, False]  # noise is no signal

    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=noise_only,
                              args=tiny_grpo_args(tmp_path, max_steps=2), train_dataset=smoke_dataset,
                              callbacks=[ZeroStdResampling(max_rounds=1)])
    trainer.train()
    for h in [h for h in trainer.state.log_history if "loss" in h]:
        assert h["frac_reward_zero_std"] == 0.0 == h["optimised/frac_reward_zero_std"]  # TRL's definition, both
        assert h["resample/frac_zero_std_before"] == 1.0 == h["resample/frac_zero_std_after"]  # the resampler's
