"""scripts/build_tiny_model.py: a rebuild with the same seed is identical, and stages run out of order say what to do.

Run at toy size (a few dozen lines, a one-layer model, three SFT steps): the claim that a rebuild reproduces the
shipped model rests on every stage being seeded and deterministic, which this checks end to end.
"""

import json
import random

import pytest
from conftest import REPO, load_script, run_cli, venv_bin

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
    # Both held-out panels: the evaluation positions, then the GRPO positions (6 lines here: "P: rows" + "A: rows").
    assert card.index("## Numbers (held-out") < card.index("## Numbers on the GRPO positions")
    rows = card.split("## Numbers on the GRPO positions")[1].split("```")[1]
    panel = info[0]["eval_grpo_positions"]
    assert panel["n_policy"] + panel["n_env"] == 6 and f"(P: rows {panel['n_policy']}, A: rows" in rows
    # The third: as many lines as the GRPO panel, each a line of the SFT mix (every P: line of the SFT split, A: drawn),
    # one copy of each; packaged, and the same in both builds.
    assert card.index("## Numbers on the GRPO positions") < card.index("## Numbers on lines it was trained on")
    work = tmp_path / "first" / "work"
    sample = (first / "sft_sample.txt").read_text().splitlines()
    assert sample == (work / "sft_sample.txt").read_text().splitlines()
    assert (first / "sft_sample.txt").read_bytes() == (second / "sft_sample.txt").read_bytes()
    mix = _script().sft_mix((work / "sft.txt").read_text().splitlines(), 0.5, 1234)
    assert len(sample) == len(set(sample)) == 6 and set(sample) <= set(mix)
    assert sum(l.startswith("A:") for l in sample) == round(6 * 0.25)
    fit = info[0]["eval_sft_sample"]
    assert fit["n_policy"] + fit["n_env"] == 6
    assert f"(P: rows {fit['n_policy']}, A: rows" in card.split("## Numbers on lines it was trained on")[1]
    # New builds use the fused tanh GELU, and the card says so.
    assert json.loads((first / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    assert "tanh GELU as one fused kernel (`gelu_pytorch_tanh`), dropout 0.1;" in card


def test_board_tokenizer_and_unlikelihood_build(tmp_path):
    proc = build(tmp_path, "board", "--tokenizer", "board", "--rank_vocab", "50", "--unlikelihood", "1.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, work = tmp_path / "board" / "out", tmp_path / "board" / "work"
    from transformers import AutoTokenizer

    from rookgrpo.models.tiny_model import build_move_tokenizer

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
    proc = build(tmp_path, "more", "--init_from", str(base), "--unlikelihood", "1.0", "--own_target", "2.0",
                 "--own_from", "2", "--lr", "1e-3", "--n_layer", "2", "--micro_batches", "2",
                 "--activation", "gelu_new", "--dropout", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "more" / "out"
    history = json.loads((tmp_path / "more" / "work" / "final" / "sft_log_history.json").read_text())
    shares = [h["own/repeat_share"] for h in history if "own/repeat_share" in h]
    assert shares and all(0.0 <= x <= 1.0 for x in shares) and any(h.get("own/target", 0) > 0 for h in history)
    # --own_from 2: the own-list terms start at the third update (global step 2), so steps 1 and 2 log none.
    logged = {h["step"] for h in history if "loss" in h}
    assert {1, 2, 3} <= logged and {h["step"] for h in history if "own/repeat_share" in h} == {3}
    # Same tokenizer and shape as the model it started from (the shape arguments are ignored), new weights.
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    assert (out / "model.safetensors").read_bytes() != (base / "model.safetensors").read_bytes()
    card = (out / "README.md").read_text()
    assert f"continued from `{base}`" in card and "(1 layers," in card and "2.0 x the line's unlisted M: moves" in card
    assert "(the own-list terms from step 2 on)" in card
    assert "batch 8 (run as 2 length-sorted micro-batches, the same gradient)" in card
    # --activation holds for a model it continues from (saved with the fused kernel): trained and saved with gelu_new.
    assert json.loads((base / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu_new"
    assert "as transformers' `gelu_new` writes it" in card
    # So does --dropout (the init model was saved with GPT-2's 0.1).
    pdrops = ("embd_pdrop", "attn_pdrop", "resid_pdrop")
    assert [json.loads((base / "config.json").read_text())[k] for k in pdrops] == [0.1] * 3
    assert [json.loads((out / "config.json").read_text())[k] for k in pdrops] == [0.0] * 3 and "dropout 0;" in card
    proc = build(tmp_path, "bad_dropout", "--dropout", "1")
    assert proc.returncode != 0 and "--dropout must be within [0, 1), got 1.0" in proc.stderr
    # --own_every 2 from step 0: the terms at global steps 0 and 2 (the first and third updates) only.
    # With --own_rows 2 the terms charge at most two P: lines of a batch (the other builds: up to 32, all of theirs).
    proc = build(tmp_path, "every", "--init_from", str(base), "--own_target", "2.0", "--own_every", "2", "--own_rows", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "every" / "work" / "final" / "sft_log_history.json").read_text())
    assert {h["step"] for h in history if "own/repeat_share" in h} == {1, 3}
    assert all(0 < h["own/rows"] <= 2 for h in history if "own/rows" in h)
    assert any(h["own/rows"] > 2 for h in json.loads((tmp_path / "more" / "work" / "final" /
                                                      "sft_log_history.json").read_text()) if "own/rows" in h)
    card = (tmp_path / "every" / "out" / "README.md").read_text()
    assert "(the own-list terms on one step in 2 from step 0 on, on 2 P: lines of each batch)" in card
    proc = build(tmp_path, "bad_rows", "--own_target", "1", "--own_rows", "0")
    assert proc.returncode != 0 and "--own_rows must be at least 1, got 0" in proc.stderr
    proc = build(tmp_path, "nothing_rows", "--own_rows", "16")
    assert proc.returncode != 0 and "--own_rows 16 has nothing to charge" in proc.stderr
    proc = build(tmp_path, "bad_every", "--own_target", "1", "--own_every", "0")
    assert proc.returncode != 0 and "--own_every must be at least 1, got 0" in proc.stderr
    proc = build(tmp_path, "nothing_every", "--own_every", "2")
    assert proc.returncode != 0 and "--own_every 2 has no terms to space out" in proc.stderr
    proc = build(tmp_path, "nothing", "--own_from", "5")
    assert proc.returncode != 0 and "--own_from 5 has nothing to start" in proc.stderr
    proc = build(tmp_path, "missing", "--init_from", str(tmp_path / "nowhere"))
    assert proc.returncode != 0 and "no saved model there" in proc.stderr


def test_a_continuation_keeps_its_init_builds_splits_and_its_card_names_both_commands(tmp_path):
    assert build(tmp_path, "base").returncode == 0
    base = tmp_path / "base" / "out"
    # Other data arguments would split the positions otherwise: the new held-out positions could be ones the init
    # model was trained on. Refused before any work, naming the argument.
    proc = build(tmp_path, "resplit", "--init_from", str(base), "--seed", "99")
    assert proc.returncode != 0 and "--seed 99 (it was built with 1234)" in proc.stderr
    assert not (tmp_path / "resplit" / "work" / "sft.txt").exists()
    # --sft_seed seeds the SFT stage alone: the same splits as the init build, another draw of the SFT run.
    for name, sft_seed in (("more", "7"), ("other", "8")):
        proc = build(tmp_path, name, "--init_from", str(base), "--sft_seed", sft_seed, "--lr", "1e-3")
        assert proc.returncode == 0, proc.stderr[-3000:]
    more, other = tmp_path / "more" / "out", tmp_path / "other" / "out"
    for f in ("train_positions.txt", "eval_positions.txt"):
        assert (more / f).read_bytes() == (base / f).read_bytes() == (other / f).read_bytes(), f
    assert (more / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    info, base_info = (json.loads((d / "build_info.json").read_text()) for d in (more, base))
    assert info["init"]["command"] == base_info["command"] and info["init"]["eval"] == base_info["eval"]
    assert "samples" not in info["init"] and info["args"]["sft_seed"] == 7
    card = (more / "README.md").read_text()
    assert card.index(f"1. `{base_info['command']}` (seed 1234)") < card.index(f"2. `{info['command']}` (SFT seed 7)")
    assert card.count("- data: 40 RookWorld lines") == 1 and card.count("- SFT") == 2
    assert f"continued from `{base}`" in card and "3 steps (" in card and "of an epoch of the mix)" in card


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
    return load_script(SCRIPT)


def test_repeat_unlikelihood_pushes_down_moves_already_listed_in_m(tmp_path):
    import copy

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

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


def _steps_on(own, model, ids, steps: int = 10):
    """``steps`` Adam steps (lr 1e-3) on an :class:`OwnLists`'s terms alone."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        own(model, ids).backward()
        opt.step()


def test_own_lists_slots_follow_the_models_list_and_owe_the_lines_moves(tmp_path):
    import torch
    from transformers import AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    tok = AutoTokenizer.from_pretrained(build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32)))
    own = _script().OwnLists(tok, target=1.0)
    line = "P: 4k3/8/8/8/8/8/8/4K3 b - - 0 1 M: e8e7 e8d7 e8f7 E: 0.1 0.2 0.3 B: e8e7"
    for side in ("left", "right"):
        tok.padding_side = side
        batch = tok([line, "A: no list here", line.replace(" e8d7 e8f7", " e8e7")], padding=True)["input_ids"]
        (prompt, data), (_, once) = own.prompts(torch.tensor(batch))
        assert prompt == tok(line.split(" M:")[0] + " M:")["input_ids"]
        assert data == tok.convert_tokens_to_ids(["e8e7", "e8d7", "e8f7"]) and len(once) == 1  # a repeat counts once
    e8e7, e8d7, e8f7 = data
    # The model wrote " e8e7 e8e7 e8d7 e8f7 E:": slot 1 owes all three, slots 2 and 3 the two unlisted ones (after
    # e8e7, and after the repeat); a fourth slot is beyond the line's three moves and owes nothing.
    written = tok(" e8e7 e8e7 e8d7 e8f7 E:", add_special_tokens=False)["input_ids"]
    seq = torch.tensor([prompt + written])
    spaces = [len(prompt) + i for i, t in enumerate(written) if t == own.space]
    assert own.slots(seq, len(prompt), [data]) == [
        (0, spaces[0], [e8e7, e8d7, e8f7], []), (0, spaces[1], [e8d7, e8f7], [e8e7]),
        (0, spaces[2], [e8d7, e8f7], [e8e7])]
    # A list that stops early owes the slot where it stopped: " e8e7 E:" still owes slot 2.
    short = tok(" e8e7 E:", add_special_tokens=False)["input_ids"]
    slots = own.slots(torch.tensor([prompt + short]), len(prompt), [data])
    assert [rem for _, _, rem, _ in slots] == [[e8e7, e8d7, e8f7], [e8d7, e8f7]]
    # A list with no space after M: owes the space there, and nothing after it.
    broken = tok("E: 0.1", add_special_tokens=False)["input_ids"]
    assert own.slots(torch.tensor([prompt + broken]), len(prompt), [data]) == [(0, len(prompt) - 1, [own.space], [])]


def test_own_lists_push_down_the_models_own_repeat_and_pay_the_lines_unlisted_moves(tmp_path):
    """A model taught to write one move five times: the terms equal their definition on its greedy lists, and a few
    steps on them alone halve the repeat's probability at the second slot while the line's unlisted moves gain."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(0)
    fens = ["4k3/8/8/8/8/8/8/4K3 b - - 0 1", "4k3/8/8/8/8/8/4P3/4K3 b - - 0 1"]  # short lines, a quick fit
    tok.padding_side = "right"  # as SFTTrainer's collator pads (the tokenizer's own side is left, for generation)

    def batch(moves):
        return tok([f"P: {fen} M: {moves} E: 0.3 0.3 0.3 0.3 0.3 B: e8e7" for fen in fens], padding=True,
                   return_tensors="pt")

    enc = batch("e8e7 e8e7 e8e7 e8e7 e8e7")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):  # teach the repeat by cross-entropy
        opt.zero_grad()
        logits = model(**enc).logits[:, :-1]
        F.cross_entropy(logits.reshape(-1, len(tok)), labels[:, 1:].reshape(-1), ignore_index=-100).backward()
        opt.step()
    model.eval()  # no dropout: the terms are compared with a hand computation
    right = ["e8e7", "e8d7", "e8f7", "e8d8", "e8f8"]
    ids = batch(" ".join(right))["input_ids"][:1]  # the first position, where the model writes e8e7 five times
    e8e7, *unlisted = tok.convert_tokens_to_ids(right)
    second = tok(f"P: {fens[0]} M: e8e7 ", return_tensors="pt")["input_ids"]  # the model's own list so far

    def at_second_slot():
        with torch.no_grad():
            p = torch.softmax(model(input_ids=second).logits[0, -1], -1)
        return float(p[e8e7]), float(p[unlisted].sum())

    repeat_before, owed_before = at_second_slot()
    assert repeat_before > 0.5
    own = _script().OwnLists(tok, target=0.2, unlikelihood=5.0)
    term = own(model, ids)
    assert own.last["repeat_share"] == 1.0 and own.last["list_len"] == 5
    prompts = own.prompts(ids)
    # By hand: five slots per list; slot k owes the line's moves but e8e7 (k > 1) and charges e8e7 (k > 1).
    with torch.no_grad():
        written = tok(" e8e7 e8e7 e8e7 e8e7 e8e7", add_special_tokens=False)["input_ids"]
        target, unlikely = [], []
        for prompt, _ in prompts:
            logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + written])).logits[0], -1)
            for k in range(5):
                pos = len(prompt) + 2 * k
                owed = tok.convert_tokens_to_ids(right if k == 0 else right[1:])
                target.append(-torch.logsumexp(logp[pos, owed], 0))
                if k:
                    unlikely.append(-torch.log1p(-logp[pos, e8e7].exp()))
    expected = 0.2 * torch.stack(target).mean() + 5.0 * torch.stack(unlikely).mean()
    assert torch.allclose(term, expected, rtol=1e-4), (term, expected)
    _steps_on(own, model, ids)
    repeat_after, owed_after = at_second_slot()
    assert repeat_after < 0.5 * repeat_before and owed_after > owed_before, (repeat_before, repeat_after)



def test_held_out_copies_drop_keeps_one_of_each_line_there_and_every_copy_in_sft(tmp_path):
    """The generator replays openings, so a line can be generated more than once; v2's evaluation A: rows are 47
    distinct prompts in 64. ``--held_out_copies drop`` keeps one of each line in the held-out splits (the quotas count
    distinct lines) and leaves the SFT split every copy; ``keep`` (the default, how v2 was built) keeps copies."""
    script = _script()
    fens = [f"8/8/8/8/8/8/{i}p{6 - i}/K6k w - - 0 1" for i in range(7)]
    lines = []
    for i, fen in enumerate(fens):  # every position: one P: line, and its A: line twice at even i
        lines += [f"P: {fen} M: a1a2 E: 0.1 B: a1a2"] + [f"A: {fen}+a1a2+a1a2+{fen}+0.001+0+0"] * (2 - i % 2)
    splits = {}
    for copies in ("keep", "drop"):
        args = script.parse_args(["--n_eval", "8", "--n_grpo", "8", "--held_out_copies", copies,
                                  "--work", str(tmp_path / copies)])
        (tmp_path / copies).mkdir()
        script.data_cache(args, tmp_path / copies).write_text("\n".join(lines) + "\n")
        splits[copies] = script.make_data(args, tmp_path / copies)
        # Every generated line is in some split, as often as it was generated or (drop, held out) once.
        assert set(sum(splits[copies].values(), [])) == set(lines)
    kept_held = splits["keep"]["eval"] + splits["keep"]["grpo"]
    assert len(kept_held) > len(set(kept_held))  # the case the option is for
    dropped = splits["drop"]
    for name in ("eval", "grpo"):
        assert len(dropped[name]) == len(set(dropped[name])) > 0, name
    assert all(dropped["sft"].count(line) == lines.count(line) for line in dropped["sft"])


def test_micro_batches_give_the_whole_batchs_loss_and_gradient(tmp_path):
    """--micro_batches 3 runs a batch as three length-sorted parts, each cut to its own longest line: the training
    step's loss and every parameter's gradient equal the whole batch's (unlikelihood term included), and the parts
    really are narrower than the batch."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    script = _script()
    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    for module in model.modules():  # no dropout: the two runs must see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    lines = (REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld" / "eval_positions.txt").read_text().splitlines()
    rows = [x for x in lines if x.startswith("P:")][:4] + [x for x in lines if x.startswith("A:")][:3]
    data = script.to_pairs(rows)

    def step(micro_batches):
        config = SFTConfig(output_dir=str(tmp_path / f"out{micro_batches}"), use_cpu=True, report_to="none",
                           per_device_train_batch_size=len(rows), completion_only_loss=False, max_length=256)
        trainer = script._unlikelihood_trainer(SFTTrainer)(
            script.RepeatUnlikelihood(tok, 1.0), None, model=copy.deepcopy(model), args=config, train_dataset=data,
            processing_class=tok, micro_batches=micro_batches)
        batch = next(iter(trainer.get_train_dataloader()))
        n = (batch["labels"][:, 1:] != -100).sum()
        loss = trainer.training_step(trainer.model, batch, num_items_in_batch=n)
        grads = {k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None}
        return batch, loss, grads, trainer.loss_fn.last_unlikelihood

    batch, whole, whole_grads, whole_ul = step(1)
    parts = script.length_sorted_chunks(batch, 3)
    widths = [c["input_ids"].shape[1] for c in parts]
    assert len(parts) == 3 and widths == sorted(widths) and widths[0] < batch["input_ids"].shape[1]
    assert sorted(sum((c["attention_mask"].sum(1).tolist() for c in parts), [])) == \
        sorted(batch["attention_mask"].sum(1).tolist())
    _, split, split_grads, split_ul = step(3)
    assert torch.allclose(split, whole, rtol=1e-5), (split, whole)
    assert whole_ul > 0 and abs(split_ul - whole_ul) < 1e-5, (split_ul, whole_ul)
    assert whole_grads.keys() == split_grads.keys() and whole_grads
    for k in whole_grads:
        assert torch.allclose(split_grads[k], whole_grads[k], rtol=1e-4, atol=1e-7), k


def test_micro_batches_arguments_are_checked(tmp_path):
    proc = build(tmp_path, "bad", "--micro_batches", "9")
    assert proc.returncode != 0 and "--micro_batches (9) must be at most --batch_size (8)" in proc.stderr
    proc = build(tmp_path, "zero", "--micro_batches", "0")
    assert proc.returncode != 0 and "--micro_batches must be at least 1, got 0" in proc.stderr


def test_own_evals_slots_owe_an_eval_per_listed_move_then_b(tmp_path):
    import torch
    from transformers import AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    tok = AutoTokenizer.from_pretrained(build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32)))
    own = _script().OwnLists(tok, evals=1.0)
    assert own.max_new >= 64  # the greedy generation runs on through E:
    prompt = tok("P: 4k3/8/8/8/8/8/8/4K3 b - - 0 1 M:")["input_ids"]
    digit, b = own.eval_start, [own.b]

    def walk(written):
        ids = tok(written, add_special_tokens=False)["input_ids"]
        slots, fields = own.eval_slots(torch.tensor([prompt + ids]), len(prompt))
        spaces = [len(prompt) + i for i, t in enumerate(ids) if t == own.space][4:]  # the spaces after E:
        return [(j, owed) for _, j, owed in slots], fields[0], spaces

    # Three moves, three evals, then B: three spaces owe an eval, the fourth owes B, and the field is well-formed.
    slots, ok, spaces = walk(" e8e7 e8d7 e8f7 E: 0.1 -0.25 0.0 B: e8e7")
    assert slots == [(spaces[0], digit), (spaces[1], digit), (spaces[2], digit), (spaces[3], b)] and ok is True
    # Four evals for three moves (the no-dropout build's failure): the space before the fourth owes B.
    slots, ok, spaces = walk(" e8e7 e8d7 e8f7 E: 0.3 0.3 0.3 0.3 B: e8e7")
    assert slots == [(spaces[0], digit), (spaces[1], digit), (spaces[2], digit), (spaces[3], b)] and ok is False
    # One eval for three moves: the space where B came early owes an eval, and the walk ends there.
    slots, ok, spaces = walk(" e8e7 e8d7 e8f7 E: 0.3 B: e8e7")
    assert slots == [(spaces[0], digit), (spaces[1], digit)] and ok is False
    # No E: after the list (or no list): nothing owed here, and the field is not judged.
    assert own.eval_slots(torch.tensor([prompt + tok(" e8e7 B: e8e7", add_special_tokens=False)["input_ids"]]),
                          len(prompt)) == ([], [None])


def test_own_evals_term_teaches_a_model_to_stop_its_e_field_at_its_move_count(tmp_path):
    """A model taught to write four evals for three moves: the term equals its definition on its greedy line, and a
    few steps on it alone raise P(B) where the fourth eval began."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(0)
    fen = "4k3/8/8/8/8/8/8/4K3 b - - 0 1"
    tok.padding_side = "right"
    enc = tok([f"P: {fen} M: e8e7 e8d7 e8f7 E: 0.3 0.3 0.3 0.3 B: e8e7"], return_tensors="pt")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):  # teach the miscount by cross-entropy
        opt.zero_grad()
        logits = model(**enc).logits[:, :-1]
        F.cross_entropy(logits.reshape(-1, len(tok)), enc["input_ids"][:, 1:].reshape(-1)).backward()
        opt.step()
    model.eval()
    ids = tok([f"P: {fen} M: e8e7 e8d7 e8f7 E: 0.1 0.2 0.3 B: e8e7"], return_tensors="pt")["input_ids"]
    third = tok(f"P: {fen} M: e8e7 e8d7 e8f7 E: 0.3 0.3 0.3 ", return_tensors="pt")["input_ids"]

    def p_b_after_three():
        with torch.no_grad():
            return float(torch.softmax(model(input_ids=third).logits[0, -1], -1)[own.b])

    own = _script().OwnLists(tok, evals=1.0)
    before = p_b_after_three()
    assert before < 0.5
    term = own(model, ids)
    assert own.last["eval_count_ok"] == 0.0 and own.last["list_len"] == 3
    with torch.no_grad():  # by hand: spaces after E: owe an eval, an eval, an eval, then B
        logp = torch.log_softmax(model(input_ids=third).logits[0], -1)
        spaces = [i for i, t in enumerate(third[0].tolist()) if t == own.space][-4:]
        owed = [own.eval_start] * 3 + [[own.b]]
        expected = -torch.stack([torch.logsumexp(logp[j, o], 0) for j, o in zip(spaces, owed)]).mean()
    assert torch.allclose(term, expected, rtol=1e-4), (term, expected)
    _steps_on(own, model, ids)
    assert p_b_after_three() > 2 * before, (before, p_b_after_three())


def test_a_completion_weight_weights_the_answer_tokens_in_training_only(tmp_path):
    """--a_completion_weight W: the completion of a P: line starts at its ``M``, of an A: line after the prompt's
    third ``+``; the training loss is the cross-entropy with the A: completion's terms times W (over the same token
    count; P: lines unweighted), the eval loss the plain one, and micro-batches still give the whole batch's loss.
    --p_completion_weight and --prompt_weight weight the P: completion and every prompt the same way."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    script = _script()
    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    p_prompt, p_answer = "P: 4k3/8/8/8/8/8/8/4K3 b - - 0 1 ", "M: e8e7 e8d7 E: 0.3 0.4 B: e8d7"
    a_prompt = "A: 4k3/8/8/8/8/8/8/4K3 w - - 0 1+e1e2+e1e2+"
    a_answer = "4k3/8/8/8/8/8/4K3/8 b - - 1 1+0.001+0+0"
    tok.padding_side = "right"
    enc = tok([p_prompt + p_answer, a_prompt + a_answer], padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    fn = script.RepeatUnlikelihood(tok, 0.0, a_completion_weight=3.0)
    n_prompt = [len(tok(x)["input_ids"]) for x in (p_prompt, a_prompt)]
    assert [fn.completion_start(r) for r in labels.tolist()] == n_prompt
    cut = tok("P: 8/8 w")["input_ids"]  # no M: (cut off): no completion
    assert fn.completion_start(cut) == len(cut)
    assert script.RepeatUnlikelihood(tok, 0.0).token_weights(labels) is None

    out = model(**enc)
    nll = F.cross_entropy(out.logits[:, :-1].reshape(-1, len(tok)), labels[:, 1:].reshape(-1), ignore_index=-100,
                          reduction="none").reshape(2, -1)
    w = torch.ones_like(nll)
    w[1, n_prompt[1] - 1:] = 3.0  # the A: line's; the target at row position t + 1 is scored at t
    n = (labels[:, 1:] != -100).sum()
    assert torch.allclose(fn(out, labels), (nll * w).sum() / n)
    assert torch.allclose(fn(out, labels, weighted=False), nll.sum() / n)
    assert fn(out, labels) > fn(out, labels, weighted=False)
    # The micro-batch path: two parts of the batch add up to the whole batch's weighted loss.
    parts = script.length_sorted_chunks({**enc, "labels": labels}, 2)
    split = sum(fn(model(input_ids=c["input_ids"], attention_mask=c["attention_mask"]), c["labels"],
                   num_items_in_batch=n) for c in parts)
    assert torch.allclose(split, fn(out, labels), rtol=1e-5)
    # --prompt_weight and --p_completion_weight: every line's prompt and the P: line's completion weighted too.
    both = script.RepeatUnlikelihood(tok, 0.0, a_completion_weight=2.0, p_completion_weight=3.0, prompt_weight=0.5)
    w = torch.full_like(nll, 0.5)
    w[0, n_prompt[0] - 1:], w[1, n_prompt[1] - 1:] = 3.0, 2.0
    assert torch.allclose(both(out, labels), (nll * w).sum() / n)
    assert torch.allclose(both(out, labels, weighted=False), nll.sum() / n)
    prompt_only = script.RepeatUnlikelihood(tok, 0.0, prompt_weight=0.5).token_weights(labels)
    assert prompt_only is not None and prompt_only[1, n_prompt[1] - 1:].eq(1).all()


def test_own_evals_from_starts_the_e_term_after_the_list_terms(tmp_path):
    """OwnLists(evals_start=S): before step S a call charges the M: list terms alone (a generation as short as
    without the E: term, no E: numbers logged); from S on the E: term joins them. The flag is checked."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    ids = tok(["P: 4k3/8/8/8/8/8/8/4K3 b - - 0 1 M: e8e7 e8d7 e8f7 E: 0.1 0.2 0.3 B: e8e7"],
              return_tensors="pt")["input_ids"]
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):  # a model that writes the line, so its greedy generation has an E: field to charge
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    model.eval()
    generated = []
    generate = model.generate
    model.generate = lambda **kw: generated.append(kw["max_new_tokens"]) or generate(**kw)
    own = _script().OwnLists(tok, target=1.0, evals=1.0, start=2, evals_start=5)
    lists_only = _script().OwnLists(tok, target=1.0, start=2)
    early = own(model, ids, step=4)
    assert "evals" not in own.last and "eval_count_ok" not in own.last and "target" in own.last
    assert torch.allclose(early, lists_only(model, ids, step=4))
    assert generated == [lists_only.max_new] * 2
    own(model, ids, step=5)
    assert "evals" in own.last and own.last["eval_count_ok"] == 1.0 and generated[-1] >= 64
    own(model, ids)  # no step given: every term
    assert "evals" in own.last

    proc = build(tmp_path, "no_evals", "--own_target", "1", "--own_evals_from", "3")
    assert proc.returncode != 0 and "--own_evals_from 3 has no E: term to start: give --own_evals" in proc.stderr
    proc = build(tmp_path, "bad_weight", "--a_completion_weight", "0")
    assert proc.returncode != 0 and "--a_completion_weight must be above 0, got 0.0" in proc.stderr
    proc = build(tmp_path, "bad_prompt_weight", "--prompt_weight", "0")
    assert proc.returncode != 0 and "--prompt_weight must be above 0, got 0.0" in proc.stderr


def test_move_squares_share_square_vectors_across_moves_and_fold_into_a_plain_gpt2(tmp_path):
    """MoveSquares: each move token's input embedding and output logit gain its from-, to- and promotion vectors
    (shared by every move with that square), other tokens nothing; gradients reach the shared vectors from any move;
    folding them into the tied embedding leaves a plain GPT-2 with the same logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    script = _script()
    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    enc = tok(["A: 4k3/8/8/8/8/8/8/4K3 w - - 0 1+e1e2+e1e2+", "P: 8/8 w M: e7e8q a1c4"], padding=True,
              return_tensors="pt")
    plain = model(**enc).logits.detach()
    wte = model.get_input_embeddings().weight.detach().clone()
    script.MoveSquares.attach(model, tok, seed=0)
    vocab, sq = tok.get_vocab(), model.move_squares.weight
    # Inputs: e1e2 reads its own row plus e1 (from), e2 (to); e7e8q adds q; "e" (a character) nothing.
    emb = model.get_input_embeddings()(torch.tensor([vocab["e1e2"], vocab["e7e8q"], vocab["e"]]))
    assert torch.allclose(emb[0], wte[vocab["e1e2"]] + sq[4] + sq[64 + 12])
    assert torch.allclose(emb[1], wte[vocab["e7e8q"]] + sq[52] + sq[64 + 60] + sq[128])
    assert torch.equal(emb[2], wte[vocab["e"]])
    hooked = model(**enc).logits
    assert not torch.allclose(hooked, plain)
    # A gradient through one move reaches the vectors of its squares only (and of every square it touches).
    hooked[0, -1, vocab["a2a4"]].backward()
    touched = set(torch.nonzero(sq.grad.abs().sum(1)).flatten().tolist())
    assert {8, 64 + 24} <= touched and 128 not in touched  # a2 as from-square, a4 as to-square; no promotion
    # Folded: a plain GPT-2 (no extra weights saved) computing the same logits.
    script.MoveSquares.fold(model)
    assert not hasattr(model, "move_squares")
    assert torch.allclose(model(**enc).logits, hooked.detach(), atol=1e-5)
    model.save_pretrained(tmp_path / "folded")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "folded")
    assert torch.allclose(again(**enc).logits, hooked.detach(), atol=1e-5)
    assert "move_squares.weight" not in again.state_dict()
    # Zero vectors (a continued model) start from the model's own function.
    fresh = AutoModelForCausalLM.from_pretrained(path)
    script.MoveSquares.attach(fresh, tok, seed=0, zero=True)
    assert torch.allclose(fresh(**enc).logits, plain)


def test_move_squares_build_resumes_with_its_vectors_and_ships_a_plain_model(tmp_path):
    """--move_squares in a build: checkpoints hold the shared vectors, a resumed run picks them up (so the folded
    model is the one trained), the packaged model has no extra weights and the card names the flag."""
    from safetensors import safe_open

    proc = build(tmp_path, "sq", "--move_squares")
    assert proc.returncode == 0, proc.stderr[-3000:]
    work, out = tmp_path / "sq" / "work", tmp_path / "sq" / "out"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not any("move_squares" in k for k in f.keys())
    with safe_open(str(work / "sft" / "checkpoint-3" / "model.safetensors"), "pt") as f:
        assert "move_squares.weight" in f.keys()
    assert "(`--move_squares`, folded into the embedding)" in (out / "README.md").read_text()
    first = (out / "model.safetensors").read_bytes()
    # Rerun the SFT stage from its last checkpoint (step 3 of 3): the vectors come from it, not a fresh draw.
    (work / "sft_info.json").unlink()
    proc = build(tmp_path, "sq", "--move_squares", "--stage", "sft")
    assert proc.returncode == 0 and "resuming from" in proc.stdout, proc.stderr[-3000:]
    with safe_open(str(work / "final" / "model.safetensors"), "pt") as f, \
            safe_open(str(out / "model.safetensors"), "pt") as g:
        assert (f.get_tensor("transformer.wte.weight") == g.get_tensor("transformer.wte.weight")).all()
    # The finish stage packages the resumed run's model again: the same bytes as the first build shipped.
    (out / "model.safetensors").unlink()
    proc = build(tmp_path, "sq", "--move_squares", "--stage", "finish")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert first == (out / "model.safetensors").read_bytes()


@pytest.mark.parametrize("optimizer", ["sgd", "adamw_fused", "adamw_foreach"])
def test_move_squares_cached_weight_follows_every_update(tmp_path, optimizer):
    """Without grad (greedy generation, eval) the summed weight is computed once and reused, and an optimizer step on
    the embedding or on the square vectors is seen by the next call, with every optimizer the Trainer may use: a
    fused AdamW step (the Trainer's default, ``adamw_torch_fused``) changes the weights without bumping their
    ``_version``, and a cache keyed on that alone served one build's greedy own-list passes a stale embedding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    script = _script()
    path = build_tiny_gpt2(tmp_path / "m", TinyGPT2Spec(tokenizer="move", n_embd=32, seed=0))
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    script.MoveSquares.attach(model, tok, seed=0)
    enc = tok(["P: 8/8 w M: e2e4 e7e8q"], return_tensors="pt")
    opt = {"sgd": lambda ps: torch.optim.SGD(ps, lr=1.0),
           "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True),
           "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=True)}[optimizer](list(model.parameters()))
    for params in ([model.move_squares.weight], [model.get_input_embeddings().weight]):
        with torch.no_grad():
            before = model(**enc).logits
            assert torch.equal(model(**enc).logits, before)  # the cached weight gives the same logits
        loss = model(**enc).logits[0, -1, tok.get_vocab()["e2e4"]]
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            if all(p is not q for q in params):
                p.grad = None
        opt.step()
        with torch.no_grad():
            after = model(**enc).logits
        assert not torch.allclose(after, before)
        assert torch.allclose(after, model(**enc).logits.detach())  # the same as with grad, after the update


def test_sft_a_mix_draws_rare_moves_more_and_keeps_the_mixs_size(tmp_path):
    """--sft_a_mix sqrt and balanced draw as many A: lines as random does, every P: line, in file order, and give a
    move's quota by its A: line count, so a rare move keeps a larger share of its lines than a common one."""
    script = _script()
    fen = "8/8/8/8/8/8/8/K6k w - - 0 1"
    counts = {"e2e4": 300, "g1f3": 60, "h1g1": 6}
    a_lines = [f"A: {fen}+{m}+{m} {i}+{fen}+0.001+0+0" for m, n in counts.items() for i in range(n)]
    a_lines = [a_lines[i] for i in random.Random(0).sample(range(len(a_lines)), len(a_lines))]
    lines = [f"P: {fen} {i} M: a1a2 E: 0.1 B: a1a2" for i in range(40)]
    lines = [x for pair in zip(lines, a_lines) for x in pair] + a_lines[40:]
    mixes = {mix: script.sft_mix(lines, 0.5, 7, mix) for mix in ("random", "sqrt", "balanced")}
    for mix, kept in mixes.items():
        assert [x for x in lines if x in kept] == kept, mix  # file order
        assert sum(x.startswith("P:") for x in kept) == 40 and sum(x.startswith("A:") for x in kept) == 40, mix
        assert len(set(kept)) == len(kept), mix
    for mix, power in (("sqrt", 0.5), ("balanced", 0.0)):
        drawn = {m: sum(script.a_move(x) == m for x in mixes[mix]) for m in counts}
        assert drawn == script.a_quotas(counts, 40, power), mix
        share = {m: drawn[m] / counts[m] for m in counts}
        assert share["h1g1"] > share["g1f3"] > share["e2e4"], (mix, drawn)
    assert script.a_quotas(counts, 40, 0.0) == {"e2e4": 17, "g1f3": 17, "h1g1": 6}
    # Seeded: the same seed draws the same lines, another seed others (the quotas stay).
    assert script.sft_mix(lines, 0.5, 7, "sqrt") == mixes["sqrt"] != script.sft_mix(lines, 0.5, 8, "sqrt")
    # The SFT stage trains on the mix the arguments name; random is every shipped build's draw.
    args = script.parse_args(["--sft_a_mix", "sqrt", "--seed", "7", "--work", str(tmp_path)])
    assert script.trained_mix(args, lines) == mixes["sqrt"]
    assert script.parse_args(["--work", str(tmp_path)]).sft_a_mix == "random"
    assert script.SFT_ARG_DEFAULTS["sft_a_mix"] == "random" and "sft_a_mix" in script.SFT_ARGS


def test_sft_a_distinct_draws_one_copy_of_each_a_line(tmp_path):
    """The generator replays lines (two ending lines are 6% of the default build's SFT A: lines): --sft_a_distinct
    draws the A: lines from one copy of each, with any --sft_a_mix, and keeps every P: line."""
    script = _script()
    fen = "8/8/8/8/8/8/8/K6k w - - 0 1"
    ending = f"A: {fen}+a1a8+a1a8+{fen}+0.5+1+0"
    a_lines = [ending] * 30 + [f"A: {fen}+e2e4+{i}+{fen}+0.001+0+0" for i in range(20)]
    lines = [f"P: {fen} {i} M: a1a2 E: 0.1 B: a1a2" for i in range(10)] + a_lines
    for mix in ("random", "sqrt", "balanced"):
        plain = script.sft_mix(lines, 0.5, 3, mix)
        assert plain.count(ending) > 1, mix  # the case the flag is for
        kept = script.sft_mix(lines, 0.5, 3, mix, a_distinct=True)
        a_kept = [x for x in kept if x.startswith("A:")]
        assert len(a_kept) == len(set(a_kept)) == 10 and sum(x.startswith("P:") for x in kept) == 10, mix
    # Fewer distinct A: lines than the share asks for: all of them, and the mix is smaller, not padded with copies.
    small = [f"P: {fen} {i} M: a1a2 E: 0.1 B: a1a2" for i in range(10)] + [ending] * 30
    assert script.sft_mix(small, 0.5, 3, "sqrt", a_distinct=True) == small[:11]
    args = script.parse_args(["--sft_a_distinct", "--seed", "3", "--work", str(tmp_path)])
    assert script.trained_mix(args, lines) == script.sft_mix(lines, 0.5, 3, "random", True)
    assert script.SFT_ARG_DEFAULTS["sft_a_distinct"] is False and "sft_a_distinct" in script.SFT_ARGS
