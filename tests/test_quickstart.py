"""The README's quick starts and docs/getting-started.md's first runs, run as written in an empty folder against the
installed package: the blocks are read from the docs (never copied here), in order, each section in a folder of its
own. A ``python`` or ``yaml`` block whose first line names a file (``# my_rewards.py``, ``# my-recipe.yaml``) is that
file, written before the blocks after it run; other ``python`` blocks run with the venv's Python; each ``bash`` line
runs as written with the venv's commands (``pip install`` lines aside: the suite runs against the package the venv
has). Nothing of a checkout is beside the folder, so a quick start that names a checkout's file fails.
"""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from conftest import REPO, run_cli, venv_bin

#: (file, heading) of the sections a new user runs first. Left out by name: getting-started's "A first run", which is
#: `make train-smoke` and `make train`, a checkout's Makefile targets (not the installed package's), the second the
#: 12-minute main job whose steps the suite tests one by one.
SECTIONS = [("README.md", "## Quick start in Python"), ("README.md", "## Quick start with a recipe"),
            ("docs/getting-started.md", "## Your own run")]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
FILE_LINE = re.compile(r"# ([\w.-]+\.(?:py|yaml))\s*$")


def section_blocks(path: str, heading: str) -> list[tuple[str, str]]:
    text = (REPO / path).read_text()
    section = text[text.index(heading):]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    return FENCE.findall(section)


def _command(line: str) -> list[str]:
    words = shlex.split(line)
    if words[0] in ("rookgrpo", "accelerate"):
        words[0] = venv_bin(words[0])
    elif words[0] == "python":
        words[0] = sys.executable
    return words


@pytest.mark.slow
@pytest.mark.parametrize("path, heading", SECTIONS, ids=[f"{p}:{h[3:]}" for p, h in SECTIONS])
def test_the_quick_starts_run_as_written_in_an_empty_folder(path, heading, tmp_path):
    ran = 0
    for lang, body in section_blocks(path, heading):
        first = body.splitlines()[0] if body.strip() else ""
        named = FILE_LINE.fullmatch(first)
        if lang in ("python", "yaml") and named:
            (tmp_path / named.group(1)).write_text(body)
            continue
        if lang == "python":
            steps = re.search(r"max_steps=(\d+)", body)
            tail = "\nprint('global_step', trainer.state.global_step)\n" if steps and "trainer.train()" in body else ""
            proc = run_cli([sys.executable, "-c", body + tail], cwd=tmp_path)  # pasted as written, then one print
            assert proc.returncode == 0, f"{path} python block:\n{proc.stderr[-3000:]}"
            assert "train_runtime" in proc.stdout + proc.stderr  # it trained to the end
            if tail:  # the optimizer steps the block asks for, no fewer
                assert f"global_step {steps.group(1)}" in proc.stdout, proc.stdout[-2000:]
            ran += 1
        elif lang == "bash":
            for line in body.splitlines():
                command = line.split(" #")[0].strip()
                if not command or command.startswith("#"):
                    continue
                if command.startswith("pip "):
                    continue  # installing: the suite runs against the package the venv already has
                proc = run_cli(_command(command), cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
                assert proc.returncode == 0, f"{path}: `{command}` failed in an empty folder:\n{proc.stderr[-3000:]}"
                ran += 1
    assert ran, f"{path} {heading}: nothing ran"
