"""scripts/build_tiny_model.py: a rebuild with the same seed is identical, stages run out of order say what to do, the
own-list terms are what they say, and the defaults are the packaged model's command.

Run at toy size (a few dozen lines, a one-layer model, three SFT steps): the claim that a rebuild reproduces the
shipped model rests on every stage being seeded and deterministic, which this checks end to end.
"""

import json

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
    # Trained with v3's GELU (gelu_new), packaged under the fused kernel's name for the same function.
    assert json.loads((first / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    assert json.loads((tmp_path / "first" / "work" / "final" / "config.json").read_text())["activation_function"] \
        == "gelu_new"
    assert "(`gelu_new` in training;" in card and "dropout 0.1;" in card



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
    proc = run_cli([venv_bin("python"), SCRIPT, *TOY, "--own_from", "5", "--stage", "finish",
                    "--work", str(tmp_path / "early" / "work"), "--out", str(tmp_path / "early" / "out")])
    assert proc.returncode != 0 and "--own_from 5 (the SFT stage used 2200)" in proc.stderr



def _script():
    return load_script(SCRIPT)



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




def test_held_out_splits_keep_one_copy_of_each_line_and_sft_every_copy(tmp_path):
    """The generator replays openings, so a line can be generated more than once: the held-out splits keep one copy
    of each line (their quotas count distinct lines), and the SFT split every copy."""
    script = _script()
    fens = [f"8/8/8/8/8/8/{i}p{6 - i}/K6k w - - 0 1" for i in range(7)]
    lines = []
    for i, fen in enumerate(fens):  # every position: one P: line, and its A: line twice at even i
        lines += [f"P: {fen} M: a1a2 E: 0.1 B: a1a2"] + [f"A: {fen}+a1a2+a1a2+{fen}+0.001+0+0"] * (2 - i % 2)
    args = script.parse_args(["--n_eval", "8", "--n_grpo", "8", "--work", str(tmp_path)])
    script.data_cache(args, tmp_path).write_text("\n".join(lines) + "\n")
    splits = script.make_data(args, tmp_path)
    assert set(sum(splits.values(), [])) == set(lines)  # every generated line is in some split
    for name in ("eval", "grpo"):
        assert len(splits[name]) == len(set(splits[name])) > 0, name
    assert any(lines.count(line) == 2 for line in splits["eval"] + splits["grpo"])  # a copy was dropped there
    assert all(splits["sft"].count(line) == lines.count(line) for line in splits["sft"])


def test_defaults_are_the_packaged_models_command():
    """Run with no option, the builder rebuilds v3 (into build/, not the package): its defaults are the options the
    packaged model's build_info.json recorded."""
    from rookgrpo.assets import TINY_ROOKWORLD

    args = vars(_script().parse_args([]))
    recorded = json.loads((TINY_ROOKWORLD / "build_info.json").read_text())["args"]
    differ = {k: (args[k], v) for k, v in recorded.items() if k in args and k not in ("out", "work") and args[k] != v}
    assert not differ, differ
    assert "assets" not in str(args["out"])
