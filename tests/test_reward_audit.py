"""What degenerate answers earn under the shipped chess recipes: the audit's numbers, pinned with real Stockfish.

GRPO optimises what the reward pays, so these are the limits every shipped chess recipe promises (docs/rewards.md):
a random legal move at most 50% of the engine best's weighted P: reward, the engine's 5th-best at most 60%, a constant
pawn or knight move at most 40%, listing every legal move below the engine's answer, one legal move repeated through
M: below the same move listed with others, copying the input FEN at most 10% of an exact A: answer on legal moves,
and a placement that is not a board nothing (less than a copy where the recipe adds ``chess_env_board``).
Measured on the packaged held-out positions and on RookWorld's validation file.
"""

import json

import pytest
import yaml

from conftest import REPO, SHARED_DATA, run_cli, venv_bin
from rookgrpo.chess.data import load_rookworld
from rookgrpo.chess.audit import audit, recipe_rewards
from rookgrpo.chess.rewards import GATED_REWARDS

RECIPES = ["rookworld-tiny.yaml", "rookworld.yaml", "chess-smoke.yaml"]
LIMITS = {"random legal": 0.50, "engine 5th": 0.60, "constant pawn move": 0.40, "constant knight move": 0.40}


def data_sets():
    yield "rookgrpo/tiny-rookworld-eval"
    path = SHARED_DATA / "rook_val_500.txt"
    if path.exists():
        yield str(path)


@pytest.fixture(scope="module", params=RECIPES)
def recipe(request):
    recipe = yaml.safe_load((REPO / "recipes" / request.param).read_text())
    recipe["stockfish_depth"] = 6  # the recipes' weights and rewards, at a depth fast enough for the suite
    recipe["stockfish_workers"] = 2
    return request.param, recipe_rewards(recipe)


@pytest.mark.parametrize("data", list(data_sets()))
def test_degenerate_answers_earn_less_than_the_limits(recipe, data):
    name, (funcs, weights, settings) = recipe
    tables = audit(funcs, weights, load_rookworld(data)["text"], settings, n=80, seed=1)
    by_title = {t.title.split(", ")[-1] if "A:" in t.title else "P": t for t in tables}
    policy = by_title["P"]
    assert policy.n_rows >= 60
    assert policy.share("engine best") == 1.0
    for answer, limit in LIMITS.items():
        assert policy.share(answer) <= limit, (name, data, answer, policy.share(answer))
    assert policy.share("all legal moves") < 1.0
    # Repeating one move through M: (what greedy decoding of an unsure model writes) earns less than listing distinct
    # moves with the same B:.
    assert policy.share("legal move repeated") < policy.share("random legal")
    assert policy.share("best move repeated") < 1.0
    assert policy.share("engine 2nd") < 1.0 and policy.share("engine 5th") < policy.share("engine 2nd")
    env = by_title["legal move"]
    assert env.n_rows >= 20
    assert env.share("copy FEN") <= 0.10 and env.share("copy FEN, side flipped") <= 0.10
    # Partial credit is still there for answers that get the board right, so groups keep a spread.
    assert 0.5 < env.share("board right, rest copied") < 1.0
    # A placement that is not a board earns nothing, even where its squares read right (it was paid 0.9); where the
    # recipe adds chess_env_board, it earns less than a copy of the input (GRPO traded copies for broken boards).
    broken = ("ranks run together", "one rank a square short")
    for rows in (env, by_title["illegal move"]) if "illegal move" in by_title else (env,):
        assert rows.rows["exact"]["chess_env"] == 1.0
        for answer in broken:
            assert rows.rows[answer]["chess_env"] == 0.0, (name, data, answer)
            if "chess_env_board" in rows.components:
                assert rows.share(answer) < min(0.0, rows.share("copy FEN")), (name, data, answer)
            else:
                assert rows.share(answer) == 0.0, (name, data, answer)


def test_constant_evals_earn_nothing_where_evals_are_judged():
    funcs, weights, settings = recipe_rewards({**yaml.safe_load((REPO / "recipes" / "rookworld.yaml").read_text()),
                                               "stockfish_depth": 6, "stockfish_workers": 2})
    table = audit(funcs, weights, load_rookworld("rookgrpo/tiny-rookworld-eval")["text"], settings, n=40)[0]
    assert table.rows["engine best"]["chess_evals"] > 0.95
    assert table.rows["constant evals"]["chess_evals"] == 0.0
    assert table.rows["all legal moves"]["chess_candidates"] < 0.3
    # A repeated move is judged once: five copies of the best move with its eval earned full separation before.
    assert table.rows["best move repeated"]["chess_evals"] < 0.05
    assert table.rows["legal move repeated"]["chess_evals"] < 0.05
    # ... and, ill-formed, earns no legality: the format gate charges it in full (without the gate legality pays the
    # repeat once, 2/6: tests/test_chess_rewards.py).
    assert table.rows["legal move repeated"]["chess_legality"] == 0.0


def test_an_eval_list_one_longer_than_the_moves_is_charged_by_every_component():
    """The hole GRPO broke greedy format through in the make train runs before the format gate (docs/rewards.md):
    only chess_format read the E: count, so the answer kept every other component's full credit (98% of the engine
    answer's weighted reward). With the gate, the default, every other P: component pays it nothing; with
    ``format_gate: false`` the hole is back, measured here too."""
    funcs, weights, settings = recipe_rewards({**yaml.safe_load((REPO / "recipes" / "rookworld-tiny.yaml").read_text()),
                                               "stockfish_depth": 6, "stockfish_workers": 2})
    table = audit(funcs, weights, load_rookworld("rookgrpo/tiny-rookworld-eval")["text"], settings, n=40)[0]
    extra, best = table.rows["one eval too many"], table.rows["engine best"]
    assert extra["chess_format"] == pytest.approx(2 / 3) and best["chess_format"] == 1.0
    for name in ("chess_legality", "chess_move_rank", "chess_candidates", "chess_evals"):
        assert extra[name] == 0.0 < best[name], name
    assert table.share("one eval too many") == pytest.approx(0.25 * 2 / 3 / best["total"])
    recipe = yaml.safe_load((REPO / "recipes" / "rookworld-tiny.yaml").read_text())
    ungated = [{"name": f, "format_gate": False} if f in GATED_REWARDS else f for f in recipe["reward_funcs"]]
    funcs, weights, settings = recipe_rewards({**recipe, "reward_funcs": ungated, "stockfish_depth": 6,
                                               "stockfish_workers": 2})
    table = audit(funcs, weights, load_rookworld("rookgrpo/tiny-rookworld-eval")["text"], settings, n=40)[0]
    assert table.share("one eval too many") == pytest.approx(1 - 0.25 / 3 / table.rows["engine best"]["total"])


# Ill-formed in every position ("all legal moves" is well-formed where a position has five legal moves or fewer).
ILL_FORMED = ("one eval too many", "one eval too few", "an eval not a number", "a sixth move", "best move repeated",
              "legal move repeated")


@pytest.mark.parametrize("data", list(data_sets()))
def test_every_ill_formed_answer_earns_less_than_the_engines_second_best(recipe, data):
    """The training-signal rule, on every shipped chess recipe and both panels: every ill-formed answer (one eval too
    many or too few, an eval not a number, a sixth move, a repeated move) keeps only ``chess_format``'s partial credit
    (the format gate, on by default), below the engine's 2nd-best move well-formed, whatever its moves are worth."""
    name, (funcs, weights, settings) = recipe
    table = audit(funcs, weights, load_rookworld(data)["text"], settings, n=60, seed=1)[0]
    format_weight = weights[[f.name for f in funcs].index("chess_format")]
    for answer in ILL_FORMED:
        row = table.rows[answer]
        assert all(row[c] == 0.0 for c in GATED_REWARDS if c in row), (name, data, answer)
        assert table.share(answer) < table.share("engine 2nd"), (name, data, answer)
        assert table.share(answer) <= format_weight * row["chess_format"] / table.rows["engine best"]["total"] + 1e-9
        assert row["chess_format"] < 1.0, (name, data, answer)
    assert table.share("engine 2nd") < table.share("engine best") == 1.0
    assert table.share("constant evals") < 1.0 and table.rows["constant evals"]["chess_move_rank"] > 0  # well-formed


@pytest.mark.slow
def test_audit_command_prints_and_writes_the_tables(tmp_path):
    out = tmp_path / "audit.json"
    proc = run_cli([venv_bin("rookgrpo"), "rewards", "audit", str(REPO / "recipes" / "rookworld-tiny.yaml"),
                    "--n", "20", "--depth", "4", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| random legal |" in proc.stdout and "| copy FEN |" in proc.stdout
    report = json.loads(out.read_text())
    recipe = yaml.safe_load((REPO / "recipes" / "rookworld-tiny.yaml").read_text())
    assert report["depth"] == 4 and report["weights"] == recipe["reward_weights"]
    shares = report["data"][0]["tables"][0]["share"]
    assert shares["engine best"] == 1.0 and shares["random legal"] < 0.5


def test_audit_refuses_a_reward_model_and_mismatched_weights(tmp_path):
    from rookgrpo import ConfigError

    judge = tmp_path / "judge"
    judge.mkdir()
    with pytest.raises(ConfigError, match="reward model"):
        recipe_rewards({"reward_funcs": [str(judge)]})
    funcs, _, settings = recipe_rewards({"reward_funcs": ["chess_format"]})
    with pytest.raises(ConfigError, match="reward_weights"):
        audit(funcs, [1.0, 2.0], ["P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1a2 E: 0.0 B: a1a2"], settings)


def test_code_audit_constants_and_echoes_earn_no_code_exec_and_the_docs_table_is_the_commands(tmp_path):
    """`rookgrpo rewards audit recipes/code.yaml`: on HumanEval problems every degenerate answer earns 0 from
    code_exec (only code_format's 0.1 for a fenced block), the canonical solutions 1.0, and the mutants that fail a
    test keep some credit; docs/rewards.md holds the command's table."""
    from rookgrpo.code.problems import humaneval_rows
    from rookgrpo.chess.audit import recipe_rewards
    from rookgrpo.code.audit import REFERENCE, code_audit, format_code_audit

    recipe = yaml.safe_load((REPO / "recipes" / "code.yaml").read_text())
    funcs, weights, _ = recipe_rewards(recipe)
    result = code_audit(funcs, weights, humaneval_rows()[:12])
    rows = {r["answer"]: r for r in result["rows"]}
    assert rows[REFERENCE]["code_exec/mean"] == 1.0 and rows[REFERENCE]["mean"] == pytest.approx(1.1)
    for label in ("return None", "return 0", "return []", "echo the first argument", "pass", "raise ValueError",
                  "empty block", "prompt copied back"):
        assert rows[label]["code_exec/above_zero"] == 0, label
        assert rows[label]["mean"] == pytest.approx(0.1 * rows[label]["code_format/mean"]), label
    assert 0 < rows["mutated canonical"]["code_exec/mean"] < 0.5
    docs = (REPO / "docs" / "rewards.md").read_text()
    section = docs.split("### `recipes/code.yaml`")[1].split("```")[1]
    assert section.strip().splitlines()[1:3] == format_code_audit(result).splitlines()[1:3]  # the table's header
    assert "`rookgrpo rewards audit recipes/code.yaml`" in docs
