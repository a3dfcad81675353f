"""Groups and batches: identical completions, flat groups, batches without loss tokens, recompiles."""

from __future__ import annotations

import statistics

from ..history import History
from .base import Finding, Thresholds, detector


@detector("groups/identical_frac")
def detect_identical_groups(h: History, t: Thresholds) -> list[Finding]:
    """Groups whose completions are all the same token sequence (``groups/identical_frac``, rookgrpo's diagnostics):
    sampling leaves no room to explore."""
    steps, share = h.curve("groups/identical_frac")
    if len(share) < t.min_share_points:
        return []
    med = statistics.median(share)
    if med < t.identical_share:
        return []
    every = min(share) >= 1.0
    return [Finding(
        "identical_groups", "every group's completions are identical" if every else "most groups' completions are "
        "identical", steps[0], steps[-1], subject="groups/identical_frac", values={"median": med},
        severity="critical" if every else "warning",
        message=f"a median {med:.0%} of groups had completions that are all the same token sequence "
                "(groups/identical_frac): such a group has no reward spread and teaches nothing. Likely cause: "
                "sampling too cold for this task, or a collapsed policy. Fix: raise temperature/top_p for that task "
                "(task_generation_kwargs), lower the learning rate, or raise beta / use adaptive_beta to hold the "
                "policy near the reference.")]


@detector("completions/loss_tokens")
def detect_no_loss_tokens(h: History, t: Thresholds) -> list[Finding]:
    """Generation batches of which the loss sees no token (``completions/loss_tokens`` 0, rookgrpo's diagnostics)."""
    steps, tokens = h.curve("completions/loss_tokens")
    empty = [s for s, v in zip(steps, tokens) if v == 0]
    if not empty:
        return []
    every = len(empty) == len(tokens) and len(tokens) >= t.min_share_points
    return [Finding(
        "no_loss_tokens", "batches with no token to learn from", empty[0], empty[-1], subject="completions/loss_tokens",
        severity="critical" if every or len(empty) / len(tokens) >= t.grad_zero_share and
        len(tokens) >= t.min_share_points else "warning", values={"steps": len(empty), "logged": len(tokens)},
        message=f"at {len(empty)} of {len(tokens)} logged steps every completion was masked out of the loss, so the "
                "step had no token to learn from. Likely cause: every completion was cut off at "
                "max_completion_length with mask_truncated_completions on, or a tool/completion mask that covers "
                "everything. Fix: raise max_completion_length, turn mask_truncated_completions off, or check the "
                "masks.")]


@detector("compile/graphs")
def detect_recompile(h: History, t: Thresholds) -> list[Finding]:
    """``torch.compile`` compiling again after the first step (``compile/graphs``, rookgrpo's diagnostics): the
    "second iteration 5x slower" failure."""
    steps, graphs = h.curve("compile/graphs")
    again = [(s, g) for s, g in list(zip(steps, graphs))[1:] if g > 0]
    if not again:
        return []
    _, step_time = h.curve("timing/step")
    return [Finding(
        "recompile", "torch.compile compiling again after the first step", again[0][0], again[-1][0],
        subject="compile/graphs", values={"steps": len(again), "graphs": sum(g for _, g in again)},
        message=f"torch.compile compiled {sum(g for _, g in again):g} new graph(s) at {len(again)} logged step(s) "
                f"after the first (first at step {again[0][0]}), each paid again whenever it recurs"
                f"{' (timing/step shows the cost)' if step_time else ''}. Likely cause: recompilation on a new input "
                "shape (prompts and completions of varying length) or a failed guard. Fix: pad to fixed lengths "
                "(pad_to_multiple_of, a fixed max_completion_length), compile with dynamic=True, or raise "
                "torch._dynamo.config.cache_size_limit; run with TORCH_LOGS=recompiles to see which guard failed.")]


@detector("frac_reward_zero_std")
def detect_zero_std(h: History, t: Thresholds) -> list[Finding]:
    steps, z = h.curve("frac_reward_zero_std")
    if len(z) < t.min_share_points:
        return []
    med = statistics.median(z)
    if med < t.zero_std_share:
        return []
    _, best = h.curve("groups/flat_best_frac")
    _, worst = h.curve("groups/flat_worst_frac")
    if best and worst:
        b, w = statistics.fmean(best), statistics.fmean(worst)
        split = (f" Of all groups, {b:.0%} were flat at the best reward seen (all pass: too easy) and {w:.0%} at the "
                 f"worst (all fail: too hard), mean over logs.")
        fix = ("Fix: train on harder prompts (prompt_selection)" if b > w else
               "Fix: train on prompts the model sometimes solves (prompt_selection), give the reward partial credit")
    else:
        split, fix = "", "Fix: prompt_selection, partial-credit rewards"
    every = min(z) >= 1.0  # no group ever had a spread: nothing was learned from the reward
    return [Finding(
        "zero_std", "no group ever had a reward spread" if every else "most groups have no reward spread", steps[0],
        steps[-1], subject="frac_reward_zero_std", values={"median": med}, severity="critical" if every else "warning",
        message=f"a median {med:.0%} of groups earned the same reward on every completion (frac_reward_zero_std, the "
                f"batch as generated): their advantages are 0 and they teach nothing.{split} {fix}, raise the "
                "sampling temperature, or add zero_std_resampling.")]


@detector("kl", "optimised/frac_reward_zero_std")
def detect_kl_only(h: History, t: Thresholds) -> list[Finding]:
    name = "optimised/frac_reward_zero_std" if "optimised/frac_reward_zero_std" in h.names() else "frac_reward_zero_std"
    steps, z = h.curve(name)
    _, kl = h.curve("kl")
    if len(z) < t.min_share_points or not kl:  # TRL logs kl only when beta > 0
        return []
    med = statistics.median(z)
    if med < t.kl_only_share:
        return []
    after = " after resampling" if name.startswith("optimised/") else ""
    return [Finding(
        "kl_only_groups", "flat groups moved by the KL term alone", steps[0], steps[-1], subject=name,
        values={"median": med},
        message=f"a median {med:.0%} of the optimised batch's groups were flat{after} ({name}) while beta > 0: their "
                "advantages are 0, so their only gradient is the KL term, which pulls the policy towards the "
                "reference on those prompts whatever the reward (trl#5588). Fix: zero_std_resampling (with enough "
                "rounds), prompt_selection, or a lower beta.")]
