"""Name → reward function registry, and the resolver that turns a recipe's ``reward_funcs`` entries into callables.

A recipe can name a reward in five ways (the first match wins):

1. a registered name: ``uci_charset`` (see :func:`available_rewards`);
2. a dotted import path: ``my_pkg.my_rewards:my_reward`` (``pkg.mod.fn`` also works, as in ``trl grpo``);
3. a file path: ``rewards/my_reward.py:my_reward`` (relative to the launch directory, or absolute);
4. a callable (from Python);
5. a reward-model id or local directory (``org/model`` or ``./my-judge``): passed to TRL unchanged, which loads it as
   an ``AutoModelForSequenceClassification`` exactly as ``GRPOTrainer`` does; a packaged judge's short name
   (``rookgrpo/fill-in-judge``) becomes its local directory.

Anything else is an error that lists the registered names and says what the valid forms look like.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError

_REGISTRY: dict[str, Callable[..., Any]] = {}
# "org/name" or "name" with hub-legal characters; used only to tell a model id from a typo'd registry name.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def register_reward(name: str | None = None):
    """Decorator: register a reward function (or callable class instance factory) under ``name``.

    >>> @register_reward("always_one")
    ... def always_one(completions, **kwargs):
    ...     return [1.0] * len(completions)
    """

    def decorator(func):
        key = name or getattr(func, "__name__", None)
        if not key:
            raise ValueError("register_reward needs a name for callables without __name__")
        if key in _REGISTRY and _REGISTRY[key] is not func:
            raise ValueError(f"a reward named {key!r} is already registered ({_REGISTRY[key]!r})")
        _REGISTRY[key] = func
        return func

    return decorator


def available_rewards() -> list[str]:
    """Sorted names of all registered reward functions."""
    _load_builtin_rewards()
    return sorted(_REGISTRY)


def get_reward(name: str) -> Callable[..., Any]:
    """Return the registered reward ``name`` or raise :class:`ConfigError` naming the close matches."""
    _load_builtin_rewards()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(_unknown_reward_message(name)) from None


def resolve_reward_func(spec: Any) -> Any:
    """Turn one ``reward_funcs`` entry into what ``GRPOTrainer`` accepts: a callable, a module, or a model id string."""
    if not isinstance(spec, str):
        if callable(spec):
            return spec
        raise ConfigError(
            f"reward_funcs: entry {spec!r} is a {type(spec).__name__}; expected a registered name, "
            "'pkg.module:function', 'path/to/file.py:function', a callable, or a reward-model id."
        )
    spec = spec.strip()
    _load_builtin_rewards()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if ":" in spec:
        target, _, attr = spec.rpartition(":")
        if target.endswith(".py") or "/" in target or "\\" in target:
            return _load_from_file(spec, target, attr)
        return _load_from_module(spec, target, attr)
    if Path(spec).is_dir():
        return spec  # a local reward model directory
    from ..assets import MODELS, PREFIX, resolve_model

    if spec.startswith(PREFIX) and spec[len(PREFIX):] in MODELS:
        return resolve_model(spec)  # a packaged judge (rookgrpo/fill-in-judge), built on first use
    if "." in spec and "/" not in spec and not spec.endswith(".py"):
        module, _, attr = spec.rpartition(".")  # trl's `pkg.mod.fn` form
        return _load_from_module(spec, module, attr)
    if spec.endswith(".py"):
        raise ConfigError(
            f"reward_funcs: {spec!r} names a file but no function; write it as '{spec}:function_name'."
        )
    if _HUB_ID.match(spec):
        return spec  # a hub reward model; TRL loads it
    raise ConfigError(_unknown_reward_message(spec))


def _unknown_reward_message(name: str) -> str:
    known = sorted(_REGISTRY)
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (
        f"reward_funcs: unknown reward {name!r}.{hint} Registered rewards: {', '.join(known) or '(none)'}. "
        "Other forms: 'pkg.module:function', 'path/to/file.py:function', or a reward-model id like 'org/model'."
    )


def _load_from_module(spec: str, module_name: str, attr: str) -> Callable[..., Any]:
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `trl grpo`: let recipes name modules next to them
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"reward_funcs: cannot import module {module_name!r} for {spec!r} ({exc}). Install the package that "
            "provides it, or name a file instead: 'path/to/file.py:function'."
        ) from exc
    return _get_attr(module, attr, spec)


def _load_from_file(spec: str, file_part: str, attr: str) -> Callable[..., Any]:
    path = Path(file_part).expanduser()
    resolved = path if path.is_absolute() else Path.cwd() / path
    if not resolved.is_file():
        raise ConfigError(
            f"reward_funcs: reward file {file_part!r} (from {spec!r}) does not exist (looked for {resolved}). "
            "Give a path relative to the directory you launch from, or an absolute path."
        )
    # A stable module name keeps the functions picklable within a run and lets two entries share one module.
    module_name = "rookgrpo_user_rewards." + re.sub(r"\W", "_", str(resolved.resolve().with_suffix("")))
    module = sys.modules.get(module_name)
    if module is None:
        file_spec = importlib.util.spec_from_file_location(module_name, resolved)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = module
        try:
            file_spec.loader.exec_module(module)
        except Exception:
            del sys.modules[module_name]
            raise
    return _get_attr(module, attr, spec)


def _get_attr(module: Any, attr: str, spec: str) -> Callable[..., Any]:
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"reward_funcs: {spec!r}: {module.__name__!r} has no callable {attr!r}. Callables there: "
            f"{', '.join(names) or '(none)'}."
        )
    return func


_builtins_loaded = False


def _load_builtin_rewards() -> None:
    """Import the modules that register built-in rewards (deferred so importing the registry stays cheap)."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in ("rookgrpo.rewards.basic", "rookgrpo.rewards.chess", "rookgrpo.rewards.code", "rookgrpo.rewards.fill_in"):
        importlib.import_module(module)
