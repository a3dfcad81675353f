"""Judge-scored GRPO without a hub: a fill-in task, the rule that grades it, and a small frozen judge trained on it.

The task: the prompt names a piece on an empty board and asks where it moves (``"knight on g1 moves to"``); the
completion fills in a square (``" f3"``). :func:`grade` is the rule: 1.0 for a square the piece reaches, 0.6 for
another square, halved when junk follows the square, x0.8 without the leading space, 0.15 for a file or rank letter
alone, else 0.

The judge (``rookgrpo/fill-in-judge``, built on first use into the cache, about a minute on CPU) is a
``GPT2ForSequenceClassification`` with the tiny models' character tokenizer, regressed on :func:`grade` over generated
answers (random strings, squares, squares with junk). It is an imperfect copy of the rule, as a learned judge is:
GRPO is paid by the judge, and ``recipes/judge.yaml`` logs the rule beside it with weight 0 (``fill_in_grade``), so a
run that learns the judge's mistakes instead of the task shows the two curves parting.

>>> grade("knight on g1 moves to", " f3"), grade("knight on g1 moves to", " f4"), grade("knight on g1 moves to", " f3xx")
(1.0, 0.6, 0.5)
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import chess

PIECES = {"knight": chess.KNIGHT, "bishop": chess.BISHOP, "rook": chess.ROOK, "queen": chess.QUEEN,
          "king": chess.KING}
SQUARES = [chess.square_name(s) for s in chess.SQUARES]
STOPS = ("", ".", "\n")


def destinations(piece: str, square: str) -> set[str]:
    """Squares ``piece`` on ``square`` reaches on an otherwise empty board."""
    board = chess.Board(None)
    sq = chess.parse_square(square)
    board.set_piece_at(sq, chess.Piece(PIECES[piece], chess.WHITE))
    return {chess.square_name(s) for s in board.attacks(sq)}


def fill_in_prompt(piece: str, square: str) -> str:
    return f"{piece} on {square} moves to"


def _parse_prompt(prompt: str) -> tuple[str, str] | None:
    parts = prompt.split()
    if len(parts) == 5 and parts[0] in PIECES and parts[2] in SQUARES and parts[1:] == ["on", parts[2], "moves", "to"]:
        return parts[0], parts[2]
    return None


def grade(prompt: str, completion: str) -> float:
    """The rule the judge imitates (see the module docstring); 0.0 for anything it cannot read."""
    parsed = _parse_prompt(prompt) if isinstance(prompt, str) else None
    if parsed is None or not isinstance(completion, str):
        return 0.0
    text, spaced = (completion[1:], True) if completion.startswith(" ") else (completion, False)
    if text[:2] in SQUARES:
        value = 1.0 if text[:2] in destinations(*parsed) else 0.6
        if text[2:] not in STOPS:
            value *= 0.5
    elif text[:1] and text[:1] in "abcdefgh12345678":
        value = 0.15
    else:
        return 0.0
    return value if spaced else value * 0.8


def fill_in_prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [fill_in_prompt(rng.choice(sorted(PIECES)), rng.choice(SQUARES)) for _ in range(n)]


def _answer(rng: random.Random, prompt: str, charset: str) -> str:
    """One answer from the mixture the judge learns from: what a policy writes early and late in training."""
    piece, square = _parse_prompt(prompt)
    reach = sorted(destinations(piece, square))
    junk = lambda k: "".join(rng.choice(charset) for _ in range(k))  # noqa: E731
    kind = rng.random()
    if kind < 0.3:
        return junk(rng.randint(1, 8))
    if kind < 0.45:
        return " " + junk(rng.randint(1, 7))
    if kind < 0.6:
        return " " + rng.choice(SQUARES) + rng.choice(["", "", "."])
    if kind < 0.75:
        return " " + rng.choice(reach) + rng.choice(["", "", "."])
    if kind < 0.85:
        return rng.choice(reach + SQUARES[:8])
    return " " + rng.choice(reach + SQUARES) + junk(rng.randint(1, 5))


def training_examples(n: int, seed: int = 0) -> list[tuple[str, float]]:
    """``n`` (prompt + answer, grade) pairs for the judge."""
    from ..models.tiny_model import CHARSET

    rng = random.Random(seed)
    out = []
    for prompt in fill_in_prompts(n, seed):
        answer = _answer(rng, prompt, CHARSET)
        out.append((prompt + answer, grade(prompt, answer)))
    return out


def build_fill_in_judge(out_dir: str | os.PathLike, steps: int = 800, batch_size: int = 128, seed: int = 0,
                        progress: bool = True) -> Path:
    """Train the judge (2-layer char GPT-2 with one output) on :func:`training_examples`; save it to ``out_dir``."""
    import torch
    from tqdm.auto import tqdm
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from ..models.tiny_model import build_char_tokenizer

    out = Path(out_dir)
    if (out / "model.safetensors").exists():
        return out
    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = "right"
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=64, n_layer=2, n_head=4, num_labels=1,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.eos_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    judge = GPT2ForSequenceClassification(config)
    data = training_examples(steps * batch_size, seed)
    optimizer = torch.optim.AdamW(judge.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    judge.train()
    for step in tqdm(range(steps), desc="training the fill-in judge", disable=not progress):
        batch = data[step * batch_size:(step + 1) * batch_size]
        enc = tokenizer([t for t, _ in batch], return_tensors="pt", padding=True)
        target = torch.tensor([g for _, g in batch])
        loss = torch.nn.functional.mse_loss(judge(**enc).logits[:, 0], target)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    judge.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    judge.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)  # atomic: a concurrent builder never sees half a judge
    except OSError:
        if not (out / "model.safetensors").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    return out
