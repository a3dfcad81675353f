"""The recipes at their real shapes, built locally with random weights: RookWorld-LM-124M (GPT-2 124M, byte-level BPE
with GPT-2's pre-tokenizer, a 50257-id vocabulary) on hub-layout RookWorld data, and Qwen2.5-Coder's architecture
(Qwen2, ChatML template) with LoRA on the code recipe. Each runs its shipped recipe on CPU: the code recipe for 2 steps,
the RookWorld recipe for 1 (a random 124M model never ends a completion before the recipe's 144 tokens, and each
144-token generation, resampling rounds included, takes ~20 s on 2 CPU cores)."""

import logging

import pytest

from conftest import REPO, SHARED_DATA
from rookgrpo.models.shapes import GPT2_124M, build_qwen2_shape, build_rookworld_lm_shape, write_hub_layout


def _train_logs(trainer):
    return [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.slow
def test_rookworld_lm_124m_shape_runs_a_step_of_the_rookworld_recipe(tmp_path, generated_lines, engine_settings):
    from transformers import AutoTokenizer

    from rookgrpo.chess.data import load_rookworld
    from rookgrpo.chess.evaluate import evaluate
    from rookgrpo.train import build_trainer

    texts = list(generated_lines)
    if (SHARED_DATA / "rook_val_500.txt").exists():
        texts += (SHARED_DATA / "rook_val_500.txt").read_text().splitlines()
    model_dir = build_rookworld_lm_shape(tmp_path / "rookworld-lm-124m", texts)
    data_dir = write_hub_layout(generated_lines, tmp_path / "rookworld-hub")
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert len(tok) == GPT2_124M["vocab_size"]

    # The padded-prompt rule with this vocabulary: the prompt/completion split of every hub row (P: and A:) gives the
    # tokens the whole line gives, so the completion's tokens are the ones the model was trained to write.
    rows = load_rookworld(str(data_dir))
    assert set(rows["task"]) == {"P", "A"}
    enc = lambda s: tok(s)["input_ids"]  # noqa: E731
    for row in rows:
        assert enc(row["prompt"]) + enc(row["completion"]) == enc(row["text"]), row["text"]

    trainer, _, _ = build_trainer([
        str(REPO / "recipes" / "rookworld.yaml"), "--model_name_or_path", str(model_dir), "--dataset_name",
        str(data_dir), "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--per_device_train_batch_size", "4",
        "--num_generations", "2", "--logging_steps", "1", "--save_strategy", "no", "--stockfish_depth", "6",
        "--disable_tqdm", "true"])
    assert sum(p.numel() for p in trainer.model.parameters()) == pytest.approx(124.4e6, rel=0.01)
    assert trainer.args.max_completion_length == 144 and trainer.args.use_cpu  # the recipe's length; CPU fallback
    trainer.train()
    logs = _train_logs(trainer)
    assert len(logs) == 1
    for h in logs:
        assert h["completions/max_length"] <= 144 and h["memory/loss"] > 1000  # 124M in float32 with Adam: > 1 GB
        assert h["timing/step"] > 0 and h["resample/rounds"] >= 0
        assert 0.0 <= h["select/flat_share"] <= 1.0  # the recipe's prompt selection is on
    metrics = evaluate(str(model_dir), str(tmp_path / "rookworld-hub" / "data" / "test-00000-of-00001.parquet"),
                       n=2, settings=engine_settings, progress=False)
    assert metrics["n_policy"] + metrics["n_env"] == 2


@pytest.mark.slow
def test_qwen2_shape_runs_two_steps_of_the_code_recipe_with_lora(tmp_path, caplog):
    from peft import PeftModel

    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.train import build_trainer

    problems = load_recipe_dataset("rookgrpo/humaneval")
    model_dir = build_qwen2_shape(tmp_path / "qwen2", [r["prompt"] + r["canonical_solution"] for r in problems])
    with caplog.at_level(logging.INFO, logger="rookgrpo.train"):
        trainer, _, _ = build_trainer([
            str(REPO / "recipes" / "code.yaml"), "--model_name_or_path", str(model_dir), "--output_dir",
            str(tmp_path / "out"), "--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1",
            "--save_strategy", "no", "--disable_tqdm", "true"])
    assert isinstance(trainer.model, PeftModel)
    lora = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in trainer.model.named_parameters()
            if ".lora_A." in name}
    assert lora == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # all-linear
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("trainable parameters")]
    assert summary and f"trainable parameters: {trainable:,} of" in summary[0]
    # The chat template reached the prompts: the model is asked as the assistant.
    prompt = trainer.processing_class.apply_chat_template(trainer.train_dataset[0]["prompt"], tokenize=False,
                                                          add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    trainer.train()
    logs = _train_logs(trainer)
    assert len(logs) == 2 and all(h["completions/max_length"] <= 512 for h in logs)
    assert all(h["rewards/code_exec/mean"] == 0.0 for h in logs)  # random weights write no passing code


def test_real_size_lora_share_matches_the_recipe_comment():
    """recipes/code.yaml says LoRA r=16 on all linear layers trains ~8.8M parameters, ~1.75%: counted on the real
    Qwen2.5-Coder-0.5B config, built on the meta device (no weights)."""
    from rookgrpo.models.shapes import real_size_lora_count

    trainable, total = real_size_lora_count(r=16)
    assert trainable == pytest.approx(8.8e6, rel=0.01)
    assert trainable / total == pytest.approx(0.0175, abs=0.0005)
