"""A probe for docs/tiny-model.md: A: completions trained only up to their first token that differs from the truth.

GRPO's advantage is one number per completion, so a wrong A: answer is charged at every token, including those that
follow from its first error and that the right answer writes too (a copy's later pawns). This runs a recipe with one
more scored-batch hook, after resampling: on each ``A:`` row the completion mask is cut after the first completion
token that differs from the ground truth's tokens (:func:`rookgrpo.rewards.chess.env_answer`); exact answers keep
every token, P: rows are untouched. The loss still divides by the batch's tokens counted before the cut (TRL's
``num_items_in_batch``), so the masked tokens make the remaining ones weigh a little less, not more. A probe of one
mechanism, not a feature::

    grep -v "name: chess_eval" recipes/rookworld-tiny.yaml > /tmp/rw-noeval.yaml
    python benchmarks/levers/first_error.py /tmp/rw-noeval.yaml --output_dir runs/pos-aonly-firsterr-s42 --seed 42 \\
        --dataset_tasks A --max_steps 50 --task_generation_kwargs '{"A": {"temperature": 0.6}}'

``--mode truth`` (the first argument pair) keeps less: a wrong answer's tokens that match the truth are never
charged and its first wrong token is never paid. Charged (advantage < 0), a wrong answer keeps only its first wrong
token; paid (advantage > 0, a better-than-its-group wrong answer), only the tokens before it. So the cut mode's
charge on a copy's right prefix (the unchanged ranks before the moved piece) is gone too::

    python benchmarks/levers/first_error.py --mode truth /tmp/rw-noeval.yaml --output_dir runs/pos-aonly-truth-s42 \\
        --seed 42 --dataset_tasks A --max_steps 50 --task_generation_kwargs '{"A": {"temperature": 0.6}}'
"""

from __future__ import annotations

import sys


class FirstError:
    """Scored-batch hook: cuts each A: completion's mask after its first token that differs from the ground truth."""

    def __init__(self, mode: str = "cut"):
        if mode not in ("cut", "truth"):
            raise ValueError(f"--mode: expected cut or truth, got {mode!r}")
        self.mode = mode
        self.masked = 0  # completion tokens taken out of the loss
        self.seen = 0  # A: completion tokens seen

    def on_scored_batch(self, trainer, scored):
        from rookgrpo.rewards.chess import env_answer

        out, tokenizer = scored.output, trainer.processing_class
        mask = out["completion_mask"]
        prompts = tokenizer.batch_decode(out["prompt_ids"], skip_special_tokens=True)
        for i, (prompt, ids) in enumerate(zip(prompts, out["completion_ids"])):
            if not prompt.lstrip().startswith("A:"):
                continue
            row = env_answer(prompt.strip(), tokenizer.decode(ids[mask[i].bool()], skip_special_tokens=True))
            if row is None:
                continue
            truth = tokenizer(row[1], add_special_tokens=False)["input_ids"]
            n = int(mask[i].sum())
            self.seen += n
            first = next((j for j in range(n) if j >= len(truth) or int(ids[j]) != truth[j]), None)
            if first is None:
                continue
            keep = mask[i].clone()
            keep[first + 1:] = 0  # cut: through the first wrong token
            if self.mode == "truth" and float(out["advantages"][i]) > 0:
                keep[first] = 0  # paid: only the right tokens before the error
            elif self.mode == "truth":
                keep[:first] = 0  # charged: only the first wrong token
            self.masked += int(mask[i].sum() - keep.sum())
            mask[i] = keep


def main(argv) -> None:
    from rookgrpo.train import build_trainer

    mode = "cut"
    if argv[:1] == ["--mode"]:
        mode, argv = argv[1], argv[2:]
    trainer, _, _ = build_trainer(argv)
    hook = FirstError(mode)
    trainer._batch_hooks.append(hook)  # after resampling: it cuts the batch the loss optimises
    trainer.train()
    trainer.save_model(trainer.args.output_dir)
    print(f"A: completion tokens taken out of the loss: {hook.masked} of {hook.seen}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
