"""Diagnostics: phase timings, identical-group share, KL share, and rate-limited warnings with cause and fix."""

import logging
import sys

from conftest import REPO, tiny_grpo_args
from rookgrpo import RookGRPOTrainer
from rookgrpo.callbacks import Diagnostics
from rookgrpo.callbacks.diagnostics import _eos_token_ids

sys.path.insert(0, str(REPO / "tests" / "assets"))
from flat_reward import mostly_flat  # noqa: E402


def _history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_zero_advantage_batch_warns_once_with_cause_and_fix(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    flat = smoke_dataset.map(lambda row: {"signal": False})
    args = tiny_grpo_args(tmp_path, max_steps=4)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat, args=args, train_dataset=flat,
                              callbacks=[Diagnostics(warn_every=3)])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "every advantage" in r.getMessage()]
    # Steps 0 and 3 warn (every 3 steps); the one at step 3 says how many were held back.
    assert len(warnings) == 2, warnings
    assert "zero-std groups" in warnings[0] and "Fix: add the zero_std_resampling callback" in warnings[0]
    assert "2 more like this" in warnings[1]
    # The same batches collapse the reward itself; it is a function, so the warning names a rule's causes, not a
    # judge's (tests/test_judge.py checks the judge's wording).
    collapsed = [r.getMessage() for r in caplog.records if "same score" in r.getMessage()]
    assert collapsed and "reward 'mostly_flat' gave all" in collapsed[0]
    assert "It is a rule" in collapsed[0] and "judge" not in collapsed[0]


def test_metrics_are_logged_and_sane(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    # Greedy decoding without dropout (TRL generates in train mode): every group's completions are identical.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    args = tiny_grpo_args(tmp_path, max_steps=3, beta=0.1, generation_kwargs={"do_sample": False})
    trainer = RookGRPOTrainer(model=model, reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=["diagnostics"])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    phases = ("generation", "rewards", "reference", "loss", "optimizer")
    for key in [f"timing/{p}" for p in phases] + [f"memory/{p}" for p in phases] + ["timing/step"]:
        assert len(_history(trainer, key)) == 3 and all(v > 0 for v in _history(trainer, key)), key
    steps = _history(trainer, "timing/step")
    parts = [sum(_history(trainer, f"timing/{p}")[i] for p in phases) for i in range(3)]
    assert all(s >= part for s, part in zip(steps, parts))  # the phases are parts of the step, measured apart
    assert _history(trainer, "timing/first_step") == steps[:1]  # once, in the first log
    assert not _history(trainer, "compile/graphs")  # nothing was compiled
    # The identical groups are measured and the warning says so.
    assert _history(trainer, "groups/identical_frac") == [1.0, 1.0, 1.0], _history(trainer, "groups/identical_frac")
    assert any("100% of groups had 4 identical completions" in r.getMessage() for r in caplog.records)
    shares = _history(trainer, "loss/kl_share")
    assert len(shares) == 3 and all(0.0 <= s <= 1.0 for s in shares)


def test_kl_share_is_logged_only_where_beta_kl_is_the_loss_term(tiny_model_dir, smoke_dataset, tmp_path):
    shares = {}
    for loss_type in ("dapo", "bnpo", "grpo", "dr_grpo"):
        args = tiny_grpo_args(tmp_path / loss_type, max_steps=2, beta=0.04, loss_type=loss_type)
        trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                                  train_dataset=smoke_dataset, callbacks=[Diagnostics()])
        trainer.train()
        shares[loss_type] = _history(trainer, "loss/kl_share")
        assert _history(trainer, "kl")  # the KL itself is logged for every loss type
    assert len(shares["dapo"]) == 2 and len(shares["bnpo"]) == 2
    assert all(0.0 <= s <= 1.0 for s in shares["dapo"] + shares["bnpo"])
    assert shares["grpo"] == [] and shares["dr_grpo"] == []


def test_a_batch_with_no_token_to_learn_from_is_named(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """Every completion cut off at max_completion_length with mask_truncated_completions: nothing to learn from."""
    args = tiny_grpo_args(tmp_path, max_steps=2, max_completion_length=2, mask_truncated_completions=True)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=[Diagnostics(warn_every=1)])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    masked = [h for h in trainer.state.log_history if h.get("completions/clipped_ratio") == 1.0]
    warnings = [r.getMessage() for r in caplog.records if "no token to learn from" in r.getMessage()]
    assert masked  # the setting did mask every completion of at least one batch (seeded, so always the same)
    assert len(warnings) == len(masked) and "mask_truncated_completions" in warnings[0]


def test_completions_cut_off_from_the_start_name_the_limit(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """A random tiny model never emits eos within 8 tokens: every batch is cut off, and was from the first one."""
    args = tiny_grpo_args(tmp_path, max_steps=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=[Diagnostics(warn_every=1)])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    # TRL sees it too (its count differs by a row where the model happened to sample the pad token last).
    assert all(r >= 0.5 for r in _history(trainer, "completions/clipped_ratio"))
    warnings = [r.getMessage() for r in caplog.records if "without an end token" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "100% already in the first training batch (step 0)" in warnings[0]
    assert "raise max_completion_length" in warnings[0] and "mask_truncated_completions" in warnings[0]
    assert not any("collapsing into run-on text" in w for w in warnings)


def _let_go_run(tiny_model_dir, smoke_dataset, tmp_path, caplog, let_go_at: int, **layout):
    """The random tiny model made to end every completion (eos forced at the last position) until optimizer step
    ``let_go_at``, then let go, so it runs on to max_completion_length: (trainer, diagnostics, warnings)."""
    from transformers import TrainerCallback

    class LetGo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == let_go_at:
                trainer.generation_config.forced_eos_token_id = None

    diagnostics = Diagnostics(warn_every=1)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, **layout), train_dataset=smoke_dataset,
                              eval_dataset=smoke_dataset.select(range(8)) if "eval_strategy" in layout else None,
                              callbacks=[diagnostics, LetGo()])
    trainer.generation_config.forced_eos_token_id = _eos_token_ids(trainer)[0]  # TRL 1.10 has no eos_token_ids
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    return trainer, diagnostics, [r.getMessage() for r in caplog.records if "without an end token" in r.getMessage()]


def test_completions_that_start_running_on_are_named_as_collapse(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """Forced to end for two steps, then let go: the cut-off share jumps from 0 to 1 and the warning calls it a
    collapse, not a short limit."""
    trainer, diagnostics, warnings = _let_go_run(tiny_model_dir, smoke_dataset, tmp_path, caplog, 2, max_steps=4)
    ratios = _history(trainer, "completions/clipped_ratio")
    assert ratios[:2] == [0.0, 0.0] and all(r >= 0.5 for r in ratios[2:]), ratios
    assert len(warnings) == 2, warnings
    assert "100% of this batch's completions ran to max_completion_length (8 tokens)" in warnings[0]
    assert "against 0% in the first training batch (step 0)" in warnings[0]
    assert "collapsing into run-on text" in warnings[0] and "lower learning_rate" in warnings[0]
    # The first batch's share is kept with the callback's state, so a resumed run still knows where it started.
    restored = Diagnostics()
    restored.load_state_dict(diagnostics.state_dict())
    assert restored._first_truncated == (0, 0.0)


def test_run_on_warning_counts_training_generation_batches_only(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """Gradient accumulation, a generation batch reused over steps (steps_per_generation 2, num_iterations 2) and an
    evaluation after every step: one warning per training generation batch after the let-go, each against the first
    training batch; the evaluations' cut-off completions neither warn nor become the reference."""
    layout = dict(max_steps=6, per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=2,
                  num_iterations=2, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    trainer, diagnostics, warnings = _let_go_run(tiny_model_dir, smoke_dataset, tmp_path, caplog, 2, **layout)
    # A generation batch of 8 rows serves 2 micro-batches x 2 iterations = 2 optimizer steps: batches at steps 0, 2
    # and 4, the last two after the let-go.
    assert len(warnings) == 2, warnings
    assert all("against 0% in the first training batch (step 0)" in w for w in warnings), warnings
    assert [w.split(":")[0] for w in warnings] == ["step 2", "step 4"], warnings
    assert diagnostics._first_truncated == (0, 0.0)
    assert [h for h in trainer.state.log_history if "eval_loss" in h]  # the evaluations did run


def test_peak_memory_is_booked_to_the_phase_that_used_it(tiny_model_dir, smoke_dataset, tmp_path):
    """A reward that holds 256 MiB for a moment: the rewards phase's peak shows it, the other phases' do not."""
    import torch

    def heavy_reward(completions, **kwargs):
        block = torch.ones(64 * 1024 * 1024, dtype=torch.float32)  # 256 MiB, touched
        return [float(block[0]) * 0.0 + len(c) % 3 for c in completions]

    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=heavy_reward,
                              args=tiny_grpo_args(tmp_path, max_steps=2), train_dataset=smoke_dataset,
                              callbacks=[Diagnostics()])
    trainer.train()
    rewards, generation = _history(trainer, "memory/rewards"), _history(trainer, "memory/generation")
    loss = _history(trainer, "memory/loss")
    assert trainer._phases.memory_kind in ("peak_rss", "rss_at_edges", "cuda_peak_if_raised")
    assert max(_history(trainer, "memory/process_peak")) >= max(rewards)  # the lifetime peak survives the resets
    if trainer._phases.memory_kind == "peak_rss":  # Linux: the peak inside the phase is seen
        assert all(r - g > 200 for r, g in zip(rewards, generation)), (rewards, generation)
        assert all(r - x > 200 for r, x in zip(rewards, loss)), (rewards, loss)


def test_a_step_that_compiles_again_is_named_with_cause_and_fix(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """A real torch.compile (eager backend) that meets a new input shape after the first step: the step's new graphs
    are logged and the recompilation warning names the step."""
    import torch

    compiled = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
    calls = []

    def shape_changing_reward(completions, **kwargs):
        calls.append(1)
        width = 3 if len(calls) != 3 else 5  # step 3 meets a new shape
        compiled(torch.ones(width))
        return [float(len(c) % 3) for c in completions]

    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=shape_changing_reward,
                              args=tiny_grpo_args(tmp_path, max_steps=4), train_dataset=smoke_dataset,
                              callbacks=[Diagnostics()])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    graphs = _history(trainer, "compile/graphs")
    assert len(graphs) == 4 and graphs[0] >= 1 and graphs[1] == 0 and graphs[2] >= 1 and graphs[3] == 0, graphs
    warnings = [r.getMessage() for r in caplog.records if "torch.compile compiled" in r.getMessage()]
    assert len(warnings) == 1 and "during step 3" in warnings[0] and "TORCH_LOGS=recompiles" in warnings[0]


def test_phases_with_gradient_accumulation_and_evaluation_between_steps(tiny_model_dir, smoke_dataset, tmp_path):
    """Two micro-batches per optimizer step: the loss phase covers both; an evaluation between steps (no-grad loss)
    opens no loss phase and books its generation to the eval metrics, not to the training step's."""
    args = tiny_grpo_args(tmp_path, max_steps=2, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                          eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, eval_dataset=smoke_dataset.select(range(8)),
                              callbacks=[Diagnostics()])
    trainer.train()
    losses, steps = _history(trainer, "timing/loss"), _history(trainer, "timing/step")
    assert len(losses) == 2 and all(0 < l < s for l, s in zip(losses, steps))
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert evals and all("eval_timing/generation" in h for h in evals)
    assert "loss" not in trainer._phases.pending()  # nothing left open by the no-grad evaluation loss


def test_the_phase_meter_leaves_cudas_peak_to_the_user(monkeypatch):
    """On a GPU the meter reads torch.cuda's peak and never resets it, so the user's own
    torch.cuda.max_memory_allocated stays right: a phase that raised the peak is exact, one that did not reports what
    it held at its edges. exact_cuda_peaks (reset_cuda_peaks) resets per phase instead. A stand-in allocator here."""
    import torch

    from rookgrpo.dynamics.phases import MIB, PhaseMeter

    state = {"allocated": 100 * MIB, "peak": 500 * MIB, "resets": 0}

    def reset(device=None):
        state["resets"] += 1
        state["peak"] = state["allocated"]

    def use(mib):  # a transient allocation of ``mib`` inside a phase
        state["peak"] = max(state["peak"], state["allocated"] + mib * MIB)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    meter = PhaseMeter("cuda")
    with meter.measure("generation"):
        use(100)  # 200 MiB: below the 500 the user's code had reached
    with meter.measure("loss"):
        use(700)  # 800 MiB: a new peak
    taken = meter.take()
    assert state["resets"] == 0 and torch.cuda.max_memory_allocated() == 800 * MIB  # the user's reading, intact
    assert taken["generation"][1] == 100 and taken["loss"][1] == 800
    assert meter.memory_kind == "cuda_peak_if_raised" and meter.process_peak_mib == 800
    exact = PhaseMeter("cuda", reset_cuda_peaks=True)
    with exact.measure("generation"):
        use(100)
    assert exact.take()["generation"][1] == 200 and state["resets"] == 1 and exact.memory_kind == "cuda_max_allocated"
