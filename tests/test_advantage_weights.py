"""advantage_weights: the loss reads advantages scaled by sign and task, in every layout TRL supports (batches reused
over steps and iterations with accumulation, a LoRA policy with evaluations between steps), and evaluation losses
read TRL's own."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import AdvantageWeights, RookCallback
from rookgrpo.trainer import ScoredBatch


class LossProbe(RookCallback):
    """Records the advantages each loss call reads, by mode."""

    state_key = "loss_probe"

    def __init__(self):
        self.seen = {"train": [], "eval": []}

    def on_loss_logps(self, trainer, inputs, per_token_logps):
        self.seen["train" if trainer.model.training else "eval"].append(inputs["advantages"].detach().clone())


LAYOUTS = {
    "default": {},
    "buffered-batches": {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2},
    "lora-with-evaluation": {"lora": True, "eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 8},
}


def _run(tiny_model_dir, dataset, path, options, callbacks):
    from peft import LoraConfig

    options = dict(options)
    peft = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM") if options.pop("lora", False) else None
    evaluation = dataset.select(range(8)) if options.get("eval_strategy") else None
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(path, max_steps=4, **options), train_dataset=dataset,
                              eval_dataset=evaluation, peft_config=peft, callbacks=callbacks)
    trainer.train()
    return trainer


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
def test_the_loss_reads_the_weighted_advantages(tiny_model_dir, smoke_dataset, tmp_path, layout):
    plain, weighted = LossProbe(), LossProbe()
    _run(tiny_model_dir, smoke_dataset, tmp_path / "plain", LAYOUTS[layout], [plain])
    _run(tiny_model_dir, smoke_dataset, tmp_path / "weighted", LAYOUTS[layout],
         [AdvantageWeights(negative=0.0, positive=2.0), weighted])
    # The same seed draws the same first generation batch: its losses read TRL's advantages, negatives zeroed and
    # positives doubled; every later training loss has no negative advantage left.
    first = plain.seen["train"][0]
    assert (first < 0).any() and (first > 0).any()
    assert torch.equal(weighted.seen["train"][0], torch.where(first < 0, 0.0, 2.0 * first))
    assert all((adv >= 0).all() for adv in weighted.seen["train"])
    if plain.seen["eval"]:  # evaluations between steps read TRL's advantages, unweighted
        assert any((adv < 0).any() for adv in weighted.seen["eval"])


def test_factors_are_per_task_and_token_level_advantages_scale_by_their_own_sign():
    from types import SimpleNamespace

    cb = AdvantageWeights(negative={"A": 0.5}, positive={"P": 3.0})
    metrics = {"train": __import__("collections").defaultdict(list)}
    trainer = SimpleNamespace(model=SimpleNamespace(training=True), _metrics=metrics)
    rows = [{"task": "A"}, {"task": "A"}, {"task": "P"}, {"task": "P"}]
    out = {"advantages": torch.tensor([-1.0, 1.0, -1.0, 1.0])}
    cb.on_scored_batch(trainer, ScoredBatch(rows, out, None, out, None))
    assert out["advantages"].tolist() == [-0.5, 1.0, -1.0, 3.0]
    tokens = {"advantages": torch.tensor([[-1.0, 2.0], [0.0, -2.0], [1.0, -1.0], [0.0, 0.0]])}
    cb.on_scored_batch(trainer, ScoredBatch(rows, tokens, None, tokens, None))
    assert tokens["advantages"].tolist() == [[-0.5, 2.0], [0.0, -1.0], [3.0, -1.0], [0.0, 0.0]]
    assert metrics["train"]["advantage_weights/negative_share"] == [0.5, 0.25]  # a row by its summed advantage
    with pytest.raises(ConfigError, match="negative: factor for 'A' must be >= 0"):
        AdvantageWeights(negative={"A": -1})
