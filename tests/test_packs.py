"""The registry's one grammar across kinds, task packs (built-in, entry-point, missing extra) and the packaged
recipes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from rookgrpo import registry
from rookgrpo.errors import ConfigError
from rookgrpo.rewards.registry import resolve_reward_func

REWARDS = '''
def length_penalty(completions, target=10, **kwargs):
    return [-abs(len(c) - target) / target for c in completions]


class Contains:
    def __init__(self, text="e4"):
        self.text = text
        self.__name__ = "contains"

    def __call__(self, completions, **kwargs):
        return [1.0 if self.text in c else 0.0 for c in completions]


def exact_eval(model, tokenizer, rows, scale=1.0):
    return {"rows": float(len(rows)) * scale}
'''


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(REWARDS)
    return "mine.py"


def test_rewards_take_arguments_in_every_form_and_keep_their_name(user_file):
    plain = resolve_reward_func("mine.py:length_penalty")
    bound = resolve_reward_func({"name": "mine.py:length_penalty", "target": 4})
    nested = resolve_reward_func({"mine.py:length_penalty": {"target": 4}})
    assert plain(["abcd"]) == [-0.6] and bound(["abcd"]) == nested(["abcd"]) == [0.0]
    assert bound.__name__ == "length_penalty"  # TRL logs rewards/<__name__>/mean
    instance = resolve_reward_func({"name": "mine.py:Contains", "text": "d4"})
    assert instance(["d4 e5", "e4"]) == [1.0, 0.0] and instance.__name__ == "contains"
    with pytest.raises(ConfigError, match=r"bad arguments for 'mine.py:Contains'.*text"):
        resolve_reward_func({"name": "mine.py:Contains", "txt": "d4"})
    with pytest.raises(ConfigError, match="takes no arguments here"):
        resolve_reward_func({"name": "org/reward-model", "scale": 2})


def test_formats_and_evaluators_resolve_through_the_same_grammar(user_file):
    from datasets import Dataset

    from rookgrpo.data import apply_format

    rows = Dataset.from_dict({"question": ["1+1="], "answer": ["2"]})
    assert apply_format(rows, "prompt", prompt_column="question")["prompt"] == ["1+1="]
    with pytest.raises(ConfigError, match=r"dataset_format: unknown format 'rookworl'.*Did you mean 'rookworld'"):
        apply_format(rows, "rookworl")
    evaluator = registry.load("evaluator", "mine.py:exact_eval")
    assert evaluator(None, None, [{}, {}]) == {"rows": 2.0}
    from rookgrpo.callbacks import resolve_callback

    cb = resolve_callback({"heldout_eval": {"data": "x", "evaluator": {"name": "mine.py:exact_eval", "scale": 3}}})
    cb.rows = [{"prompt": "a"}]
    cb.setup(trainer=None)
    assert cb.score(None, None) == {"rows": 3.0}


def test_auto_format_asks_the_packs_detectors():
    from datasets import Dataset

    from rookgrpo.data import apply_format

    text = Dataset.from_dict({"text": ["P: 8/8/8/8/8/8/8/K6k w - - 0 1                                             "
                                       "M: a1a2 E: 0.0 B: a1a2"]})
    assert registry.detect_format(["text"], "prompt") == "rookworld"
    assert registry.detect_format(["prompt", "text"], "prompt") is None
    assert set(apply_format(text, "auto").column_names) >= {"prompt", "completion", "task", "fen"}


def test_a_pack_installed_through_an_entry_point_registers_with_rookgrpo(tmp_path):
    site = tmp_path / "site"
    (site / "mypack-0.1.dist-info").mkdir(parents=True)
    (site / "mypack-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mypack\nVersion: 0.1\n")
    (site / "mypack-0.1.dist-info" / "entry_points.txt").write_text("[rookgrpo.packs]\nsums = mypack\n")
    (site / "mypack.py").write_text(textwrap.dedent('''
        from rookgrpo.registry import register
        register("reward", "sum_exact", "mypack_rewards:sum_exact")
        register("format", "sums", "mypack_rewards:sums")
    '''))
    (site / "mypack_rewards.py").write_text("def sum_exact(completions, **kw):\n    return [1.0] * len(completions)\n"
                                            "def sums(dataset, prompt_column='prompt', tasks=None):\n    return dataset\n")
    code = ("from rookgrpo.rewards import available_rewards, get_reward; from rookgrpo.registry import pack_of;"
            "assert 'sum_exact' in available_rewards(); assert get_reward('sum_exact')(['a']) == [1.0];"
            "assert pack_of('reward', 'sum_exact') == 'sums' and pack_of('reward', 'chess_env') == 'chess';"
            "assert pack_of('callback', 'heldout_eval') == 'core'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_a_missing_extra_is_one_line_naming_it():
    entry = registry.Entry("nowhere:thing", pack="chess", extra="chess", extra_modules=("chess",))
    exc = ModuleNotFoundError("No module named 'chess'", name="chess")
    assert registry.missing_extra(exc, entry)
    assert not registry.missing_extra(ModuleNotFoundError("x", name="chessboard"), entry)
    assert registry.extra_message("reward_funcs: 'chess_move_rank'", entry, exc) == (
        "reward_funcs: 'chess_move_rank' comes with rookgrpo's chess pack, which needs 'chess', not installed here: "
        "pip install 'rookgrpo[chess]'.")


def test_packaged_recipes_list_copy_and_refuse_to_overwrite(tmp_path, capsys):
    from rookgrpo.cli import main
    from rookgrpo.recipe import packaged_recipes

    assert main(["recipes"]) == 0
    listing = capsys.readouterr().out
    assert all(f"  {name} " in listing for name in packaged_recipes()) and "  cpu-ddp " in listing
    assert main(["recipes", "judge", "--copy", str(tmp_path)]) == 0
    assert (tmp_path / "judge.yaml").read_text() == packaged_recipes()["judge"].read_text()
    assert main(["recipes", "judge", "--copy", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["recipes", "rookworld-tin"]) == 2
    assert "Did you mean 'rookworld-tiny'" in capsys.readouterr().err


def test_a_recipe_name_resolves_for_every_launcher(tmp_path, monkeypatch):
    """`python -m rookgrpo NAME`, `accelerate launch -m rookgrpo NAME` and `rookgrpo train NAME` all go through
    normalize_argv: a packaged recipe's name (or recipes/NAME.yaml, as the docs write it) becomes its file, from any
    folder; a file of the same name in the folder wins."""
    from rookgrpo.recipe import normalize_argv, packaged_recipes

    monkeypatch.chdir(tmp_path)
    packaged = str(packaged_recipes()["rookworld"])
    assert normalize_argv(["rookworld", "--max_steps", "2"]) == ["--config", packaged, "--max_steps", "2"]
    assert normalize_argv(["recipes/rookworld.yaml"]) == ["--config", packaged]
    (tmp_path / "rookworld.yaml").write_text("model_name_or_path: x\n")
    assert normalize_argv(["rookworld.yaml"]) == ["--config", "rookworld.yaml"]
    with pytest.raises(ConfigError, match="does not exist and is not a packaged recipe"):
        normalize_argv(["elsewhere/rookworld.yaml"])
