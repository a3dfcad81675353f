"""The cuDNN attention fault (pytorch/pytorch#196678), forced on CPU, and the guards against it.

``cudnn_emulation`` replaces SDPA with an autograd function that behaves as cuDNN's kernel does on H100/H200 (the -65504
fill; in backward, at key lengths 64 mod 128, an unmasked zero-filled key tail that overflows for rows whose logsumexp
is below -88.7). Through the trainer's own loss path, a left-padded batch of width 192 then has NaN gradients unless
``no_fully_masked_rows`` is on, and with it the gradients are stock SDPA's.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import cudnn_emulation
from conftest import tiny_grpo_args


def _attention_inputs(width: int, pads=(0, 5, 12, 20), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(pads), 2, width, 16, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    keep = torch.ones(len(pads), width, dtype=torch.bool)
    for row, n in enumerate(pads):
        keep[row, :n] = False
    mask = torch.ones(width, width, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]
    return q, k, v, mask, keep


@pytest.mark.parametrize("width, padded, nan", [(191, True, False), (192, True, True), (193, True, False),
                                                 (320, True, True), (192, False, False)])
def test_the_emulated_kernel_fails_where_cudnn_does(width, padded, nan):
    """NaN query gradients exactly at widths 64 mod 128 with fully masked (left-pad) rows; forward always exact."""
    q, k, v, mask, keep = _attention_inputs(width, pads=(0, 5, 12, 20) if padded else (0, 0, 0, 0))
    out = cudnn_emulation.cudnn_like_sdpa(q, k, v, attn_mask=mask)
    (out * keep[:, None, :, None]).sum().backward()  # the loss reads real rows only
    assert bool(q.grad.isnan().any()) is nan
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    stock = cudnn_emulation.STOCK_SDPA(q.detach(), k.detach(), v.detach(), attn_mask=mask)
    real = keep[:, None, :, None].expand_as(out)
    assert torch.allclose(out.detach()[real], stock[real], atol=1e-12)


def test_no_fully_masked_rows_removes_the_fault_exactly():
    from rookgrpo.dynamics.attention import no_fully_masked_rows

    q, k, v, mask, keep = _attention_inputs(192)
    fixed = no_fully_masked_rows(mask)
    assert torch.equal(fixed[keep[:, None, :, None].expand_as(fixed)], mask[keep[:, None, :, None].expand_as(mask)])
    assert fixed.any(-1).all()
    grads = []
    for sdpa, m in ((cudnn_emulation.cudnn_like_sdpa, fixed), (cudnn_emulation.STOCK_SDPA, mask)):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        (sdpa(qq, kk, vv, attn_mask=m) * keep[:, None, :, None]).sum().backward()
        grads.append([t.grad for t in (qq, kk, vv)])
    for a, b in zip(*grads):
        assert torch.isfinite(a).all()
        assert (a - b).abs().max() < 1e-9


# ---- through the trainer's loss path ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def float64_model():
    """A tiny GPT-2 (SDPA, no dropout) in float64, so fixed and stock gradients compare to 1e-9."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rookgrpo.models.tiny_model import build_char_tokenizer

    tok = build_char_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_layer=2, n_head=2, n_embd=32, n_positions=512, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, attn_implementation="sdpa")
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).double(), tok


def _trainer(float64_model, tmp_path, fix: bool):
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.data import load_recipe_dataset

    model, tok = float64_model
    args = tiny_grpo_args(tmp_path / f"fix-{fix}", beta=0.0, no_fully_masked_rows=fix)
    data = load_recipe_dataset("rookgrpo/smoke-prompts").select(range(8))
    return RookGRPOTrainer(model=copy.deepcopy(model), reward_funcs=["uci_charset"], args=args, train_dataset=data,
                           processing_class=tok)


def _batch(tok, width: int, padded: bool, seed: int = 0):
    """A scored GRPO batch as the loss reads it: four left-padded prompts (pads 0, 5, 12, 20 when ``padded``) and
    completions, ``width`` tokens in all."""
    g = torch.Generator().manual_seed(seed)
    completion = 24
    prompt = width - completion
    pads = (0, 5, 12, 20) if padded else (0, 0, 0, 0)
    low, high = 3, len(tok) - 1  # printable characters (0-2 are EOS, PAD, UNK)
    prompt_ids = torch.randint(low, high, (4, prompt), generator=g)
    prompt_mask = torch.ones(4, prompt, dtype=torch.long)
    for row, n in enumerate(pads):
        prompt_ids[row, :n] = tok.pad_token_id
        prompt_mask[row, :n] = 0
    completion_ids = torch.randint(low, high, (4, completion), generator=g)
    completion_mask = torch.ones(4, completion, dtype=torch.long)
    completion_mask[1, -3:] = 0
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor([1.0, -0.5, 0.25, -0.75]),
            "num_items_in_batch": completion_mask.sum()}


def _loss_grads(trainer, batch, emulate: bool) -> torch.Tensor:
    model = trainer.model
    model.train()
    model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1  # set by transformers' training loop, which this bypasses
    with cudnn_emulation.patched() if emulate else torch.enable_grad():
        loss = trainer.compute_loss(model, batch)
        loss.backward()
    assert torch.isfinite(loss)  # forward is fine: only the backward goes NaN, as on the GPU
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_a_left_padded_batch_of_width_192_has_nan_gradients_unless_no_row_is_fully_masked(float64_model, tmp_path):
    _, tok = float64_model
    batch = _batch(tok, 192, padded=True)
    stock = _loss_grads(_trainer(float64_model, tmp_path, fix=False), batch, emulate=False)
    assert torch.isfinite(stock).all()
    broken = _loss_grads(_trainer(float64_model, tmp_path, fix=False), batch, emulate=True)
    assert broken.isnan().any()  # the fault, through TRL's loss and transformers' mask, as on an H200
    fixed = _loss_grads(_trainer(float64_model, tmp_path, fix=True), batch, emulate=True)
    assert torch.isfinite(fixed).all()
    assert (fixed - stock).abs().max() < 1e-9


@pytest.mark.parametrize("width, padded", [(191, True), (193, True), (192, False)])
def test_other_widths_and_unpadded_batches_stay_finite_either_way(float64_model, tmp_path, width, padded):
    _, tok = float64_model
    batch = _batch(tok, width, padded=padded)
    for fix in (False, True):
        grads = _loss_grads(_trainer(float64_model, tmp_path, fix=fix), batch, emulate=True)
        assert torch.isfinite(grads).all(), (width, padded, fix)


def test_the_mask_guard_touches_only_the_trainers_models(float64_model, tmp_path):
    """Another model in the process keeps transformers' masks; turning the field off takes the guard off."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from rookgrpo.dynamics.attention import _is_guarded

    trainer = _trainer(float64_model, tmp_path, fix=True)
    other = copy.deepcopy(float64_model[0])
    assert _is_guarded(trainer.model.config) and not _is_guarded(other.config)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    padding = torch.tensor([[0, 0, 1, 1]])
    kwargs = dict(batch_size=1, q_length=4, kv_length=4, attention_mask=padding.bool(), allow_is_causal_skip=False)
    assert mask_fn(**kwargs, config=trainer.model.config)[0, 0].any(-1).all()
    assert not mask_fn(**kwargs, config=other.config)[0, 0].any(-1).all()  # rows 0-1 fully masked, as transformers
    _trainer(float64_model, tmp_path, fix=False)  # a new model object: the first trainer's stays guarded
    assert _is_guarded(trainer.model.config)


def test_training_runs_without_the_cudnn_backend_on_cuda(tiny_model_dir, smoke_dataset, tmp_path, monkeypatch):
    """The training loss's forward (whose backward runs the kernels it chose) runs inside the backend guard with the
    trainer's device, once per training loss; generation and the reference's scoring run outside it, with every
    backend, as in TRL. On CUDA the guard switches cuDNN's SDPA off (and restores it), unless allowed."""
    import contextlib

    import rookgrpo.trainer as trainer_module
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.dynamics.attention import sdpa_backend_guard

    calls, inside, seen = [], [False], []

    @contextlib.contextmanager
    def recording_guard(device, allow_cudnn=False):
        calls.append((torch.device(device).type, allow_cudnn))
        inside[0] = True
        try:
            with sdpa_backend_guard(device, allow_cudnn):
                yield
        finally:
            inside[0] = False

    generate = RookGRPOTrainer._generate
    scoring = RookGRPOTrainer._get_per_token_logps_and_entropies

    def recording_generate(self, prompts):
        seen.append(("generate", inside[0]))
        return generate(self, prompts)

    def recording_scoring(self, *args, **kwargs):
        seen.append(("logps", inside[0], torch.is_grad_enabled()))
        return scoring(self, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "sdpa_backend_guard", recording_guard)
    monkeypatch.setattr(RookGRPOTrainer, "_generate", recording_generate)
    monkeypatch.setattr(RookGRPOTrainer, "_get_per_token_logps_and_entropies", recording_scoring)
    for allow in (False, True):
        calls.clear(), seen.clear()
        args = tiny_grpo_args(tmp_path / str(allow), max_steps=1, allow_cudnn_attention=allow, beta=0.1)
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                        train_dataset=smoke_dataset).train()
        assert calls == [("cpu", allow)]
        assert ("generate", False) in seen and ("logps", False, False) in seen  # reference scoring: outside
        assert ("logps", True, True) in seen  # the training loss's policy pass: inside
        assert not [s for s in seen if s[0] == "generate" and s[1]]
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with sdpa_backend_guard(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with sdpa_backend_guard(torch.device("cuda"), allow_cudnn=True):
        assert torch.backends.cuda.cudnn_sdp_enabled()


def test_eager_models_are_left_alone(tiny_model_dir, smoke_dataset, tmp_path):
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.dynamics.attention import _is_guarded

    args = tiny_grpo_args(tmp_path, max_steps=1, model_init_kwargs={"attn_implementation": "eager"})
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                              train_dataset=smoke_dataset)
    assert trainer.model.config._attn_implementation == "eager"
    assert trainer._guarded_masks == [] and not _is_guarded(trainer.model.config)


def _tiny_qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=64, max_position_embeddings=64, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, attn_implementation="sdpa", vocab_size=64,
                              eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _fully_masked_rows_seen(model, monkeypatch) -> list[bool]:
    """A left-padded text-only forward of ``model``: for each boolean SDPA mask it built, whether a row is all False."""
    masks = []

    def recording_sdpa(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return cudnn_emulation.STOCK_SDPA(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording_sdpa)
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(2, 6, dtype=torch.long)
    keep[1, :3] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=keep)
    monkeypatch.setattr(F, "scaled_dot_product_attention", cudnn_emulation.STOCK_SDPA)
    return [bool((~m.any(-1)).any()) for m in masks if isinstance(m, torch.Tensor) and m.dtype == torch.bool]


def test_the_mask_guard_reaches_a_vision_language_models_text_masks(monkeypatch):
    """Qwen2.5-VL's text model builds its masks from its text sub-config: the guard registers it (a guard of the
    top-level config alone reported the model guarded and left its fully masked rows)."""
    from types import SimpleNamespace

    from rookgrpo.dynamics.attention import _is_guarded, guard_masks, unguarded_roles

    model = _tiny_qwen2_5_vl()
    trainer = SimpleNamespace(model=model, ref_model=None)
    assert _fully_masked_rows_seen(model, monkeypatch) == [True]  # transformers' mask: the pad rows fully masked
    try:
        assert guard_masks(trainer) == ["policy"] and _is_guarded(model.config.get_text_config())
        assert _fully_masked_rows_seen(model, monkeypatch) == [False]
        assert unguarded_roles(trainer) == []  # a mask was built through the registry for the guarded configs
    finally:
        guard_masks(trainer, enabled=False)
    assert not _is_guarded(model.config.get_text_config())


def test_a_model_whose_masks_the_guard_cannot_reach_is_named_once(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    """A model that builds its masks itself (here: transformers' mask registry bypassed for the run) is named once
    at warning level after the first training loss, not reported guarded in silence."""
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.dynamics import attention

    args = tiny_grpo_args(tmp_path, max_steps=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                              train_dataset=smoke_dataset)
    assert trainer._guarded_masks == ["policy"]
    attention._SEEN.clear()
    original, attention._SEEN = attention._SEEN, type("NeverSeen", (set,), {"add": lambda self, x: None})()
    try:
        with caplog.at_level("WARNING", logger="rookgrpo.trainer"):
            trainer.train()
    finally:
        attention._SEEN = original
    said = [r for r in caplog.records if "no_fully_masked_rows" in r.getMessage()]
    assert len(said) == 1 and "the policy built no attention mask" in said[0].getMessage()


def test_unused_import_guard():
    assert F.scaled_dot_product_attention is cudnn_emulation.STOCK_SDPA  # no test leaves SDPA patched
