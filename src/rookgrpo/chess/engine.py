"""A pool of Stockfish processes with a shared LRU cache, for scoring many completions of few positions.

Why a pool and a cache: GRPO scores G completions of each prompt. They share one position, so one multipv-5 analysis
per *unique* position serves all G (and every reward component). A move outside the top 5 is evaluated once per
(position, move). Unique work is spread over N engine processes; results stay cached across steps.

Determinism: every request runs with ``Threads=1`` after ``ucinewgame`` (python-chess sends it when the ``game``
changes; Stockfish clears its hash), under a fixed depth or node limit. The same position and limit therefore give
the same result in any worker and any run. A time limit would not, so none is offered.

Faults: each request has a wall-clock watchdog. A crashed engine (EOF) or a hung one (watchdog fires, the process
is killed) is restarted and the request retried; the event is logged and counted in :attr:`EnginePool.stats`.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import queue
import shutil
import signal
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field

import chess
import chess.engine

from ..errors import ConfigError
from .formats import board_from_fen, is_legal

logger = logging.getLogger(__name__)

MATE_SCORE = 100_000  # centipawns; mate in n scores ±(100000 - n), i.e. ±999.xx pawns as in RookWorld data
DEFAULT_PATHS = ("stockfish", "/usr/games/stockfish", "/usr/local/bin/stockfish", "/opt/homebrew/bin/stockfish")


# How a crashed or killed engine shows up through python-chess, depending on when it dies: EOF on its pipe
# (terminated), a protocol error, a cancelled pending command, a timeout, or a broken pipe on write.
_ENGINE_FAULTS = (chess.engine.EngineTerminatedError, chess.engine.EngineError, CancelledError, TimeoutError, OSError)


class EngineNotFoundError(ConfigError):
    """No Stockfish binary: raised at trainer start, with the fix."""


def find_stockfish(path: str | None = None) -> str:
    """Locate the Stockfish binary: ``path``, ``$ROOKGRPO_STOCKFISH``, ``stockfish`` on PATH, then common locations."""
    candidates = [path] if path else [os.environ.get("ROOKGRPO_STOCKFISH"), *DEFAULT_PATHS]
    for candidate in filter(None, candidates):
        found = shutil.which(candidate)
        if found:
            return found
    looked = ", ".join(str(c) for c in candidates if c)
    raise EngineNotFoundError(
        f"stockfish_path: no Stockfish binary found (looked for {looked}). Install it (`apt-get install stockfish` "
        "on Debian/Ubuntu, `brew install stockfish` on macOS; `make setup` does this), or set stockfish_path in the "
        "recipe / $ROOKGRPO_STOCKFISH to the binary."
    )


@dataclass(frozen=True)
class EngineSettings:
    """How positions are analysed. Frozen and hashable: one pool (and cache) per distinct settings per process."""

    path: str | None = None
    depth: int | None = 10
    nodes: int | None = None
    multipv: int = 5
    workers: int | None = None  # default min(cores, 4)
    hash_mb: int = 16
    timeout: float = 30.0  # seconds one request may take before the engine counts as hung
    retries: int = 2
    cache_size: int = 200_000

    def with_args(self, args) -> EngineSettings:
        """These settings with a trainer config's ``stockfish_path``/``depth``/``nodes``/``workers`` fields applied
        (each field the config has, as it is), so everything scored for one run uses the same engine settings.

        >>> from types import SimpleNamespace
        >>> EngineSettings().with_args(SimpleNamespace(stockfish_depth=6, stockfish_nodes=None)).depth
        6
        """
        keys = ("path", "depth", "nodes", "workers")
        return dataclasses.replace(self, **{k: getattr(args, f"stockfish_{k}") for k in keys
                                            if hasattr(args, f"stockfish_{k}")})

    def limit(self) -> chess.engine.Limit:
        if self.depth is None and self.nodes is None:
            raise ConfigError("stockfish_depth / stockfish_nodes: set at least one (a deterministic search limit).")
        return chess.engine.Limit(depth=self.depth, nodes=self.nodes)

    def num_workers(self) -> int:
        return self.workers or max(1, min(os.cpu_count() or 1, 4))


@dataclass(frozen=True)
class Analysis:
    """Multipv analysis of one position: the engine's top moves, best first, in centipawns for the side to move."""

    fen: str
    moves: tuple[str, ...]
    scores: tuple[int, ...]

    @property
    def best(self) -> str | None:
        return self.moves[0] if self.moves else None

    def score_of(self, move: str) -> int | None:
        try:
            return self.scores[self.moves.index(move)]
        except ValueError:
            return None


@dataclass
class PoolStats:
    requests: int = 0
    cache_hits: int = 0
    engine_calls: int = 0
    restarts: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)


class _Slot:
    """One engine process, restartable. Used by one thread at a time (the pool hands slots out through a queue)."""

    def __init__(self, settings: EngineSettings, binary: str, index: int):
        self.settings, self.binary, self.index = settings, binary, index
        self.engine: chess.engine.SimpleEngine | None = None
        self.start()

    def start(self) -> None:
        self.engine = chess.engine.SimpleEngine.popen_uci(self.binary, timeout=self.settings.timeout)
        self.engine.configure({"Threads": 1, "Hash": self.settings.hash_mb})

    def pid(self) -> int | None:
        try:
            return self.engine.transport.get_pid() if self.engine else None
        except Exception:
            return None

    def kill(self) -> None:
        pid = self.pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def restart(self) -> None:
        self.kill()
        try:
            self.engine.close()
        except Exception:
            pass
        self.start()

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.quit()
            except Exception:
                self.kill()
            self.engine = None


class EnginePool:
    """N Stockfish processes analysing unique positions in parallel, with an LRU cache. Thread-safe."""

    def __init__(self, settings: EngineSettings = EngineSettings()):
        self.settings = settings
        self.binary = find_stockfish(settings.path)
        self.limit = settings.limit()
        n = settings.num_workers()
        self._slots: queue.Queue[_Slot] = queue.Queue()
        self.slots = [_Slot(settings, self.binary, i) for i in range(n)]
        for slot in self.slots:
            self._slots.put(slot)
        self._executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="stockfish")
        self._cache: OrderedDict = OrderedDict()
        self._cache_lock = threading.Lock()
        self.stats = PoolStats()
        self._closed = False
        _ALL_POOLS.add(self)

    # -- public API ------------------------------------------------------------------------------------------

    def analyse(self, fen: str) -> Analysis:
        return self.analyse_many([fen])[0]

    def analyse_many(self, fens: Sequence[str]) -> list[Analysis]:
        """Multipv analyses of ``fens`` (duplicates analysed once, in parallel over the pool)."""
        return self._batched([("a", fen) for fen in fens], self._run_analysis)

    def move_scores(self, pairs: Sequence[tuple[str, str]]) -> list[int | None]:
        """Centipawn score, for the side to move at ``fen``, of playing ``move``; ``None`` for an illegal move.

        Top-``multipv`` moves take their multipv score. Others are searched alone (``root_moves``) and capped at the
        lowest top-``multipv`` score: the engine ranked them below those moves, and the cap keeps that order even
        where a single-move search at the same depth happens to be more optimistic.
        """
        analyses = dict(zip((f for f, _ in pairs), self.analyse_many([f for f, _ in pairs])))
        outside = []
        for fen, move in pairs:
            if analyses[fen].score_of(move) is None and is_legal(board_from_fen(fen), move):
                outside.append(("m", fen, move))
        searched = dict(zip(outside, self._batched(outside, self._run_move)))
        scores = []
        for fen, move in pairs:
            analysis = analyses[fen]
            top = analysis.score_of(move)
            if top is not None:
                scores.append(top)
            elif ("m", fen, move) in searched:
                value = searched[("m", fen, move)]
                scores.append(min(value, min(analysis.scores)) if analysis.scores else value)
            else:
                scores.append(None)
        return scores

    def close(self) -> None:
        """Quit the engines. Every pool still open is closed at interpreter exit (see :func:`close_all_pools`)."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        for slot in self.slots:
            slot.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals -------------------------------------------------------------------------------------------

    def _batched(self, keys: Sequence[tuple], run) -> list:
        self.stats.add(requests=len(keys))
        results: dict[tuple, object] = {}
        missing = []
        with self._cache_lock:
            for key in dict.fromkeys(keys):
                if key in self._cache:
                    self._cache.move_to_end(key)
                    results[key] = self._cache[key]
                else:
                    missing.append(key)
        self.stats.add(cache_hits=len(keys) - len(missing))
        if missing:
            for key, value in zip(missing, self._executor.map(lambda k: self._with_slot(run, k), missing)):
                results[key] = value
            with self._cache_lock:
                for key in missing:
                    self._cache[key] = results[key]
                while len(self._cache) > self.settings.cache_size:
                    self._cache.popitem(last=False)
        return [results[key] for key in keys]

    def _with_slot(self, run, key):
        slot = self._slots.get()
        try:
            for attempt in range(self.settings.retries + 1):
                timer = threading.Timer(self.settings.timeout, slot.kill)
                timer.start()
                try:
                    self.stats.add(engine_calls=1)
                    return run(slot.engine, key)
                except _ENGINE_FAULTS as exc:
                    hung = not timer.is_alive()
                    logger.warning(
                        "Stockfish worker %d %s on %s (%s); restarting it and retrying (attempt %d of %d)",
                        slot.index, "hung" if hung else "failed", key[1], type(exc).__name__, attempt + 1,
                        self.settings.retries + 1,
                    )
                    self.stats.add(restarts=1)
                    slot.restart()
                finally:
                    timer.cancel()
            self.stats.add(failures=1)
            raise RuntimeError(f"Stockfish failed on {key[1]!r} after {self.settings.retries + 1} attempts")
        finally:
            self._slots.put(slot)

    def _run_analysis(self, engine: chess.engine.SimpleEngine, key: tuple) -> Analysis:
        board = chess.Board(key[1])
        if board.is_game_over():
            return Analysis(key[1], (), ())
        infos = engine.analyse(board, self.limit, multipv=self.settings.multipv, game=object())
        moves, scores = [], []
        for info in infos:
            if "pv" in info and info["pv"]:
                moves.append(info["pv"][0].uci())
                scores.append(info["score"].pov(board.turn).score(mate_score=MATE_SCORE))
        return Analysis(key[1], tuple(moves), tuple(scores))

    def _run_move(self, engine: chess.engine.SimpleEngine, key: tuple) -> int:
        board = chess.Board(key[1])
        move = chess.Move.from_uci(key[2])
        info = engine.analyse(board, self.limit, root_moves=[move], game=object())
        return info["score"].pov(board.turn).score(mate_score=MATE_SCORE)


_POOLS: dict[EngineSettings, EnginePool] = {}
_ALL_POOLS: weakref.WeakSet = weakref.WeakSet()
_POOLS_LOCK = threading.Lock()


def get_pool(settings: EngineSettings = EngineSettings()) -> EnginePool:
    """The process-wide pool for ``settings`` (created on first use, closed at exit). Reward functions share it."""
    with _POOLS_LOCK:
        pool = _POOLS.get(settings)
        if pool is None or pool._closed:
            pool = _POOLS[settings] = EnginePool(settings)
        return pool


def close_all_pools() -> None:
    """Quit every engine. Runs at interpreter exit (see below) and may be called by hand."""
    with _POOLS_LOCK:
        for pool in list(_ALL_POOLS):
            pool.close()
        _POOLS.clear()


# python-chess runs each SimpleEngine on a non-daemon thread. The interpreter joins non-daemon threads *before*
# running `atexit` handlers, so an `atexit` close would never run and a process with an open pool would hang at exit.
# `threading._register_atexit` (what concurrent.futures uses) runs before that join.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(close_all_pools)
else:  # pragma: no cover - CPython < 3.9
    atexit.register(close_all_pools)

