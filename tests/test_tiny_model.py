"""The tiny model: lossless tokenization of RookWorld text (char and move level), deterministic weights, loads in TRL."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import SHARED_DATA
from rookgrpo.chess.data import rookworld_row
from rookgrpo.models.tiny_model import (SQUARES, TinyGPT2Spec, build_board_tokenizer, build_char_tokenizer, build_move_tokenizer,
                                 build_tiny_gpt2, frequent_ranks, geometric_moves)


def test_tokenizer_round_trips_real_rookworld_lines():
    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    tok = build_char_tokenizer()
    for line in path.read_text().splitlines():
        ids = tok(line, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(line) and tok.unk_token_id not in ids
        assert tok.decode(ids) == line


def test_environment_task_text_round_trips():
    tok = build_char_tokenizer()
    line = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    assert tok.decode(tok(line)["input_ids"]) == line
    # A prompt's tokens followed by the completion's are the full line's tokens (char level splits anywhere).
    cut = line.index("+", line.index("+", line.index("+") + 1) + 1) + 1
    assert tok(line[:cut])["input_ids"] + tok(line[cut:])["input_ids"] == tok(line)["input_ids"]


def test_move_tokenizer_round_trips_and_splits_prompt_from_completion_on_real_lines():
    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    tok = build_move_tokenizer()
    moves = set(geometric_moves())
    n_move_tokens = 0
    for line in path.read_text().splitlines():
        row = rookworld_row(line)
        text = row["prompt"] + row["completion"]
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == text
        # GRPO tokenizes the prompt and the completion apart: their tokens must be the whole line's.
        assert tok(row["prompt"])["input_ids"] + tok(row["completion"])["input_ids"] == ids
        pieces = tok.convert_ids_to_tokens(ids)
        n_move_tokens += sum(p in moves for p in pieces)
        # Every move in the text is one token, and nothing else is longer than a character or a square.
        words = text.replace("+", " ").split()
        assert sum(w in moves for w in words) == sum(p in moves for p in pieces)
        assert all(len(p) == 1 or p in moves or len(p) == 2 for p in pieces)
    assert n_move_tokens > 1000


def test_move_tokenizer_keeps_fen_ranks_and_impossible_moves_as_characters():
    tok = build_move_tokenizer()
    # b1b4 inside a FEN rank is not a move; a1c4 is move-shaped but no piece moves so, so it stays two squares; a
    # promotion is one token; the vocabulary is the characters, the squares and the 1968 moves.
    assert tok.tokenize("P: 1b1b4/8 w - - 0 1 M: a1c4 g7g8n") == [
        "P", ":", " ", "1", "b", "1", "b", "4", "/", "8", " ", "w", " ", "-", " ", "-", " ", "0", " ", "1", " ",
        "M", ":", " ", "a1", "c4", " ", "g7g8n"]
    assert len(tok) == len(build_char_tokenizer()) + 64 + 1968
    for text in ("e2e4e2e4", "xe2e4", "e2e4/", "A: x+e2e4+e2e4 e7e5+"):
        assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.tokenize("+e2e4+e2e4 e7e5+") == ["+", "e2e4", "+", "e2e4", " ", "e7e5", "+"]


def test_board_tokenizer_gives_listed_fen_ranks_one_token_and_round_trips_real_lines(tmp_path):
    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    lines = path.read_text().splitlines()
    ranks = frequent_ranks(lines[:250], max_ranks=300)
    assert 0 < len(ranks) <= 300 and "rnbqkbnr" in ranks and all(len(r) > 1 for r in ranks)
    tok = build_board_tokenizer(ranks=ranks)
    # Ranks spelled like a square ("b7": a bishop and seven empty squares) keep the square's token.
    assert len(tok) == len(build_move_tokenizer()) + sum(r not in SQUARES for r in ranks)
    assert sorted(tok.get_vocab().values()) == list(range(len(tok)))
    # Saved and loaded with the Auto class (as TRL loads it), it still splits the same way.
    build_board_tokenizer(ranks=ranks).save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    listed, n_rank_tokens, n_chars, n_chars_move = set(ranks), 0, 0, 0
    for line in lines[250:]:  # lines whose ranks were not all counted: unlisted ranks must stay characters
        row = rookworld_row(line)
        text = row["prompt"] + row["completion"]
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == text and loaded(text)["input_ids"] == ids
        # The A: completion starts with a FEN: alone it must split as it does after the prompt's "+".
        assert tok(row["prompt"])["input_ids"] + tok(row["completion"])["input_ids"] == ids
        pieces = tok.convert_ids_to_tokens(ids)
        n_rank_tokens += sum(p in listed for p in pieces)
        n_chars, n_chars_move = n_chars + len(ids), n_chars_move + len(build_move_tokenizer()(text)["input_ids"])
        for board in (f for f in text.replace("+", " ").split() if f.count("/") == 7):
            for rank in (r for r in board.split("/") if len(r) > 1):  # "8" is a character token anyway
                assert (rank in pieces) == (rank in listed), (rank, pieces)
    # Whole games (this file) vary more than openings, and 250 lines counted few of their ranks: still shorter.
    assert n_rank_tokens > 400 and n_chars < 0.97 * n_chars_move


def test_board_tokenizer_refuses_what_is_not_a_rank_and_needs_ranks():
    with pytest.raises(ValueError, match="ranks: expected FEN rank strings"):
        build_move_tokenizer(ranks=["rnbqkbnr", "e2e4 "])
    with pytest.raises(ValueError, match="board tokenizer needs the FEN ranks"):
        build_board_tokenizer()
    tok = build_board_tokenizer(ranks=["4P3", "pppppppp"])
    # A listed rank inside a longer run of rank characters, or at a move's place, is not a rank.
    assert tok.tokenize("4P3/4P3P 4P3+pppppppp") == ["4P3", "/", "4", "P", "3", "P", " ", "4P3", "+", "pppppppp"]
    # Counting: most frequent first, ties in string order, once-seen ranks left out, one-character ranks never listed.
    fens = ["P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"] * 3 + [
        "A: rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1+e7e5+d2d4+"
        "rnbqkbnr/pppp1ppp/8/4p3/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 0 2+0.001+0+0"]
    assert frequent_ranks(fens) == ["RNBQKBNR", "rnbqkbnr", "pppppppp", "4P3", "PPPP1PPP", "3P4", "PPP1PPPP"]
    assert frequent_ranks(fens, max_ranks=2) == ["RNBQKBNR", "rnbqkbnr"]


def test_build_is_deterministic_and_loads_with_auto_classes(tmp_path):
    a = build_tiny_gpt2(tmp_path / "a", TinyGPT2Spec(seed=3))
    b = build_tiny_gpt2(tmp_path / "b", TinyGPT2Spec(seed=3))
    c = build_tiny_gpt2(tmp_path / "c", TinyGPT2Spec(seed=4))
    ma, mb, mc = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b, c))
    wa, wb, wc = (m.transformer.wte.weight for m in (ma, mb, mc))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    tok = AutoTokenizer.from_pretrained(a)
    assert tok.eos_token_id == ma.config.eos_token_id and tok.pad_token_id != tok.eos_token_id
    out = ma.generate(**tok(["P: 8/8 w "], return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert out.shape[1] == len("P: 8/8 w ") + 5 or tok.eos_token_id in out[0].tolist()


def test_tiny_models_use_the_fused_tanh_gelu_which_computes_gelu_new(tmp_path):
    """New tiny models and the packaged chess model name GPT-2's tanh GELU as one fused kernel; it is the function
    transformers' GPT-2 default (gelu_new) computes, so the packaged weights trained under gelu_new mean the same."""
    import json

    from transformers.activations import ACT2FN

    from rookgrpo.assets import TINY_ROOKWORLD

    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec())
    assert AutoModelForCausalLM.from_pretrained(path).config.activation_function == "gelu_pytorch_tanh"
    assert json.loads((TINY_ROOKWORLD / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    x = torch.linspace(-8, 8, 10001)
    fused, new = ACT2FN["gelu_pytorch_tanh"](x), ACT2FN["gelu_new"](x)
    assert torch.allclose(fused, new, rtol=1e-6, atol=1e-6) and not torch.allclose(fused, torch.nn.functional.gelu(x),
                                                                                    rtol=1e-6, atol=1e-6)
