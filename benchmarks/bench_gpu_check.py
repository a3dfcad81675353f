"""GPU check: does ``recipes/rookworld.yaml`` train at RookWorld-LM-124M's shape, and what does each component cost?

One command for anyone with a GPU (``--tiny``: a 2-layer model with a 4,096-token vocabulary, 16-token completions,
for a CPU dry run and the test):

    python benchmarks/bench_gpu_check.py [--steps 20] [--bisect-steps 4] [--arms ...] [--force-width W] [--tiny]
                                         [--work DIR] [--out FILE]

The check for the cuDNN attention fault (pytorch/pytorch#196678: NaN gradients for left-padded batches whose width is
64 mod 128 on H100/H200; docs/howto.md), in one command on a GPU machine::

    python benchmarks/bench_gpu_check.py --arms probe vanilla bare bare/unguarded recipe recipe+lora \
        --force-width 192 --work runs/gpu-check

It builds GPT-2 124M with random weights and a GPT-2-pretokenized BPE (``rookgrpo.models.shapes``), writes the packaged
RookWorld lines in the hub layout, and runs each arm in a process of its own (a crash or NaN in one leaves the others;
each arm's CUDA peak is its own), a few optimizer steps each:

- ``probe`` (first, no training): the SDPA kernel alone at widths 191/192/193/320 with left-pad (fully masked) query
  rows, bf16 on CUDA: which backend's backward runs, and whether the query gradient goes NaN with the default backends,
  with cuDNN excluded, and with no row fully masked (``rookgrpo.dynamics.attention``);
- ``vanilla``: TRL's ``GRPOTrainer`` with the recipe's TRL fields, rewards and data;
- ``bare/unguarded``: ``bare`` with rookgrpo's numerical guards off (``no_fully_masked_rows: false``,
  ``allow_cudnn_attention: true``, ``skip_nonfinite_updates: false``): what vanilla TRL meets;
- ``recipe+lora``: the recipe with LoRA (r 16 on GPT-2's attention and MLP projections);
- ``recipe``: ``recipes/rookworld.yaml`` as shipped (``zero_std_resampling`` left out, as in
  ``bench_shapes.py``: random weights make every group flat, so it would always run its maximum rounds);
- ``recipe+heldout``: the recipe with ``sft_anchor`` (A: lines disjoint from the panel), ``chess_eval`` every 4 steps
  and ``heldout_guard``: the configuration whose first GPU run (H200, bf16) had a NaN ``grad_norm`` at step 1;
- the bisection: ``bare`` (``RookGRPOTrainer`` with the recipe's fields, no callback, one temperature) and ``bare`` plus
  one component each (``+task_sampling``, ``+diagnostics``, ``+doctor``, ``+prompt_selection``, ``+adaptive_beta``,
  ``+sft_anchor``, ``+heldout``), ``bare-positions``, and ``recipe+heldout`` with eager attention (``/eager``: SDPA's
  kernels out of the picture) and in float32 (``/fp32``: bf16 autocast out of it); on request (``--arms``), the recipe
  less one component each (``recipe-task_sampling``, ``recipe-prompt_selection``, ...), for effects of two together;
- on request, generation with vLLM colocated (TRL's ``use_vllm``; vLLM installed): ``vanilla/vllm``, ``recipe/vllm``
  and ``recipe+heldout/vllm`` (``--arms vanilla/vllm recipe/vllm recipe+heldout/vllm``).

Batches hold several prompts (the recipe's 32 completions per device are 4 prompts of 8), so prompts are left-padded;
``--force-width W`` left-pads every log-prob forward (policy, reference, old policy) to width ``W`` (or ``W`` plus a
multiple of 128 where the batch is wider), which keeps each completion's logits and positions and puts every step at
the fault's width. Per arm: the batch widths its losses saw, every step's loss, ``grad_norm`` (and the doctor's
``grad/kl_norm``, ``grad/policy_norm`` where logged) checked finite, the first step that is not, the updates
rookgrpo skipped, whether the weights are finite after the run; median step time; seconds
and peak memory per phase (generation with its rewards and reference pass, the loss's forward and backward, the
optimizer step), metered the same way for every arm around TRL's own methods (CUDA: peaks reset per phase; CPU: peak
resident set), with the rewards' share of the generate phase in seconds; the device, dtype and attention kernel.
Results go to ``DIR/results.jsonl`` after every arm, and the table to ``DIR/table.md`` (``--work DIR``); ``--out FILE`` writes the result JSON as every benchmark does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "rookworld.yaml"
ASSETS = REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld"
PANEL = 48  # held-out panel rows (the first of the packaged evaluation positions)

MAIN_ARMS = ("vanilla", "recipe", "recipe+heldout", "recipe+lora")
BISECT_ARMS = ("bare", "bare/unguarded", "bare-positions", "+task_sampling", "+diagnostics", "+doctor", "+prompt_selection",
               "+adaptive_beta", "+sft_anchor", "+heldout", "recipe+heldout/eager", "recipe+heldout/fp32")
# The recipe less one component (for effects that need two components together).
LEAVE_ONE_OUT = ("recipe-task_sampling", "recipe-diagnostics", "recipe-doctor", "recipe-prompt_selection",
                 "recipe-adaptive_beta")
#: Generation with vLLM colocated (TRL's use_vllm), vanilla TRL and the recipe: on request (``--arms``), where vLLM is
#: installed; rookgrpo's own vLLM tests run on CPU (make test-vllm), these on the GPU's vLLM build.
VLLM_ARMS = ("vanilla/vllm", "recipe/vllm", "recipe+heldout/vllm")
ARMS = ("probe",) + MAIN_ARMS + BISECT_ARMS + LEAVE_ONE_OUT + VLLM_ARMS
#: The arms of the cuDNN check (the issue's table): the kernel probe, vanilla TRL, rookgrpo bare with and without its
#: guards, the recipe, the recipe with LoRA.
FAULT_ARMS = ("probe", "vanilla", "bare", "bare/unguarded", "recipe", "recipe+lora")
#: Options of rookgrpo's numerical guards, off (``/unguarded``).
UNGUARDED = ["--no_fully_masked_rows", "false", "--allow_cudnn_attention", "true", "--skip_nonfinite_updates", "false"]
LORA = ["--use_peft", "true", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.0",
        "--lora_target_modules", "c_attn", "c_proj", "c_fc"]


def _name(entry) -> str:
    return entry if isinstance(entry, str) else entry.get("name", next(iter(entry)))


def heldout_callbacks(data: Path) -> list[dict]:
    """The anchor, the held-out evaluation and the guard, as the first GPU run added them."""
    return [{"name": "sft_anchor", "data": str(data / "anchor.txt"), "tasks": ["A"], "batch_size": 8, "coef": 0.1},
            {"name": "chess_eval", "data": str(data / "panel.txt"), "every": 4},
            {"name": "heldout_guard", "metric": {"heldout/move_rank_reward": 1.0}}]


def arm_recipe(arm: str, data: Path) -> tuple[dict, list[str]]:
    """The recipe an arm runs (the shipped one, changed as the arm says) and its extra command-line overrides."""
    import yaml

    recipe = yaml.safe_load(RECIPE.read_text())
    shipped = [c for c in recipe["callbacks"] if _name(c) != "zero_std_resampling"]
    base, _, variant = arm.partition("/")
    extra = {"eager": ["--attn_implementation", "eager"], "fp32": ["--bf16", "false"], "unguarded": list(UNGUARDED),
             "vllm": ["--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.3"],
             "": []}[variant]
    if base in ("vanilla", "recipe"):
        recipe["callbacks"] = shipped
    elif base == "recipe+lora":
        recipe["callbacks"] = shipped
        extra += LORA
    elif base.startswith("recipe-"):  # the recipe less one component
        part = base[len("recipe-"):]
        recipe["callbacks"] = [c for c in shipped if _name(c) != part]
        if part == "task_sampling":
            recipe.pop("task_generation_kwargs")
        elif len(recipe["callbacks"]) == len(shipped):
            raise SystemExit(f"{arm}: the recipe has no component {part!r}")
    elif base == "recipe+heldout":
        recipe["callbacks"] = shipped + heldout_callbacks(data)
    else:  # bare, or bare plus one component
        recipe["callbacks"] = []
        task_kwargs = recipe.pop("task_generation_kwargs")
        if base == "bare-positions":
            extra += ["--position_ids_from_mask", "false"]
        elif base == "+task_sampling":
            recipe["task_generation_kwargs"] = task_kwargs
        elif base == "+heldout":
            recipe["callbacks"] = heldout_callbacks(data)[1:]
        elif base == "+sft_anchor":
            recipe["callbacks"] = heldout_callbacks(data)[:1]
        elif base.startswith("+"):
            recipe["callbacks"] = [c for c in shipped if _name(c) == base[1:]]
            if not recipe["callbacks"]:
                raise SystemExit(f"{arm}: the recipe has no callback {base[1:]!r}")
        elif base != "bare":
            raise SystemExit(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    return recipe, extra


def prepare(work: Path, tiny: bool) -> dict:
    """The model, the hub-layout data, the panel and the anchor's lines (disjoint from the panel), once."""
    from rookgrpo.models.shapes import build_rookworld_lm_shape, write_hub_layout

    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    train = (ASSETS / "train_positions.txt").read_text().splitlines()
    panel = (ASSETS / "eval_positions.txt").read_text().splitlines()[:PANEL]
    panel_prompts = {line.split(" M:")[0] if line.startswith("P:") else line.rsplit("+", 4)[0] for line in panel}
    anchor = [line for line in (ASSETS / "sft_sample.txt").read_text().splitlines()
              if line.startswith("A:") and line.rsplit("+", 4)[0] not in panel_prompts]
    (data / "panel.txt").write_text("\n".join(panel) + "\n")
    (data / "anchor.txt").write_text("\n".join(anchor) + "\n")
    hub = write_hub_layout(train, data / "hub")
    # tiny: GPT-2's byte-level BPE with a 4,096-token vocabulary (50,257 logits per token were most of a CPU step)
    sizes = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=4096) if tiny else {}
    model = build_rookworld_lm_shape(work / "model", train + panel + anchor, **sizes)
    return {"data": str(data), "hub": str(hub), "model": str(model)}


def kernel_probe(widths=(191, 192, 193, 320)) -> list[dict]:
    """The SDPA kernel alone, as GPT-2's training attention calls it (explicit boolean mask, 12 heads of 64, left-pad
    rows fully masked, the loss reading real rows only): per width and case, the backward that ran and whether the
    output or the query/key gradient has a NaN. Cases: ``default`` (torch's backend choice), ``no_cudnn``
    (rookgrpo's backend guard), ``no_fully_masked_rows`` (rookgrpo's mask guard, default backends). bf16 on CUDA,
    float32 elsewhere (a dry run: CPU kernels have no such fault)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from rookgrpo.dynamics.attention import no_fully_masked_rows, sdpa_backend_guard

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    batch, heads, dim, pads = 8, 12, 64, [0, 5, 12, 20, 0, 5, 12, 20]
    rows = []
    for width in widths:
        for case in ("default", "no_cudnn", "no_fully_masked_rows"):
            torch.manual_seed(0)
            q, k, v = (torch.randn(batch, heads, width, dim, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            keep = torch.ones(batch, width, dtype=torch.bool, device=device)
            for b, n in enumerate(pads):
                keep[b, :n] = False
            mask = torch.ones(width, width, dtype=torch.bool, device=device).tril()[None, None] & keep[:, None, None, :]
            if case == "no_fully_masked_rows":
                mask = no_fully_masked_rows(mask)
            ctx = sdpa_backend_guard(torch.device(device)) if case == "no_cudnn" else contextlib.nullcontext()
            with ctx:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                (out * keep[:, None, :, None]).float().sum().backward()
            rows.append({"width": width, "case": case, "backward": out.grad_fn.name() if out.grad_fn else None,
                         "out_nan": bool(out.isnan().any()), "dq_nan": bool(q.grad.isnan().any()),
                         "dk_nan": bool(k.grad.isnan().any())})
    return rows


def probe_table(rows: list[dict]) -> str:
    lines = ["| width | width mod 128 | case | backward kernel | NaN in output | NaN in dQ | NaN in dK |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['width']} | {r['width'] % 128} | {r['case']} | {r['backward']} | "
                     f"{'**yes**' if r['out_nan'] else 'no'} | {'**yes**' if r['dq_nan'] else 'no'} | "
                     f"{'**yes**' if r['dk_nan'] else 'no'} |")
    return "\n".join(lines)


def force_width(trainer, width: int, widths: list) -> None:
    """Left-pad every log-prob forward (TRL's ``_get_per_token_logps_and_entropies``: policy, reference, old policy)
    to ``width``, or to ``width`` plus the least multiple of 128 that fits the batch; the completion's logits are the
    last ones either way (``logits_to_keep``), and a padded row's positions come from its mask. The widths of the
    forwards with gradients (the losses') are appended to ``widths``, with whether the batch itself was left-padded;
    with ``width`` 0, only that."""
    import torch

    inner = trainer._get_per_token_logps_and_entropies
    pad_id = trainer.processing_class.pad_token_id
    pad_id = trainer.processing_class.eos_token_id if pad_id is None else pad_id

    def padded(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        n = input_ids.shape[1]
        left_padded = bool((attention_mask[:, 0] == 0).any())
        target = n if not width else width + 128 * max(0, -(-(n - width) // 128))
        if target > n:
            rows = input_ids.shape[0]
            input_ids = torch.cat([input_ids.new_full((rows, target - n), pad_id), input_ids], dim=1)
            attention_mask = torch.cat([attention_mask.new_zeros((rows, target - n)), attention_mask], dim=1)
        if torch.is_grad_enabled():
            widths.append((int(target), left_padded))
        return inner(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = padded


class Meter:
    """Seconds and peak memory per phase around TRL's own methods, the same for every arm (TRL 1.10-1.16:
    ``_generate_and_score_completions``, inside it ``_calculate_rewards`` (seconds only: the rewards run inside the
    generate phase, whose peak memory they share), and ``compute_loss``; the optimizer step through a callback)."""

    PHASES = ("generate", "loss", "optimizer")

    def __init__(self, trainer):
        from transformers import TrainerCallback

        from rookgrpo.dynamics.phases import PhaseMeter

        self.phases = PhaseMeter(trainer.accelerator.device, reset_cuda_peaks=True)
        self.rows: list[dict] = []
        self.reward_seconds = [0.0]  # per optimizer step
        meter = self.phases
        for method, phase in (("_generate_and_score_completions", "generate"), ("compute_loss", "loss")):
            inner = getattr(trainer, method)

            def wrapped(*args, _inner=inner, _phase=phase, **kwargs):
                with meter.measure(_phase):
                    return _inner(*args, **kwargs)

            setattr(trainer, method, wrapped)
        rewards = getattr(trainer, "_calculate_rewards", None)
        if rewards is not None:
            def timed_rewards(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return rewards(*args, **kwargs)
                finally:
                    self.reward_seconds[-1] += time.perf_counter() - started

            trainer._calculate_rewards = timed_rewards
        outer = self

        class OptimizerPhase(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                meter.start("optimizer")

            def on_optimizer_step(self, args, state, control, **kwargs):
                meter.stop("optimizer")

            def on_step_end(self, args, state, control, **kwargs):
                outer.rows.append({**meter.take(), "rewards_s": outer.reward_seconds[-1]})
                outer.reward_seconds.append(0.0)

        trainer.add_callback(OptimizerPhase())

    def summary(self) -> dict:
        rows = self.rows[1:] or self.rows  # the first step carries the warm-up
        out = {}
        for phase in self.PHASES:
            seen = [r[phase] for r in rows if phase in r]
            out[phase] = {"seconds": statistics.median(s for s, _ in seen) if seen else None,
                          "peak_mib": max(m for _, m in seen) if seen else None}
        out["generate"]["rewards_seconds"] = statistics.median(r["rewards_s"] for r in rows) if rows else None
        return out


def _finite(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and math.isfinite(value))


def run_arm(arm: str, paths: dict, steps: int, tiny: bool, overrides: list[str] = (), width: int = 0) -> dict:
    """One arm in this process (see the module docstring); returns its result row."""
    import torch
    import yaml
    from trl import GRPOConfig, GRPOTrainer

    from rookgrpo.train import build_trainer

    recipe, extra = arm_recipe(arm, Path(paths["data"]))
    work = Path(paths["data"]).parent
    path = work / f"recipe-{arm.replace('/', '_').replace('+', 'plus_')}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cuda = torch.cuda.is_available()
    argv = [str(path), "--model_name_or_path", paths["model"], "--dataset_name", paths["hub"], "--output_dir",
            str(work / f"out-{path.stem}"), "--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no",
            "--disable_tqdm", "true", "--warmup_steps", "0", "--report_to", "none",
            "--stockfish_workers", str(min(8, os.cpu_count() or 1))]
    if not cuda:
        argv += ["--use_cpu", "true"]
    if tiny:
        argv += ["--per_device_train_batch_size", "16", "--max_completion_length", "16", "--bf16", "false"]
    argv += overrides
    trainer, _, model_path = build_trainer(argv + extra)
    if arm.partition("/")[0] == "vanilla":
        fields = {k: getattr(trainer.args, k) for k, f in GRPOConfig.__dataclass_fields__.items()
                  if f.init and hasattr(trainer.args, k)}
        fields.pop("generation_batch_size", None)  # derived from steps_per_generation; TRL rejects both
        funcs, data = list(trainer.reward_funcs), trainer.train_dataset  # the same rewards (Stockfish settings), rows
        del trainer  # model_init_kwargs (dtype, attention) came along in the fields
        trainer = GRPOTrainer(model=model_path, reward_funcs=funcs, args=GRPOConfig(**fields), train_dataset=data)
        from rookgrpo.vllm_compat import enable_cpu_weight_reload

        enable_cpu_weight_reload(trainer)  # vLLM's CPU build only (the --tiny dry run): TRL's sync needs it there
    meter = Meter(trainer)
    widths: list[int] = []
    force_width(trainer, width, widths)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    error = None
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001 (a halt or crash is this arm's result, not the benchmark's end)
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    seconds = time.perf_counter() - started
    logs = [h for h in trainer.state.log_history if "loss" in h or "grad_norm" in h]
    keys = ("loss", "grad_norm", "grad/kl_norm", "grad/policy_norm")
    skipped = max((h.get("skipped_updates", 0) for h in logs), default=None) if any(
        "skipped_updates" in h for h in logs) else None
    bad = [h.get("step") for h in logs if not all(_finite(h.get(k)) for k in keys)]
    model = trainer.model
    weights_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    config = getattr(model, "config", None)
    step_times = [h["step_time"] for h in logs if "step_time" in h][1:]
    return {
        "arm": arm, "steps": len(logs), "error": error, "seconds": seconds,
        "finite_steps": sum(all(_finite(h.get(k)) for k in keys) for h in logs),
        "widths": sorted({w for w, _ in widths}), "left_padded_losses": sum(p for _, p in widths),
        "losses": len(widths), "skipped_updates": skipped,
        "first_nonfinite_step": bad[0] if bad else None,
        "weights_finite": weights_finite,
        "loss": [h.get("loss") for h in logs], "grad_norm": [h.get("grad_norm") for h in logs],
        "kl_norm": [h.get("grad/kl_norm") for h in logs if "grad/kl_norm" in h],
        "step_s": statistics.median(step_times) if step_times else None,
        "phases": meter.summary(),
        "run_peak_mib": torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else meter.phases.process_peak_mib,
        "device": str(next(model.parameters()).device), "bf16": bool(trainer.args.bf16),
        "attention": getattr(config, "_attn_implementation", None),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl")},
    }


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict]) -> str:
    """The arms' table, and before it the kernel probe's where it ran."""
    probes = [r for r in rows if r.get("arm") == "probe"]
    rows = [r for r in rows if r.get("arm") != "probe"]
    head = "".join(probe_table(r["probe"]) + "\n\n" if r.get("probe") else f"probe: {r.get('error')}\n\n"
                   for r in probes)
    lines = ["| arm | finite steps | first non-finite | updates skipped | weights finite | grad_norm (step 1) | "
             "loss widths (left-padded losses) | attention, bf16 | "
             "median step (s) | generate (of it rewards) / loss / optimizer (s) | "
             "peak generate / loss / optimizer (MiB) | "
             "run peak (MiB) | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p = r["phases"]
        first = r["grad_norm"][0] if r["grad_norm"] else None
        widths = ", ".join(map(str, r.get("widths") or [])) or "-"
        padded = f" ({r['left_padded_losses']}/{r['losses']})" if r.get("losses") else ""
        lines.append(
            f"| {r['arm']} | {r['finite_steps']}/{r['steps']} | {_cell(r['first_nonfinite_step'], '')} | "
            f"{_cell(r.get('skipped_updates'), '')} | "
            f"{'yes' if r['weights_finite'] else '**no**'} | {_cell(first, '.3g')} | {widths}{padded} | "
            f"{r.get('attention') or '-'}, {'yes' if r.get('bf16') else 'no'} | {_cell(r['step_s'], '.2f')} | "
            + f"{_cell(p['generate']['seconds'], '.2f')} ({_cell(p['generate'].get('rewards_seconds'), '.2f')}) / "
            + " / ".join(_cell(p[k]["seconds"], ".2f") for k in Meter.PHASES[1:]) + " | "
            + " / ".join(_cell(p[k]["peak_mib"], ".0f") for k in Meter.PHASES)
            + f" | {_cell(r['run_peak_mib'], '.0f')} | {r['error'] or ''} |")
    return head + "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=list(FAULT_ARMS), choices=ARMS, metavar="ARM",
                    help=f"default: the cuDNN fault's check ({', '.join(FAULT_ARMS)}); all: {', '.join(ARMS)}")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps of the main arms (vanilla, recipe, ...)")
    ap.add_argument("--bisect-steps", type=int, default=4, help="optimizer steps of each bisection arm")
    ap.add_argument("--tiny", action="store_true",
                    help="a 2-layer model, 4,096-token vocabulary, 16-token completions, batch 16 (CPU dry run)")
    ap.add_argument("--force-width", type=int, default=0, metavar="W",
                    help="left-pad every log-prob forward to width W (e.g. 192, where cuDNN's SDPA backward fails on "
                         "H100/H200); 0: the batches' own widths")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per arm before it is stopped")
    ap.add_argument("--batch", type=int, default=None,
                    help="per-device completions per step (default: the recipe's 32; e.g. 8 at the full shape on CPU)")
    ap.add_argument("--work", default=None, help="where the model, data, runs, results.jsonl (a line per arm, written "
                                                 "as each ends) and table.md go (default: a temporary dir)")
    ap.add_argument("--out", default=None, help="the result JSON (title, table, command, rows), as every benchmark")
    ap.add_argument("--run-arm", default=None, help=argparse.SUPPRESS)  # the child process of one arm
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="rookgrpo-gpu-check-"))
    if args.run_arm == "probe":
        row = {"arm": "probe", "probe": kernel_probe()}
        Path(args.result).write_text(json.dumps(row))
        return row
    if args.run_arm:
        paths = json.loads((work / "paths.json").read_text())
        steps = args.steps if args.run_arm in MAIN_ARMS + VLLM_ARMS else args.bisect_steps
        overrides = ["--per_device_train_batch_size", str(args.batch)] if args.batch else []
        row = run_arm(args.run_arm, paths, steps, args.tiny, overrides, width=args.force_width)
        Path(args.result).write_text(json.dumps(row))
        return row
    out = work
    out.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}", flush=True)
    if not (work / "paths.json").exists():
        (work / "paths.json").write_text(json.dumps(prepare(work, args.tiny)))
    rows = []
    for arm in args.arms:
        result = work / f"result-{len(rows)}.json"
        cmd = [sys.executable, __file__, "--run-arm", arm, "--work", str(work), "--result", str(result),
               "--steps", str(args.steps), "--bisect-steps", str(args.bisect_steps), *(["--tiny"] if args.tiny else []),
               *(["--force-width", str(args.force_width)] if args.force_width else []),
               *(["--batch", str(args.batch)] if args.batch else [])]
        print(f"== {arm}", flush=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            tail = (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            proc, tail = None, f"stopped after {args.timeout:.0f} s"
        if result.exists():
            row = json.loads(result.read_text())
        else:
            row = {"arm": arm, "steps": 0, "finite_steps": 0, "first_nonfinite_step": None, "weights_finite": False,
                   "grad_norm": [], "step_s": None, "run_peak_mib": None, "error": f"the arm's process failed: {tail}",
                   "phases": {k: {"seconds": None, "peak_mib": None} for k in Meter.PHASES}}
        rows.append(row)
        with open(out / "results.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(table([row]).split("\n\n")[0] if arm == "probe" else table([row]).splitlines()[-1], flush=True)
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    first = next((r for r in rows if r.get("device")), {})
    where = first.get("gpu") or "CPU"
    shape = ("2-layer, 64-wide GPT-2, 4,096-token vocabulary, 16-token completions, batch 16" if args.tiny else
             "GPT-2 124M (RookWorld-LM-124M's shape)")
    result = {
        "title": f"GPU check: recipes/rookworld.yaml at {shape} on {where}",
        "description": f"Each arm a process of its own, {args.steps} optimizer steps for {', '.join(MAIN_ARMS)} and "
                       f"{args.bisect_steps} for each bisection arm, {args.batch or 32} completions per "
                       f"step ({(args.batch or 32) // 8} prompts: left-padded)"
                       + (f", every log-prob forward left-padded to width {args.force_width} (mod 128: "
                          f"{args.force_width % 128})" if args.force_width else "")
                       + "; random weights, packaged RookWorld lines in the hub layout. Versions: "
                       f"{first.get('versions')}.",
        "table": text,
        "command": "python benchmarks/bench_gpu_check.py" + (" --tiny" if args.tiny else "")
                   + (f" --arms {' '.join(args.arms)}" if args.arms != list(FAULT_ARMS) else "")
                   + (f" --force-width {args.force_width}" if args.force_width else "")
                   + (f" --steps {args.steps}" if args.steps != 20 else "")
                   + (f" --bisect-steps {args.bisect_steps}" if args.bisect_steps != 4 else "")
                   + (f" --batch {args.batch}" if args.batch else ""),
        "rows": rows,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
