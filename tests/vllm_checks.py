"""What a vLLM engine samples from, compared with the trainer's weights: the checks the vLLM tests share.

Every check goes through log-probs: the engine's own log-probs of a fixed sequence (colocate: the engine's
``generate`` with ``prompt_logprobs``; server: the server's ``/v1/completions`` over HTTP) against the trainer model's.
That covers the whole model, LM head included, and does not depend on which parameters vLLM's CPU build keeps: its
linear layers are repacked for the GEMM kernel the CPU supports (AVX-512 / AMX: the weights are dropped, the packed
copy kept; AVX2-only: torch's linear on the loaded [out, in] weight, GPT-2's Conv1D transposed), so comparing
parameters compares different things on different machines.

The engine runs in bf16 and the trainer in fp32, so the two never agree exactly, and how far apart they sit grows
as training sharpens the model: on the tiny GPT-2 the engine's log-probs of the probe sequence are 0.03-0.05
nats/token (mean absolute difference) from the trainer's at the start and 0.15-0.23 after a few steps at learning rate
5e-2, always at or below what casting the trainer's own model to bf16 moves them (0.06, then 0.22-0.31). So the
tolerance, :func:`tolerance`, is measured each time: the larger of :data:`SAME` and 1.25 times that bf16 rounding gap.
A check is only as strong as the movement it must tell apart, so the tests that claim "the engine samples the current
weights" also show the trainer moved more than twice the tolerance between the weights they tell apart.
"""

from __future__ import annotations

import copy
import functools
import weakref
from pathlib import Path

import torch

#: nats/token (mean absolute difference of the probe's log-probs): the least tolerance (:func:`tolerance`). bf16
#: against fp32 is 0.03-0.05 on the tiny GPT-2 at its start; one step at learning rate 1e-2 moves it 0.13-0.22.
SAME = 0.08

ASSETS = Path(__file__).parent / "assets"

#: Seconds a ``vllm serve`` process may take to answer its health check (about 45 s here).
SERVER_START_S = 300

#: The probe sequence: chess-like text the char-level GPT-2's vocabulary covers (the Qwen2 tests pass their own).
PROBE_TEXT = "P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: e2e4 d2d4 g1f3 E: 0.3 0.2 0.1 B: e2e4"


def probe_ids(trainer, text: str = PROBE_TEXT) -> list[int]:
    return trainer.processing_class(text)["input_ids"]


def policy(trainer):
    return trainer.accelerator.unwrap_model(trainer.model)


def model_logprobs(model, ids: list[int]) -> torch.Tensor:
    """A transformers model's log-probs of ``ids[1:]`` (no padding, so no position question), in eval mode (dropout
    off, as the engine samples; the mode is put back)."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    finally:
        model.train(training)
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)


def colocated_logprobs(generate, ids: list[int]) -> torch.Tensor:
    """A colocated engine's log-probs of ``ids[1:]`` given what precedes each (temperature 1, no truncation), through
    ``generate`` (the engine's ``LLM.generate`` or the original of a wrapped one)."""
    from vllm import SamplingParams

    out = generate([{"prompt_token_ids": ids}], sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=0),
                   use_tqdm=False)
    return torch.tensor([entry[token].logprob for entry, token in zip(out[0].prompt_logprobs[1:], ids[1:])])


def server_logprobs(client, ids: list[int]) -> torch.Tensor:
    """A vLLM server's log-probs of ``ids[1:]``, over HTTP, through TRL's client (``get_sequence_logprobs``)."""
    out = client.get_sequence_logprobs([ids], prompt_lengths=[1], top_logprobs=1)
    return torch.tensor([row[0] for row in out["actual_logprobs"][0]])


def engine_logprobs(trainer, ids: list[int]) -> torch.Tensor:
    """The log-probs of the engine the trainer generates with, colocated or a server."""
    generation = trainer.vllm_generation
    if generation.mode == "server":
        return server_logprobs(generation.vllm_client, ids)
    llm = generation.llm
    return colocated_logprobs(functools.partial(type(llm).generate, llm), ids)


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute difference in nats/token."""
    return (a - b).abs().mean().item()


def tolerance(model, ids: list[int], logprobs: torch.Tensor | None = None) -> float:
    """The gap under which an engine in bf16 holds ``model``'s weights: the larger of SAME and 1.25 times how far
    ``model``'s own log-probs of ``ids`` move when it runs in bf16 (rounding grows as training sharpens the model)."""
    logprobs = model_logprobs(model, ids) if logprobs is None else logprobs
    rounded = model_logprobs(copy.deepcopy(model).to(torch.bfloat16), ids)
    return max(SAME, 1.25 * gap(rounded, logprobs))


def sampling_gap(trainer, ids: list[int] | None = None) -> tuple[float, float]:
    """How far what the engine samples is from the trainer's current weights, nats/token, and the tolerance under
    which that is the same weights (:func:`tolerance`)."""
    ids = ids or probe_ids(trainer)
    ours = model_logprobs(policy(trainer), ids)
    return gap(engine_logprobs(trainer, ids), ours), tolerance(policy(trainer), ids, ours)


def assert_samples_trainers_weights(trainer, ids: list[int] | None = None) -> float:
    found, tol = sampling_gap(trainer, ids)
    assert found < tol, (found, tol)
    return tol


class SamplingRecorder:
    """Wraps the engine's ``generate`` (colocate: the ``LLM``'s; server: TRL's client's): each call's settings, the
    step, and how far what the engine samples is from the trainer's weights at that moment (TRL syncs right before it
    generates) and from the weights of the previous call (``moved``: how much a one-step-stale engine would show)."""

    def __init__(self, trainer, prompt_tasks: dict[tuple, str] | None = None, ids: list[int] | None = None):
        self.trainer, self.calls, self.prompt_tasks = trainer, [], prompt_tasks or {}
        self.ids = ids or probe_ids(trainer)
        self._last = None
        generation = trainer.vllm_generation
        self.server = generation.mode == "server"
        target = generation.vllm_client if self.server else generation.llm
        # a weak proxy: a strong reference here would keep the engine's memory after the test
        self.original = functools.partial(type(target).generate, weakref.proxy(target))
        target.generate = self._generate

    def _engine(self) -> torch.Tensor:
        if self.server:
            return server_logprobs(self.trainer.vllm_generation.vllm_client, self.ids)
        return colocated_logprobs(self.original, self.ids)

    def _generate(self, prompts, *args, **kwargs):
        trainer = self.trainer
        ours, theirs = model_logprobs(policy(trainer), self.ids), self._engine()
        call = {"step": trainer.state.global_step, "training": trainer.model.training, "gap": gap(theirs, ours),
                "tol": tolerance(policy(trainer), self.ids, ours),
                "moved": None if self._last is None else gap(ours, self._last), "prompts": len(prompts),
                "logprobs": ours}
        self._last = ours
        if not self.server:
            params = kwargs.get("sampling_params")
            params = params[0] if isinstance(params, list) else params
            call.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                        max_tokens=params.max_tokens,
                        tasks={self.prompt_tasks.get(tuple(p["prompt_token_ids"])) for p in prompts})
        else:
            call.update(temperature=kwargs.get("temperature"), max_tokens=kwargs.get("max_tokens"))
        self.calls.append(call)
        return self.original(prompts, *args, **kwargs)


def assert_sampled_current_weights(calls: list[dict], *, shown_stale_at_least: int = 1) -> None:
    """Every recorded generation sampled the trainer's weights of that moment (gap under its tolerance), and the check
    could have failed: at ``shown_stale_at_least`` of them the trainer had moved more than twice the tolerance since
    the previous call, so an engine one step behind would have shown a gap above it."""
    assert calls, "no generation was recorded"
    assert all(c["gap"] < c["tol"] for c in calls), [(c["step"], round(c["gap"], 4), round(c["tol"], 4)) for c in calls]
    moved = [(c["moved"], c["tol"]) for c in calls if c["moved"] is not None]
    assert sum(m > 2 * tol for m, tol in moved) >= shown_stale_at_least, (
        f"the trainer barely moved between generations ({[(round(m, 3), round(t, 3)) for m, t in moved]}): this run "
        "cannot tell a stale engine from a current one")


# ---- a vLLM server process --------------------------------------------------------------------------------------

def free_port() -> int:
    from rookgrpo.vllm_cpu_transport import free_port as port

    return port()


def Server(model: Path, log: Path, extra: list[str] | None = None):
    """A ``vllm serve`` process on loopback with the CPU weight transport (``rookgrpo.vllm_cpu_transport.LocalServer``),
    stopped with its ``stop()``."""
    from rookgrpo.vllm_cpu_transport import LocalServer

    return LocalServer(model, log, extra=extra, start_s=SERVER_START_S)


# ---- the flat-reward data the vLLM tests train on ----------------------------------------------------------------

def mostly_flat_reward():
    """tests/assets/flat_reward.py's ``mostly_flat``: graded on rows whose ``signal`` is true, a constant on the rest."""
    import sys

    sys.path.insert(0, str(ASSETS))
    from flat_reward import mostly_flat

    return mostly_flat


def flat_prompts(folder: Path, n: int = 32):
    """``n`` smoke prompts of different lengths (so prompts are left-padded) with the ``signal`` column."""
    from datasets import load_dataset

    from conftest import write_flat_data

    return load_dataset("json", data_files=str(write_flat_data(folder / "flat.jsonl", n)), split="train")
