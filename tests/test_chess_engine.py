"""Stockfish pool: parallel and cached, deterministic, and it survives engines that crash or hang mid-batch."""

import os
import signal
import threading
import time

import pytest

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.chess.engine import EngineNotFoundError, EnginePool, EngineSettings, find_stockfish
from rookgrpo.chess.formats import parse_policy, split_policy
from rookgrpo.chess.rewards import ChessBestMove, ChessEvals


def _positions(lines, k=40):
    rows = [split_policy(l) for l in lines if l.startswith("P:")][:k]
    return [p for p, _ in rows], [c for _, c in rows]


def test_cache_serves_repeats_and_results_are_deterministic_across_pools(generated_lines):
    prompts, _ = _positions(generated_lines, 20)
    fens = [parse_policy(p + " M:").fen for p in prompts]
    with EnginePool(EngineSettings(depth=6, workers=2)) as two, EnginePool(EngineSettings(depth=6, workers=1)) as one:
        first = two.analyse_many(fens * 8)  # G=8 copies of each position
        assert two.stats.engine_calls == len(set(fens))  # one analysis per unique position
        again = two.analyse_many(fens)
        assert two.stats.engine_calls == len(set(fens))  # all cache hits
        assert first[: len(fens)] == again == one.analyse_many(fens)
        assert all(1 <= len(a.moves) <= 5 and list(a.scores) == sorted(a.scores, reverse=True) for a in first)


def _kill_when(pool, calls, sig):
    """Send ``sig`` to one engine once the pool has made ``calls`` engine calls (i.e. in the middle of the batch)."""

    def watch():
        deadline = time.time() + 30
        while pool.stats.engine_calls < calls and time.time() < deadline:
            time.sleep(0.001)
        os.kill(pool.slots[0].pid(), sig)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_engine_crash_or_hang_mid_batch_is_restarted_and_rewards_stay_correct(generated_lines, fault):
    prompts, completions = _positions(generated_lines, 40)
    settings = EngineSettings(depth=9, workers=2, timeout=3.0)
    expected = ChessEvals(settings)(prompts, completions)  # clean run (shared pool for these settings)
    with EnginePool(settings) as pool:
        reward = ChessEvals(settings)
        import rookgrpo.chess.rewards as chess_rewards

        # Score through a fresh pool so nothing is cached, and fault one of its engines mid-batch.
        original = chess_rewards.get_pool
        chess_rewards.get_pool = lambda s: pool
        try:
            watcher = _kill_when(pool, 5, signal.SIGKILL if fault == "crash" else signal.SIGSTOP)
            got = reward(prompts, completions)
            watcher.join()
        finally:
            chess_rewards.get_pool = original
        assert pool.stats.restarts >= 1
        assert got == expected


def test_missing_binary_is_a_clear_error_at_trainer_start(tmp_path, smoke_dataset):
    with pytest.raises(EngineNotFoundError) as err:
        find_stockfish("/nonexistent/stockfish")
    assert "apt-get install stockfish" in str(err.value) and "stockfish_path" in str(err.value)
    args = tiny_grpo_args(tmp_path, stockfish_path="/nonexistent/stockfish")
    # The model path does not exist either: the engine check must come first, before any loading.
    with pytest.raises(ConfigError, match="no Stockfish binary found"):
        RookGRPOTrainer(model=str(tmp_path / "no-model"), reward_funcs=["chess_format", "chess_best_move"],
                        args=args, train_dataset=smoke_dataset)


def test_reward_setup_takes_engine_settings_from_the_config(tmp_path):
    args = tiny_grpo_args(tmp_path, stockfish_depth=3, stockfish_workers=1)
    configured = ChessBestMove().setup(args)
    assert configured.engine.depth == 3 and configured.engine.workers == 1
    assert configured.__name__ == "chess_best_move"
