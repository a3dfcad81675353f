"""Real short GRPO runs built to fail one way each (and healthy ones), for ``rookgrpo doctor``'s tests and benchmark.

Each scenario trains the tiny char-level GPT-2 (built locally, random weights) on the smoke prompts with plain TRL
settings and a reward written for the failure; ``LABELS`` says which finding kinds the run must produce (``()`` for a
healthy run: none at all). ``run_scenario`` returns the run's log history (as ``trainer_state.json`` holds it).

- ``healthy``, ``healthy-kl``: a reward the model can learn (share of one character), at a learning rate that learns
  it steadily; the second with a KL term.
- ``constant``: every completion earns 1.0: zero-std groups, exactly-zero gradients (beta 0).
- ``constant-kl``: the same with beta > 0: flat groups moved by the KL term alone (trl#5588).
- ``plateau-judge``: a judge whose score does not depend on what the policy can change (a fixed pseudo-random score
  per completion around 0.5): the reward stays flat.
- ``diverging``: learning rate 5 with Adam and no clipping: the first update wrecks the policy, which collapses onto
  one output (its entropy falls to ~0 in one step).
- ``length``: a reward that pays for length (generation ends at eos or a digit, ``STOPS``, in every scenario, so
  early completions are short and there is length to gain).
- ``heldout-drop``: the learnable reward at a learning rate high enough to damage the model, with a held-out probe
  (teacher-forced NLL of fixed RookWorld lines, ``heldout/reference_nll``) that rises.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: scenario -> finding kinds the run must produce (any other finding on a healthy run is a false alarm).
LABELS: dict[str, tuple[str, ...]] = {
    "healthy": (),
    "healthy-kl": (),
    "constant": ("zero_gradient", "zero_std"),
    "constant-kl": ("kl_only_groups",),
    "plateau-judge": ("reward_plateau",),
    "diverging": ("entropy_collapse",),
    "length": ("length_hacking",),
    "heldout-drop": ("heldout_drop",),
}

TARGET = set("abcdefghijklm")
#: Generation ends at eos or any of these characters (as a trained model ends its answers), so completions end
#: before max_completion_length and have length to gain.
STOPS = "0123456789"


def share_of_target(completions, **kwargs):
    """Share of the completion's characters in ``TARGET``: learnable, with partial credit."""
    return [sum(ch in TARGET for ch in c) / max(len(c), 1) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0 for _ in completions]


def plateau_judge(completions, **kwargs):
    """A judge on its plateau: 0.5 plus a fixed pseudo-random offset per completion text (no direction to learn)."""
    return [0.5 + (int(hashlib.sha1(c.encode()).hexdigest()[:6], 16) / 0xFFFFFF - 0.5) * 0.2 for c in completions]


def length_reward(completion_ids, **kwargs):
    return [len(ids) / 24 for ids in completion_ids]


class ReferenceNLL:
    """A held-out probe: teacher-forced NLL (nats/token) of fixed RookWorld lines, logged as
    ``heldout/reference_nll`` at step 0 and every ``every`` steps, as ``chess_eval`` logs its own."""

    LINES = ["P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1 M: e7e5 d7d5 g8f6 c7c5 e7e6",
             "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+",
             "P: r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3 M: f1b5 f1c4 d2d4"]

    def __init__(self, every: int = 3):
        from transformers import TrainerCallback

        self.every = every
        probe = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kwargs):
                if state.global_step == 0:
                    state.log_history.append({"step": 0, "heldout/reference_nll": probe.nll(model)})

            def on_step_end(self, args, state, control, model=None, **kwargs):
                if state.global_step % probe.every == 0:
                    probe.trainer._metrics["train"]["heldout/reference_nll"].append(probe.nll(model))

        self.callback = Callback()

    def nll(self, model) -> float:
        import torch

        tok = self.trainer.processing_class
        total, count = 0.0, 0
        with torch.no_grad():
            for line in self.LINES:
                ids = torch.tensor([tok(line)["input_ids"]])
                out = model(input_ids=ids, labels=ids)
                n = ids.size(1) - 1
                total, count = total + out.loss.item() * n, count + n
        return total / count


def run_scenario(name: str, model_dir: str | Path, out_dir: str | Path, steps: int = 30, seed: int = 0,
                 callbacks: list | None = None) -> list[dict]:
    """Train scenario ``name`` for ``steps`` steps; returns the log history. ``callbacks`` are added (e.g. the doctor)."""
    from rookgrpo import RookGRPOConfig, RookGRPOTrainer
    from rookgrpo.data import load_recipe_dataset

    if name not in LABELS:
        raise ValueError(f"unknown scenario {name!r}; scenarios: {', '.join(LABELS)}")
    settings = dict(learning_rate=3e-3, beta=0.0, max_completion_length=24, reward=share_of_target)
    settings.update({
        "healthy-kl": dict(beta=0.04),
        "constant": dict(reward=constant_reward),
        "constant-kl": dict(reward=constant_reward, beta=0.04),
        "plateau-judge": dict(reward=plateau_judge),
        "diverging": dict(learning_rate=5.0, max_grad_norm=0.0),
        "length": dict(reward=length_reward, learning_rate=1e-2),
        "heldout-drop": dict(learning_rate=3e-2),
    }.get(name, {}))
    reward = settings.pop("reward")
    args = RookGRPOConfig(
        output_dir=str(out_dir), seed=seed, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
        save_strategy="no", max_steps=steps, per_device_train_batch_size=16, num_generations=4, logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, temperature=1.0, **settings)
    dataset = load_recipe_dataset("rookgrpo/smoke-prompts")
    probe = ReferenceNLL() if name == "heldout-drop" else None
    trainer = RookGRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=args, train_dataset=dataset,
                              callbacks=list(callbacks or []) + ([probe.callback] if probe else []))
    if probe is not None:
        probe.trainer = trainer
    tok = trainer.processing_class
    stops = [tok.eos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in STOPS]
    trainer.model.generation_config.eos_token_id = stops
    trainer.eos_token_ids = stops
    trainer.generation_config.eos_token_id = stops
    trainer.generation_kwargs["eos_token_id"] = stops
    trainer.train()
    return trainer.state.log_history
