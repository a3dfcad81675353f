"""The grids in experiments/: every re-table command experiments/README.md lists gives the table stored with its
result, from the stored runs alone (no training), so a grid's numbers in its plan can always be re-made."""

import json
import re
import shlex

import pytest

from conftest import REPO, load_script

README = REPO / "experiments" / "README.md"
COMMAND = re.compile(r"`(python experiments/\w+\.py --from_result [^`]+)`")


def retable_commands() -> list[str]:
    return COMMAND.findall(README.read_text())


def stored_result(argv: list[str]) -> tuple[list[str], str]:
    """The command's arguments without ``--out``, and the result file it re-makes: its ``--out`` where it names one
    (several results tabled as one), else the one result it reads."""
    if "--out" in argv:
        i = argv.index("--out")
        return argv[:i] + argv[i + 2:], argv[i + 1]
    inputs = [a for a in argv if a.endswith(".json")]
    assert len(inputs) == 1, argv
    return argv, inputs[0]


def test_every_grid_script_and_every_result_file_has_a_command():
    commands = [shlex.split(c) for c in retable_commands()]
    stored = {stored_result(argv[2:])[1] for argv in commands}
    assert stored == {f"experiments/results/{p.name}" for p in (REPO / "experiments" / "results").glob("*.json")
                      if not p.name.startswith("make_train")}  # the make train seeds': test_the_readme_table_...
    grids = {f"experiments/{p.name}" for p in (REPO / "experiments").glob("*.py")}
    assert {argv[1] for argv in commands} == grids - {"experiments/levers.py", "experiments/seed_table.py"}


@pytest.mark.parametrize("command", retable_commands(), ids=lambda c: stored_result(shlex.split(c)[2:])[1][20:-5])
def test_each_grid_retables_its_stored_result(command, monkeypatch, capsys):
    argv = shlex.split(command)
    args, stored = stored_result(argv[2:])
    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    monkeypatch.chdir(REPO)
    script = load_script(REPO / argv[1], f"retable_{argv[1].rsplit('/', 1)[-1][:-3]}")
    result = script.main(args)
    assert result["table"] == json.loads((REPO / stored).read_text())["table"]
    assert result["table"] in capsys.readouterr().out


def test_the_make_train_tables_are_what_their_command_prints(capsys, monkeypatch):
    """README.md's `make train` table and docs/results.md's tables are the output of the seed-table command
    docs/results.md gives, on the five runs' stored evaluations (experiments/results/make_train_*/)."""
    results = (REPO / "docs" / "results.md").read_text()
    command = re.search(r"`(python experiments/seed_table\.py --before experiments/results/[^`]+)`", results)
    assert command, "docs/results.md gives no seed-table command over stored evaluations"
    argv = shlex.split(command.group(1))
    monkeypatch.chdir(REPO)
    assert load_script(REPO / argv[1], "seed_table_docs").main(argv[2:]) == 0
    tables = [t for t in re.split(r"\n\n+", capsys.readouterr().out) if t.startswith("|")]
    assert len(tables) == 3  # against the start, format answer by answer, against the recipe before
    for table in tables:
        assert table.strip() in results
    assert tables[0].strip() in (REPO / "README.md").read_text()
