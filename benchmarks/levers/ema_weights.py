"""The measurement behind docs/tiny-model.md's "ending on an average of the policy's weights": not a shipped feature.

``EMAWeights`` keeps exponential moving averages of the policy's weights (``decay`` per optimizer step). By default it
copies the average into the model when training ends, so the saved model is the average, not the last step. With
``save_beside: true`` it leaves the model alone and writes each average as a model of its own next to the run
(``<output_dir>-ema<decay>``, tokenizer included), so one run gives the last step and every average of the same
trajectory, paired by construction. ``decays`` keeps several averages at once. It changes nothing else in the run. It
holds the averages in memory only (no checkpoint state) and assumes unsharded weights, which is why it lives here and
not among the callbacks. The runs, with a copy of the recipe that lists it after ``chess_eval``::

    sed 's/  - {name: chess_eval, every: 20}.*/&\n  - {name: "ema_weights:EMAWeights", decay: 0.95}/' \
        recipes/rookworld-tiny.yaml > /tmp/rookworld-tiny-ema.yaml
    PYTHONPATH=benchmarks/levers accelerate launch --num_processes 1 -m rookgrpo /tmp/rookworld-tiny-ema.yaml \
        --output_dir runs/ema-s42 --seed 42
    rookgrpo evaluate --model runs/ema-s42 --data rookgrpo/tiny-rookworld-eval --depth 8 --baseline <before.json>

and, for both ends of one run, ``{name: "ema_weights:EMAWeights", decays: [0.95, 0.98], save_beside: true}``.
"""

import copy

import torch
from transformers import TrainerCallback


class EMAWeights(TrainerCallback):
    """EMAs of the weights; put into the model at ``on_train_end`` (before the launcher saves it), or saved beside it."""

    def __init__(self, decay: float = 0.95, decays=None, save_beside: bool = False):
        self.decays = [float(d) for d in (decays if decays is not None else [decay])]
        self.save_beside, self.ema = save_beside, None
        if not save_beside and len(self.decays) != 1:
            raise ValueError("ema_weights: several `decays` need `save_beside: true` (the model holds one average)")

    @torch.no_grad()
    def on_step_end(self, args, state, control, model=None, **kwargs):
        params = {n: p.detach() for n, p in model.named_parameters()}
        if self.ema is None:
            self.ema = {d: {n: p.clone().float() for n, p in params.items()} for d in self.decays}
        else:
            for d, ema in self.ema.items():
                for n, p in params.items():
                    ema[n].mul_(d).add_(p.float(), alpha=1 - d)

    @staticmethod
    @torch.no_grad()
    def _load(model, ema):
        for n, p in model.named_parameters():
            p.copy_(ema[n].to(p.dtype))

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.save_beside:
            self._load(model, self.ema[self.decays[0]])
            print(f"ema_weights: the model now holds the EMA (decay {self.decays[0]}) of {state.global_step} steps",
                  flush=True)
            return
        for d, ema in self.ema.items():
            out = f"{args.output_dir.rstrip('/')}-ema{d}"
            averaged = copy.deepcopy(model)
            self._load(averaged, ema)
            averaged.save_pretrained(out)
            if processing_class is not None:
                processing_class.save_pretrained(out)
            print(f"ema_weights: the EMA (decay {d}) of {state.global_step} steps saved to {out}", flush=True)
