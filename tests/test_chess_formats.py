"""RookWorld text formats: lossless round trip of the published validation file, the GPT-2 BPE split rule, the
environment task's ground truth, and parsers that never raise."""

import chess
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SHARED_DATA
from rookgrpo.chess.formats import (
    COMPACT,
    PADDED,
    PolicyLine,
    env_step,
    parse_env,
    parse_env_completion,
    parse_policy,
    policy_prompt,
    render_env,
    render_policy,
    split_env,
    split_policy,
    update_history,
)

VAL = SHARED_DATA / "rook_val_500.txt"


def val_lines():
    if not VAL.exists():
        pytest.skip("shared RookWorld validation file not present")
    return VAL.read_text().splitlines()


def test_every_validation_line_parses_and_renders_back_byte_for_byte():
    lines = val_lines()
    assert len(lines) == 500
    for line in lines:
        parsed = parse_policy(line)
        assert parsed.ok, (line, parsed.errors)
        assert chess.Board(parsed.fen).is_valid()
        assert render_policy(parsed, PADDED) == line
        assert (line.index("M:"), line.index("E:"), line.index("B:")) == (92, 125, 168)


def test_compact_layout_round_trips_and_parses_to_the_same_fields():
    for line in val_lines()[:50]:
        parsed = parse_policy(line)
        compact = render_policy(parsed, COMPACT)
        assert "  " not in compact
        again = parse_policy(compact)
        assert (again.fen, again.moves, again.eval_texts, again.best) == (
            parsed.fen, parsed.moves, parsed.eval_texts, parsed.best)


def test_over_long_fields_keep_markers_separate():
    line = PolicyLine(fen="x" * 95, moves=["e2e4"], eval_texts=["0.1"], best="e2e4")
    parsed = parse_policy(render_policy(line, PADDED))
    assert parsed.fen == "x" * 95 and parsed.moves == ["e2e4"]


def _gpt2_style_bpe(texts):
    """A byte-level BPE trained here, with GPT-2's pre-tokenizer (regex + byte mapping), as RookWorld-LM's is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def test_prompt_completion_split_reproduces_gpt2_training_tokenization():
    lines = val_lines()
    compact = [render_policy(parse_policy(l), COMPACT) for l in lines]
    tok = _gpt2_style_bpe(lines + compact)
    enc = lambda s: tok.encode(s).ids  # noqa: E731
    naive_mismatches = 0
    for line in lines + compact:
        prompt, completion = split_policy(line)
        assert completion.startswith(" M: ")
        assert enc(prompt) + enc(completion) == enc(line)
        assert prompt == policy_prompt(parse_policy(line).fen, PADDED if line in lines else COMPACT)
        # Cutting right at "M:" (all spaces in the prompt) gives a different token sequence: the rule matters.
        cut = line.index("M:")
        naive_mismatches += enc(line[:cut]) + enc(line[cut:]) != enc(line)
    assert naive_mismatches == len(lines) + len(compact)


def test_parse_reports_what_is_wrong_instead_of_raising():
    assert parse_policy("").errors == ["M: missing", "E: missing", "B: missing move"]
    bad = parse_policy(" M: e2e4 e2e4 e9e1 E: 1.0 x B: e2e4 e7e5")
    assert "M: repeated move" in bad.errors and "M: 'e9e1' is not a UCI move" in bad.errors
    assert "E: 'x' is not a number" in bad.errors and any(e.startswith("B:") for e in bad.errors)
    assert parse_policy(" M: e2e4 E: nan B: e2e4").evals == [None]


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_parsers_never_raise_on_arbitrary_text(text):
    parse_policy(text)
    parse_env(text)
    parse_env_completion(text)


# --- environment task ground truth -------------------------------------------------------------------------------

CASES = {
    # name: (fen, move, expected reward, terminated, truncated, expected new-FEN check)
    "normal": ("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4", "0.001", "0", "0"),
    "capture": ("rnbqkbnr/ppp1pppp/8/3p4/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2", "e4d5", "0.001", "0", "0"),
    "castle_kingside": ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1", "e1g1", "0.001", "0", "0"),
    "castle_queenside": ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b KQkq - 0 1", "e8c8", "0.001", "0", "0"),
    "en_passant": ("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", "e5f6", "0.001", "0", "0"),
    "promotion": ("8/P6k/8/8/8/8/8/K7 w - - 0 1", "a7a8q", "0.001", "0", "0"),
    "checkmate": ("7k/8/6K1/8/8/8/8/1Q6 w - - 0 1", "b1b8", "1.0", "1", "0"),
    "stalemate": ("7k/8/5K2/8/8/8/8/6Q1 w - - 0 1", "g1g6", "0.5", "1", "0"),
    "illegal": ("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e5", "-1.0", "0", "1"),
    "garbage_move": ("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "zz", "-1.0", "0", "1"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_env_step_ground_truth(name):
    fen, move, reward, terminated, truncated = CASES[name]
    line = env_step(fen, move, update_history("", move))
    assert (line.reward, line.terminated, line.truncated) == (reward, terminated, truncated)
    board = chess.Board(fen)
    if reward == "-1.0":
        assert line.new_fen == board.fen()  # FEN unchanged
    else:
        board.push_uci(move)
        assert line.new_fen == board.fen()
    # Render → split → parse round trip.
    text = render_env(line)
    prompt, completion = split_env(text)
    assert prompt == f"A: {fen}+{move}+{move}+" and completion == line.completion()
    parsed = parse_env(text)
    assert (parsed.fen, parsed.move, parsed.new_fen, parsed.reward) == (fen, move, line.new_fen, reward)


def test_en_passant_square_only_when_a_capture_is_legal():
    quiet = env_step("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4")
    assert " - 0 1" in quiet.new_fen  # no e3: no black pawn can take
    capturable = env_step("rnbqkbnr/ppp1pppp/8/8/3p4/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4")
    assert " e3 " in capturable.new_fen


def test_history_keeps_last_ten_half_moves():
    history = ""
    for i in range(12):
        history = update_history(history, f"m{i}")
    assert history.split() == [f"m{i}" for i in range(2, 12)]
