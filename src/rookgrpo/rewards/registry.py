"""The rewards' side of rookgrpo's one registry (:mod:`rookgrpo.registry`), and the resolver that turns a recipe's
``reward_funcs`` entries into what TRL takes.

A recipe names a reward in the registry's grammar, plus what only rewards have (the first match wins):

1. a registered name: ``uci_charset``, ``chess_move_rank`` (see :func:`available_rewards`);
2. a dotted import path: ``my_pkg.my_rewards:my_reward`` (``pkg.mod.fn`` also works, as in ``trl grpo``);
3. a file path: ``rewards/my_reward.py:my_reward`` (relative to the launch directory, or absolute);
4. any of these with arguments: ``{name: my_rewards.py:length_penalty, target: 40}``;
5. a callable (from Python);
6. a reward-model id or local directory (``org/model`` or ``./my-judge``): passed to TRL unchanged, which loads it as
   an ``AutoModelForSequenceClassification`` exactly as ``GRPOTrainer`` does; a packaged judge's short name
   (``rookgrpo/fill-in-judge``) becomes its local directory.

Anything else is an error that lists the registered names and says what the valid forms look like.
"""

from __future__ import annotations

import inspect

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import registry
from ..errors import ConfigError

# "org/name" or "name" with hub-legal characters; used only to tell a model id from a typo'd registry name.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def register_reward(name: str | None = None):
    """Decorator: register a reward function (or a callable instance) under ``name`` (default: its ``__name__``).

    >>> @register_reward("always_one")
    ... def always_one(completions, **kwargs):
    ...     return [1.0] * len(completions)
    """

    def decorator(func):
        key = name or getattr(func, "__name__", None)
        if not key:
            raise ValueError("register_reward needs a name for callables without __name__")
        registry.register("reward", key, func)
        return func

    return decorator


def available_rewards() -> list[str]:
    """Sorted names of all registered reward functions (the core's and every task pack's)."""
    return registry.names("reward")


def get_reward(name: str) -> Callable[..., Any]:
    """Return the registered reward ``name`` or raise :class:`ConfigError` naming the close matches (or the extra its
    pack needs)."""
    return registry.lookup("reward", name)


def resolve_reward_func(spec: Any) -> Any:
    """Turn one ``reward_funcs`` entry into what ``GRPOTrainer`` accepts: a callable, or a reward-model id string.

    An entry with arguments (``{name: my_rewards.py:length_penalty, target: 40}``) builds a new reward: a new instance of a
    registered reward object's class, a class called with them, or a function with them bound; TRL names its metrics
    by the registered name either way.
    """
    name, kwargs = registry.split_spec(spec, "reward")
    if not isinstance(name, str):
        if inspect.isclass(name):
            return registry.call_with(name, kwargs, "reward", name.__name__)
        if callable(name) and not kwargs:
            return name
        if callable(name):
            return registry.bind(name, kwargs, "reward", getattr(name, "__name__", type(name).__name__))
        raise ConfigError(
            f"reward_funcs: entry {spec!r} is a {type(spec).__name__}; expected a registered name, "
            "'pkg.module:function', 'path/to/file.py:function', a callable, or a reward-model id."
        )
    if registry.registered("reward", name) or registry.looks_like_path(name) and not Path(name).is_dir():
        func = registry.load("reward", name)
        if inspect.isclass(func):  # a reward class named by path: TRL calls what it gets, so build one
            return registry.call_with(func, kwargs, "reward", name)
        return registry.bind(func, kwargs, "reward", name)
    if kwargs:
        raise ConfigError(f"reward_funcs: {name!r} takes no arguments here (it is not a registered reward or a path).")
    if Path(name).is_dir():
        return name  # a local reward model directory
    from ..assets import PREFIX, resolve_model

    if name.startswith(PREFIX) and registry.registered("model", name[len(PREFIX):]):
        return resolve_model(name)  # a packaged judge (rookgrpo/fill-in-judge), built on first use
    if _HUB_ID.match(name):
        return name  # a hub reward model; TRL loads it
    raise ConfigError(registry.unknown_message("reward", name))


def judge_names(trainer) -> tuple[str, ...]:
    """The names of a trainer's rewards that are reward models (judges: modules TRL scores with), in order. The doctor
    names a judge's causes where a reward scores every completion alike, and ``run_info.json`` records them."""
    import torch

    return tuple(n for n, f in zip(trainer.reward_func_names, trainer.reward_funcs) if isinstance(f, torch.nn.Module))
