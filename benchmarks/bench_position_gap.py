"""How far TRL's log-probs of `make train`'s sampled completions lie from the distribution that sampled them.

transformers' ``generate`` numbers a left-padded prompt from its first real token; TRL's log-prob forwards pass no
``position_ids``, so the packaged chess model (GPT-2, learned absolute positions) scores each completion of a padded
prompt shifted by its pad count. rookgrpo's ``position_ids_from_mask`` (on by default) passes the positions
``generate`` used (``rookgrpo.dynamics.positions``).

For each task, ``--batches`` generation batches shaped as the recipe's (``per_device_train_batch_size`` rows, groups
of ``num_generations`` completions of one prompt, prompts drawn from the packaged training data with a fixed seed),
sampled with the recipe's per-task settings. Every completion token is scored three ways, at the task's temperature:
the row alone without padding (what ``generate`` sampled from: the truth), the padded batch as TRL's forward scores
it, and the padded batch with mask positions. Reported per task: the share of rows with padding, their mean pad count,
and the gap of each way from the truth per token (mean, 99th percentile, max) and summed per completion.

    python benchmarks/bench_position_gap.py [--batches 8] [--recipe recipes/rookworld-tiny.yaml] [--out result.json]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from common import finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]


def scored(model, ids, mask, n, temperature, positions=None):
    """Per-token log-probs of the last ``n`` tokens of each row, as a log-prob forward computes them."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -n - 1:-1]
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids[:, -n:, None])[..., 0]


def measure_task(model, tok, prompts, settings, rows, group, max_new, batches, seed):
    import torch

    from rookgrpo.dynamics.positions import positions_from_mask

    temperature = float(settings.get("temperature", 1.0))
    rng = random.Random(seed)
    gaps = {"trl": [], "mask": []}
    per_completion = {"trl": [], "mask": []}
    pads = []
    for b in range(batches):
        chosen = [p for p in rng.sample(prompts, rows // group) for _ in range(group)]
        enc = tok(chosen, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(seed * 1000 + b)
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=True, max_new_tokens=max_new, pad_token_id=tok.pad_token_id,
                                 **settings)
        n = ids.size(1) - enc.input_ids.size(1)
        completion = ids[:, -n:]
        # TRL's completion mask: up to and including the first EOS
        is_eos = completion == tok.eos_token_id
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full((ids.size(0),), n))
        keep = torch.arange(n)[None] <= first[:, None]
        mask = torch.cat([enc.attention_mask, keep.long()], 1)
        trl = scored(model, ids, mask, n, temperature)
        fixed = scored(model, ids, mask, n, temperature, positions_from_mask(mask))
        for i in range(ids.size(0)):
            real = mask[i].bool()
            alone = scored(model, ids[i][real][None], None, int(keep[i].sum()), temperature)[0]
            for name, value in (("trl", trl), ("mask", fixed)):
                gap = (value[i][keep[i]] - alone).abs()
                gaps[name].append(gap)
                per_completion[name].append(float(gap.sum()))
            pads.append(int((enc.attention_mask[i] == 0).sum()))
    result = {}
    for name in gaps:
        g = torch.cat(gaps[name])
        result[name] = {"tokens": g.numel(), "mean": g.mean().item(), "p99": g.quantile(0.99).item(),
                     "max": g.max().item(), "per_completion": sum(per_completion[name]) / len(per_completion[name])}
    padded = [p for p in pads if p > 0]
    result["rows"] = len(pads)
    result["padded_share"] = len(padded) / len(pads)
    result["mean_pads"] = sum(padded) / max(1, len(padded))
    return result


def main(argv=None):
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.assets import resolve_model
    from rookgrpo.chess.data import load_rookworld

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "rookworld-tiny.yaml"))
    ap.add_argument("--batches", type=int, default=8, help="generation batches per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.batches < 1:
        ap.error("--batches must be at least 1")
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    path = resolve_model(recipe["model_name_or_path"])
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = load_rookworld(recipe["dataset_name"])
    results = {}
    for task, settings in (recipe.get("task_generation_kwargs") or {}).items():
        prompts = [r["prompt"] for r in rows if r["task"] == task]
        results[task] = measure_task(model, tok, prompts, settings, int(recipe["per_device_train_batch_size"]),
                                     int(recipe["num_generations"]), int(recipe["max_completion_length"]),
                                     args.batches, args.seed)
        print(f"{task}: done", flush=True, file=sys.stderr)
    lines = ["| task | rows | rows padded | mean pads | scored as | tokens | mean abs gap (nats/token) | 99th pct | max "
             "| mean summed gap per completion (nats) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task, r in results.items():
        for name, label in (("trl", "TRL (no position ids)"), ("mask", "position_ids_from_mask")):
            g = r[name]
            lines.append(f"| {task} | {r['rows']} | {r['padded_share']:.2f} | {r['mean_pads']:.1f} | {label} | "
                         f"{g['tokens']} | {g['mean']:.3g} | {g['p99']:.3g} | {g['max']:.3g} | "
                         f"{g['per_completion']:.3g} |")
    table = "\n".join(lines + ["", "Gap: |log-prob in the batch − log-prob of the row scored alone|, at the task's "
                               "sampling temperature, packaged model, recipe's sampling settings."])
    return finish({
        "title": "Scoring the sampled completions at the positions that sampled them (packaged chess model)",
        "description": (
            f"{args.batches} generation batches per task shaped as make train's (the recipe's batch, groups and "
            "per-task sampling settings), prompts from the packaged training data. Each completion token's log-prob "
            "in the left-padded batch, as TRL's forward scores it and with position_ids_from_mask, against the row "
            "scored alone without padding (what generate sampled from)."),
        "command": f"python benchmarks/bench_position_gap.py --batches {args.batches} --seed {args.seed}",
        "results": results, "table": table}, args.out)


if __name__ == "__main__":
    main()
