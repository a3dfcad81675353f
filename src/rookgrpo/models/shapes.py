"""Local stand-ins for the hub models the recipes name: the real architecture and tokenizer kind, random weights.

No hub is needed to exercise a recipe at its real shape: tokenization rules with a real-size vocabulary, step time
and memory at 124M parameters, a chat template and LoRA on a Qwen2 model. The weights are random, so what these
models write is noise; they test the machinery, not the learning.

- :func:`build_rookworld_lm_shape`: GPT-2 124M (12 layers, 768 wide, 1024 positions, vocabulary 50257) with a byte-level
  BPE using GPT-2's pre-tokenizer (its regex and byte mapping), trained on the given chess lines, as RookWorld-LM-124M.
- :func:`build_qwen2_shape`: a ``Qwen2ForCausalLM`` (grouped-query attention, SwiGLU MLP, tied embeddings) with a
  byte-level BPE using Qwen2's pre-tokenizer and Qwen2.5's ChatML chat template, as Qwen2.5-Coder-*-Instruct; small
  by default (the 0.5B sizes are the defaults' names in :data:`QWEN25_CODER_05B`).
- :func:`write_hub_layout`: RookWorld lines as the hub dataset stores them (``text`` column, ``A:`` rows without their
  prefix) in ``data/train-*.parquet`` / ``data/test-*.parquet``, which ``datasets`` reads as its two splits.

Example (``benchmarks/bench_shapes.py`` builds both and runs their recipes)::

    lines = Path("rook_val_500.txt").read_text().splitlines()
    build_rookworld_lm_shape("shapes/rookworld-lm-124m", lines)
    write_hub_layout(lines, "shapes/rookworld-hub")
    # rookgrpo train recipes/rookworld.yaml --model_name_or_path shapes/rookworld-lm-124m \
    #     --dataset_name shapes/rookworld-hub --max_steps 2
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

GPT2_124M = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
QWEN25_CODER_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        intermediate_size=4864, vocab_size=151936)
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                     r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2.5's template: a default system message when the conversation has none, ChatML turns.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _fill_vocab(bpe, size: int, prefix: str):
    """``bpe`` (a trained ``tokenizers.Tokenizer``) with unused entries appended to its BPE vocabulary until it has
    ``size`` ids, so every id the model can sample decodes. Vocabulary entries that no merge produces, not added
    tokens: a tokenizer with tens of thousands of added tokens takes ~20 s to load in transformers 5."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(bpe.to_str())
    vocab = spec["model"]["vocab"]
    start = max([len(vocab), *(t["id"] + 1 for t in spec["added_tokens"])])
    vocab.update({f"<|{prefix}_{i}|>": start + i for i in range(size - start)})
    return Tokenizer.from_str(json.dumps(spec))


def gpt2_bpe_tokenizer(texts: Sequence[str], vocab_size: int = 50257):
    """A byte-level BPE with GPT-2's pre-tokenizer and ``<|endoftext|>``, trained on ``texts``, ``vocab_size`` ids.

    The merges are learned from ``texts`` (as many as they support); unused ids are filled with special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(list(texts), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=_fill_vocab(bpe, vocab_size, "unused"), eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", unk_token="<|endoftext|>")


def build_rookworld_lm_shape(out_dir: str | os.PathLike, texts: Sequence[str], seed: int = 0, **sizes) -> Path:
    """Save a randomly initialised GPT-2 of RookWorld-LM-124M's shape and its BPE tokenizer to ``out_dir``.

    ``sizes`` override :data:`GPT2_124M` (e.g. ``n_layer=2`` for a quick test of the tokenizer rules).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    shape = {**GPT2_124M, **sizes}
    tok = gpt2_bpe_tokenizer(texts, shape["vocab_size"])
    config = GPT2Config(**shape, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    return _save_random(GPT2LMHeadModel, config, tok, out_dir, seed)


def qwen2_bpe_tokenizer(texts: Sequence[str], vocab_size: int = 4096):
    """A byte-level BPE with Qwen2's pre-tokenizer (digits split one by one), ChatML special tokens and template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(list(texts), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=_fill_vocab(bpe, vocab_size, "extra"), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", additional_special_tokens=specials[1:])
    tok.chat_template = QWEN25_CHAT_TEMPLATE
    return tok


def build_qwen2_shape(out_dir: str | os.PathLike, texts: Sequence[str], seed: int = 0, hidden_size: int = 64,
                      num_hidden_layers: int = 2, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                      intermediate_size: int = 128, vocab_size: int = 4096) -> Path:
    """Save a randomly initialised ``Qwen2ForCausalLM`` with a ChatML tokenizer to ``out_dir`` (small by default)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = qwen2_bpe_tokenizer(texts, vocab_size)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                         num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tok.pad_token_id)
    return _save_random(Qwen2ForCausalLM, config, tok, out_dir, seed)


def _save_random(model_class, config, tokenizer, out_dir: str | os.PathLike, seed: int) -> Path:
    """A randomly initialised ``model_class(config)`` (seeded) and ``tokenizer``, saved together to ``out_dir``."""
    import torch

    torch.manual_seed(seed)
    out = Path(out_dir)
    model_class(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_hub_layout(lines: Sequence[str], out_dir: str | os.PathLike, test_share: float = 0.1) -> Path:
    """Write RookWorld lines as the hub dataset stores them: ``data/{train,test}-00000-of-00001.parquet``."""
    from datasets import Dataset

    hub_text = [line[3:] if line.startswith("A: ") else line for line in lines]
    n_test = max(1, int(len(hub_text) * test_share))
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_dict({"text": hub_text[n_test:]}).to_parquet(str(out / "data" / "train-00000-of-00001.parquet"))
    Dataset.from_dict({"text": hub_text[:n_test]}).to_parquet(str(out / "data" / "test-00000-of-00001.parquet"))
    return out


def real_size_lora_count(r: int = 16, target_modules: str | list[str] = "all-linear") -> tuple[int, int]:
    """(trainable, total) parameters of LoRA rank ``r`` on Qwen2.5-Coder-0.5B, counted on the meta device (no weights).

    The recipe's setting (r=16 on all linear layers) gives about 8.8M trainable parameters, 1.75% of all.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**QWEN25_CODER_05B, tie_word_embeddings=True)
    with torch.device("meta"):
        model = get_peft_model(Qwen2ForCausalLM(config), LoraConfig(r=r, lora_alpha=2 * r, target_modules=target_modules,
                                                                     task_type="CAUSAL_LM"))
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total
