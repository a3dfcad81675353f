"""A tiny GPT-2 for tests, smoke runs and the embedded default, with a character or a move-level tokenizer.

Why character level: RookWorld text (FENs, UCI moves, evals) is a small alphabet, so a char tokenizer needs no
training, tokenizes every string the same way in prompt and completion, and keeps the model small enough to train on
a laptop CPU. The move-level tokenizer (:func:`build_move_tokenizer`) adds one token per UCI move a piece can make,
so choosing a move is one prediction instead of four, and RookWorld lines get shorter; everything else stays one
character per token. The tokenizer is a real ``PreTrainedTokenizerFast`` (built with ``tokenizers``) and the model a real
``GPT2LMHeadModel``, saved with ``save_pretrained`` so TRL can load both (and the reference model) from a path.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# Printable ASCII covers RookWorld text (both tasks) and Python source; newline and tab for code.
CHARSET = "".join(ch for ch in string.printable if ch not in "\r\x0b\x0c")


def build_char_tokenizer(charset: str = CHARSET):
    """Return a ``PreTrainedTokenizerFast`` with one token per character of ``charset`` plus EOS and PAD.

    Characters outside ``charset`` map to EOS's id would be lossy, so they map to a dedicated ``<unk>`` token instead.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = [EOS_TOKEN, PAD_TOKEN, "<unk>"]
    chars = list(dict.fromkeys(charset))  # keep order, drop repeats
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _fast(tok)


def _fast(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token="<unk>",
        padding_side="left",
        truncation_side="left",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )


FILES, RANKS = "abcdefgh", "12345678"
SQUARES = [f + r for r in RANKS for f in FILES]
# A move-shaped word: four square characters and an optional promotion piece, standing alone between spaces, ``+``
# (the A: task's field separator) or the text's ends. A FEN rank such as ``b1b4`` sits between ``/`` and is not one.
MOVE_WORD = r"(?<![^ +\n])[a-h][1-8][a-h][1-8][qrbn]?(?![^ +\n])"


def geometric_moves() -> list[str]:
    """Every UCI move some piece could make on an empty board (queen and knight lines, pawn promotions): 1968.

    >>> moves = geometric_moves()
    >>> len(moves), moves[:3], "e7e8q" in moves, "a1c4" in moves
    (1968, ['a1b1', 'a1c1', 'a1d1'], True, False)
    """
    out = []
    for i, frm in enumerate(SQUARES):
        for j, to in enumerate(SQUARES):
            df, dr = abs(i % 8 - j % 8), abs(i // 8 - j // 8)
            if i != j and (df == 0 or dr == 0 or df == dr or {df, dr} == {1, 2}):
                out.append(frm + to)
    for from_rank, to_rank in (("7", "8"), ("2", "1")):
        for a, f in enumerate(FILES):
            for b, t in enumerate(FILES):
                if abs(a - b) <= 1:
                    out += [f + from_rank + t + to_rank + p for p in "qrbn"]
    return out


def build_move_tokenizer(charset: str = CHARSET):
    """Return a ``PreTrainedTokenizerFast`` with one token per UCI move (:func:`geometric_moves`) and per character.

    A BPE whose merges only join a move-shaped word (:data:`MOVE_WORD`): its two squares first, then the squares
    into the move, then a promotion piece. A move-shaped word that no piece can play (``a1c4``, an illegal answer)
    stays two square tokens, so every text still round-trips; all other text is one token per character, as in
    :func:`build_char_tokenizer`.

    >>> tok = build_move_tokenizer()
    >>> tok.tokenize("1b1b4/8 M: e2e4 e7e8q a1c4+")
    ['1', 'b', '1', 'b', '4', '/', '8', ' ', 'M', ':', ' ', 'e2e4', ' ', 'e7e8q', ' ', 'a1', 'c4', '+']
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = [EOS_TOKEN, PAD_TOKEN, "<unk>"]
    chars = list(dict.fromkeys(charset))
    moves = geometric_moves()
    merges = [(f, r) for r in RANKS for f in FILES]  # squares
    merges += [(m[:2], m[2:4]) for m in moves if len(m) == 4]  # from + to
    merges += [(m[:4], m[4]) for m in moves if len(m) == 5]  # + promotion piece
    vocab = {tok: i for i, tok in enumerate(specials + chars + SQUARES + moves)}
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>")
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(MOVE_WORD + "|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _fast(tok)


TOKENIZERS = {"char": build_char_tokenizer, "move": build_move_tokenizer}


@dataclass(frozen=True)
class TinyGPT2Spec:
    """Size of the tiny model. The defaults give ~0.1M parameters: fast enough for multi-process CPU tests."""

    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    n_positions: int = 512
    seed: int = 0
    tokenizer: str = "char"  # or "move": see TOKENIZERS
    # GPT-2's tanh GELU as one fused kernel. transformers' GPT-2 default ("gelu_new") computes the same function in
    # Python from seven tensor ops (outputs equal to 1 ulp); on CPU, make train's fp32 GRPO step took 1.47x as long
    # with it (benchmarks/bench_precision.py, docs/benchmarks.md).
    activation: str = "gelu_pytorch_tanh"


def build_tiny_gpt2(out_dir: str | os.PathLike, spec: TinyGPT2Spec = TinyGPT2Spec(), charset: str = CHARSET) -> Path:
    """Build a randomly initialised GPT-2 and its tokenizer (``spec.tokenizer``), and save both to ``out_dir``.

    Deterministic for a given ``spec`` (the weights come from ``spec.seed``). Writing goes through a temporary
    directory and an atomic rename, so concurrent callers never see a half-written model. Under an initialised
    process group transformers writes weights only on rank 0, so distributed callers should build on the main process
    first (:func:`rookgrpo.assets.resolve_model` does).
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GenerationConfig

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    if spec.tokenizer not in TOKENIZERS:
        raise ValueError(f"TinyGPT2Spec.tokenizer: expected one of {sorted(TOKENIZERS)}, got {spec.tokenizer!r}.")
    tokenizer = TOKENIZERS[spec.tokenizer](charset)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_layer=spec.n_layer,
        n_head=spec.n_head,
        n_embd=spec.n_embd,
        n_positions=spec.n_positions,
        activation_function=spec.activation,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        model = GPT2LMHeadModel(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, is_main_process=True)
        tokenizer.save_pretrained(tmp)
        missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (tmp / f).exists()]
        if missing:
            raise RuntimeError(
                f"building the tiny model wrote no {', '.join(missing)} (a non-zero distributed rank does not write "
                "weights); build it on the main process first."
            )
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users (e.g. a sandbox's uid)
        try:
            os.rename(tmp, out_dir)
        except OSError:  # another process won the race; its copy is identical
            if not (out_dir / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
