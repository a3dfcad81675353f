"""Chess rewards on real positions with real Stockfish: ranking, floors, task routing, and no exceptions ever."""

import random

import chess
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SHARED_DATA
from rookgrpo.chess.engine import EngineSettings, get_pool
from rookgrpo.chess.formats import env_step, is_legal, parse_env, parse_policy, split_env, split_policy
from rookgrpo.chess.audit import _rank_short
from rookgrpo.chess.rewards import (
    ChessBestMove,
    ChessCandidates,
    ChessEnv,
    ChessEnvBoard,
    ChessEvals,
    ChessFormat,
    ChessLegality,
    ChessMoveRank,
    board_change_credit,
    move_accuracy,
)


def policy_rows(lines, k):
    return [split_policy(l) for l in lines if l.startswith("P:")][:k]


def all_rewards(engine_settings):
    return [ChessFormat(), ChessLegality(), ChessBestMove(engine_settings), ChessCandidates(engine_settings),
            ChessEvals(engine_settings), ChessMoveRank(engine_settings), ChessEnv()]


def test_reference_completions_score_full_marks(generated_lines, engine_settings):
    """The generator's own labels (engine best, top 5 with evals) earn 1.0 on every policy component."""
    rows = policy_rows(generated_lines, 30)
    prompts, completions = [p for p, _ in rows], [c for _, c in rows]
    for reward in all_rewards(engine_settings)[:-1]:
        assert reward(prompts, completions) == pytest.approx([1.0] * len(rows)), reward.name


def one_move(move: str) -> str:
    """A well-formed P: answer naming one move (what the B:-reading rewards score, past the format gate)."""
    return f" M: {move} E: 0.0 B: {move}"


def every_legal_move_scored(reward, generated_lines, engine_settings, positions=8):
    """For the first ``positions`` generated P: positions: (fen, engine analysis, {legal move: reward of a well-formed
    one-move answer naming it, ``M: m E: 0.0 B: m``})."""
    pool = get_pool(engine_settings)
    for prompt, _ in policy_rows(generated_lines, positions):
        fen = parse_policy(prompt + " M:").fen
        moves = [m.uci() for m in chess.Board(fen).legal_moves]
        yield fen, pool.analyse(fen), dict(zip(moves, reward([prompt] * len(moves), [one_move(m) for m in moves])))


def test_best_move_outranks_every_other_move(generated_lines, engine_settings):
    pool = get_pool(engine_settings)
    strictly_lower = 0
    for fen, analysis, by_move in every_legal_move_scored(ChessBestMove(engine_settings), generated_lines,
                                                          engine_settings):
        moves = list(by_move)
        assert by_move[analysis.best] == 1.0 == max(by_move.values())
        outside = [m for m in moves if m not in analysis.moves]
        cps = dict(zip(outside, pool.move_scores([(fen, m) for m in outside])))
        for move in outside:
            assert by_move[move] <= by_move[analysis.best]
            if cps[move] < analysis.scores[0]:
                assert by_move[move] < by_move[analysis.best]
                strictly_lower += 1
    assert strictly_lower > 20  # the comparison was exercised, not vacuous


def test_best_move_credit_is_continuous_in_move_quality():
    assert move_accuracy(20, 15) > 0.97  # loses 5 centipawns: nearly full credit
    assert move_accuracy(20, -180) < 0.5  # loses two pawns: well under half
    assert move_accuracy(20, -880) < 0.15  # drops a queen: little
    assert move_accuracy(20, 15) > move_accuracy(20, -30) > move_accuracy(20, -180)


def test_illegal_malformed_and_garbage_get_the_floor(generated_lines, engine_settings):
    prompt, good = policy_rows(generated_lines, 1)[0]
    fen = parse_policy(prompt + " M:").fen
    board = chess.Board(fen)
    illegal = next(f"{a}{b}" for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES
                   if a != b and chess.Move.from_uci(a + b) not in board.legal_moves)
    bad = [f" M: {illegal} E: 0.1 B: {illegal}", " M: e2e4 E: zz B: e2", "", "§§§ not chess at all", None, 42,
           [{"role": "assistant", "content": "B: e2e4"}]]
    for reward in all_rewards(engine_settings)[1:-1]:  # every component that judges chess content
        assert reward([prompt] * len(bad), bad) == [0.0] * len(bad), reward.name
    # Format judges shape only: the illegal but well-formed line passes, the half-formed one gets partial credit,
    # and text with no fields gets the floor.
    assert ChessFormat()([prompt] * len(bad), bad) == [1.0, 1 / 3, 0.0, 0.0, 0.0, 0.0, 1 / 3]


def test_rewards_return_none_for_the_other_task(generated_lines, engine_settings):
    p_prompt, p_completion = policy_rows(generated_lines, 1)[0]
    a_line = next(l for l in generated_lines if l.startswith("A:"))
    a_prompt, a_completion = split_env(a_line)
    for reward in all_rewards(engine_settings):
        scores = reward([p_prompt, a_prompt], [p_completion, a_completion])
        if reward.name == "chess_env":
            assert scores[0] is None and scores[1] == 1.0
        else:
            assert scores[1] is None and scores[0] == pytest.approx(1.0)


def test_rookworld_black_to_move_labels_rank_below_the_engine_best():
    """The published file's known defect: for black to move, B: is the lowest-eval of its five moves, not the best.

    At the tiny recipe's depth, ``chess_move_rank`` pays those labels strictly less than the engine's best move in at
    least 85% of the lines (the old absolute scale managed 71% at depth 6)."""
    import yaml

    from conftest import REPO

    path = SHARED_DATA / "rook_val_500.txt"
    if not path.exists():
        pytest.skip("shared RookWorld validation file not present")
    depth = yaml.safe_load((REPO / "recipes" / "rookworld-tiny.yaml").read_text())["stockfish_depth"]
    settings = EngineSettings(depth=depth, workers=2)
    reward = ChessMoveRank(settings)
    lines = [l for l in path.read_text().splitlines() if l.startswith("P:") and " b " in l[:95]]
    prompts = [split_policy(l)[0] for l in lines]
    parsed = [parse_policy(l) for l in lines]
    analyses = get_pool(settings).analyse_many([p.fen for p in parsed])
    label_scores = reward(prompts, [one_move(p.best) for p in parsed])
    best_scores = reward(prompts, [one_move(a.best) for a in analyses])
    assert len(lines) > 200 and best_scores == [1.0] * len(lines)
    assert sum(l < b for l, b in zip(label_scores, best_scores)) >= 0.85 * len(lines)


def test_move_rank_follows_the_engine_order_and_pays_no_move_outside_the_top_five(generated_lines, engine_settings):
    outside_seen = 0
    for fen, analysis, by_move in every_legal_move_scored(ChessMoveRank(engine_settings), generated_lines,
                                                          engine_settings):
        moves = list(by_move)
        assert by_move[analysis.best] == 1.0
        ranked = [by_move[m] for m in analysis.moves]
        assert ranked == sorted(ranked, reverse=True)  # credit never rises down the engine's list
        for move, cp in zip(analysis.moves, analysis.scores):
            if cp < analysis.scores[0]:
                assert by_move[move] <= 0.8  # a strictly worse top-5 move keeps at most the 2nd rank's credit
        for move in set(moves) - set(analysis.moves):
            assert by_move[move] == 0.0
            outside_seen += 1
    assert outside_seen > 50


def test_candidates_count_the_list_length(generated_lines, engine_settings):
    """The overlap's arithmetic, format gate off (each list here is ill-formed: over five moves, a repeat, one eval):
    with the gate on, the default, each earns 0."""
    reward = ChessCandidates(engine_settings, format_gate=False)
    prompt, reference = policy_rows(generated_lines, 1)[0]
    fen = parse_policy(prompt + " M:").fen
    legal = [m.uci() for m in chess.Board(fen).legal_moves]
    top = list(get_pool(engine_settings).analyse(fen).moves)
    everything, padded, half = reward([prompt] * 3, [f" M: {' '.join(legal)} E: 0 B: {top[0]}",
                                                     f" M: {' '.join(top + top)} E: 0 B: {top[0]}",
                                                     f" M: {' '.join(top[:2])} E: 0 B: {top[0]}"])
    assert len(legal) > 10
    assert everything == pytest.approx(len(top) / len(legal))
    assert padded == pytest.approx(0.5)  # the top 5 named twice: ten items for five right
    assert half == pytest.approx(2 / len(top))
    assert ChessCandidates(engine_settings)([prompt] * 2, [f" M: {' '.join(top + top)} E: 0 B: {top[0]}",
                                                            f" M: {' '.join(top[:2])} E: 0 0 B: {top[0]}"]) == [
        0.0, pytest.approx(2 / len(top))]


def test_legality_pays_a_repeated_move_once():
    # A model that half knows the rules: five distinct moves, two illegal, must earn more legality than its one safe
    # move written five times (GRPO drifted to repeats while a repeat earned full legality).
    # With the format gate (the default) a repeated move is ill-formed and earns 0; without it, legality alone pays
    # the repeat once.
    prompt = "P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    answers = [" M: g1f3 e2e4 d2d4 e2e5 a1a3 E: 0 0 0 0 0 B: g1f3", " M: g1f3 g1f3 g1f3 g1f3 g1f3 E: 0 0 0 0 0 B: g1f3",
               " M: g1f3 E: 0 B: g1f3"]
    distinct, repeated, safe = ChessLegality()([prompt] * 3, answers)
    assert distinct == pytest.approx(4 / 6) and repeated == 0.0 and safe == 1.0
    distinct, repeated, safe = ChessLegality(format_gate=False)([prompt] * 3, answers)
    assert distinct == pytest.approx(4 / 6) and repeated == pytest.approx(2 / 6) and safe == 1.0
    assert repeated < distinct


def test_constant_and_shifted_evals(generated_lines, engine_settings):
    reward = ChessEvals(engine_settings)
    rows = policy_rows(generated_lines, 20)
    prompts = [p for p, _ in rows]
    constant = [f" M: {' '.join(parse_policy(c).moves)} E: {' '.join(['0.0'] * len(parse_policy(c).moves))} "
                f"B: {parse_policy(c).best}" for _, c in rows]
    scores = reward(prompts, constant)
    # 0 wherever the engine's evals of the listed moves differ (the reference's E: are the engine's, same depth);
    # where they are all equal (say every move mates) constant evals do separate them, and only the level counts.
    capped = [{max(-10.0, min(10.0, v)) for v in parse_policy(c).evals} for _, c in rows]
    differ = [s for s, values in zip(scores, capped) if len(values) > 1]
    assert len(differ) >= 12 and max(differ) == 0.0
    shifted = []
    for _, c in rows:
        line = parse_policy(c)
        shifted.append(f" M: {' '.join(line.moves)} E: {' '.join(str(round(v + 1, 2)) for v in line.evals)} "
                       f"B: {line.best}")
    for s, (_, c) in zip(reward(prompts, shifted), rows):
        if len(parse_policy(c).moves) > 1 and max(abs(v) for v in parse_policy(c).evals) < 9:
            assert s == pytest.approx(0.5, abs=0.01)  # right differences, one pawn too high: half


# --- never raise --------------------------------------------------------------------------------------------------


def _mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        pos = rng.randrange(len(chars) + 1)
        if op < 0.4 and chars:
            del chars[min(pos, len(chars) - 1)]
        elif op < 0.8:
            chars.insert(pos, rng.choice("abcdefgh12345678qrbnkKQRBNP /-+.:MEBP \n0"))
        elif chars:
            chars[min(pos, len(chars) - 1)] = rng.choice("x9+:")
    return "".join(chars)


@pytest.fixture(scope="module")
def reward_funcs(engine_settings):
    return all_rewards(engine_settings)


@given(text=st.text(max_size=200), seed=st.integers(0, 10_000))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_reward_raises_on_random_or_mutated_text(reward_funcs, generated_lines, text, seed):
    rng = random.Random(seed)
    line = generated_lines[seed % len(generated_lines)]
    prompt, completion = split_policy(line) if line.startswith("P:") else split_env(line)
    completions = [text, _mutate(completion, rng), _mutate(line, rng)]
    prompts = [prompt, prompt, _mutate(prompt, rng)]  # a damaged prompt must not raise either
    for reward in reward_funcs:
        scores = reward(prompts, completions)
        assert len(scores) == 3
        assert all(s is None or 0.0 <= s <= 1.0 for s in scores), (reward.name, scores)


# --- environment task ---------------------------------------------------------------------------------------------


def test_env_ground_truth_earns_one_on_every_case():
    from test_chess_formats import CASES

    reward = ChessEnv()
    prompts, completions = [], []
    for fen, move, *_ in CASES.values():
        prompts.append(f"A: {fen}+{move}+{move}+")
        completions.append(env_step(fen, move, move).completion())
    assert reward(prompts, completions) == [1.0] * len(CASES)


def test_env_partial_credit_orders_near_misses_above_wrong_boards(generated_lines):
    reward = ChessEnv()
    checked = 0
    for line in [l for l in generated_lines if l.startswith("A:")][:20]:
        prompt, truth = split_env(line)
        fields = parse_env(line)
        placement = fields.new_fen.split()[0]
        i = next(i for i, ch in enumerate(placement) if ch.isalpha())
        one_char = placement[:i] + ("q" if placement[i] != "q" else "r") + placement[i + 1:]
        near = truth.replace(placement, one_char, 1)
        wrong_board = truth.replace(placement, "8/8/8/8/8/8/8/8", 1)
        s_truth, s_near, s_wrong = reward([prompt] * 3, [truth, near, wrong_board])
        assert s_truth == 1.0 and s_wrong < s_near < 1.0
        checked += 1
    assert checked == 20


def test_env_copying_the_input_earns_nothing_and_credit_rises_with_the_change(generated_lines):
    """Legal-move rows: the copied input (with or without the side flipped) earns 0; lifting the piece earns less
    than placing it, which earns less than the right board with the right verdict, which earns less than exact."""
    reward = ChessEnv()
    rows = 0
    for line in [l for l in generated_lines if l.startswith("A:")]:
        prompt, truth = split_env(line)
        fields = parse_env(line)
        board = chess.Board(fields.fen)
        if not is_legal(board, fields.move) or board.is_castling(chess.Move.from_uci(fields.move)):
            continue
        move = chess.Move.from_uci(fields.move)
        lifted = board.copy()
        lifted.remove_piece_at(move.from_square)
        parts = fields.fen.split()
        copy = f"{fields.fen}+0.001+0+0"
        flipped = " ".join([parts[0], "b" if parts[1] == "w" else "w", *parts[2:]]) + "+0.001+0+0"
        half = f"{lifted.board_fen()} {' '.join(parts[1:])}+0.001+0+0"
        new = fields.new_fen.split()
        board_only = " ".join([new[0], *parts[1:]]) + f"+{fields.reward}+{fields.terminated}+{fields.truncated}"
        wrong_verdict = f"{fields.new_fen}+-1.0+0+1"
        s = reward([prompt] * 6, [copy, flipped, half, wrong_verdict, board_only, truth])
        assert s[0] == s[1] == 0.0, line
        assert 0.0 < s[2] < s[3] < s[4] < s[5] == 1.0, (line, s)
        rows += 1
    assert rows >= 15


def test_env_a_board_that_is_not_a_board_earns_nothing(generated_lines):
    """Read square by square, a placement with two empty ranks written as ``88``, or a ``/`` left out, matches the
    right board; it is not a FEN, and with the verdict and fields right it was paid 0.9."""
    reward = ChessEnv()
    rows = 0
    for line in [l for l in generated_lines if l.startswith("A:")]:
        prompt, truth = split_env(line)
        placement = parse_env(line).new_fen.split()[0]
        ranks = placement.split("/")
        joined = "/".join(ranks[:3]) + ranks[3] + "/" + "/".join(ranks[4:])  # one "/" left out: seven ranks
        malformed = [truth.replace(placement, joined, 1)]
        if "8/8" in placement:
            malformed.append(truth.replace(placement, placement.replace("8/8", "88", 1), 1))
        assert reward([prompt] * (len(malformed) + 1), [*malformed, truth]) == [0.0] * len(malformed) + [1.0], line
        rows += 1
    assert rows >= 15


def test_env_board_penalises_what_is_not_a_board_and_nothing_else(generated_lines):
    """``chess_env_board`` ranks a broken board below a copy: -1 for a placement that is not a board (a rank a square
    short, as GRPO wrote on black's second rank, ranks run together, junk), 0 for any board, right or copied, and
    None on P: rows. Summed with ``chess_env`` (the tiny recipe's weights): broken < copy = 0 < lifted piece < exact."""
    env, board = ChessEnv(), ChessEnvBoard()
    rows = 0
    for line in [l for l in generated_lines if l.startswith("A:")]:
        prompt, truth = split_env(line)
        fields = parse_env(line)
        chess_board = chess.Board(fields.fen)
        if not is_legal(chess_board, fields.move):
            continue
        placement = fields.new_fen.split()[0]
        short = _rank_short(placement, 1)  # black's 2nd rank a square short
        copy = f"{fields.fen}+0.001+0+0"
        move = chess.Move.from_uci(fields.move)
        lifted = chess_board.copy()
        lifted.remove_piece_at(move.from_square)
        half = f"{lifted.board_fen()} {' '.join(fields.fen.split()[1:])}+0.001+0+0"
        answers = [truth, copy, half, truth.replace(placement, short, 1), truth.replace("/", "", 1), "junk", ""]
        penalty = board([prompt] * len(answers), answers)
        assert penalty == [0.0, 0.0, 0.0, -1.0, -1.0, -1.0, -1.0], line
        total = [e + 0.5 * b for e, b in zip(env([prompt] * len(answers), answers), penalty)]
        assert total[3] < total[1] == 0.0 < total[2] < total[0] == 1.0, (line, total)
        rows += 1
    assert rows >= 15
    p_prompt, p_completion = policy_rows(generated_lines, 1)[0]
    assert board([p_prompt, "A: not a fen+e2e4+e2e4+"], [p_completion, "junk"]) == [None, 0.0]


@given(text=st.text(max_size=200), seed=st.integers(0, 10_000))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_env_board_never_raises_and_is_a_penalty_only(generated_lines, text, seed):
    rng = random.Random(seed)
    lines = [l for l in generated_lines if l.startswith("A:")]
    prompt, truth = split_env(lines[seed % len(lines)])
    scores = ChessEnvBoard()([prompt, prompt, _mutate(prompt, rng)], [text, _mutate(truth, rng), truth])
    assert scores[0] in (0.0, -1.0) and scores[1] in (0.0, -1.0), scores
    assert scores[2] in (0.0, -1.0, None), scores  # a damaged prompt may no longer be an A: row


def test_board_change_credit_on_special_moves():
    castled = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    before = castled.board_fen()
    castled.push_uci("e1g1")
    king_only = chess.Board("r3k2r/8/8/8/8/8/8/R5KR w - - 0 1").board_fen()  # the king moved, the rook stayed
    assert board_change_credit(before, castled.board_fen(), castled.board_fen()) == 1.0
    assert board_change_credit(before, castled.board_fen(), before) == 0.0
    assert board_change_credit(before, castled.board_fen(), king_only) == 0.5  # e1, g1 right; f1, h1 wrong
    ep = chess.Board("4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 2")
    before = ep.board_fen()
    ep.push_uci("e5d6")
    assert board_change_credit(before, ep.board_fen(), ep.board_fen()) == 1.0
    # Forgetting the captured pawn: two of three changed squares right.
    forgot = chess.Board("4k3/8/3P4/3p4/8/8/8/4K3 w - - 0 2").board_fen()
    assert board_change_credit(before, ep.board_fen(), forgot) == pytest.approx(2 / 3)


def test_hostile_text_never_raises_and_stays_in_range(generated_lines, engine_settings):
    """Answers built to break a parser or a formula: huge, non-finite and Unicode numbers, thousands of moves,
    very long text, field markers repeated, and prompts damaged the same ways."""
    p_prompt, p_truth = policy_rows(generated_lines, 1)[0]
    a_line = next(l for l in generated_lines if l.startswith("A:"))
    a_prompt, a_truth = split_env(a_line)
    moves = " ".join(f"{a}{b}" for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES[:80])  # 5,120 moves
    hostile = [
        " M: e2e4 d2d4 E: 1e308 -1e308 B: e2e4", " M: e2e4 d2d4 E: nan inf B: e2e4", " M: e2e4 E: ١٢٣ B: e2e4",
        f" M: {moves} E: {' '.join(['0.5'] * 5120)} B: e2e4", " M: M: M: E: E: B: B: B:", "B:" * 10_000,
        "x" * 200_000, " M: e2e4 E: 0 B: e2e4\n" * 1000, "\x00\x01\x02", " M: e7e8q e7e8k e1g1 a1a1 E: 1 2 3 4 B: a1a1",
        "+" * 5000, "8/8/8/8/8/8/8/8 w - - 0 1+0.001+0+0", "²²²²/8/8/8/8/8/8/8 b KQkq e3 999999999 1+1e999+1+1",
        a_truth.replace("/", "//"), a_truth + "+extra+fields", "9" * 5000 + "+0+0+0",
    ]
    prompts = [p_prompt, a_prompt, "P: not a fen at all", "A: ²²/8+e2e4+e2e4+", "P: " + "8/" * 5000, "A: " + "+" * 9]
    for reward in all_rewards(engine_settings):
        for prompt in prompts:
            scores = reward([prompt] * len(hostile), hostile)
            assert len(scores) == len(hostile)
            assert all(s is None or (0.0 <= s <= 1.0) for s in scores), (reward.name, prompt[:30], scores)


def test_the_format_gate_is_on_by_default_and_a_recipe_entry_turns_it_off(engine_settings):
    """Every P: component but chess_format charges an ill-formed answer in full unless the recipe opts out; the
    setting survives the trainer's setup(); chess_format itself reads the form and has no gate to turn."""
    from types import SimpleNamespace

    from rookgrpo.chess.rewards import GATED_REWARDS
    from rookgrpo.errors import ConfigError
    from rookgrpo.rewards.registry import resolve_reward_func

    fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    prompt, top = f"P: {fen}", get_pool(engine_settings).analyse(fen)
    moves, evals = " ".join(top.moves[:2]), " ".join(f"{cp / 100:.2f}" for cp in top.scores[:2])
    well, long_e = f" M: {moves} E: {evals} B: {top.best}", f" M: {moves} E: {evals} 0.0 B: {top.best}"
    args = SimpleNamespace(stockfish_depth=engine_settings.depth, stockfish_workers=1)
    for name in GATED_REWARDS:
        gated = resolve_reward_func(name).setup(args)
        ungated = resolve_reward_func({"name": name, "format_gate": False}).setup(args)
        assert gated.format_gate and not ungated.format_gate, name
        assert "format_gate=False" in repr(ungated) and "format_gate" not in repr(gated)
        ill, good = gated([prompt] * 2, [long_e, well])
        assert ill == 0.0 < good, name
        assert ungated([prompt], [long_e])[0] > 0.0, name  # what the gate takes away: the moves' worth
    with pytest.raises(ConfigError, match="format_gat"):
        resolve_reward_func({"name": "chess_move_rank", "format_gat": False})
