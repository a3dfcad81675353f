"""RookWorld text formats: parse and render the policy task (``P:``) and the environment task (``A:``).

Policy task, one line::

    P: <FEN>  M: <up to 5 UCI moves>  E: <one eval per move, pawns, side to move's view>  B: <best move>

In the RookWorld validation data the fields sit at fixed columns (``M:`` at 92, ``E:`` at 125, ``B:`` at 168): the
FEN is left-justified to 89 characters after ``P: ``, the moves to 30 after ``M: `` and the evals to 40 after
``E: ``. That is the ``padded`` layout (what RookWorld-LM was trained on); ``compact`` uses single spaces.

Environment task (arbiter), ``+``-separated::

    A: <FEN>+<uci move>+<history>+<new FEN>+<reward>+<terminated>+<truncated>

The parsers are lenient about whitespace and never raise: they return what they could read plus a list of what was
wrong, so reward functions can grade model output of any shape. Rendering a parsed validation line reproduces it
byte for byte (eval texts are kept as written).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import chess

PADDED = "padded"
COMPACT = "compact"
LAYOUTS = (PADDED, COMPACT)
# Field widths of the padded layout: text after "P: ", "M: " and "E: " is left-justified to these widths.
FEN_WIDTH, MOVES_WIDTH, EVALS_WIDTH = 89, 30, 40
MAX_MOVES = 5
UCI_RE = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
_POLICY_MARKERS = re.compile(r"(?:^|\s)(P|M|E|B):")


def is_uci(text: str) -> bool:
    """True when ``text`` has the shape of a UCI move (``e2e4``, ``e7e8q``); legality is not checked."""
    return bool(UCI_RE.match(text))


def board_from_fen(fen: str) -> chess.Board | None:
    """The position for ``fen``, or ``None`` when it does not parse or is not a legal position. Never raises."""
    try:
        board = chess.Board(fen)
    except (TypeError, ValueError):
        return None
    return board if board.is_valid() else None


def is_legal(board: chess.Board | None, move: str) -> bool:
    """Whether ``move`` (UCI text) is legal on ``board``; ``False`` for no board or unparseable text. Never raises."""
    if board is None:
        return False
    try:
        return chess.Move.from_uci(move) in board.legal_moves
    except (TypeError, ValueError):
        return False


def format_eval(pawns: float) -> str:
    """Eval text as RookWorld writes it: shortest float text with at most 2 decimals (``-2.3``, ``0.0``, ``4.75``)."""
    value = round(float(pawns), 2)
    if value == 0:
        value = 0.0  # no "-0.0"
    return repr(value)


def parse_eval(text: str) -> float | None:
    """Float value of an eval text, or ``None`` when it is not a finite number."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class PolicyLine:
    """A policy-task line, parsed. ``errors`` lists what was missing or malformed (empty for a clean line).

    ``eval_texts`` keeps evals as written so rendering is lossless; ``evals`` gives their values (``None`` for a text
    that is not a number).
    """

    fen: str = ""
    moves: list[str] = field(default_factory=list)
    eval_texts: list[str] = field(default_factory=list)
    best: str = ""
    errors: list[str] = field(default_factory=list)
    present: frozenset = frozenset()  # which of "P", "M", "E", "B" markers were found

    @property
    def evals(self) -> list[float | None]:
        return [parse_eval(t) for t in self.eval_texts]

    @property
    def ok(self) -> bool:
        return not self.errors

    @classmethod
    def from_values(cls, fen: str, moves: list[str], evals: list[float], best: str) -> PolicyLine:
        return cls(fen=fen, moves=list(moves), eval_texts=[format_eval(e) for e in evals], best=best,
                   present=frozenset("PMEB"))


def parse_policy(text: str) -> PolicyLine:
    """Parse a full policy line, or a completion (``M: ... B: ...`` without ``P:``). Never raises.

    >>> line = parse_policy("P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1a2 a1b1 E: 0.0 0.0 B: a1a2")
    >>> line.fen, line.moves, line.evals, line.best, line.errors
    ('8/8/8/8/8/8/8/K6k w - - 0 1', ['a1a2', 'a1b1'], [0.0, 0.0], 'a1a2', [])
    >>> parse_policy("M: e2e4 zz E: 0.3 B:").errors
    ["M: 'zz' is not a UCI move", 'E: 1 evals for 2 moves', 'B: missing move']
    """
    if not isinstance(text, str):
        text = ""
    # Split on the markers; each value is the text up to the next marker.
    parts = _POLICY_MARKERS.split(text)
    fields_: dict[str, str] = {}
    duplicates = []
    for i in range(1, len(parts) - 1, 2):
        key, value = parts[i], parts[i + 1]
        if key in fields_:
            duplicates.append(key)
            continue
        fields_[key] = value.strip()
    line = PolicyLine(present=frozenset(fields_))
    errors = line.errors
    errors += [f"{k}: appears more than once" for k in dict.fromkeys(duplicates)]
    line.fen = fields_.get("P", "")
    moves = fields_.get("M", "").split()
    line.moves = moves
    line.eval_texts = fields_.get("E", "").split()
    best = fields_.get("B", "").split()
    line.best = best[0] if best else ""
    if "M" not in fields_:
        errors.append("M: missing")
    elif not moves:
        errors.append("M: no moves")
    else:
        errors += [f"M: {m!r} is not a UCI move" for m in moves if not is_uci(m)]
        if len(moves) > MAX_MOVES:
            errors.append(f"M: {len(moves)} moves, at most {MAX_MOVES}")
        if len(set(moves)) != len(moves):
            errors.append("M: repeated move")
    if "E" not in fields_:
        errors.append("E: missing")
    else:
        errors += [f"E: {t!r} is not a number" for t in line.eval_texts if parse_eval(t) is None]
        if len(line.eval_texts) != len(moves):
            errors.append(f"E: {len(line.eval_texts)} evals for {len(moves)} moves")
    if not line.best:
        errors.append("B: missing move")
    elif not is_uci(line.best) or len(best) > 1:
        errors.append(f"B: {' '.join(best)!r} is not one UCI move")
    return line


def scored_errors(line: PolicyLine) -> list[str]:
    """The errors of the fields a P: answer's format is scored on (M:, E:, B:; not a repeated P:).

    >>> scored_errors(parse_policy(" M: e2e4 E: 0.3 0.1 B: e2e4"))
    ['E: 2 evals for 1 moves']
    """
    return [e for e in line.errors if e[:2] in ("M:", "E:", "B:")]


def format_failures(completion: str) -> list[str]:
    """The kinds of format error in a P: completion (the fields :class:`~rookgrpo.chess.rewards.ChessFormat` scores),
    with the answer's own moves and numbers left out, so the errors of many answers can be counted by kind.

    >>> format_failures(" M: e2e4 zz E: 0.3 B:")
    ['M: X is not a UCI move', 'E: N evals for N moves', 'B: missing move']
    >>> format_failures(" M: e2e4 e2e4 E: 0.3 0.3 B: e2e4"), format_failures(" M: e2e4 E: 0.3 B: e2e4")
    (['M: repeated move'], [])
    """
    errors = scored_errors(parse_policy(" " + str(completion).split("\n", 1)[0]))
    kinds = (re.sub(r"\d+", "N", re.sub(r"'[^']*'", "X", e)) for e in errors)
    return list(dict.fromkeys(kinds))


def render_policy(line: PolicyLine, layout: str = PADDED) -> str:
    """Render a policy line in the ``padded`` (RookWorld) or ``compact`` layout."""
    moves, evals = " ".join(line.moves), " ".join(line.eval_texts)
    if layout == PADDED:
        return f"P: {_pad(line.fen, FEN_WIDTH)}M: {_pad(moves, MOVES_WIDTH)}E: {_pad(evals, EVALS_WIDTH)}B: {line.best}"
    if layout == COMPACT:
        return f"P: {line.fen} M: {moves} E: {evals} B: {line.best}"
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _pad(text: str, width: int) -> str:
    """Left-justify to ``width``; an over-long field still gets one space so the next marker stays separate."""
    return text.ljust(width) if len(text) < width else text + " "


def policy_prompt(fen: str, layout: str = PADDED) -> str:
    """The prompt for a position: the line up to the space before ``M:`` (see :func:`split_policy`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return "P: " + (_pad(fen, FEN_WIDTH)[:-1] if layout == PADDED else fen)


def split_policy(text: str) -> tuple[str, str]:
    """Split a policy line into ``(prompt, completion)``; the completion starts with the space before ``M:``.

    Why the last space goes to the completion: GPT-2's pre-tokenizer turns a run of N spaces before a word into
    N-1 spaces plus `` M``. RookWorld-LM saw `` M`` as one token in training, so a prompt that ends with all N
    spaces would ask it to continue from a tokenization it never saw. With this split,
    ``tokens(prompt) + tokens(completion) == tokens(line)`` for GPT-2's BPE in both layouts.

    >>> split_policy("P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1a2 E: 0.0 B: a1a2")
    ('P: 8/8/8/8/8/8/8/K6k w - - 0 1', ' M: a1a2 E: 0.0 B: a1a2')
    """
    match = re.search(r"\sM:", text)
    if match is None:
        raise ValueError(f"not a policy line (no 'M:' field): {text[:80]!r}")
    return text[: match.start()], text[match.start():]


# ---------------------------------------------------------------------------------------------------------------
# Environment task


ENV_PROMPT_FIELDS = 3  # FEN, move, history
ENV_COMPLETION_FIELDS = 4  # new FEN, reward, terminated, truncated
REWARD_LEGAL, REWARD_WIN, REWARD_DRAW, REWARD_ILLEGAL = 0.001, 1.0, 0.5, -1.0
HISTORY_LENGTH = 10


@dataclass
class EnvLine:
    """An environment-task line (or completion), parsed; text fields are kept as written."""

    fen: str = ""
    move: str = ""
    history: str = ""
    new_fen: str = ""
    reward: str = ""
    terminated: str = ""
    truncated: str = ""
    errors: list[str] = field(default_factory=list)

    def completion(self) -> str:
        return f"{self.new_fen}+{self.reward}+{self.terminated}+{self.truncated}"


def parse_env(text: str) -> EnvLine:
    """Parse a full ``A:`` line. Never raises; missing fields stay empty and are listed in ``errors``."""
    if not isinstance(text, str):
        text = ""
    body = text.strip()
    if body.startswith("A:"):
        body = body[2:].lstrip()
    parts = [p.strip() for p in body.split("+")]
    line = EnvLine()
    names = ["fen", "move", "history", "new_fen", "reward", "terminated", "truncated"]
    for name, value in zip(names, parts):
        setattr(line, name, value)
    if len(parts) != len(names):
        line.errors.append(f"{len(parts)} '+'-separated fields, expected {len(names)}")
    return line


def parse_env_completion(text: str) -> EnvLine:
    """Parse an ``A:`` completion (``<new FEN>+<reward>+<terminated>+<truncated>``). Never raises."""
    if not isinstance(text, str):
        text = ""
    parts = [p.strip() for p in text.strip().split("+")]
    line = EnvLine()
    for name, value in zip(["new_fen", "reward", "terminated", "truncated"], parts):
        setattr(line, name, value)
    if len(parts) != ENV_COMPLETION_FIELDS:
        line.errors.append(f"{len(parts)} '+'-separated fields, expected {ENV_COMPLETION_FIELDS}")
    return line


def render_env(line: EnvLine) -> str:
    return f"A: {line.fen}+{line.move}+{line.history}+{line.completion()}"


def split_env(text: str) -> tuple[str, str]:
    """Split an ``A:`` line after its third ``+``: prompt = FEN, move, history; completion = the rest.

    >>> split_env("A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+8/8/8/8/8/8/K7/7k b - - 1 1+0.001+0+0")
    ('A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+', '8/8/8/8/8/8/K7/7k b - - 1 1+0.001+0+0')
    """
    cut = -1
    for _ in range(ENV_PROMPT_FIELDS):
        cut = text.find("+", cut + 1)
        if cut < 0:
            raise ValueError(f"not an environment line (fewer than 3 '+'): {text[:80]!r}")
    return text[: cut + 1], text[cut + 1:]


def env_step(fen: str, move: str, history: str = "") -> EnvLine:
    """The ground-truth environment transition, computed with python-chess.

    - legal, game goes on: new FEN, reward ``0.001``, ``0``, ``0``;
    - legal and the game ends (``outcome()`` without claims): ``1.0`` if the mover wins, ``0.5`` for a draw,
      terminated ``1``;
    - illegal or unparseable move: FEN unchanged, reward ``-1.0``, terminated ``0``, truncated ``1``.

    FENs are ``Board.fen()`` (en-passant square only when a capture is legal). ``history`` is kept as given; use
    :func:`update_history` to build it.

    >>> env_step("7k/8/6K1/8/8/8/8/1Q6 w - - 0 1", "b1b8").completion()
    '1Q5k/8/6K1/8/8/8/8/8 b - - 1 1+1.0+1+0'
    """
    board = chess.Board(fen)
    line = EnvLine(fen=fen, move=move, history=history)
    try:
        parsed = chess.Move.from_uci(move)
    except (ValueError, chess.InvalidMoveError):
        parsed = None
    if parsed is None or parsed not in board.legal_moves:
        line.new_fen, line.reward, line.terminated, line.truncated = board.fen(), format_reward(REWARD_ILLEGAL), "0", "1"
        return line
    board.push(parsed)
    outcome = board.outcome(claim_draw=False)
    if outcome is None:
        reward, terminated = REWARD_LEGAL, "0"
    else:
        reward, terminated = (REWARD_DRAW if outcome.winner is None else REWARD_WIN), "1"
    line.new_fen, line.reward, line.terminated, line.truncated = board.fen(), format_reward(reward), terminated, "0"
    return line


def format_reward(value: float) -> str:
    return repr(float(value))


def update_history(history: str, move: str, length: int = HISTORY_LENGTH) -> str:
    """Append ``move`` and keep the last ``length`` half-moves, oldest first.

    >>> update_history("e2e4 e7e5", "g1f3")
    'e2e4 e7e5 g1f3'
    """
    moves = history.split() + [move]
    return " ".join(moves[-length:])


def task_of(text: str) -> str | None:
    """``"P"`` or ``"A"`` from a line or prompt's prefix, else ``None``."""
    stripped = text.lstrip() if isinstance(text, str) else ""
    if stripped.startswith("P:"):
        return "P"
    if stripped.startswith("A:"):
        return "A"
    return None


def best_move_part(prompt: str, completion: str) -> tuple[int, int] | None:
    """The character span of a P: completion's B: move, to the end of the line: the part ``sft_anchor`` scores with
    ``score: rookworld_best_move`` (the engine's best move taught without the reference M: and E: lists, whose random
    order teaches repeated moves). ``None`` for a completion with no ``B:`` (an A: line): scored whole.

    >>> c = " M: e2e4 d2d4 E: 0.3 0.2 B: e2e4"
    >>> start, end = best_move_part("P: fen", c)
    >>> c[start:end]
    'e2e4'
    >>> best_move_part("A: fen+e2e4+e2e4+", "fen2+0.001+0+0") is None
    True
    """
    at = completion.rfind("B:")
    if at < 0:
        return None
    start = at + 2
    while start < len(completion) and completion[start].isspace():
        start += 1
    end = len(completion.rstrip())
    return (start, end) if end > start else None
