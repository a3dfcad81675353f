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
  ``compile/graphs``: graphs ``torch.compile`` compiled during the step (logged once it has compiled any).
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

Warnings (through ``logging``, at most once per ``warn_every`` steps per kind, with a count of the ones held back):
every advantage of a batch zero, most groups identical, every completion masked out of the loss (no token to learn
from), most completions cut off at ``max_completion_length`` (so since the first batch: a limit too short for the
task; risen since: a policy collapsing into text that never ends), a reward that gave every completion of the
batch the same score (a judge's causes and fixes differ from a rule's, and the warning names the kind) or scores
within a thousandth of their magnitude of each other (saturated), and a step after the first in which
``torch.compile`` compiled again (the "second iteration 5x slower" failure).
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from ..dynamics.batch import combined_rewards, loss_mask, zero_std_groups
from ..trl_compat import metric_mode, pending_metrics
from ..dynamics.phases import dynamo_graphs
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger("rookgrpo.diagnostics")

ZERO_ADVANTAGE_HELP = (
    "every advantage in this generation batch is 0, so the policy-gradient term is exactly 0 and this step only "
    "moves the policy through the KL term. Likely cause: every completion of each prompt earned the same reward "
    "(zero-std groups: the task is too easy or too hard for the model, or the reward gives the same value to all "
    "failures). Fix: add the zero_std_resampling callback, raise temperature (task_generation_kwargs per task), "
    "use a reward with partial credit, or train on prompts the model sometimes solves."
)
NO_TOKENS_HELP = (
    "every completion of this batch is masked out of the loss, so there is no token to learn from and the step's "
    "per-token log-probs are all 0. Likely cause: every completion was cut off at max_completion_length with "
    "mask_truncated_completions on, or a tool/completion mask that covers everything. Fix: raise "
    "max_completion_length, turn mask_truncated_completions off, or check the masks."
)
COLLAPSED_HELP = (
    "reward {name!r} gave all {n} scored completions of this batch the same score ({value:.4g}), so it adds nothing "
    "to the advantages. Likely cause: a judge (reward model) that scores every completion alike: saturated (its "
    "output far from 0 whatever the text) or blind to the completion (the text it sees is cut off, or the completion "
    "part is lost in formatting). Fix: check what the judge is given (reward_processing_classes, truncation) and its "
    "raw scores on good and bad answers."
)
# The same event for a reward function (a rule): every completion failed it or passed it, which is the rule's verdict
# on this batch, not a fault; it only matters when it keeps happening.
COLLAPSED_RULE_HELP = (
    "reward {name!r} gave all {n} scored completions of this batch the same score ({value:.4g}), so it adds nothing "
    "to the advantages. It is a rule, so every completion failed it (or passed it) in this batch. If this warning "
    "keeps coming, the rule is too hard (or too easy) for the model at this temperature. Fix: raise the temperature "
    "for that task (task_generation_kwargs), give the reward partial credit, or train on prompts the model sometimes "
    "solves."
)
SATURATED_HELP = (
    "reward {name!r} scored all {n} completions of this batch within {spread:.3g} of each other around {center:.4g} "
    "({ratio:.1e} of its magnitude): saturated. Scaled advantages divide by the group's spread, so differences this "
    "small become full-size advantages and the policy learns from the reward's noise. Likely cause: a judge whose "
    "output sits far from 0 whatever the text (a logit on a sigmoid's plateau), or a task the policy has saturated. "
    "Fix: check the judge's raw scores on good and bad answers (center or rescale them), use scale_rewards: none, or "
    "train on harder prompts."
)
RECOMPILE_HELP = (
    "torch.compile compiled {graphs} new graph(s) during step {step}, after the first step; the step took {seconds:.2f} "
    "s{ratio}. Likely cause: recompilation on a new input shape (prompts and completions of varying length) or a "
    "failed guard, each paid again whenever it recurs. Fix: pad to fixed lengths (pad_to_multiple_of, a fixed "
    "max_completion_length), compile with dynamic=True, or raise torch._dynamo.config.cache_size_limit; run with "
    "TORCH_LOGS=recompiles to see which guard failed."
)
IDENTICAL_HELP = (
    "{share:.0%} of groups had {G} identical completions. Likely cause: sampling too cold for this task or a "
    "collapsed policy. Fix: raise temperature/top_p for that task (task_generation_kwargs), lower the learning rate, "
    "or raise beta / use adaptive_beta to hold the policy near the reference."
)
RUNAWAY_HELP = (
    "{share:.0%} of this batch's completions ran to max_completion_length ({limit} tokens) without an end token, "
    "against {first:.0%} in the first training batch (step {first_step}). Likely cause: the policy is collapsing into "
    "run-on text that never ends; the rewards score cut-off, malformed answers and the run degrades from here. (In "
    "rookgrpo's prompt-selection benchmark a run at learning_rate 5e-5 and beta 0 had 0% cut off over its first 20 "
    "steps, 26% over the next 5 and 100% in its last batch, and its held-out legal-move rate fell to 0.) Fix: lower "
    "learning_rate, set beta > 0 or add adaptive_beta, and restart from a checkpoint saved before the rise "
    "(completions/clipped_ratio in the logs shows when it began)."
)
TOO_SHORT_HELP = (
    "{share:.0%} of this batch's completions ran to max_completion_length ({limit} tokens) without an end token, "
    "{first:.0%} already in the first training batch (step {first_step}). Likely cause: max_completion_length is too "
    "short for the task, or the model never learned to stop (its fine-tuning completions did not end with the "
    "tokenizer's eos token); the rewards score cut-off answers. Fix: raise max_completion_length, check that the "
    "model ends its answers with eos{mask}."
)
MASK_HINT = ", or set mask_truncated_completions to keep cut-off completions out of the loss"


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


def _score_ranges(rewards_per_func: torch.Tensor, names: list[str]):
    """(name, lowest, highest, count) of each reward function's scores in the batch, for those with 2+ scores."""
    for i, name in enumerate(names):
        values = rewards_per_func[:, i]
        values = values[~torch.isnan(values)].double()
        if values.numel() >= 2:
            yield name, values.min().item(), values.max().item(), values.numel()


def collapsed_rewards(rewards_per_func: torch.Tensor, names: list[str]) -> list[tuple[str, float, int]]:
    """(name, value, count) of each reward function that gave all its scored completions (at least 2) one score.

    >>> nan = float("nan")
    >>> collapsed_rewards(torch.tensor([[0.5, 1.0], [0.5, 0.0], [0.5, nan]]), ["judge", "rule"])
    [('judge', 0.5, 3)]
    """
    return [(name, high, n) for name, low, high, n in _score_ranges(rewards_per_func, names)
            if high - low <= 1e-6 * max(1.0, abs(high))]


def saturated_rewards(rewards_per_func: torch.Tensor, names: list[str],
                      relative: float = 1e-3) -> list[tuple[str, float, float, int]]:
    """(name, center, spread, count) of each reward whose scores in the batch are not all equal but spread by less
    than ``relative`` of their magnitude (a saturated judge); exactly equal scores are :func:`collapsed_rewards`.

    >>> nan = float("nan")
    >>> saturated_rewards(torch.tensor([[9.9995, 1.0], [10.0, 0.0], [10.0002, nan]]), ["judge", "rule"])
    [('judge', 9.99985, 0.0007, 3)]
    """
    out = []
    for name, low, high, n in _score_ranges(rewards_per_func, names):
        spread, magnitude = high - low, max(abs(low), abs(high))
        if 1e-6 * max(1.0, magnitude) < spread < relative * magnitude:
            out.append((name, round((low + high) / 2, 6), round(spread, 6), n))
    return out


def truncated_rows(completion_ids: torch.Tensor, eos_token_ids: list[int], limit: int) -> torch.Tensor:
    """Rows of a padded completion batch that hold no end token within their first ``limit`` tokens: cut off at
    ``max_completion_length``. Padding after an end token, even when pad is eos, does not matter. TRL's
    ``completions/clipped_ratio`` counts the same rows but one: a row whose last token is a sampled pad token (TRL
    counts it as finished).

    >>> ids = torch.tensor([[5, 6, 0, 0], [5, 6, 7, 8], [5, 0, 9, 9]])  # eos 0; pad 9 after the third row's eos
    >>> truncated_rows(ids, [0], limit=4)
    tensor([False,  True, False])
    """
    eos = torch.tensor(list(eos_token_ids), device=completion_ids.device, dtype=completion_ids.dtype)
    return ~torch.isin(completion_ids[:, :limit], eos).any(dim=1)


def _eos_token_ids(trainer) -> list[int]:
    """Every id that ends a completion: TRL's ``eos_token_ids`` (1.16: the tokenizer's and the generation config's),
    else the tokenizer's eos."""
    ids = getattr(trainer, "eos_token_ids", None)
    if ids:
        return list(ids)
    tokenizer = getattr(trainer, "_tokenizer", None) or getattr(trainer.processing_class, "tokenizer",
                                                                 trainer.processing_class)
    return [tokenizer.eos_token_id]


def kl_share(loss: float, kl_term: float) -> float:
    """Share of the loss magnitude from the KL term: ``|beta·kl| / (|loss − beta·kl| + |beta·kl|)``."""
    total = abs(loss - kl_term) + abs(kl_term)
    return abs(kl_term) / total if total > 0 else 0.0


@register_callback("diagnostics")
class Diagnostics(RookCallback):
    """Per-phase timing, identical-group share, KL share of the loss, and rate-limited warnings (module docstring).

    Args:
        warn_every: optimizer steps between two warnings of the same kind (the ones held back are counted).
        identical_warn_frac: warn when at least this share of a batch's groups are identical completions.
        truncated_warn_frac: warn when at least this share of a batch's completions ran to
            ``max_completion_length``.
        exact_cuda_peaks: on a GPU, reset ``torch.cuda``'s peak when each phase starts, so ``memory/<phase>`` is
            each phase's exact peak; this resets the peak your own code reads from ``torch.cuda.max_memory_allocated``
            (off by default: then a phase that did not raise the run's peak reports a lower bound).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"diagnostics": {"warn_every": 20}})
        >>> type(cb).__name__, cb.warn_every
        ('Diagnostics', 20)
    """

    state_key = "diagnostics"

    def __init__(self, warn_every: int = 50, identical_warn_frac: float = 0.5, truncated_warn_frac: float = 0.5,
                 exact_cuda_peaks: bool = False):
        self.warn_every = int(warn_every)
        self.exact_cuda_peaks = bool(exact_cuda_peaks)
        self.identical_warn_frac = float(identical_warn_frac)
        self.truncated_warn_frac = float(truncated_warn_frac)
        self._first_truncated: tuple[int, float] | None = None  # (step, share) of the first training batch
        self._last_warned: dict[str, int] = {}
        self._held_back: dict[str, int] = {}
        self._step_start: float | None = None
        self._graphs_at_start = 0
        self._steps: list[float] = []  # durations of the steps after the first (for the median)
        self._first_step: float | None = None
        self._reward_range: tuple[float, float] | None = None  # lowest and highest combined reward so far

    def bind(self, trainer) -> None:
        super().bind(trainer)
        self.meter = trainer.measure_phases(reset_cuda_peaks=self.exact_cuda_peaks)

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
        nonzero_adv = (scored.output["advantages"].abs() > 1e-8).sum()
        loss_tokens = loss_mask(scored.output).sum()
        cut = truncated_rows(scored.first_output["completion_ids"], _eos_token_ids(trainer),
                             trainer.args.max_completion_length).sum()
        local = torch.stack([identical.float(), torch.tensor(float(ids.size(0)), device=identical.device),
                             nonzero_adv.float(), loss_tokens.float().to(identical.device),
                             cut.float().to(identical.device)])
        totals = trainer.accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
        identical, groups, nonzero_adv, loss_tokens, cut = totals
        share = identical / max(groups, 1.0)
        metrics["groups/identical_frac"].append(share)
        if mode != "train":
            return
        self._flat_split(trainer, scored, G, metrics)
        step = trainer.state.global_step
        if loss_tokens == 0:
            self._warn("no_tokens", step, NO_TOKENS_HELP)
        if nonzero_adv == 0:
            self._warn("zero_advantage", step, ZERO_ADVANTAGE_HELP)
        if share >= self.identical_warn_frac:
            self._warn("identical", step, IDENTICAL_HELP.format(share=share, G=G))
        self._check_truncation(step, cut / max(groups * G, 1.0), trainer.args)
        judges = {name for name, func in zip(trainer.reward_func_names, trainer.reward_funcs)
                  if isinstance(func, torch.nn.Module)}
        for name, value, n in collapsed_rewards(scored.rewards_per_func, trainer.reward_func_names):
            help_text = COLLAPSED_HELP if name in judges else COLLAPSED_RULE_HELP
            self._warn(f"collapsed:{name}", step, help_text.format(name=name, n=n, value=value))
        for name, center, spread, n in saturated_rewards(scored.rewards_per_func, trainer.reward_func_names):
            self._warn(f"saturated:{name}", step, SATURATED_HELP.format(name=name, n=n, spread=spread, center=center,
                                                                        ratio=spread / abs(center)))

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

    def _check_truncation(self, step: int, share: float, args) -> None:
        """Warns when ``share`` (of the batch's completions cut off) reaches ``truncated_warn_frac``: as a limit too
        short when the first training batch was already at half of it or more, else as run-on collapse."""
        if self._first_truncated is None:
            self._first_truncated = (step, share)
        if share < self.truncated_warn_frac:
            return
        first_step, first = self._first_truncated
        rose = first < self.truncated_warn_frac / 2
        kind, help_text = ("runaway", RUNAWAY_HELP) if rose else ("truncated", TOO_SHORT_HELP)
        mask = "" if getattr(args, "mask_truncated_completions", False) else MASK_HINT
        self._warn(kind, step, help_text.format(share=share, limit=args.max_completion_length, first=first,
                                                first_step=first_step, mask=mask))

    def _warn(self, kind: str, step: int, message: str) -> None:
        last = self._last_warned.get(kind)
        if last is not None and step - last < self.warn_every:
            self._held_back[kind] = self._held_back.get(kind, 0) + 1
            return
        held = self._held_back.pop(kind, 0)
        suffix = f" ({held} more like this since step {last} not shown)" if held else ""
        if self.trainer.accelerator.is_main_process:
            logger.warning("step %d: %s%s", step, message, suffix)
        self._last_warned[kind] = step

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
        if graphs:
            metrics["compile/graphs"].append(float(new_graphs))
        if self._first_step is None:
            self._first_step = seconds
            metrics["timing/first_step"].append(seconds)
            return
        if new_graphs:
            ratio = f", {seconds / statistics.median(self._steps):.1f}x the median of the steps before it" if self._steps else ""
            self._warn("recompile", state.global_step, RECOMPILE_HELP.format(graphs=new_graphs, step=state.global_step,
                                                                             seconds=seconds, ratio=ratio))
        else:
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
        return {"last_warned": self._last_warned, "held_back": self._held_back,
                "reward_range": list(self._reward_range) if self._reward_range else None,
                "first_truncated": list(self._first_truncated) if self._first_truncated else None}

    def load_state_dict(self, state: dict) -> None:
        self._last_warned = {k: int(v) for k, v in state.get("last_warned", {}).items()}
        self._held_back = {k: int(v) for k, v in state.get("held_back", {}).items()}
        first = state.get("first_truncated")  # absent in checkpoints written before it was kept
        self._first_truncated = (int(first[0]), float(first[1])) if first else None
        rng = state.get("reward_range")
        self._reward_range = (float(rng[0]), float(rng[1])) if rng else None
