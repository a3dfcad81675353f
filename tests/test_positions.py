"""position_ids_from_mask: every log-prob GRPO trains on is the one of the distribution that sampled the token.

transformers' ``generate`` numbers a left-padded row from its first real token; a plain forward numbers the pads too.
On GPT-2 (learned absolute positions) TRL's log-prob forwards therefore score a padded row's completion at shifted
positions. The reference for every check here is the row scored alone, without padding, which is what ``generate``
sampled from.
"""

from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import RookGRPOTrainer
from rookgrpo.dynamics.positions import HANDLE, MaskPositions, backbone_of


def _model_and_batch(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = tokenizer(["P: 8/8/8/8/8/8/8/K6k w - - 0 1 ", "A: e2e4 "], return_tensors="pt", padding=True)
    assert tokenizer.padding_side == "left" and not bool(batch.attention_mask.all())  # the short row is padded
    return model, tokenizer, batch


def _alone(model, ids, mask):
    """Each row's logits at its real tokens, scored on its own (no padding): what generation saw."""
    with torch.no_grad():
        return [model(input_ids=row[m.bool()][None]).logits[0] for row, m in zip(ids, mask)]


def test_a_left_padded_row_is_scored_at_the_positions_generation_gives_it(tiny_model_dir):
    model, _, batch = _model_and_batch(tiny_model_dir)
    truth = _alone(model, batch.input_ids, batch.attention_mask)
    fake_trainer = SimpleNamespace(model=model, ref_model=None)

    def padded():
        with torch.no_grad():
            logits = model(**batch).logits
        return [logits[i][m.bool()] for i, m in enumerate(batch.attention_mask)]

    before = padded()
    assert MaskPositions(fake_trainer).installed == ["policy"]
    after = padded()
    MaskPositions(fake_trainer, enabled=False)
    assert getattr(backbone_of(model)[0], HANDLE, None) is None and torch.equal(padded()[1], before[1])
    # The unpadded row is the same either way; the padded one matches generation only with the hook.
    assert torch.allclose(before[0], truth[0], atol=1e-5) and torch.allclose(after[0], truth[0], atol=1e-5)
    assert not torch.allclose(before[1], truth[1], atol=1e-2)
    assert torch.allclose(after[1], truth[1], atol=1e-5)


def test_generation_brings_its_own_positions_and_is_unchanged(tiny_model_dir):
    model, tokenizer, batch = _model_and_batch(tiny_model_dir)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        plain = model.generate(**batch, **kwargs)
        MaskPositions(SimpleNamespace(model=model, ref_model=None))
        hooked = model.generate(**batch, **kwargs)
    assert torch.equal(plain, hooked)


def test_a_multimodal_model_is_left_alone(tiny_model_dir):
    """Its rotary positions are 3-D and computed inside the model: 2-D ids from the mask would replace them."""
    model, _, _ = _model_and_batch(tiny_model_dir)
    model.config.vision_config = {"model_type": "stand-in"}
    positions = MaskPositions(SimpleNamespace(model=model, ref_model=None))
    assert positions.installed == [] and "multimodal" in positions.skipped["policy"]
    assert getattr(backbone_of(model)[0], HANDLE, None) is None


LAYOUTS = {
    "default": {},
    "buffered-batches": {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2,
                         "max_steps": 4},
    "reference-model": {"beta": 0.1},
    "per-task-temperature": {"beta": 0.1, "task_generation_kwargs": {"P": {"temperature": 0.5},
                                                                     "A": {"temperature": 1.7}}},
    "lora-with-evaluation": {"lora": True, "beta": 0.1, "eval_strategy": "steps", "eval_steps": 1,
                             "per_device_eval_batch_size": 8},
}


def _scored_calls(tiny_model_dir, dataset, tmp_path, layout):
    """Train, and for every log-prob forward TRL makes (policy, old policy, reference; training and evaluation) the
    largest gap between its per-token log-probs and the same tokens scored row by row without padding."""
    from peft import LoraConfig

    layout = dict(layout)
    peft = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM") if layout.pop("lora", False) else None
    evaluation = dataset.select(range(8)) if layout.get("eval_strategy") else None
    args = tiny_grpo_args(tmp_path, disable_dropout=True, **{"max_steps": 2, **layout})  # exact, not noisy, scores
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args, train_dataset=dataset,
                              eval_dataset=evaluation, peft_config=peft)
    original = trainer._get_per_token_logps_and_entropies
    gaps = []

    def checked(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        out = original(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        logps = out[0]
        was_training = model.training
        model.eval()  # no dropout, as the tiny model's own scoring
        try:
            rows = _alone(model, input_ids, attention_mask)
        finally:
            model.train(was_training)
        completion = input_ids[:, -logits_to_keep:]
        scored = attention_mask[:, -logits_to_keep:].bool()
        worst = 0.0
        for i, logits in enumerate(rows):
            n = int(scored[i].sum())
            if n == 0:
                continue
            # A row's real tokens end with its scored completion tokens (padding after EOS is masked).
            expected = torch.log_softmax(logits[-n - 1:-1].float() / trainer.temperature, -1)
            expected = expected.gather(-1, completion[i][scored[i]][:, None])[:, 0]
            worst = max(worst, float((logps[i][scored[i]].detach() - expected).abs().max()))
        gaps.append(worst)
        return out

    trainer._get_per_token_logps_and_entropies = checked
    trainer.train()
    return trainer, gaps


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_logprob_forward_scores_what_generation_sampled(tiny_model_dir, smoke_dataset, tmp_path, layout):
    dataset = smoke_dataset.map(lambda row, i: {"task": "P" if i % 2 else "A"}, with_indices=True)
    trainer, gaps = _scored_calls(tiny_model_dir, dataset, tmp_path, layout)
    roles = 1 + (trainer.ref_model is not None or trainer.beta > 0)  # the policy, and the reference when beta > 0
    assert len(gaps) >= 2 * roles, gaps
    assert max(gaps) < 1e-4, gaps


def test_without_it_padded_rows_are_scored_at_shifted_positions(tiny_model_dir, smoke_dataset, tmp_path):
    """The control: TRL's own scoring (``position_ids_from_mask: false``) misses on the same check, so the check can
    fail and the smoke prompts are padded."""
    _, gaps = _scored_calls(tiny_model_dir, smoke_dataset, tmp_path, {"position_ids_from_mask": False})
    assert max(gaps) > 0.1, gaps
