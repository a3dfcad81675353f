"""Name → callback registry, and the resolver for a recipe's ``callbacks`` entries.

An entry is a registered name (``"my_callback"``), a dotted path (``"pkg.module:Class"``), a mapping with arguments
(``{"name": "my_callback", "arg": 1}`` or ``{"my_callback": {"arg": 1}}``), a ``TrainerCallback`` class, or an
instance. Names and arguments are checked when the trainer is built, so a typo fails before training starts.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import re
from typing import Any

from transformers import TrainerCallback

from ..errors import ConfigError

_REGISTRY: dict[str, type[TrainerCallback]] = {}


def register_callback(name: str):
    """Class decorator: make a ``TrainerCallback`` subclass available to recipes under ``name``."""

    def decorator(cls):
        if not (inspect.isclass(cls) and issubclass(cls, TrainerCallback)):
            raise TypeError(f"register_callback({name!r}) expects a TrainerCallback subclass, got {cls!r}")
        _REGISTRY[name] = cls
        return cls

    return decorator


def available_callbacks() -> list[str]:
    """Sorted names of all registered callbacks, the built-in ones included."""
    _load_builtin_callbacks()
    return sorted(_REGISTRY)


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
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            spec = json.loads(spec)  # `--callbacks '{"name": "x", "arg": 1}'` on the command line
        except json.JSONDecodeError as exc:
            raise ConfigError(f"callbacks: {spec!r} is not valid JSON ({exc}).") from exc
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, dict):
        spec = dict(spec)
        if "name" in spec:
            name, kwargs = spec.pop("name"), spec
        elif len(spec) == 1:
            (name, kwargs), = spec.items()
            kwargs = dict(kwargs or {})
        else:
            raise ConfigError(
                f"callbacks: entry {spec!r} has no 'name'. Write it as {{name: my_callback, arg: 1}} or "
                "{my_callback: {arg: 1}}."
            )
    else:
        raise ConfigError(f"callbacks: entry {spec!r} is a {type(spec).__name__}; expected a name or a mapping.")
    cls = _lookup(name)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"callbacks: bad arguments for {name!r}: {exc}. Signature: {cls.__name__}{inspect.signature(cls)}") from exc
    return cls(**kwargs)


def _lookup(name: str) -> type[TrainerCallback]:
    _load_builtin_callbacks()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name or "." in name:
        module_name, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"callbacks: cannot load {name!r}: {exc}.") from exc
        if not (inspect.isclass(cls) and issubclass(cls, TrainerCallback)):
            raise ConfigError(f"callbacks: {name!r} is not a transformers.TrainerCallback subclass.")
        return cls
    close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise ConfigError(
        f"callbacks: unknown callback {name!r}.{hint} Registered: {', '.join(sorted(_REGISTRY)) or '(none)'}; "
        "or give a dotted path 'pkg.module:Class'."
    )


def _load_builtin_callbacks() -> None:
    """Import the built-in callback modules (``rookgrpo.BUILTIN_CALLBACKS``); each registers itself on import."""
    from .. import BUILTIN_CALLBACKS

    for module, _ in BUILTIN_CALLBACKS.values():
        importlib.import_module(f"rookgrpo.callbacks.{module}")


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
    rows = [f"### `{name}` (`{_lookup(name).__name__}`)", "", "| field | default | meaning |", "| --- | --- | --- |"]
    for field, default, meaning in callback_fields(name):
        rows.append(f"| `{field}` | {f'`{default}`' if default else ''} | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)
