"""The control for ``sft_anchor`` (docs/tiny-model.md): the anchor's supervised term alone, no GRPO.

``sft_anchor`` adds ``coef`` x the NLL of reference completions to each GRPO loss. What it holds or adds on held-out
positions could be the supervised term's own doing; this trains the packaged model on the anchor's term alone, with
the recipe's optimizer settings (AdamW, TrainingArguments' defaults: betas 0.9/0.999, eps 1e-8, no weight decay,
gradient norm clipped at 1.0; the recipe's learning rate, warm-up and steps), drawing the same lines in the same order
as the callback (its own code draws and scores them). Adam rescales the update, so ``coef`` barely matters here: this
is the anchor at full strength, an upper bound on what it does inside a GRPO run. ``--shuffle_completions`` gives each
line another line's completion (a seeded permutation), so the same steps teach nothing true about the board: a
perturbation control for the control. Then evaluate as usual::

    python benchmarks/levers/anchor_only.py --out runs/anchor-only-s42 --seed 42
    python benchmarks/levers/anchor_only.py --out runs/anchor-shuffled-s42 --seed 42 --shuffle_completions
    rookgrpo evaluate --model runs/anchor-only-s42 --data rookgrpo/tiny-rookworld-eval --depth 8 --baseline <before.json>
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import defaultdict
from types import SimpleNamespace

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, get_constant_schedule_with_warmup

from rookgrpo.assets import resolve_model
from rookgrpo.callbacks import SFTAnchor


def shuffled_copy(data: str, tasks: list[str], seed: int) -> str:
    """A temporary file of ``data``'s lines of ``tasks`` with the completions permuted among them (no line keeps its
    own); returns its path."""
    from rookgrpo.chess.data import load_rookworld

    rows = load_rookworld(data, tasks=tasks)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    # One cycle through the shuffled order: line order[k] gets the completion of line order[k + 1], never its own.
    moved = {order[k]: order[(k + 1) % len(order)] for k in range(len(order))}
    lines = [rows[i]["prompt"] + rows[moved[i]]["completion"] for i in range(len(rows))]
    out = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    out.write("\n".join(lines) + "\n")
    out.close()
    print(f"shuffled completions: {len(lines)} lines in {out.name}")
    return out.name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="rookgrpo/tiny-rookworld")
    p.add_argument("--data", default="rookgrpo/tiny-rookworld-train")
    p.add_argument("--tasks", nargs="+", default=["A"])
    p.add_argument("--coef", type=float, default=0.1)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True)
    p.add_argument("--shuffle_completions", action="store_true",
                   help="pair each prompt with another line's completion (seeded): a control that teaches no board")
    args = p.parse_args(argv)
    if args.shuffle_completions:
        args.data = shuffled_copy(args.data, args.tasks, args.seed)

    torch.manual_seed(args.seed)
    path = resolve_model(args.model)
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    for module in model.modules():  # the recipe's disable_dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    # What SFTAnchor reads of a trainer, and nothing else.
    trainer = SimpleNamespace(processing_class=tok, model=model, args=SimpleNamespace(seed=args.seed),
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m),
                              _metrics={"train": defaultdict(list)}, current_gradient_accumulation_steps=1)
    anchor = SFTAnchor(data=args.data, tasks=args.tasks, coef=args.coef, batch_size=args.batch_size)
    anchor.bind(trainer)
    opt = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = get_constant_schedule_with_warmup(opt, args.warmup_steps)
    for _ in tqdm(range(args.steps), desc="anchor only"):
        loss = anchor.extra_loss(trainer, model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad()
    nll = trainer._metrics["train"]["sft_anchor/nll"]
    print(f"anchor NLL per token: first 10 steps {sum(nll[:10]) / 10:.4f}, last 10 {sum(nll[-10:]) / 10:.4f}")
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
