"""The tiny character-level model: lossless tokenization of RookWorld text, deterministic weights, loadable by TRL."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import SHARED_DATA
from rookgrpo.tiny_model import TinyGPT2Spec, build_char_tokenizer, build_tiny_gpt2


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
