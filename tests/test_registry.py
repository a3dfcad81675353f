"""Reward registry and resolver: every documented form resolves, and every bad entry is a clear ConfigError."""

from pathlib import Path

import pytest

from rookgrpo import ConfigError
from rookgrpo.callbacks import register_callback, resolve_callbacks
from rookgrpo.rewards import available_rewards, get_reward, register_reward, resolve_reward_func
from rookgrpo.rewards.basic import uci_charset

REPO = Path(__file__).resolve().parents[1]


def test_registered_name_resolves_to_the_function():
    assert "uci_charset" in available_rewards()
    assert resolve_reward_func("uci_charset") is uci_charset
    assert get_reward("uci_charset") is uci_charset


def test_dotted_paths_resolve_in_both_notations():
    assert resolve_reward_func("rookgrpo.rewards.basic:uci_charset") is uci_charset
    assert resolve_reward_func("rookgrpo.rewards.basic.uci_charset") is uci_charset


def test_file_path_resolves_relative_to_cwd(monkeypatch):
    monkeypatch.chdir(REPO)
    fn = resolve_reward_func("rewards/example_reward.py:prompt_charset")
    assert fn(prompts=["abc", "abc"], completions=["aab", "xyz"]) == [1.0, 0.0]
    # The same file resolves to the same module (one import, picklable functions).
    assert resolve_reward_func(str(REPO / "rewards/example_reward.py") + ":prompt_charset") is fn


def test_callables_and_model_ids_pass_through(tmp_path):
    def mine(completions, **kw):
        return [0.0] * len(completions)

    assert resolve_reward_func(mine) is mine
    assert resolve_reward_func("some-org/some-reward-model") == "some-org/some-reward-model"
    assert resolve_reward_func(str(tmp_path)) == str(tmp_path)  # a local reward-model directory


def test_a_reward_class_is_built_with_or_without_arguments(tmp_path, monkeypatch):
    """TRL calls each reward with the batch: a class named by path (or passed) must arrive as an instance, not be
    called with ``prompts=``; with arguments, they go to its constructor."""
    (tmp_path / "mine.py").write_text(
        "class Length:\n"
        "    def __init__(self, scale=1.0):\n        self.scale, self.__name__ = scale, 'length'\n"
        "    def __call__(self, completions, **kwargs):\n        return [self.scale * len(c) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_reward_func("mine.py:Length")(completions=["ab"]) == [2.0]
    assert resolve_reward_func({"name": "mine.py:Length", "scale": 3})(completions=["ab"]) == [6.0]
    cls = type(resolve_reward_func("mine.py:Length"))
    assert resolve_reward_func(cls)(completions=["abc"]) == [3.0]


def test_unknown_name_suggests_the_close_registered_one():
    with pytest.raises(ConfigError) as err:
        resolve_reward_func("uci_charst")
    msg = str(err.value)
    assert "unknown reward 'uci_charst'" in msg and "Did you mean 'uci_charset'" in msg
    assert "path/to/file.py:function" in msg


def test_missing_reward_file_names_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"reward file 'rewards/nope.py' .*does not exist .*nope.py"):
        resolve_reward_func("rewards/nope.py:fn")


def test_missing_function_in_file_lists_what_is_there(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError, match=r"no callable 'nope'.*prompt_charset"):
        resolve_reward_func("rewards/example_reward.py:nope")


def test_missing_module_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot import module 'no_such_pkg.rewards'"):
        resolve_reward_func("no_such_pkg.rewards:fn")


def test_file_without_function_says_how_to_write_it():
    with pytest.raises(ConfigError, match="rewards/x.py:function_name"):
        resolve_reward_func("rewards/x.py")


def test_register_reward_rejects_a_second_function_under_the_same_name():
    @register_reward("_test_unique_name")
    def first(completions, **kw):
        return [1.0] * len(completions)

    with pytest.raises(ValueError, match="already registered"):

        @register_reward("_test_unique_name")
        def second(completions, **kw):
            return [0.0] * len(completions)


def test_callbacks_resolve_by_name_path_and_mapping_with_arguments():
    from transformers import TrainerCallback

    @register_callback("_test_cb")
    class Counter(TrainerCallback):
        def __init__(self, every: int = 1):
            self.every = every

    made = resolve_callbacks(["_test_cb", {"name": "_test_cb", "every": 3}, {"_test_cb": {"every": 5}},
                              '{"name": "_test_cb", "every": 7}',
                              "transformers.trainer_callback:PrinterCallback"])
    assert [getattr(c, "every", None) for c in made] == [1, 3, 5, 7, None]
    assert type(made[-1]).__name__ == "PrinterCallback"
    with pytest.raises(ConfigError, match="bad arguments for '_test_cb'"):
        resolve_callbacks([{"name": "_test_cb", "evrey": 3}])
    with pytest.raises(ConfigError, match="unknown callback '_tst_cb'.*Did you mean '_test_cb'"):
        resolve_callbacks(["_tst_cb"])


def test_callbacks_are_importable_from_the_package_root():
    """As TRL exports its own callbacks: users building trainers in Python import them from ``rookgrpo``."""
    import rookgrpo
    from rookgrpo import AdaptiveBeta, Diagnostics, RookCallback, ZeroStdResampling
    from rookgrpo.callbacks import registry

    for cls in (AdaptiveBeta, Diagnostics, ZeroStdResampling):
        assert issubclass(cls, RookCallback) and cls.__name__ in rookgrpo.__all__
    assert registry.resolve_callback("zero_std_resampling").__class__ is ZeroStdResampling


def test_builtin_callbacks_are_registered_exported_and_documented():
    """One list (``rookgrpo.BUILTIN_CALLBACKS``) drives the registry and the package exports; every built-in documents
    its arguments with a runnable example (the doctests run them)."""
    import inspect

    import rookgrpo
    from rookgrpo.callbacks import HOOKS, RookCallback
    from rookgrpo.callbacks.registry import _lookup, available_callbacks

    builtin = rookgrpo.BUILTIN_CALLBACKS
    assert set(builtin) <= set(available_callbacks())
    for name, (module, cls_name) in builtin.items():
        cls = _lookup(name)
        assert cls.__module__ == f"rookgrpo.callbacks.{module}" and cls.__name__ == cls_name
        assert getattr(rookgrpo, cls_name) is cls and cls_name in rookgrpo.__all__
        doc = inspect.getdoc(cls)
        assert "Args:" in doc and ">>> " in doc, f"{cls_name}: docstring needs Args and an Example"
        assert issubclass(cls, RookCallback)
        assert any(cls().implements(h) for h in HOOKS) or name in ("adaptive_beta", "heldout_eval")  # events only


def test_hooks_are_called_only_where_overridden():
    from rookgrpo.callbacks import HOOKS, RookCallback

    class Logs(RookCallback):
        def before_log(self, trainer, logs):
            logs["x"] = 1

    assert [h for h in HOOKS if Logs().implements(h)] == ["before_log"]
    assert not any(RookCallback().implements(h) for h in HOOKS)
    with pytest.raises(ValueError, match="not a RookCallback hook"):
        Logs().implements("on_scored_batches")


BUILDER = '''
import os, sys, time
from rookgrpo.assets import cache_dir, register_model, resolve_model

def build():
    out = cache_dir() / "models" / "slow-test"
    if (out / "config.json").exists():
        return out
    with open(os.environ["BUILDS"], "a") as log:
        log.write("built\\n")
    time.sleep(1.5)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{}")
    return out

register_model("slow-test", build)
print(resolve_model("rookgrpo/slow-test"))
'''


def test_two_jobs_sharing_a_cache_build_a_packaged_model_once(tmp_path):
    """Two processes (two jobs, or test workers) resolving the same unbuilt packaged model: one builds, the other waits
    for the cache's lock and finds it built."""
    import os
    import subprocess
    import sys

    script = tmp_path / "builder.py"
    script.write_text(BUILDER)
    env = {**os.environ, "ROOKGRPO_CACHE": str(tmp_path / "cache"), "BUILDS": str(tmp_path / "builds.log")}
    procs = [subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs[0] == outputs[1] == str(tmp_path / "cache" / "models" / "slow-test")
    assert (tmp_path / "builds.log").read_text().splitlines() == ["built"]
