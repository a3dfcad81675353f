"""The measurement behind docs/tiny-model.md's "ending on an average of the policy's weights": not a shipped feature.

``EMAWeights`` keeps an exponential moving average of the policy's weights (``decay`` per optimizer step) and copies
it into the model when training ends, so the saved model is the average, not the last step. It changes nothing else
in the run. It holds the average in memory only (no checkpoint state) and assumes unsharded weights, which is why it
lives here and not among the callbacks. The runs, with a copy of the recipe that lists it after ``chess_eval``::

    sed 's/  - {name: chess_eval, every: 20}.*/&\n  - {name: "ema_weights:EMAWeights", decay: 0.95}/' \
        recipes/rookworld-tiny.yaml > /tmp/rookworld-tiny-ema.yaml
    PYTHONPATH=benchmarks/levers accelerate launch --num_processes 1 -m rookgrpo /tmp/rookworld-tiny-ema.yaml \
        --output_dir runs/ema-s42 --seed 42
    rookgrpo evaluate --model runs/ema-s42 --data rookgrpo/tiny-rookworld-eval --depth 8 --baseline <before.json>
"""

import torch
from transformers import TrainerCallback


class EMAWeights(TrainerCallback):
    """An EMA of the trainable weights, put into the model at ``on_train_end`` (before the launcher saves it)."""

    def __init__(self, decay: float = 0.95):
        self.decay, self.ema = decay, None

    @torch.no_grad()
    def on_step_end(self, args, state, control, model=None, **kwargs):
        params = {n: p.detach() for n, p in model.named_parameters()}
        if self.ema is None:
            self.ema = {n: p.clone().float() for n, p in params.items()}
        else:
            for n, p in params.items():
                self.ema[n].mul_(self.decay).add_(p.float(), alpha=1 - self.decay)

    @torch.no_grad()
    def on_train_end(self, args, state, control, model=None, **kwargs):
        for n, p in model.named_parameters():
            p.copy_(self.ema[n].to(p.dtype))
        print(f"ema_weights: the model now holds the EMA (decay {self.decay}) of {state.global_step} steps", flush=True)
