"""The callbacks' side of rookgrpo's one registry (:mod:`rookgrpo.registry`), and the resolver for a recipe's
``callbacks`` entries.

An entry is in the registry's grammar: a registered name (``"my_callback"``), an import or file path
(``"pkg.module:Class"``, ``"my_callbacks.py:Class"``), either with arguments (``{"name": "my_callback", "arg": 1}`` or
``{"my_callback": {"arg": 1}}``); from Python also a ``TrainerCallback`` class or instance. Names and arguments are
checked when the trainer is built, so a typo fails before training starts.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from transformers import TrainerCallback

from .. import registry
from ..errors import ConfigError



def register_callback(name: str):
    """Class decorator: make a ``TrainerCallback`` subclass available to recipes under ``name``."""

    def decorator(cls):
        if not (inspect.isclass(cls) and issubclass(cls, TrainerCallback)):
            raise TypeError(f"register_callback({name!r}) expects a TrainerCallback subclass, got {cls!r}")
        registry.register("callback", name, cls, replace=True)
        return cls

    return decorator


def available_callbacks() -> list[str]:
    """Sorted names of all registered callbacks: the core's, every task pack's, and any registered by a user."""
    return registry.names("callback")


def resolve_callbacks(specs: Any) -> list[Any] | None:
    """Instantiate every entry of ``specs`` (see module docstring). ``None`` stays ``None``."""
    if specs is None:
        return None
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    return [resolve_callback(spec) for spec in specs]


def resolve_callback(spec: Any) -> TrainerCallback:
    """Instantiate one callback entry."""
    if isinstance(spec, TrainerCallback):
        return spec
    if inspect.isclass(spec) and issubclass(spec, TrainerCallback):
        return spec()
    name, kwargs = registry.split_spec(spec, "callback")
    if not isinstance(name, str):
        raise ConfigError(f"callbacks: entry {spec!r} is a {type(spec).__name__}; expected a name or a mapping.")
    cls = _lookup(name)
    return registry.call_with(cls, kwargs, "callback", name)


def _lookup(name: str) -> type[TrainerCallback]:
    cls = registry.load("callback", name)
    if not (inspect.isclass(cls) and issubclass(cls, TrainerCallback)):
        raise ConfigError(f"callbacks: {name!r} is not a transformers.TrainerCallback subclass.")
    return cls


def callback_fields(name: str) -> list[tuple[str, str, str]]:
    """(field, default, meaning) of each argument a registered callback takes, from its signature and the ``Args:``
    section of its docstring (what ``rookgrpo callbacks NAME`` prints and docs/reference.md tabulates).

    >>> callback_fields("kl_cap")
    [('max_token_kl', '10.0', 'the largest k3 KL term (`exp(r) - r - 1`) one token may contribute, in nats; > 0.')]
    """
    cls = _lookup(name)
    doc = inspect.getdoc(cls) or ""
    meanings: dict[str, str] = {}
    current = None
    for line in doc.split("Args:", 1)[1].split("\n\n", 1)[0].splitlines()[1:] if "Args:" in doc else []:
        entry = re.match(r"    (?:\*\*)?([\w, ]+): (.*)", line)
        if entry and not line.startswith("        "):
            current = entry.group(1)
            meanings[current] = entry.group(2)
        elif current:
            meanings[current] += " " + line.strip()
    rows = []
    for param in inspect.signature(cls).parameters.values():
        if param.kind == param.VAR_POSITIONAL:
            continue
        key = next((k for k in meanings if param.name in (x.strip() for x in k.split(","))), None)
        meaning = meanings.get(key, "").replace("``", "`") if key else ""
        if param.kind == param.VAR_KEYWORD:
            rows.append((f"**{param.name}", "", meaning))
        else:
            rows.append((param.name, "required" if param.default is param.empty else repr(param.default), meaning))
    return rows


def callback_fields_markdown(name: str) -> str:
    """:func:`callback_fields` of ``name`` as a markdown table, headed by its recipe name and class."""
    fields = callback_fields(name)
    if not fields:
        return f"### `{name}` (`{_lookup(name).__name__}`)\n\nNo fields."
    rows = [f"### `{name}` (`{_lookup(name).__name__}`)", "", "| field | default | meaning |", "| --- | --- | --- |"]
    for field, default, meaning in fields:
        rows.append(f"| `{field}` | {f'`{default}`' if default else ''} | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)
