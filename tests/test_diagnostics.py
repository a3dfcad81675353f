"""Diagnostics measures (phase timings, identical groups, tokens in the loss, KL share); the doctor judges what it
measures, live, with cause and fix."""

import logging
import sys

from conftest import REPO, tiny_grpo_args
from rookgrpo import RookGRPOTrainer
from rookgrpo.callbacks import Diagnostics, Doctor

sys.path.insert(0, str(REPO / "tests" / "assets"))
from flat_reward import mostly_flat  # noqa: E402


def _eos_token_ids(trainer) -> list[int]:
    """Every id that ends a completion: TRL's ``eos_token_ids`` (1.16: the tokenizer's and the generation config's),
    else the tokenizer's eos."""
    ids = getattr(trainer, "eos_token_ids", None)
    if ids:
        return list(ids)
    tokenizer = getattr(trainer, "_tokenizer", None) or getattr(trainer.processing_class, "tokenizer",
                                                                 trainer.processing_class)
    return [tokenizer.eos_token_id]


def _history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def _doctor_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rookgrpo.doctor"]


def test_flat_batches_are_judged_by_the_doctor_once_with_cause_and_fix(tiny_model_dir, smoke_dataset, tmp_path,
                                                                        caplog):
    """diagnostics measures, the doctor judges: every batch flat is said once, live, with cause and fix; the reward
    is a function, so the doctor names a rule's causes, not a judge's (tests/test_judge.py checks a judge's)."""
    flat = smoke_dataset.map(lambda row: {"signal": False})
    args = tiny_grpo_args(tmp_path, max_steps=4)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=mostly_flat, args=args, train_dataset=flat,
                              callbacks=[Diagnostics(), Doctor()])
    with caplog.at_level(logging.INFO):
        trainer.train()
    lines = _doctor_lines(caplog)
    zero = [line for line in lines if "no group ever had a reward spread" in line]
    assert len(zero) == 1 and zero[0].startswith("doctor: [critical]") and "zero_std_resampling" in zero[0], lines
    collapsed = [line for line in lines if "gives every completion the same score" in line]
    assert len(collapsed) == 1 and "reward 'mostly_flat'" in collapsed[0], lines
    assert "It is a rule" in collapsed[0] and "judge (reward model)" not in collapsed[0]
    # diagnostics itself judges nothing: no warning of its own
    assert not [r for r in caplog.records if r.name == "rookgrpo.diagnostics" and r.levelno >= logging.WARNING]


def test_diagnostics_without_the_doctor_says_where_the_judging_went(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    import pytest

    with pytest.warns(FutureWarning, match="identical_warn_frac is ignored.*identical_share"):
        Diagnostics(identical_warn_frac=0.3)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=1), train_dataset=smoke_dataset,
                              callbacks=[Diagnostics()])
    with caplog.at_level(logging.INFO, logger="rookgrpo.diagnostics"):
        trainer.train()
    assert any("add the doctor callback" in r.getMessage() for r in caplog.records)


def test_metrics_are_logged_and_sane(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    # Greedy decoding without dropout (TRL generates in train mode): every group's completions are identical.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    args = tiny_grpo_args(tmp_path, max_steps=3, beta=0.1, generation_kwargs={"do_sample": False})
    trainer = RookGRPOTrainer(model=model, reward_funcs="uci_charset", args=args, train_dataset=smoke_dataset,
                              callbacks=["diagnostics", {"doctor": {"thresholds": {"min_share_points": 3}}}])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    phases = ("generation", "rewards", "reference", "loss", "optimizer")
    for key in [f"timing/{p}" for p in phases] + [f"memory/{p}" for p in phases] + ["timing/step"]:
        assert len(_history(trainer, key)) == 3 and all(v > 0 for v in _history(trainer, key)), key
    steps = _history(trainer, "timing/step")
    parts = [sum(_history(trainer, f"timing/{p}")[i] for p in phases) for i in range(3)]
    assert all(s >= part for s, part in zip(steps, parts))  # the phases are parts of the step, measured apart
    assert _history(trainer, "timing/first_step") == steps[:1]  # once, in the first log
    assert not _history(trainer, "compile/graphs")  # nothing was compiled
    # The identical groups are measured, and the doctor judges them (every group, every step: critical).
    assert _history(trainer, "groups/identical_frac") == [1.0, 1.0, 1.0], _history(trainer, "groups/identical_frac")
    assert any(line.startswith("doctor: [critical] every group's completions are identical")
               and "a median 100% of groups" in line for line in _doctor_lines(caplog)), _doctor_lines(caplog)
    assert all(v > 0 for v in _history(trainer, "completions/loss_tokens"))
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
    """Every completion cut off at max_completion_length with mask_truncated_completions: nothing to learn from.
    diagnostics counts the loss's tokens; the doctor names the batches that had none."""
    args = tiny_grpo_args(tmp_path, max_steps=2, max_completion_length=2, mask_truncated_completions=True)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=[Diagnostics(), Doctor()])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    masked = [h for h in trainer.state.log_history if h.get("completions/clipped_ratio") == 1.0]
    assert masked  # the setting did mask every completion of at least one batch (seeded, so always the same)
    assert [h["completions/loss_tokens"] for h in masked] == [0.0] * len(masked)
    lines = [line for line in _doctor_lines(caplog) if "no token to learn from" in line]
    assert lines and "mask_truncated_completions" in lines[0], _doctor_lines(caplog)


def test_completions_cut_off_from_the_start_name_the_limit(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """A random tiny model never emits eos within 8 tokens: every batch is cut off, and was from the first one."""
    args = tiny_grpo_args(tmp_path, max_steps=4)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=[Diagnostics(), Doctor()])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    assert all(r >= 0.5 for r in _history(trainer, "completions/clipped_ratio"))
    lines = [line for line in _doctor_lines(caplog) if "cut off at max_completion_length" in line]
    assert len(lines) == 1, _doctor_lines(caplog)
    assert "from the start" in lines[0] and "raise max_completion_length" in lines[0]
    assert "mask_truncated_completions" in lines[0] and "never ends" not in lines[0]


def _let_go_run(tiny_model_dir, smoke_dataset, tmp_path, caplog, let_go_at: int, **layout):
    """The random tiny model made to end every completion (eos forced at the last position) until optimizer step
    ``let_go_at``, then let go, so it runs on to max_completion_length: (trainer, doctor, its truncation lines)."""
    from transformers import TrainerCallback

    class LetGo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == let_go_at:
                trainer.generation_config.forced_eos_token_id = None

    doctor = Doctor(halt_on=["truncation"])
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, **layout), train_dataset=smoke_dataset,
                              eval_dataset=smoke_dataset.select(range(8)) if "eval_strategy" in layout else None,
                              callbacks=[Diagnostics(), doctor, LetGo()])
    trainer.generation_config.forced_eos_token_id = _eos_token_ids(trainer)[0]  # TRL 1.10 has no eos_token_ids
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    return trainer, doctor, [line for line in _doctor_lines(caplog) if "cut off at max_completion_length" in line]


def test_completions_that_start_running_on_are_named_as_collapse_and_halt(tiny_model_dir, smoke_dataset, tmp_path,
                                                                          caplog):
    """Forced to end for three steps, then let go: the cut-off share jumps from 0 to 1; the doctor calls it a
    collapse, not a short limit, and ``halt_on: [truncation]`` stops the run there (a judgement diagnostics could
    only warn about before)."""
    trainer, doctor, lines = _let_go_run(tiny_model_dir, smoke_dataset, tmp_path, caplog, 3, max_steps=12)
    ratios = _history(trainer, "completions/clipped_ratio")
    assert ratios[:3] == [0.0, 0.0, 0.0] and all(r >= 0.5 for r in ratios[3:]), ratios
    assert len(lines) == 1, lines
    assert "against 0% at the start" in lines[0] and "never ends" in lines[0] and "lower learning_rate" in lines[0]
    assert lines[0].startswith("doctor: [critical]")
    assert doctor.halted == "truncation:completions/clipped_ratio" and trainer.state.global_step < 12


def test_run_on_is_judged_on_training_batches_only(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """Gradient accumulation, a generation batch reused over steps (steps_per_generation 2, num_iterations 2) and an
    evaluation after every step: the doctor reads the training batches' cut-off share (the evaluations' is logged
    apart, as eval_*), so the first training batch stays the reference and the collapse is named."""
    layout = dict(max_steps=12, per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=2,
                  num_iterations=2, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    trainer, doctor, lines = _let_go_run(tiny_model_dir, smoke_dataset, tmp_path, caplog, 4, **layout)
    assert [h for h in trainer.state.log_history if "eval_loss" in h]  # the evaluations did run
    assert any("eval_completions/clipped_ratio" in h for h in trainer.state.log_history)
    assert len(lines) == 1 and "against 0% at the start" in lines[0] and "never ends" in lines[0], lines
    assert doctor.halted == "truncation:completions/clipped_ratio"


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
                              callbacks=[Diagnostics(), Doctor()])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        trainer.train()
    graphs = _history(trainer, "compile/graphs")
    assert len(graphs) == 4 and graphs[0] >= 1 and graphs[1] == 0 and graphs[2] >= 1 and graphs[3] == 0, graphs
    lines = [line for line in _doctor_lines(caplog) if "torch.compile compiling again" in line]
    assert len(lines) == 1 and "first at step 3" in lines[0] and "TORCH_LOGS=recompiles" in lines[0], lines


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
