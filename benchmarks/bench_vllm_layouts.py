"""vLLM's layouts on CPU: server mode against colocate (step time), and TRL's async GRPO against synchronous GRPO at
equal samples (wall time), each a ratio with its interval.

Two tables, one command (it runs itself in ``.venv-vllm``, which ``make test-vllm`` builds, when vLLM is not importable
here):

1. **Server against colocate.** ``RookGRPOTrainer`` on a tiny GPT-2 (head size 32), generating through a colocated
   engine and through a ``vllm serve`` process on this machine (the CPU weight transport,
   :mod:`rookgrpo.vllm_cpu_transport`), built once and trained in interleaved blocks; the ratio of median step times
   (TRL's ``step_time``: generation, the weight push before it, scoring and the update) with a 95% paired bootstrap
   interval over blocks.
2. **Async against synchronous.** TRL's ``AsyncGRPOTrainer`` against ``RookGRPOTrainer`` in server mode, the same
   tiny Qwen2 (a chat model: TRL's async trainer takes conversational prompts), the same server, the same samples
   (steps x batch), ``weight_sync_steps`` 1 and TRL's default ``max_staleness`` 4: wall time of whole runs, alternated,
   the ratio of medians with a bootstrap interval over runs.

What the CPU figures leave out (docs/benchmarks.md says it with the numbers): the trainer and the server share two
cores here, so a server cannot generate while the trainer trains, which is the whole point of both layouts on GPUs;
and the weights go over gloo on loopback, where NCCL would send them GPU to GPU.

    python benchmarks/bench_vllm_layouts.py [--steps 4] [--blocks 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_features, finish, in_vllm_venv, without_out  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]


GPU_NOTE = (
    "What these CPU figures say about GPUs: little. Here the trainer and the server share two cores, so the server "
    "cannot generate while the trainer trains, and for a model this small every step is dominated by fixed costs "
    "(an HTTP round trip per generation, the weight push before it, process start-up): server mode pays them and "
    "gains nothing. On GPUs the server has devices of its own, generation (the larger part of a GRPO step at real "
    "sizes) runs beside training, and NCCL moves the weights device to device where the stand-in pickles nothing but "
    "still copies every tensor through the CPU over loopback gloo. The async trainer's gain (verl reports 2.35-2.67x "
    "from fully async training) needs that overlap too; here its rollout worker competes with the trainer for the "
    "same cores.")


def _bootstrap(a: list[float], b: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Ratio of medians b/a with a 95% bootstrap interval, resampling the pairs (a[i], b[i])."""
    rng = random.Random(seed)
    ratio = statistics.median(b) / statistics.median(a)
    pairs = list(zip(a, b))
    draws = []
    for _ in range(n):
        sample = [rng.choice(pairs) for _ in pairs]
        draws.append(statistics.median(y for _, y in sample) / statistics.median(x for x, _ in sample))
    draws.sort()
    return ratio, draws[int(0.025 * n)], draws[int(0.975 * n)]


def server_against_colocate(tmp: str, steps: int, n_blocks: int) -> tuple[str, dict]:
    from bench_step_time import ratio_interval, step_times

    from rookgrpo import RookGRPOTrainer
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2
    from rookgrpo.vllm_compat import release_engine
    from rookgrpo.vllm_cpu_transport import LocalServer, free_port, use_cpu_transport

    use_cpu_transport()
    model = str(build_tiny_gpt2(f"{tmp}/gpt2", TinyGPT2Spec(n_embd=64, n_head=2)))
    data = load_recipe_dataset("rookgrpo/smoke-prompts")
    server = LocalServer(model, f"{tmp}/serve-gpt2.log")
    url = server.url
    try:
        trainers = {}
        for mode in ("colocate", "server"):
            args = _args(f"{tmp}/{mode}", max_steps=steps, vllm_mode=mode, generation_kwargs={"min_tokens": 24},
                         **({"vllm_server_base_url": url, "vllm_group_port": free_port()} if mode == "server" else {}))
            trainers[mode] = RookGRPOTrainer(model=model, reward_funcs=["uci_charset"], args=args, train_dataset=data)
        blocks = {mode: [] for mode in trainers}
        for block in range(n_blocks + 1):  # in turn; the first block of each warms it up
            for mode, trainer in trainers.items():
                measured = step_times(trainer)
                if block:
                    blocks[mode].append(measured)
        release_engine(trainers["colocate"])
    finally:
        server.stop()
    ratio, low, high = ratio_interval(blocks["colocate"], blocks["server"])
    med = {n: statistics.median([t for b in blocks[n] for t in b]) for n in blocks}
    table = "\n".join([
        "| RookGRPOTrainer, vLLM | median step time (s) | steps measured | ratio to colocate [95% interval] |",
        "| --- | --- | --- | --- |",
        f"| colocate (engine in the trainer's process) | {med['colocate']:.4f} | "
        f"{sum(map(len, blocks['colocate']))} | 1 |",
        f"| server (`vllm serve`, CPU weight transport) | {med['server']:.4f} | {sum(map(len, blocks['server']))} | "
        f"**{ratio:.2f}** [{low:.2f}, {high:.2f}] |"])
    return table, {"blocks": blocks, "ratio": ratio, "ci95": [low, high], "median": med}


def _args(out: str, **overrides):
    from rookgrpo import RookGRPOConfig

    values = dict(output_dir=out, seed=1, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                  learning_rate=1e-3, per_device_train_batch_size=16, num_generations=8, max_completion_length=24,
                  logging_steps=1, disable_tqdm=True, beta=0.0, use_vllm=True)
    values.update(overrides)
    return RookGRPOConfig(**values)


def async_against_sync(tmp: str, steps: int, runs: int) -> tuple[str, dict]:
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from rookgrpo import RookGRPOTrainer
    from rookgrpo.async_grpo_cpu import SERVER_FLAGS
    from rookgrpo.chess.data import prepare_rookworld
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.shapes import build_qwen2_shape
    from rookgrpo.rewards.basic import uci_charset
    from rookgrpo.trl_compat import async_grpo_on_cpu
    from rookgrpo.vllm_cpu_transport import AsyncCPUWeightTransfer, LocalServer, free_port, use_cpu_transport

    use_cpu_transport()
    async_grpo_on_cpu()
    rows = prepare_rookworld(load_recipe_dataset("rookgrpo/tiny-rookworld-grpo"))
    model = str(build_qwen2_shape(f"{tmp}/qwen2", list(rows["text"][:400]), hidden_size=64, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=128, vocab_size=512))
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(model)
    data = rows.select(range(64)).map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"]}]},
                                      remove_columns=["completion", "text"])
    common = dict(max_steps=steps, per_device_train_batch_size=16, num_generations=8, max_completion_length=24,
                  learning_rate=1e-3, report_to="none", logging_steps=1, use_cpu=True, save_strategy="no", bf16=False,
                  seed=1, disable_tqdm=True)
    server = LocalServer(model, f"{tmp}/serve-qwen2.log", extra=list(SERVER_FLAGS))
    url = server.url
    times: dict[str, list[float]] = {"sync": [], "async": []}
    steps_s: dict[str, list[float]] = {"sync": [], "async": []}  # steady-state step wall times, steps 2 on
    try:
        for r in range(runs + 1):  # the first pair warms both up
            for kind in ("sync", "async"):
                start = time.perf_counter()
                if kind == "sync":
                    trainer = RookGRPOTrainer(model=model, reward_funcs=[uci_charset], train_dataset=data,
                                              args=_args(f"{tmp}/s{r}", vllm_mode="server", vllm_server_base_url=url,
                                                         vllm_group_port=free_port(), **common))
                else:
                    trainer = AsyncGRPOTrainer(model=model, reward_funcs=[uci_charset], train_dataset=data,
                                               args=AsyncGRPOConfig(output_dir=f"{tmp}/a{r}", vllm_server_base_url=url,
                                                                    **common),
                                               weight_transfer=AsyncCPUWeightTransfer(url))
                trainer.train()
                if kind == "sync":
                    trainer.vllm_generation.vllm_client.close_communicator()
                if r:
                    times[kind].append(time.perf_counter() - start)
                    key = "step_time" if kind == "sync" else "perf/step_s"  # each trainer's own step wall time
                    steps_s[kind] += [h[key] for h in trainer.state.log_history if key in h][1:]
    finally:
        server.stop()
    ratio, low, high = _bootstrap(times["sync"], times["async"])
    med = {k: statistics.median(v) for k, v in times.items()}
    n = min(len(steps_s["sync"]), len(steps_s["async"]))
    step_ratio, step_low, step_high = _bootstrap(steps_s["sync"][:n], steps_s["async"][:n])
    step_med = {k: statistics.median(v) for k, v in steps_s.items()}
    samples = steps * common["per_device_train_batch_size"]
    table = "\n".join([
        f"| trainer (one vLLM server, {samples} completions a run) | wall time per run (s, median; start and stop "
        "included) | ratio [95% interval] | step time, steps 2 on (s, median) | ratio [95% interval] |",
        "| --- | --- | --- | --- | --- |",
        f"| RookGRPOTrainer, `vllm_mode: server` | {med['sync']:.1f} | 1 | {step_med['sync']:.3f} | 1 |",
        f"| TRL `AsyncGRPOTrainer` (max_staleness 4) | {med['async']:.1f} | **{ratio:.2f}** [{low:.2f}, {high:.2f}] | "
        f"{step_med['async']:.3f} | **{step_ratio:.2f}** [{step_low:.2f}, {step_high:.2f}] |",
        "", f"{runs} runs of each, alternated, after one of each to warm up; step times pooled over the runs "
        f"({n} steps each). The async trainer's run includes spawning its rollout worker process and, on stopping, "
        "waiting up to 15 s for it to exit before terminating it (TRL's AsyncRolloutWorker.stop)."])
    return table, {"seconds": times, "median": med, "ratio": ratio, "ci95": [low, high], "step_seconds": steps_s,
                   "step_median": step_med, "step_ratio": step_ratio, "step_ci95": [step_low, step_high]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per block (server) and per run (async)")
    ap.add_argument("--blocks", type=int, default=8, help="interleaved blocks per trainer in the server table")
    ap.add_argument("--runs", type=int, default=3, help="runs per trainer in the async table")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ran = in_vllm_venv(__file__, argv, args.out)  # in .venv-vllm when vLLM is not here
    if ran is not None:
        return ran
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        server_table, result["server"] = server_against_colocate(tmp, args.steps, args.blocks)
        async_table, result["async"] = async_against_sync(tmp, args.steps, args.runs)
    import vllm

    cpu = cpu_features()
    result.update({
        "title": "vLLM layouts on CPU: server against colocate, async against synchronous GRPO",
        "description": (
            f"vllm-cpu {vllm.__version__}, this machine's CPU ({cpu}), trainer and server sharing its cores. Server "
            f"against colocate: tiny GPT-2 (head size 32), 16 completions of 24 tokens a step, interleaved blocks of "
            f"{args.steps} steps. Async against synchronous: tiny Qwen2 (chat template), {args.steps} steps of 16 "
            "completions (8 per prompt, up to 24 tokens) per run, uci_charset reward, one server for both. " + GPU_NOTE),
        "table": server_table + "\n\n" + async_table,
        "command": " ".join(["python benchmarks/bench_vllm_layouts.py", *without_out(argv or [])]),
    })
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
