"""reference_credit: a wrong A: answer is charged only at its first wrong token, in every batch layout TRL trains in."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import RookGRPOTrainer
from rookgrpo.callbacks.reference_credit import ReferenceCredit, first_departure
from rookgrpo.errors import ConfigError
from rookgrpo.rewards.chess import env_answer

A_PROMPT = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
RIGHT = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
COPY = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"  # departs at the 5th rank's "8"


def _tokenizer():
    from transformers import AutoTokenizer

    from rookgrpo.assets import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("rookgrpo/tiny-rookworld"))


def _batch(tok, rows):
    """A scored batch as TRL returns it: right-padded completions with EOS, their mask, one advantage per row."""
    ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _, c, _ in rows]
    width = max(map(len, ids))
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p, _, _ in rows]
    pwidth = max(map(len, prompts))
    return {
        "prompt_ids": torch.tensor([[tok.eos_token_id] * (pwidth - len(p)) + p for p in prompts]),
        "completion_ids": torch.tensor([x + [tok.eos_token_id] * (width - len(x)) for x in ids]),
        "completion_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
        "advantages": torch.tensor([a for _, _, a in rows]),
        "num_items_in_batch": torch.tensor(sum(map(len, ids))),
    }


def _fake_trainer(tok, training=True):
    return SimpleNamespace(model=SimpleNamespace(training=training), processing_class=tok,
                           accelerator=SimpleNamespace(gather=lambda x: x), _metrics={"train": defaultdict(list)})


def test_a_wrong_answer_loses_its_right_tokens_and_the_ones_after_its_error():
    tok = _tokenizer()
    departs = first_departure([tok.decode([t]) for t in tok(COPY, add_special_tokens=False)["input_ids"]], RIGHT)
    assert COPY[:departs] == RIGHT[:departs] and COPY[departs] != RIGHT[departs]  # one character per token here
    p_row = ("P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", " M: e2e4 E: 0.3 B: e2e4", -1.0)
    rows = [(A_PROMPT, RIGHT, 1.5), (A_PROMPT, COPY, -1.0), (A_PROMPT, COPY, 0.5), (A_PROMPT, COPY, 0.0),
            (A_PROMPT, RIGHT[:20], -1.0), p_row]
    out = _batch(tok, rows)
    before = out["completion_mask"].clone()
    trainer = _fake_trainer(tok)
    ReferenceCredit(tasks=["A"]).on_scored_batch(trainer, SimpleNamespace(output=out))
    mask = out["completion_mask"]
    assert torch.equal(mask[0], before[0])  # right: every token
    assert mask[1].nonzero().flatten().tolist() == [departs]  # charged: its first wrong token only
    assert mask[2].nonzero().flatten().tolist() == list(range(departs))  # paid: the right tokens before it only
    assert torch.equal(mask[3], before[3])  # no advantage: nothing to move
    assert torch.equal(mask[4], before[4])  # stops early, never departs: as TRL charges it
    assert torch.equal(mask[5], before[5])  # another task
    assert int(out["num_items_in_batch"]) == int(mask.sum())
    taken = int(before[1:3].sum() - mask[1:3].sum())
    assert trainer._metrics["train"]["reference_credit/masked_frac"] == [taken / int(before[:5].sum())]
    assert trainer._metrics["train"]["reference_credit/wrong_frac"] == [4 / 5]
    # A batch with no row of the listed tasks logs nothing (per-task sampling's P: batches).
    ReferenceCredit().on_scored_batch(trainer, SimpleNamespace(output=_batch(tok, [p_row] * 2)))
    assert len(trainer._metrics["train"]["reference_credit/masked_frac"]) == 1
    # Evaluation batches keep their tokens: the evaluation loss stays the plain one.
    out = _batch(tok, rows)
    ReferenceCredit().on_scored_batch(_fake_trainer(tok, training=False), SimpleNamespace(output=out))
    assert torch.equal(out["completion_mask"], before)


def test_a_task_without_a_reference_is_refused_with_the_tasks_that_have_one():
    with pytest.raises(ConfigError, match=r"tasks \['P'\] have no reference answer; tasks with one: \['A'\]"):
        ReferenceCredit(tasks=["P"])


LAYOUTS = {
    "buffered-batches": {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2,
                         "max_steps": 4},
    "lora-with-evaluation": {"lora": True, "beta": 0.1, "eval_strategy": "steps", "eval_steps": 1,
                             "per_device_eval_batch_size": 8},
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_training_loss_sees_the_credit_and_evaluation_losses_do_not(tmp_path, layout):
    """With resampling before it, the mask each loss optimises is the rule's, whatever the batch layout; the evaluation
    between steps computes its loss on every token."""
    from peft import LoraConfig

    from rookgrpo.assets import resolve_model
    from rookgrpo.callbacks.zero_std import ZeroStdResampling
    from rookgrpo.chess.data import load_rookworld

    layout = dict(layout)
    peft = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM") if layout.pop("lora", False) else None
    data = load_rookworld("rookgrpo/tiny-rookworld-train", tasks=["A"]).select(range(16))
    evaluation = data.select(range(8)) if layout.get("eval_strategy") else None
    args = tiny_grpo_args(tmp_path, disable_dropout=True, learning_rate=1e-4, max_completion_length=80,
                          temperature=0.6, **{"max_steps": 2, **layout})
    trainer = RookGRPOTrainer(model=resolve_model("rookgrpo/tiny-rookworld"), reward_funcs="chess_env", args=args,
                              train_dataset=data, eval_dataset=evaluation, peft_config=peft,
                              callbacks=[ReferenceCredit(), ZeroStdResampling(max_rounds=1)])
    tok = trainer.processing_class
    seen = {"train": [0, 0], "eval": [0, 0]}  # rows checked, rows whose mask the rule changed
    original = trainer.compute_loss

    def checked(model, inputs, *a, **k):
        mode = "train" if model.training else "eval"
        prompts = tok.batch_decode(inputs["prompt_ids"], skip_special_tokens=True)
        for i, prompt in enumerate(prompts):
            ids = inputs["completion_ids"][i].tolist()
            n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
            pieces = [tok.decode([t], skip_special_tokens=True) for t in ids[:n]]
            reference = env_answer(prompt.strip(), "")[1]
            first = first_departure(pieces, reference)
            advantage = float(inputs["advantages"][i])
            expected = list(range(n))
            if mode == "train" and first is not None and advantage < 0:
                expected = [first]
            elif mode == "train" and first is not None and advantage > 0:
                expected = list(range(first))
            kept = inputs["completion_mask"][i].nonzero().flatten().tolist()
            assert kept == expected, (mode, prompt, "".join(pieces), advantage)
            seen[mode][0] += 1
            seen[mode][1] += expected != list(range(n))
        return original(model, inputs, *a, **k)

    trainer.compute_loss = checked
    trainer.train()
    assert seen["train"][0] >= 16 and seen["train"][1] > 0, seen  # the rule changed rows, so the check can fail
    if evaluation is not None:
        assert seen["eval"][0] > 0, seen
    logged = [h for h in trainer.state.log_history if "reference_credit/masked_frac" in h]
    shares = [h["reference_credit/masked_frac"] for h in logged]
    assert shares and max(shares) > 0 and all(0 <= x < 1 for x in shares), shares
