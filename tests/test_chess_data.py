"""RookWorld data: loading the hub layout from local files, generation, evaluation metrics, and the CLI."""

import json
from collections import Counter

import chess
import pytest

from conftest import SHARED_DATA, run_cli, venv_bin
from rookgrpo.chess.data import classify_move, generate, load_rookworld, rank_moves, rookworld_row
from rookgrpo.chess.engine import EngineSettings, get_pool
from rookgrpo.chess.formats import parse_env, parse_policy
from rookgrpo.errors import ConfigError
from rookgrpo.chess.evaluate import score


def test_hub_layout_loads_from_local_files_and_gets_the_a_prefix(tmp_path, generated_lines):
    from datasets import Dataset

    # Hub rows: one `text` column; A: rows without their prefix.
    hub_text = [l[3:] if l.startswith("A: ") else l for l in generated_lines]
    Dataset.from_dict({"text": hub_text}).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in hub_text))
    (tmp_path / "train.txt").write_text("\n".join(hub_text) + "\n")
    for name in ("train.parquet", "train.jsonl", "train.txt"):
        ds = load_rookworld(str(tmp_path / name))
        assert ds["text"] == generated_lines
        assert set(ds["task"]) == {"P", "A"}
        for row in ds:
            assert row["prompt"] + row["completion"] == row["text"]
            assert chess.Board(row["fen"]).is_valid()
    assert load_rookworld(str(tmp_path / "train.txt"), tasks=["A"])["task"] == ["A"] * sum(
        l.startswith("A:") for l in generated_lines)


def test_validation_file_loads_as_policy_rows():
    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    ds = load_rookworld(str(path))
    assert len(ds) == 500 and set(ds["task"]) == {"P"}
    assert all(c.startswith(" M: ") for c in ds["completion"])


def test_generation_is_deterministic_labels_engine_best_and_covers_special_cases(generated_lines, engine_settings):
    again = generate(120, seed=11, settings=EngineSettings(depth=6, workers=1), progress=False)
    assert again == generated_lines  # same seed, different worker count
    assert generate(20, seed=12, settings=engine_settings, progress=False) != generated_lines[:20]
    p_lines = [l for l in generated_lines if l.startswith("P:")]
    a_lines = [l for l in generated_lines if l.startswith("A:")]
    assert 0.2 < len(a_lines) / len(generated_lines) < 0.35
    assert len({parse_policy(l).fen for l in p_lines}) == len(p_lines)  # distinct positions
    pool = get_pool(engine_settings)
    for line in p_lines[:20]:
        parsed = parse_policy(line)
        assert parsed.ok and parsed.best == pool.analyse(parsed.fen).best  # the engine's best, for both colours
        assert sorted(parsed.moves) == sorted(pool.analyse(parsed.fen).moves)
    kinds = Counter()
    for line in a_lines:
        env = parse_env(line)
        board = chess.Board(env.fen)
        move = chess.Move.from_uci(env.move)
        kinds["illegal" if move not in board.legal_moves else classify_move(board, move)] += 1
        assert env.history.split()[-1] == env.move and len(env.history.split()) <= 10
    assert set(kinds) == {"move", "illegal", "castling", "en_passant", "promotion", "checkmate", "stalemate"}
    # Whole-file sanity: both colours to move among the policy rows.
    assert {parse_policy(l).fen.split()[1] for l in p_lines} == {"w", "b"}


def test_rank_order_puts_the_engine_best_first_and_keeps_every_move_with_its_eval(generated_lines):
    ranked = [rank_moves(line) for line in generated_lines]
    moved = 0
    for before, after in zip(generated_lines, ranked):
        if before.startswith("A:"):
            assert after == before
            continue
        b, a = parse_policy(before), parse_policy(after)
        assert a.ok and (a.fen, a.best) == (b.fen, b.best)
        assert sorted(zip(a.moves, a.eval_texts)) == sorted(zip(b.moves, b.eval_texts))  # pairs kept together
        assert a.moves[0] == a.best and a.evals[1:] == sorted(a.evals[1:], reverse=True)
        assert rank_moves(after) == after
        moved += after != before
    assert moved > 0.5 * sum(l.startswith("P:") for l in generated_lines)  # generation writes random order
    broken = "P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1b1 a1a2 E: 0.0 B: a1a2"
    assert rank_moves(broken) == broken  # a line that does not parse is left as it was


def test_max_plies_keeps_every_position_in_the_opening(engine_settings):
    lines = generate(40, seed=5, settings=engine_settings, max_plies=10, progress=False)
    assert len(lines) == 40
    # P: positions come from plies 4..9: the fullmove number of ply k is k // 2 + 1, so at most 5.
    p_fens = [parse_policy(l).fen for l in lines if l.startswith("P:")]
    assert p_fens and max(int(f.split()[5]) for f in p_fens) <= 5
    assert min(int(f.split()[5]) for f in p_fens) >= 3
    with pytest.raises(ConfigError, match="max_plies"):
        generate(10, seed=5, settings=engine_settings, max_plies=5, progress=False)


def test_evaluation_metrics_on_reference_and_broken_completions(generated_lines, engine_settings):
    rows = [rookworld_row(l) for l in generated_lines]
    prompts, tasks = [r["prompt"] for r in rows], [r["task"] for r in rows]
    perfect = score(prompts, [r["completion"] for r in rows], tasks, engine_settings)
    for key in ("best_move_accuracy", "top5_accuracy", "legal_move_rate", "format_rate", "best_move_reward",
                "env_exact_accuracy", "env_reward"):
        assert perfect[key] == pytest.approx(1.0), key
    broken = score(prompts, ["junk"] * len(rows), tasks, engine_settings)
    assert broken["best_move_accuracy"] == broken["format_rate"] == broken["env_exact_accuracy"] == 0.0
    assert perfect["n_policy"] + perfect["n_env"] == len(rows)
    assert broken["top_move_share"] == 0.0 and broken["top_move"] is None  # nothing parsed, nothing collapsed
    # One generic move for every position: its share is 1 however good or bad the move is.
    p_rows = [r for r in rows if r["task"] == "P"]
    collapsed = score([r["prompt"] for r in p_rows], [r["completion"].split(" B: ")[0] + " B: a2a3" for r in p_rows],
                      ["P"] * len(p_rows), engine_settings)
    assert collapsed["top_move"] == "a2a3" and collapsed["top_move_share"] == 1.0 and collapsed["distinct_moves"] == 1
    assert perfect["top_move_share"] < 0.5 and perfect["distinct_moves"] > 1


def test_evaluation_tells_a_copied_board_from_a_broken_one(generated_lines, engine_settings):
    """chess_env pays both 0 on a legal move; the evaluation counts them apart, so a run that trades one for the
    other (GRPO on v3 doubled the broken boards) shows it."""
    rows = [r for r in (rookworld_row(l) for l in generated_lines) if r["task"] == "A"]
    prompts, truths = [r["prompt"] for r in rows], [r["completion"] for r in rows]
    moved = [parse_env(p).fen.split()[0] != t.split()[0] for p, t in zip(prompts, truths)]
    assert 0 < sum(moved) < len(rows)  # legal moves and illegal ones (whose right answer is the board unchanged)

    def evaluate_answers(answers):
        return score(prompts, answers, ["A"] * len(rows), engine_settings)

    right = evaluate_answers(truths)
    assert right["env_copied_rate"] == right["env_broken_rate"] == 0.0
    copied = evaluate_answers([parse_env(p).fen + "+0.001+0+0" for p in prompts])
    assert copied["per_row"]["env_copied_rate"] == [float(m) for m in moved]
    assert copied["env_broken_rate"] == 0.0
    # The first two ranks run together: the squares read in order are the right ones, but it is not a board.
    broken = evaluate_answers([t.replace("/", "", 1) for t in truths])
    assert broken["env_broken_rate"] == 1.0 and broken["env_copied_rate"] == 0.0
    for kind in (copied, broken):
        assert all(r == 0.0 for r, m in zip(kind["per_row"]["env_reward"], moved) if m)


def test_cli_generate_and_evaluate_end_to_end(tmp_path):
    out = tmp_path / "gen.txt"
    gen = run_cli([venv_bin("rookgrpo"), "data", "generate", "--tasks", "P,A", "--n", "24", "--out", str(out),
                   "--depth", "5", "--workers", "2", "--seed", "3"])
    assert gen.returncode == 0, gen.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 24 and all(rookworld_row(l) for l in lines)
    result = tmp_path / "eval.json"
    ev = run_cli([venv_bin("rookgrpo"), "evaluate", "--model", "rookgrpo/tiny-random", "--data", str(out),
                  "--depth", "5", "--out", str(result)])
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "best-move accuracy" in ev.stdout
    metrics = json.loads(result.read_text())
    assert metrics["n_policy"] + metrics["n_env"] == 24
    assert 0.0 <= metrics["legal_move_rate"] <= 1.0 and "best_move_accuracy_se" in metrics
    # --baseline takes an earlier evaluation or a model's build_info.json (metrics under "eval") and prints the
    # change per metric.
    build_info = tmp_path / "build_info.json"
    shifted = {**metrics, "format_rate": metrics["format_rate"] + 0.5}
    build_info.write_text(json.dumps({"command": "...", "eval": shifted}))
    for baseline in (result, build_info):
        cmp = run_cli([venv_bin("rookgrpo"), "evaluate", "--model", "rookgrpo/tiny-random", "--data", str(out),
                       "--depth", "5", "--out", str(tmp_path / "again.json"), "--baseline", str(baseline)])
        assert cmp.returncode == 0, cmp.stderr[-3000:]
        comparison = cmp.stdout.split("compared with")[1]
        row = next(l for l in comparison.splitlines() if l.startswith("format rate"))
        change = float(row.split()[-2])
        assert change == pytest.approx(-0.5 if baseline == build_info else 0.0, abs=1e-3), row


def test_comparison_pairs_the_rows_of_the_same_prompts():
    from rookgrpo.chess.evaluate import format_comparison, paired

    def ev(rows, sha="same"):
        return {"best_move_accuracy": sum(rows) / len(rows), "best_move_accuracy_se": 0.25, "n_policy": 4, "n_env": 0,
                "per_row": {"best_move_accuracy": rows}, "prompts_sha1": sha}

    before, after = ev([1, 0, 1, 0]), ev([1, 1, 1, 0])
    # Row differences [0, 1, 0, 0]: mean 0.25, standard error 0.25; unpaired, the two 0.25 errors add to 0.354.
    assert paired(before, after, "best_move_accuracy") == pytest.approx((0.25, 0.25, "paired"))
    diff, se, how = paired(before, ev([1, 1, 1, 0], sha="other prompts"), "best_move_accuracy")
    assert how == "independent" and se == pytest.approx(0.3536, abs=1e-4)
    assert format_comparison(before, after).endswith("paired by position)")
    # A model's build_info.json has no per-row values: the comparison says it treated the two as independent.
    legacy = {k: v for k, v in before.items() if k != "per_row"}
    assert "treated as independent" in format_comparison(legacy, after)


def test_the_evaluation_keeps_every_answer_and_names_the_format_failures_a_change_adds(generated_lines,
                                                                                    engine_settings):
    """GRPO lowered greedy format by one to three answers in 192 and the evaluation kept pass/fail only, so what the
    new failures were went unmeasured: the answers are kept, counted by kind, and the comparison lists the kinds."""
    from rookgrpo.chess.evaluate import PER_ROW_KEYS, format_comparison, format_failure_changes, format_table

    rows = [rookworld_row(l) for l in generated_lines]
    p_rows = [r for r in rows if r["task"] == "P"][:4]
    a_row = next(r for r in rows if r["task"] == "A")
    prompts = [a_row["prompt"]] + [r["prompt"] for r in p_rows]  # an A: row first: P: answers map by task
    right = [r["completion"] for r in p_rows]
    line = parse_policy(" " + right[1])  # its first move again in place of its last (or twice if it lists one)
    moves, evals = (line.moves[:-1], line.eval_texts[:-1]) if len(line.moves) > 1 else (line.moves, line.eval_texts)
    repeated = f" M: {' '.join(moves + line.moves[:1])} E: {' '.join(evals + line.eval_texts[:1])} B: {line.best}"
    before = score(prompts, [a_row["completion"], right[0], right[1], right[2], "junk"], ["A"] + ["P"] * 4,
                   engine_settings)
    after = score(prompts, [a_row["completion"], right[0], repeated, " M: E: B:", right[3]], ["A"] + ["P"] * 4,
                  engine_settings)
    assert after["completions"] == {"P": [right[0], repeated, " M: E: B:", right[3]], "A": [a_row["completion"]]}
    assert after["format_failures"] == {"M: repeated move": 1, "M: no moves": 1, "B: missing move": 1}
    assert before["format_failures"] == {"M: missing": 1, "E: missing": 1, "B: missing move": 1}
    assert "ill-formed P: answers by kind: M: repeated move (1), M: no moves (1), B: missing move (1)" in \
        format_table(after)
    changes = format_failure_changes(before, after)
    assert changes == {"broke": [1, 2], "fixed": [3],
                       "broke_kinds": {"M: repeated move": 1, "M: no moves": 1, "B: missing move": 1}}
    text = format_comparison(before, after)
    assert "P: answers well-formed before, ill-formed after: 2; after's errors: M: repeated move (1)" in text
    assert "P: answers ill-formed before, well-formed after: 1" in text
    # A summary leaves the answers out; without them (an older evaluation) the comparison has no such lines.
    assert "completions" in PER_ROW_KEYS
    old = {k: v for k, v in after.items() if k != "completions"}
    assert format_failure_changes(before, old) is None and "ill-formed after" not in format_comparison(before, old)


def test_copies_of_a_prompt_count_once_in_the_errors(generated_lines, engine_settings):
    """The packaged held-out file holds some A: lines 7 times (a generator replaying an opening writes the same line
    again). Greedy decoding answers every copy alike, so copies must not shrink a standard error or inflate a z."""
    from rookgrpo.chess.evaluate import format_comparison, format_table, paired

    rows = [rookworld_row(l) for l in generated_lines]
    a_rows = [r for r in rows if r["task"] == "A"][:6]
    assert len({r["prompt"] for r in a_rows}) == 6
    # Half right (the reference), half wrong (junk): a spread, so the error is not zero.
    answers = [r["completion"] if i % 2 else "junk" for i, r in enumerate(a_rows)]
    once = score([r["prompt"] for r in a_rows], answers, ["A"] * 6, engine_settings)
    thrice = score([r["prompt"] for r in a_rows] * 3, answers * 3, ["A"] * 18, engine_settings)
    assert once["env_exact_accuracy"] == thrice["env_exact_accuracy"] == 0.5
    assert once["env_exact_accuracy_se"] > 0
    assert thrice["env_exact_accuracy_se"] == pytest.approx(once["env_exact_accuracy_se"])
    assert thrice["n_env"] == 18 and thrice["n_env_distinct"] == 6
    assert "A: rows 18 (6 distinct)" in format_table(thrice) and "A: rows 6;" in format_table(once)
    # Paired: one prompt copied 3 times flips right; unclustered, its copies would look like 3 independent gains.
    prompts = [r["prompt"] for r in a_rows] + [a_rows[0]["prompt"]] * 2
    before = score(prompts, ["junk"] * 8, ["A"] * 8, engine_settings)
    right = a_rows[0]["completion"]
    after = score(prompts, [right] + ["junk"] * 5 + [right] * 2, ["A"] * 8, engine_settings)
    diff, se, how = paired(before, after, "env_exact_accuracy")
    assert how == "paired" and diff == pytest.approx(3 / 8)
    # Cluster-robust error of row differences [1, 0, 0, 0, 0, 0, 1, 1] over 6 prompts: residual 3 - 3 * 3/8 on the
    # copied prompt and -3/8 on each of the other 5.
    expected = (6 / 5 * ((3 - 9 / 8) ** 2 + 5 * (3 / 8) ** 2)) ** 0.5 / 8
    assert se == pytest.approx(expected)
    naive = ((3 * (5 / 8) ** 2 + 5 * (3 / 8) ** 2) / 7 / 8) ** 0.5  # the plain error, rows taken as independent
    assert se > 1.5 * naive
    # An evaluation written before clusters were recorded pairs with a new one on the new one's clusters.
    legacy = {k: v for k, v in before.items() if k != "per_row_cluster"}
    assert paired(legacy, after, "env_exact_accuracy")[1] == pytest.approx(expected)
    assert "A: rows 8 (6 distinct)" in format_comparison(before, after)


def test_evaluate_runs_on_a_gpt2_bpe_model_with_rookworld_layout(tmp_path, engine_settings):
    """RookWorld-LM-124M's shape (GPT-2, byte-level BPE, padded P: lines), built locally at toy size."""
    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from rookgrpo.chess.evaluate import evaluate

    lines = path.read_text().splitlines()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_head=2, n_embd=32, n_positions=256,
                                       eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    metrics = evaluate(str(tmp_path / "m"), str(path), n=8, settings=engine_settings, progress=False)
    assert metrics["n_policy"] == 8 and metrics["n_env"] == 0
    assert 0 < metrics["max_new_tokens"] < 120  # BPE: far fewer tokens than characters
    assert 0.0 <= metrics["best_move_reward"] <= 1.0


def test_sampled_evaluation_is_seeded_and_differs_from_greedy(tmp_path, generated_lines, engine_settings):
    from rookgrpo.chess.evaluate import evaluate, format_table

    data = tmp_path / "lines.txt"
    data.write_text("\n".join(generated_lines[:8]) + "\n")

    def completions(**kw):
        metrics = evaluate("rookgrpo/tiny-random", str(data), settings=engine_settings, progress=False, **kw)
        return metrics, [s["completion"] for s in metrics["samples"]]

    greedy, greedy_text = completions()
    sampled, sampled_text = completions(temperature=1.0, seed=3)
    _, again = completions(temperature=1.0, seed=3)
    _, other_seed = completions(temperature=1.0, seed=4)
    assert sampled_text == again and sampled_text != other_seed and sampled_text != greedy_text
    assert "sampled at T=1.0, seed 3" in format_table(sampled) and "greedy" in format_table(greedy)
    with pytest.raises(ConfigError, match="temperature"):
        evaluate("rookgrpo/tiny-random", str(data), settings=engine_settings, progress=False, temperature=-1)


def test_evaluate_runs_on_the_gpu_when_there_is_one(tmp_path, generated_lines, engine_settings, monkeypatch):
    """`rookgrpo evaluate` puts the model on the device pick_device chooses (auto: the GPU when torch sees one), for
    the completions and the reference NLL alike, and says which in its JSON; a device that is not there is a
    ConfigError naming --device."""
    import torch

    import rookgrpo.chess.evaluate as ev
    from rookgrpo import ConfigError

    assert ev.pick_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ev.pick_device(None) == torch.device("cuda") and ev.pick_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.undo()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--device: cuda asked for"):
            ev.pick_device("cuda")
    with pytest.raises(ConfigError, match="--device: 'gpu0' is not a device"):
        ev.pick_device("gpu0")
    # Where the model goes: every load is moved to the picked device (a recording stand-in for a GPU here).
    moved = []
    real_to = torch.nn.Module.to

    def to(module, *args, **kwargs):
        moved.append(str(args[0]) if args else str(kwargs.get("device")))
        return real_to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(generated_lines[:4]) + "\n")
    metrics = ev.evaluate("rookgrpo/tiny-random", str(data), settings=engine_settings, progress=False, device="cpu")
    assert metrics["device"] == "cpu" and moved.count("cpu") == 2  # the generating model and the scoring one
