"""scripts/build_tiny_model.py: a rebuild with the same seed is identical, and stages run out of order say what to do.

Run at toy size (a few dozen lines, a one-layer model, three SFT steps): the claim that a rebuild reproduces the
shipped model rests on every stage being seeded and deterministic, which this checks end to end.
"""

import json

from conftest import REPO, run_cli, venv_bin

SCRIPT = str(REPO / "scripts" / "build_tiny_model.py")
TOY = ["--n_lines", "40", "--n_games", "8", "--n_eval", "4", "--n_grpo", "6", "--label_depth", "4", "--eval_depth", "4",
       "--workers", "2", "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--batch_size", "8", "--max_steps", "3"]


def build(tmp_path, name, *extra):
    return run_cli([venv_bin("python"), SCRIPT, *TOY, "--work", str(tmp_path / name / "work"),
                    "--out", str(tmp_path / name / "out"), *extra])


def test_a_rebuild_with_the_same_seed_is_identical(tmp_path):
    for name in ("first", "second"):
        proc = build(tmp_path, name)
        assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = tmp_path / "first" / "out", tmp_path / "second" / "out"
    for f in ("train_positions.txt", "eval_positions.txt", "model.safetensors", "tokenizer.json"):
        assert (first / f).read_bytes() == (second / f).read_bytes(), f
    info = [json.loads((d / "build_info.json").read_text()) for d in (first, second)]
    assert info[0]["eval"] == info[1]["eval"]
    assert info[0]["splits"]["sft"] > 0 and info[0]["parameters"] > 0
    # The held-out splits keep a fixed A: share (a quarter) whatever the generated mix (here 70% A:), and the SFT mix
    # is every P: line of the SFT split with as many A: lines (sft_a_share 0.5).
    for name, n in (("eval_positions.txt", 4), ("train_positions.txt", 6)):
        lines = (first / name).read_text().splitlines()
        a_quota = round(n * 0.25)
        assert sum(l.startswith("A:") for l in lines) <= a_quota and sum(l.startswith("P:") for l in lines) <= n - a_quota
    sft_p = sum(l.startswith("P:") for l in (tmp_path / "first" / "work" / "sft.txt").read_text().splitlines())
    assert info[0]["stages"]["sft"]["train_lines"] == 2 * sft_p > 0
    card = (first / "README.md").read_text()
    assert card.startswith("# rookgrpo/tiny-rookworld") and "3 steps" in card and "--stage" not in card


def test_board_tokenizer_and_unlikelihood_build(tmp_path):
    proc = build(tmp_path, "board", "--tokenizer", "board", "--rank_vocab", "50", "--unlikelihood", "1.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, work = tmp_path / "board" / "out", tmp_path / "board" / "work"
    from transformers import AutoTokenizer

    from rookgrpo.tiny_model import build_move_tokenizer

    tok, n_move = AutoTokenizer.from_pretrained(out), len(build_move_tokenizer())
    ranks = [t for t, i in tok.get_vocab().items() if i >= n_move]
    assert 0 < len(ranks) <= 50 and tok.tokenize(ranks[0] + "/8") == [ranks[0], "/", "8"]
    # The rank tokens come from the SFT lines only.
    sft_text = (work / "sft.txt").read_text()
    assert all(r in sft_text for r in ranks)
    history = json.loads((work / "final" / "sft_log_history.json").read_text())
    assert any(h.get("unlikelihood", 0) > 0 for h in history)
    card = (out / "README.md").read_text()
    assert "per frequent FEN rank string" in card and "1.0 x an unlikelihood term" in card


def test_init_from_continues_a_finished_build(tmp_path):
    assert build(tmp_path, "base").returncode == 0
    base = tmp_path / "base" / "work" / "final"
    proc = build(tmp_path, "more", "--init_from", str(base), "--unlikelihood", "1.0", "--lr", "1e-3", "--n_layer", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "more" / "out"
    # Same tokenizer and shape as the model it started from (the shape arguments are ignored), new weights.
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    assert (out / "model.safetensors").read_bytes() != (base / "model.safetensors").read_bytes()
    card = (out / "README.md").read_text()
    assert f"continued from `{base}`" in card and "(1 layers," in card
    proc = build(tmp_path, "missing", "--init_from", str(tmp_path / "nowhere"))
    assert proc.returncode != 0 and "no saved model there" in proc.stderr


def test_stages_out_of_order_say_which_stage_to_run(tmp_path):
    proc = build(tmp_path, "early", "--stage", "sft")
    assert proc.returncode != 0 and "run `--stage data` first" in proc.stderr
    assert build(tmp_path, "early", "--stage", "data").returncode == 0
    proc = build(tmp_path, "early", "--stage", "finish")
    assert proc.returncode != 0 and "run `--stage sft` first" in proc.stderr
    assert build(tmp_path, "early", "--stage", "sft").returncode == 0
    # The finish stage writes the model card, so it refuses arguments that differ from what the SFT stage used.
    proc = run_cli([venv_bin("python"), SCRIPT, *TOY, "--n_embd", "32", "--stage", "finish",
                    "--work", str(tmp_path / "early" / "work"), "--out", str(tmp_path / "early" / "out")])
    assert proc.returncode != 0 and "--n_embd 32 (the SFT stage used 16)" in proc.stderr
    proc = run_cli([venv_bin("python"), SCRIPT, *TOY, "--m_order", "rank", "--stage", "finish",
                    "--work", str(tmp_path / "early" / "work"), "--out", str(tmp_path / "early" / "out")])
    assert proc.returncode != 0 and "--m_order rank (the SFT stage used random)" in proc.stderr


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_tiny_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeat_unlikelihood_pushes_down_moves_already_listed_in_m(tmp_path):
    import copy

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    p_line = "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1 M: e7e5 g8f6 d7d5 E: 0.3 0.4 0.2 B: g8f6"
    a_line = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
              "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")
    enc = tok([p_line, a_line], padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    loss_fn = _script().RepeatUnlikelihood(tok, weight=1.0)
    # The P: line's M: list: g8f6 after e7e5, d7d5 after both; B: (outside M:) and the A: line add nothing.
    rows, cols, bans = loss_fn.repeats(labels)
    ids = enc["input_ids"][0].tolist()
    at = {m: ids.index(tok.convert_tokens_to_ids(m)) for m in ("e7e5", "g8f6", "d7d5")}
    e7e5, g8f6 = tok.convert_tokens_to_ids("e7e5"), tok.convert_tokens_to_ids("g8f6")
    assert list(zip(rows, cols, bans)) == [(0, at["g8f6"] - 1, e7e5), (0, at["d7d5"] - 1, e7e5),
                                           (0, at["d7d5"] - 1, g8f6)]

    out = model(**enc)
    ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, len(tok)), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(_script().RepeatUnlikelihood(tok, 0.0)(out, labels), ce)
    p = torch.softmax(out.logits[rows, cols], -1)[range(len(rows)), bans]
    assert torch.allclose(loss_fn(out, labels), ce - torch.log1p(-p).mean())
    assert loss_fn.last_unlikelihood > 0

    # Trained on the line with the term, the slot after e7e5 gives e7e5 less than half what plain cross-entropy leaves.
    def p_repeat_after_training(weight):
        m = copy.deepcopy(model)
        fn = _script().RepeatUnlikelihood(tok, weight)
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        for _ in range(30):
            opt.zero_grad()
            fn(m(**enc), labels).backward()
            opt.step()
        with torch.no_grad():
            logits = m(**enc).logits[0, at["g8f6"] - 1]
        return float(torch.softmax(logits, -1)[e7e5])

    plain, penalised = p_repeat_after_training(0.0), p_repeat_after_training(2.0)
    assert penalised < 0.5 * plain, (penalised, plain)
