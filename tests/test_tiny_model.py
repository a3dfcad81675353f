"""The tiny model: lossless tokenization of RookWorld text (char and move level), deterministic weights, loads in TRL."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import SHARED_DATA
from rookgrpo.chess.data import rookworld_row
from rookgrpo.models.tiny_model import (TinyGPT2Spec, build_char_tokenizer, build_move_tokenizer, build_tiny_gpt2,
                                        geometric_moves)


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


def test_move_tokenizer_round_trips_real_lines_and_splits_them_as_training_does(tmp_path):
    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    tok = build_move_tokenizer()
    assert sorted(tok.get_vocab().values()) == list(range(len(tok)))
    tok.save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")  # as TRL loads it
    for line in path.read_text().splitlines()[:200]:
        row = rookworld_row(line)
        text = row["prompt"] + row["completion"]
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == text and loaded(text)["input_ids"] == ids
        # The A: completion starts with a FEN: alone it must split as it does after the prompt's "+".
        assert tok(row["prompt"])["input_ids"] + tok(row["completion"])["input_ids"] == ids


def test_the_packaged_models_tokenizer_is_the_move_tokenizer_built_today(tmp_path):
    import json

    from rookgrpo.assets import TINY_ROOKWORLD

    build_move_tokenizer().save_pretrained(tmp_path / "tok")
    fresh, packaged = (json.loads((d / "tokenizer.json").read_text()) for d in (tmp_path / "tok", TINY_ROOKWORLD))
    assert fresh["model"] == packaged["model"] and fresh["pre_tokenizer"] == packaged["pre_tokenizer"]


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
