#!/usr/bin/env python
"""Build the embedded default: ``rookgrpo/tiny-rookworld``, a small character-level GPT-2 taught RookWorld by SFT.

Why: RookWorld-LM-124M and its dataset live on a hub our machines cannot reach, and a random model earns the same
floor reward on every completion, so GRPO has nothing to learn from. This script makes a starting point that has
learned the format and plays legal, often reasonable moves, yet leaves room to improve.

Steps (each seeded, so a rebuild reproduces the shipped numbers within noise):

1. generate RookWorld lines (``P:`` and ``A:``, compact layout) with :func:`rookgrpo.chess.data.generate` and split
   them into SFT data, GRPO training positions and held-out evaluation positions (no FEN shared between splits);
2. build a randomly initialised char-level GPT-2 (:mod:`rookgrpo.tiny_model`) and fine-tune it with TRL's
   ``SFTTrainer`` on prompt/completion pairs (loss on the completion only), on CPU;
3. evaluate it with ``rookgrpo evaluate`` on the held-out positions;
4. write model, tokenizer, positions and a model card (how it was made, its numbers) to
   ``src/rookgrpo/assets/tiny-rookworld/``.

Run time on the 2-core reference machine with the defaults: about 25 minutes (data ~4 min, SFT ~20 min)::

    python scripts/build_tiny_model.py                 # writes src/rookgrpo/assets/tiny-rookworld
    python scripts/build_tiny_model.py --out /tmp/tr   # a rebuild elsewhere, e.g. to compare numbers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the model and positions go")
    p.add_argument("--work", type=Path, default=REPO / "build" / "tiny-rookworld", help="scratch (data cache, SFT)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--n_lines", type=int, default=12000, help="RookWorld lines generated in all (all splits)")
    p.add_argument("--n_grpo", type=int, default=1024, help="GRPO training positions kept out of SFT")
    p.add_argument("--n_eval", type=int, default=256, help="held-out evaluation positions")
    p.add_argument("--label_depth", type=int, default=8, help="Stockfish depth that labels P: rows")
    p.add_argument("--eval_depth", type=int, default=8, help="Stockfish depth for evaluation")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--epochs", type=float, default=4.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="Stockfish processes")
    return p.parse_args(argv)


def make_data(args, work: Path) -> dict[str, list[str]]:
    """Generate (or reuse the cached) lines and split them by position."""
    from rookgrpo.chess.data import generate, write_lines
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.formats import COMPACT

    cache = work / f"lines-{args.n_lines}-seed{args.seed}-d{args.label_depth}.txt"
    if cache.exists():
        lines = cache.read_text().splitlines()
    else:
        settings = EngineSettings(depth=args.label_depth, workers=args.workers)
        lines = generate(args.n_lines, tasks=("P", "A"), seed=args.seed, settings=settings, layout=COMPACT)
        write_lines(lines, str(cache))
    # Split by the position a line is about (P: its FEN, A: the FEN before the move), so no held-out position is
    # ever seen in SFT. Positions are shuffled with the seed; the first go to eval, the next to GRPO, the rest SFT.
    def key(line: str) -> str:
        return line[3:].split(" M:")[0].split("+")[0].strip()

    positions = sorted({key(line) for line in lines})
    random.Random(args.seed).shuffle(positions)
    by_pos: dict[str, list[str]] = {}
    for line in lines:
        by_pos.setdefault(key(line), []).append(line)
    splits: dict[str, list[str]] = {"eval": [], "grpo": [], "sft": []}
    for pos in positions:
        name = "eval" if len(splits["eval"]) < args.n_eval else "grpo" if len(splits["grpo"]) < args.n_grpo else "sft"
        splits[name] += by_pos[pos]
    return splits


def to_pairs(lines: list[str]):
    from datasets import Dataset

    from rookgrpo.chess.data import rookworld_row

    rows = [rookworld_row(line) for line in lines]
    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows if r])


def sft(args, work: Path, sft_lines: list[str]) -> Path:
    """Fine-tune a fresh char-level GPT-2 on the SFT lines with TRL's SFTTrainer; return the saved model dir."""
    from trl import SFTConfig, SFTTrainer

    from rookgrpo.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    longest = max(len(line) for line in sft_lines) + 2
    spec = TinyGPT2Spec(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                        n_positions=max(256, 64 * ((longest + 63) // 64)), seed=args.seed)
    init = work / "init"
    shutil.rmtree(init, ignore_errors=True)
    build_tiny_gpt2(init, spec)
    config = SFTConfig(
        output_dir=str(work / "sft"), seed=args.seed, use_cpu=True, bf16=False,
        num_train_epochs=args.epochs, learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=0.03,
        weight_decay=0.01, per_device_train_batch_size=args.batch_size, max_length=spec.n_positions,
        completion_only_loss=True, logging_steps=25, save_strategy="no", report_to="none",
        dataloader_num_workers=0, gradient_checkpointing=False,
    )
    trainer = SFTTrainer(model=str(init), args=config, train_dataset=to_pairs(sft_lines))
    trainer.train()
    final = work / "final"
    shutil.rmtree(final, ignore_errors=True)
    trainer.save_model(str(final))
    trainer.processing_class.save_pretrained(str(final))
    (final / "sft_log_history.json").write_text(json.dumps(trainer.state.log_history))
    return final


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    splits = make_data(args, work)
    t_data = time.time() - t0
    print({k: len(v) for k, v in splits.items()}, f"data {t_data:.0f}s", flush=True)
    for name in ("grpo", "eval"):
        (work / f"{name}.txt").write_text("".join(line + "\n" for line in splits[name]))

    t1 = time.time()
    model_dir = sft(args, work, splits["sft"])
    t_sft = time.time() - t1

    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.evaluate import evaluate, format_table

    settings = EngineSettings(depth=args.eval_depth, workers=args.workers)
    metrics = evaluate(str(model_dir), str(work / "eval.txt"), settings=settings)
    print(format_table(metrics), flush=True)

    out = args.out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / f).exists():
            shutil.copy2(model_dir / f, tmp / f)
    shutil.copy2(work / "grpo.txt", tmp / "train_positions.txt")
    shutil.copy2(work / "eval.txt", tmp / "eval_positions.txt")
    build = {
        "command": "python scripts/build_tiny_model.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "splits": {k: len(v) for k, v in splits.items()},
        "seconds": {"data": round(t_data), "sft": round(t_sft), "total": round(time.time() - t0)},
        "parameters": _n_params(model_dir),
        "eval": {k: v for k, v in metrics.items() if k != "samples"},
        "samples": metrics["samples"],
    }
    (tmp / "build_info.json").write_text(json.dumps(build, indent=2))
    (tmp / "README.md").write_text(model_card(build, format_table(metrics)))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB) in {time.time() - t0:.0f}s")
    return 0


def _n_params(model_dir: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def model_card(build: dict, table: str) -> str:
    a = build["args"]
    return f"""# rookgrpo/tiny-rookworld

A {build['parameters'] / 1e6:.2f}M-parameter character-level GPT-2 ({a['n_layer']} layers, {a['n_head']} heads,
width {a['n_embd']}) that has learned the RookWorld text formats by supervised fine-tuning. It is rookgrpo's
embedded default: `make train` runs GRPO on it with no network. It is a starting point with room to improve,
not a chess player.

## How it was made

`{build['command']}` (seed {a['seed']}):

- data: {a['n_lines']} RookWorld lines (compact layout, P: and A: tasks) from `rookgrpo.chess.data.generate`,
  P: rows labelled by Stockfish at depth {a['label_depth']}; split by position into SFT
  ({build['splits']['sft']} lines), GRPO training positions ({build['splits']['grpo']}, `train_positions.txt`) and
  held-out evaluation positions ({build['splits']['eval']}, `eval_positions.txt`). No position is in two splits.
- SFT: TRL `SFTTrainer`, prompt/completion pairs with the loss on the completion, {a['epochs']} epochs, lr
  {a['lr']} cosine, batch {a['batch_size']}, CPU.
- run time: data {build['seconds']['data']} s, SFT {build['seconds']['sft']} s, total {build['seconds']['total']} s.

## Numbers (held-out positions, greedy decoding, Stockfish depth {a['eval_depth']})

```
{table}
```

Reproduce: `rookgrpo evaluate --model rookgrpo/tiny-rookworld --data rookgrpo/tiny-rookworld-eval --depth {a['eval_depth']}`.
"""


if __name__ == "__main__":
    sys.exit(main())
