"""int8 per channel and int4 per group, by hand, against PyTorch's own int8 kernel
(helpers.serve.quantize; notebook 14, section 7)."""

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.serve.quantize import (
    QuantizedLinear,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4,
    quantize_int8,
    quantize_model,
    unpack_int4,
    weight_bytes,
)


def _weight(seed: int, shape=(24, 64)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(3))
def test_int8_error_is_at_most_half_a_step(seed):
    w = _weight(seed)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() == 127
    assert ((dequantize_int8(q, scale) - w).abs() <= scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("seed", range(3))
def test_int4_error_is_at_most_half_a_step_and_packs_two_per_byte(seed):
    w = _weight(seed)
    packed, scale, zero = quantize_int4(w, group_size=16)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 32) and scale.shape == (24, 4)
    back = dequantize_int4(packed, scale, zero)
    step = scale.repeat_interleave(16, dim=1)
    assert ((back - w).abs() <= step / 2 + 1e-6).all()


def test_pack_unpack_round_trip():
    q = torch.randint(0, 16, (5, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_int4(pack_int4(q)), q)
    assert pack_int4(torch.tensor([[3, 10]], dtype=torch.uint8)).item() == 3 + 16 * 10


def test_int8_equals_pytorchs_weight_only_int8_kernel():
    if not hasattr(torch, "_weight_int8pack_mm"):
        pytest.skip("this torch has no _weight_int8pack_mm")
    w, x = _weight(0), _weight(1, (5, 64))
    q, scale = quantize_int8(w)
    ours = x @ dequantize_int8(q, scale).T
    theirs = torch._weight_int8pack_mm(x, q, scale)
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_quantized_model_is_smaller_and_close():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=24, context_length=16, n_layers=2, n_heads=2, d_model=64)).eval()
    x = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)
        errors = {bits: (quantize_model(model, bits)(x) - full).abs().max().item() for bits in (8, 4)}
    assert 0 < errors[8] < errors[4] < 0.5
    sizes = [weight_bytes(m) for m in (model, quantize_model(model, 8), quantize_model(model, 4))]
    assert sizes[0] > sizes[1] > sizes[2]
    assert isinstance(quantize_model(model, 8).blocks[0].attn.q_proj, QuantizedLinear)
    assert not isinstance(model.blocks[0].attn.q_proj, QuantizedLinear)  # the original is untouched


@pytest.mark.parametrize("call, match", [
    (lambda: quantize_int8(torch.tensor([[1.0, float("inf")]])), "inf or NaN"),
    (lambda: quantize_int4(torch.tensor([[1.0, float("nan")]]), 2), "inf or NaN"),
    (lambda: quantize_int8(torch.ones(4)), "matrix"),
    (lambda: quantize_int4(torch.ones(2, 10), group_size=4), "multiple of group_size"),
    (lambda: quantize_int4(torch.ones(2, 8), group_size=0), "group_size is 0"),
    (lambda: pack_int4(torch.tensor([[16, 1]], dtype=torch.uint8)), r"\[0, 15\]"),
    (lambda: QuantizedLinear(torch.nn.Linear(4, 4), bits=3), "bits is 3"),
    (lambda: quantize_int8(torch.ones(4, 0)), r"^weight has shape \(4, 0\), expected at least one row"),
    (lambda: quantize_int4(torch.ones(0, 8), 4), r"^weight has shape \(0, 8\), expected at least one row"),
])
def test_bad_quantization_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
