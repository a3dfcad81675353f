"""The README and the docs: every link resolves, every code example runs (or, for a shell command, names things that
exist), every recipe excerpt says what the recipe says, and the generated reference is up to date.

- ``python`` blocks run in a subprocess in a scratch folder (with the repository's ``rewards/`` beside it); a block
  whose first line is ``# NAME.py`` (``# rewards/NAME.py``, ``# my_rewards.py``) is a file: it is written there, and
  the blocks after it can name it.
- ``yaml`` blocks parse; their callbacks and rewards resolve; a full recipe (with ``model_name_or_path``) passes the
  recipe parser; a block whose first line is ``# from recipes/NAME.yaml`` holds that recipe's values.
- ``bash`` blocks: each command's make target, ``rookgrpo`` command, files and ``--flags`` exist.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, load_script

# The manual and the README; docs/experiments is a dated log (linked, not run), docs/benchmarks.md is generated.
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "rewards" / "README.md"])
LINKED = sorted({*DOCS, *(REPO / "docs" / "experiments").glob("*.md"), REPO / "benchmarks" / "README.md",
                 REPO / "experiments" / "README.md",
                 REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld" / "README.md"})
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: The first line of a python block that is a file the blocks after it name: ``# rewards/my_reward.py``.
FILE_BLOCK = r"# (?:rewards/)?\w+\.py"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(path.read_text()) if kind == lang]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading.

    >>> slug("Scoring at the positions: `position_ids_from_mask` (on by default)")
    'scoring-at-the-positions-position_ids_from_mask-on-by-default'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_short_and_in_order():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    order = ["make train", "## Install", "## Quick start in Python", "## Quick start with a recipe",
             "## What `make train` shows", "## Callbacks", "## Rewards", "## Launching", "## Documentation"]
    positions = [text.index(marker) for marker in order]
    assert positions == sorted(positions)


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(path):
    broken = []
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: no network in tests
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, broken


# Files that name repository paths in plain text (a comment, a help line): each path they name must exist. The dated
# experiments log is history and keeps the names of its day.
PLAIN = sorted([*DOCS, REPO / "Makefile", *(REPO / "src" / "rookgrpo" / "recipes").glob("*.yaml"),
                *(REPO / "src" / "rookgrpo").rglob("*.py"), *(REPO / "benchmarks").glob("*.py"),
                *(REPO / "experiments").glob("*.py"), REPO / "experiments" / "README.md"])
PATH_TEXT = re.compile(r"(?<![\w./-])((?:docs|benchmarks|experiments(?!/\d{4}-)|scripts|recipes|examples|rewards)/[\w./-]*\w\.(?:md|py|yaml))")


@pytest.mark.parametrize("path", PLAIN, ids=lambda p: str(p.relative_to(REPO)))
def test_plain_text_paths_exist(path):
    named = set(PATH_TEXT.findall(path.read_text()))
    missing = sorted(p for p in named if not (REPO / p).exists() and "my_" not in p and "/R." not in p
                     and "NAME" not in p)
    assert not missing, f"{path.relative_to(REPO)} names missing files: {missing}"


def _python_blocks():
    return [(path, i, body) for path in DOCS for i, body in enumerate(blocks(path, "python"))]


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted({p for p, *_ in _python_blocks()}), ids=lambda p: str(p.relative_to(REPO)))
def test_python_examples_run(path, tmp_path):
    (tmp_path / "rewards").mkdir()
    for f in (REPO / "rewards").glob("*.py"):
        (tmp_path / "rewards" / f.name).write_text(f.read_text())
    for i, body in enumerate(blocks(path, "python")):
        first = body.splitlines()[0]
        if re.fullmatch(FILE_BLOCK, first):  # a file the next blocks name
            target = tmp_path / first[2:]
            target.write_text(body)
            module = load_script(target, f"doc_{target.stem}")
            fns = [v for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
            for fn in fns:  # a reward file: each function answers one float per completion
                out = fn(prompts=["P: x"] * 2, completions=["e2e4", "junk"], completion_ids=[[1], [2]])
                assert len(out) == 2 and all(v is None or isinstance(v, float) for v in out), (path, i)
            continue
        proc = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{path.name} python block {i}:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "yaml")], ids=lambda p: str(p.relative_to(REPO)))
def test_yaml_examples_parse_and_resolve(path, tmp_path, monkeypatch):
    from rookgrpo.callbacks.registry import resolve_callbacks
    from rookgrpo.recipe import parse_recipe
    from rookgrpo.rewards.registry import resolve_reward_func

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards").mkdir()
    for f in (REPO / "rewards").glob("*.py"):
        (tmp_path / "rewards" / f.name).write_text(f.read_text())
    for body in blocks(path, "python"):  # reward files the yaml may name
        first = body.splitlines()[0]
        if re.fullmatch(FILE_BLOCK, first):
            (tmp_path / first[2:]).write_text(body)
    for body in blocks(path, "yaml"):
        values = yaml.safe_load(body)
        assert isinstance(values, dict), body
        source = re.match(r"# from ((?:recipes|examples/[\w-]+)/[\w.-]+\.yaml)", body)
        if source and source.group(1).startswith("examples/"):  # the files an example's recipe names, beside it
            for f in (REPO / source.group(1)).parent.glob("*.py"):
                (tmp_path / f.name).write_text(f.read_text())
        if values.get("callbacks"):
            resolve_callbacks(values["callbacks"])
        for entry in values.get("reward_funcs") or ():
            resolve_reward_func(entry)
        if "reward_weights" in values:
            assert len(values["reward_weights"]) == len(values["reward_funcs"])
        if source:
            recipe = yaml.safe_load((REPO / source.group(1)).read_text())
            differ = {k: (v, recipe.get(k)) for k, v in values.items() if recipe.get(k) != v}
            assert not differ, f"{path.name}: excerpt of {source.group(1)} differs: {differ}"
        if "model_name_or_path" in values:
            recipe_file = tmp_path / "recipe.yaml"
            recipe_file.write_text(body)
            parse_recipe([str(recipe_file), "--output_dir", str(tmp_path / "out")])


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def _help_flags(command: list[str], cwd: Path = REPO) -> set[str]:
    proc = subprocess.run(command + ["--help"], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(re.findall(r"--[\w-]+", proc.stdout))


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "bash")], ids=lambda p: str(p.relative_to(REPO)))
def test_shell_examples_name_what_exists(path):
    from rookgrpo.cli import build_parser
    from rookgrpo.recipe import known_keys

    commands = build_parser()._subparsers._group_actions[0].choices
    problems = []
    for body in blocks(path, "bash"):
        cwd = REPO
        for line in body.splitlines():
            line = line.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before a command
                words = words[1:]
            if not words or words[0] == "export":
                continue
            if words[0] == "cd":  # the block's later lines run there
                cwd = cwd / words[1]
                problems += [f"{line}: no folder {words[1]}"] if not cwd.is_dir() else []
                continue
            if words[0] == "pip":
                continue
            if words[0] == "make":
                problems += [f"make {t}" for t in words[1:] if "=" not in t and t not in _make_targets()]
                continue
            files = [w for w in words if re.search(r"\.(py|yaml)$", w) and "/" in w]
            files += [w for w in words if re.search(r"\.(py|yaml)$", w) and "/" not in w and cwd != REPO]
            problems += [f"{line}: {f} missing" for f in files if not (cwd / f).exists() and "my" not in f
                         and not f.startswith("recipes/R.")]
            flags = {w.split("=")[0] for w in words if w.startswith("--")}
            if words[0] == "rookgrpo":
                if words[1] not in commands:
                    problems.append(f"{line}: no command {words[1]!r}")
                    continue
                accepted = set(commands[words[1]]._option_string_actions)
                if words[1] == "train":
                    accepted |= {f"--{k}" for k in known_keys()}
                problems += [f"{line}: {f} unknown" for f in flags - accepted]
            elif "-m" in words and "rookgrpo" in words:  # python -m rookgrpo / accelerate launch -m rookgrpo
                recipe_flags = {w.split("=")[0] for w in words[words.index("rookgrpo") + 1:] if w.startswith("--")}
                problems += [f"{line}: {f} is no recipe key" for f in recipe_flags
                             if f[2:] not in known_keys()]
            elif words[:2] == ["python", "-m"] and words[2].startswith("rookgrpo."):  # a module of the package
                module = REPO / "src" / (words[2].replace(".", "/") + ".py")
                problems += [f"{line}: no module {words[2]}"] if not module.exists() else []
            elif words[0] == "python" and words[1].endswith(".py"):
                problems += [f"{line}: {f} unknown" for f in flags - _help_flags([sys.executable, words[1]], cwd)]
            elif words[0] not in ("accelerate", "vllm"):  # the launchers a run names: accelerate, vLLM's server
                problems.append(f"{line}: not a command these docs may use")
    assert not problems, problems


def test_reference_tables_are_generated_from_the_code():
    script = load_script(REPO / "scripts" / "build_reference.py")
    assert script.main(["--check"]) == 0, "run `python scripts/build_reference.py`"
