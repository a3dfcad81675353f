"""``Diagnostics``: the numbers that explain why a GRPO run "does nothing", and warnings that name cause and fix.

Logged (averaged over the logging window like TRL's own metrics):

- ``timing/generation``, ``timing/rewards``, ``timing/reference``: seconds per generation batch spent generating,
  scoring, and computing log-probs outside the loss (reference model and, when needed, the old policy);
  ``timing/loss`` (forward and backward of every micro-batch) and ``timing/optimizer`` (the optimizer step): seconds
  per optimizer step; ``timing/step``: seconds per optimizer step, everything included. The trainer measures the
  phases around TRL's own methods, so they add up to what the step really spent.
- ``memory/<phase>`` for the same five phases: peak memory during the phase in MiB on the main process (CUDA
  allocated memory on a GPU, the process's peak resident set on CPU; :mod:`rookgrpo.dynamics.phases` says how). On a
  GPU the meter never resets ``torch.cuda``'s peak (your own ``torch.cuda.max_memory_allocated`` stays right), so a
  phase that did not raise the run's peak reports what it held at its edges; ``exact_cuda_peaks: true`` resets the
  peak per phase for exact numbers instead. ``memory/process_peak``: the run's peak (CUDA allocated, or the CPU
  process's resident set) since training began.
- ``timing/first_step`` (in the first log only): the first optimizer step, which carries the warm-up (allocator,
  kernels, a ``torch.compile`` compilation); after 5 more steps an info line says how many median steps it cost.
  ``compile/graphs``: graphs ``torch.compile`` compiled during the step (logged once it has compiled any; the most
  any rank compiled, so every rank logs and judges the same).
- ``groups/identical_frac``: share of groups whose completions are all the same token sequence (the policy or the
  sampling settings leave no room to explore; such a group has no reward spread).
- ``groups/flat_best_frac``, ``groups/flat_worst_frac``: share of the optimised batch's groups that are flat (every
  completion the same combined reward) at the highest combined reward any completion has earned so far in the run
  (all pass: too easy) or at the lowest (all fail: too hard); not logged until two rewards have differed. The doctor's
  zero-std finding splits by them.
- ``loss/kl_share``: share of the loss magnitude that comes from the KL term, ``beta·kl / (|loss − beta·kl| +
  beta·kl)``, using TRL's per-token ``kl``. Near 1 the KL penalty dominates and the policy is pulled back to the
  reference instead of towards reward (published RookWorld runs: ~0.95 at beta 0.1). Logged for the loss types that
  normalise by a token count (dapo, bnpo, cispo, vespo), where ``beta·kl`` is the loss's KL term; grpo/sapo (per
  sequence means), dr_grpo (fixed length) and luspo (per-sequence sums) weight tokens differently, so it is not
  logged for them rather than logged wrong.

- ``completions/loss_tokens``: completion tokens of the generation batch the loss sees (all processes), 0 when every
  completion is masked out (cut off with ``mask_truncated_completions``, say).

It measures; the doctor judges (``callbacks: [diagnostics, doctor]``): identical groups, batches with no token to
learn from, rewards that collapse or saturate, completions cut off, recompilation and the rest are findings of
:mod:`rookgrpo.doctor.detectors` on these metrics and TRL's, with one set of thresholds, said live once (again when
they grow) and stopping the run through the doctor's ``halt_on``. Without the doctor, this callback says so once.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings

import torch

from ..dynamics.batch import combined_rewards, loss_mask, zero_std_groups
from ..trl_compat import metric_mode, pending_metrics
from ..dynamics.phases import dynamo_graphs
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger("rookgrpo.diagnostics")

# Loss types whose KL term is beta times TRL's logged ``kl`` (a token mean over the batch): they normalise the
# per-token loss by a token count. grpo/sapo average per sequence first, dr_grpo divides by batch x
# max_completion_length, luspo sums per sequence: for those, beta·kl is not the KL part of the loss.
TOKEN_NORMALISED_LOSSES = ("dapo", "bnpo", "cispo", "vespo")


def kl_term(loss_type: str, beta: float, kl: float | None) -> float | None:
    """The KL part of the loss from the logged metrics, or ``None`` where the loss type does not allow it.

    >>> kl_term("dapo", 0.1, 0.02), kl_term("grpo", 0.1, 0.02)
    (0.002, None)
    """
    if kl is None or loss_type not in TOKEN_NORMALISED_LOSSES:
        return None
    return beta * kl


def kl_share(loss: float, kl_term: float) -> float:
    """Share of the loss magnitude from the KL term: ``|beta·kl| / (|loss − beta·kl| + |beta·kl|)``."""
    total = abs(loss - kl_term) + abs(kl_term)
    return abs(kl_term) / total if total > 0 else 0.0


@register_callback("diagnostics")
class Diagnostics(RookCallback):
    """Per-phase timing and memory, identical-group share, tokens in the loss, flat-group split, KL share of the loss
    (module docstring). It measures; the ``doctor`` callback judges.

    Args:
        exact_cuda_peaks: on a GPU, reset ``torch.cuda``'s peak when each phase starts, so ``memory/<phase>`` is
            each phase's exact peak; this resets the peak your own code reads from ``torch.cuda.max_memory_allocated``
            (off by default: then a phase that did not raise the run's peak reports a lower bound).
        warn_every, identical_warn_frac, truncated_warn_frac: retired (from when diagnostics judged too): accepted
            with a FutureWarning and ignored; the doctor's thresholds ``identical_share`` and ``truncated_share``
            replace the last two, and the doctor says each finding once.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"diagnostics": {"exact_cuda_peaks": True}})
        >>> type(cb).__name__, cb.exact_cuda_peaks
        ('Diagnostics', True)
    """

    state_key = "diagnostics"

    def __init__(self, exact_cuda_peaks: bool = False, warn_every: int | None = None,
                 identical_warn_frac: float | None = None, truncated_warn_frac: float | None = None):
        self.exact_cuda_peaks = bool(exact_cuda_peaks)
        given = {"warn_every": warn_every, "identical_warn_frac": identical_warn_frac,
                 "truncated_warn_frac": truncated_warn_frac}
        moved = {k: RETIRED[k] for k, v in given.items() if v is not None}
        if moved:
            warnings.warn("diagnostics: " + "; ".join(f"{k} is ignored, {v}" for k, v in moved.items()) +
                          " (the doctor judges what diagnostics measures: callbacks: [diagnostics, doctor]).",
                          FutureWarning, stacklevel=2)
        self._step_start: float | None = None
        self._graphs_at_start = 0
        self._steps: list[float] = []  # durations of the steps after the first (for the median)
        self._first_step: float | None = None
        self._reward_range: tuple[float, float] | None = None  # lowest and highest combined reward so far

    def bind(self, trainer) -> None:
        super().bind(trainer)
        self.meter = trainer.measure_phases(reset_cuda_peaks=self.exact_cuda_peaks)

    def on_train_begin(self, args, state, control, **kwargs):
        from .doctor import Doctor

        trainer = getattr(self, "trainer", None)  # None on a trainer that never bound it (plain TRL)
        handler = getattr(trainer, "callback_handler", None)
        if handler is not None and not any(isinstance(c, Doctor) for c in handler.callbacks) \
                and state.is_world_process_zero:
            logger.info("diagnostics measures and logs; add the doctor callback (callbacks: [diagnostics, doctor]) "
                        "to have the numbers judged while training, or run `rookgrpo doctor OUTPUT_DIR` after.")

    # The trainer calls this after TRL scored a generation batch (and after resampling replaced groups).
    def on_scored_batch(self, trainer, scored) -> None:
        mode = "train" if trainer.model.training else "eval"
        metrics = pending_metrics(trainer, mode)
        for phase, (seconds, peak) in self.meter.take(("generation", "rewards", "reference")).items():
            metrics[f"timing/{phase}"].append(seconds)
            metrics[f"memory/{phase}"].append(peak)
        G = trainer.num_generations if mode == "train" else getattr(trainer, "num_generations_eval", None) or trainer.num_generations
        ids, mask = scored.first_output["completion_ids"], scored.first_output["completion_mask"]
        ids = ids.masked_fill(mask == 0, -1).view(-1, G, ids.size(1))
        identical = (ids == ids[:, :1]).all(dim=2).all(dim=1).sum()
        loss_tokens = loss_mask(scored.output).sum()
        local = torch.stack([identical.float(), torch.tensor(float(ids.size(0)), device=identical.device),
                             loss_tokens.float().to(identical.device)])
        identical, groups, loss_tokens = trainer.accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
        metrics["groups/identical_frac"].append(identical / max(groups, 1.0))
        metrics["completions/loss_tokens"].append(loss_tokens)
        if mode == "train":
            self._flat_split(trainer, scored, G, metrics)

    def _flat_split(self, trainer, scored, G: int, metrics) -> None:
        """Log the shares of groups flat at the best and at the worst combined reward seen so far (the rewards are
        gathered from every process, so every process computes the same shares)."""
        rpf = scored.rewards_per_func
        if rpf is None or rpf.numel() == 0 or rpf.size(0) % G:
            return
        weights = trainer.reward_weights.to(rpf.device)
        totals = combined_rewards(rpf, weights)
        finite = totals[~torch.isnan(totals)]
        if finite.numel() == 0:
            return
        low, high = finite.min().item(), finite.max().item()
        if self._reward_range is not None:
            low, high = min(low, self._reward_range[0]), max(high, self._reward_range[1])
        self._reward_range = (low, high)
        eps = 1e-6 * max(1.0, abs(high), abs(low))
        if high - low <= eps:  # no spread seen yet: neither "all pass" nor "all fail" means anything
            return
        flat = zero_std_groups(rpf, weights, G, getattr(trainer, "multi_objective_aggregation", "sum_then_normalize"))
        value = totals.view(-1, G).nanmean(dim=1)
        groups = max(flat.numel(), 1)
        metrics["groups/flat_best_frac"].append((flat & (value >= high - eps)).sum().item() / groups)
        metrics["groups/flat_worst_frac"].append((flat & (value <= low + eps)).sum().item() / groups)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()
        self._graphs_at_start = dynamo_graphs()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.meter.start("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.meter.stop("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_start is None:
            return
        seconds = time.perf_counter() - self._step_start
        self._step_start = None
        metrics = pending_metrics(self.trainer)
        metrics["timing/step"].append(seconds)
        for phase, (phase_seconds, peak) in self.meter.take(("loss", "optimizer")).items():
            metrics[f"timing/{phase}"].append(phase_seconds)
            metrics[f"memory/{phase}"].append(peak)
        metrics["memory/process_peak"].append(self.meter.process_peak_mib)
        graphs = dynamo_graphs()
        new_graphs = graphs - self._graphs_at_start
        accelerator = self.trainer.accelerator
        if accelerator.num_processes > 1:  # the most any rank compiled: every rank logs and judges the same count
            import torch

            counts = accelerator.reduce(torch.tensor([graphs, new_graphs], dtype=torch.float64,
                                                     device=accelerator.device), reduction="max")
            graphs, new_graphs = (int(v) for v in counts.tolist())
        if graphs:
            metrics["compile/graphs"].append(float(new_graphs))
        if self._first_step is None:
            self._first_step = seconds
            metrics["timing/first_step"].append(seconds)
            return
        if not new_graphs:  # a step that compiled again is the doctor's recompile finding, not a steady step
            self._steps = (self._steps + [seconds])[-50:]
        if len(self._steps) == 5 and not new_graphs:  # the fifth steady step (the list only grows, to 50)
            median = statistics.median(self._steps)
            if self.trainer.accelerator.is_main_process:
                logger.info("first step: %.2f s, %.1fx the median of the next steady steps (%.2f s): warm-up%s.",
                            self._first_step, self._first_step / median, median,
                            " and torch.compile's first compilation" if graphs else "")

    # The trainer calls this before TRL adds its metric averages to ``logs`` and logs them.
    def before_log(self, trainer, logs: dict) -> None:
        metrics = pending_metrics(trainer, metric_mode(trainer))
        kl_values, beta_values = list(metrics.get("kl", [])), list(metrics.get("beta", []))
        if "loss" not in logs or not kl_values:
            return
        beta = sum(beta_values) / len(beta_values) if beta_values else trainer.beta
        term = kl_term(trainer.loss_type, beta, sum(kl_values) / len(kl_values))
        if term is not None:
            logs["loss/kl_share"] = kl_share(float(logs["loss"]), term)

    def state_dict(self) -> dict:
        return {"reward_range": list(self._reward_range) if self._reward_range else None}

    def load_state_dict(self, state: dict) -> None:
        rng = state.get("reward_range")  # checkpoints of older versions also hold their warnings' state: ignored
        self._reward_range = (float(rng[0]), float(rng[1])) if rng else None


#: Arguments diagnostics took when it judged as well as measured: each now a doctor threshold, or gone.
RETIRED = {"warn_every": "the doctor says each finding once, and again when it grows",
           "identical_warn_frac": "set the doctor's thresholds: {identical_share: ...}",
           "truncated_warn_frac": "set the doctor's thresholds: {truncated_share: ...}"}
