"""Short names for the models and datasets rookgrpo ships or builds, so recipes work with no network.

``rookgrpo/<name>`` in ``model_name_or_path`` or ``dataset_name`` resolves here first; any other string is left for
transformers/datasets to load (hub id or local path). The core packages a smoke model and prompts; task packs
register theirs (:func:`register_model`, :func:`register_dataset`; the chess pack's model and positions ship in this
folder).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
PREFIX = "rookgrpo/"


def cache_dir() -> Path:
    """Where built-on-demand assets go: ``$ROOKGRPO_CACHE`` or ``~/.cache/rookgrpo``."""
    return Path(os.environ.get("ROOKGRPO_CACHE", Path.home() / ".cache" / "rookgrpo"))


def _tiny_random() -> Path:
    from ..models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    return build_tiny_gpt2(cache_dir() / "models" / "tiny-random-v2", TinyGPT2Spec())


#: Files of the chess pack's packaged model (registered by ``rookgrpo.chess.pack``; they ship in this folder).
TINY_ROOKWORLD = ASSETS_DIR / "tiny-rookworld"


def register_model(name: str, build) -> None:
    """Make ``rookgrpo/<name>`` a packaged model: ``build()`` returns its local directory (building it on first use),
    or an import path ``"pkg.module:function"`` to such a function."""
    from ..registry import register

    register("model", name, build)


def register_dataset(name: str, source) -> None:
    """Make ``rookgrpo/<name>`` a packaged dataset: a data file (``Path``), a function returning a
    ``datasets.Dataset``, or an import path ``"pkg.module:function"`` to one."""
    from ..registry import register

    register("dataset", name, source)


def _core_assets() -> None:
    register_model("tiny-random", _tiny_random)
    register_dataset("smoke-prompts", ASSETS_DIR / "smoke_prompts.jsonl")


_core_assets()


def packaged_models() -> list[str]:
    """The ``rookgrpo/<name>`` models of the core and of every loaded task pack."""
    from ..registry import names

    return names("model")


def packaged_datasets() -> list[str]:
    from ..registry import names

    return names("dataset")


def resolve_model(name_or_path: str) -> str:
    """Map ``rookgrpo/<name>`` to a local model directory; return anything else unchanged."""
    if isinstance(name_or_path, str) and name_or_path.startswith(PREFIX) and not Path(name_or_path).exists():
        from ..registry import guarded, lookup, registered

        key = name_or_path[len(PREFIX):]
        if registered("model", key):
            build = _one_build_at_a_time(key, guarded("model", key, lookup("model", key)))
            return str(_on_local_main_process_first(build))
        from ..errors import ConfigError

        raise ConfigError(
            f"model_name_or_path: {name_or_path!r} is not a packaged rookgrpo model. Packaged: "
            f"{', '.join(PREFIX + k for k in packaged_models())}. For a hub model use its id, for a local one its "
            "directory."
        )
    return name_or_path


@contextlib.contextmanager
def build_lock(name: str):
    """Held while ``rookgrpo/<name>`` builds into the cache (an exclusive ``flock`` on a file under
    ``cache_dir()/.locks``): jobs sharing a cache, on one machine or a shared filesystem with locks, build it once; the
    others wait, then find it built. Without POSIX locks, or with no writable cache, builds go unlocked as before."""
    try:
        import fcntl

        locks = cache_dir() / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        handle = open(locks / f"{name.replace('/', '_')}.lock", "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _one_build_at_a_time(name: str, build):
    def call(*args, **kwargs):
        with build_lock(name):
            return build(*args, **kwargs)

    return call


def _on_local_main_process_first(build):
    """Run ``build`` on each node's main process before the other ranks, which then find the result on disk."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return build()
    from accelerate import PartialState

    with PartialState().local_main_process_first():
        return build()


def packaged_dataset_builder(name: str):
    """The builder for a built-on-demand packaged dataset (``rookgrpo/humaneval``, ...), or ``None``."""
    if isinstance(name, str) and name.startswith(PREFIX) and not Path(name).exists():
        from ..registry import guarded, lookup, registered

        key = name[len(PREFIX):]
        if registered("dataset", key):
            source = lookup("dataset", key)
            return None if isinstance(source, Path) else _one_build_at_a_time(key, guarded("dataset", key, source))
    return None


def resolve_dataset(name_or_path: str) -> str:
    """Map ``rookgrpo/<name>`` to a packaged data file; return anything else unchanged."""
    if isinstance(name_or_path, str) and name_or_path.startswith(PREFIX) and not Path(name_or_path).exists():
        from ..registry import lookup, registered

        key = name_or_path[len(PREFIX):]
        if registered("dataset", key):
            source = lookup("dataset", key)
            if isinstance(source, Path):
                return str(source)
            return name_or_path  # built on demand (packaged_dataset_builder)
        from ..errors import ConfigError

        raise ConfigError(
            f"dataset_name: {name_or_path!r} is not a packaged rookgrpo dataset. Packaged: "
            f"{', '.join(PREFIX + k for k in packaged_datasets())}. For a hub dataset use its id, for local data a "
            "path."
        )
    return name_or_path
