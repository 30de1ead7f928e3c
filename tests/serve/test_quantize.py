"""int8 per channel and int4 per group, by hand, against PyTorch's own int8 kernel
(helpers.serve.quantize; notebook 14, section 7)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from shared_tools import full

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


# helpers.serve.quantize, exactly:
#
# Exact values worked by hand (scales that are powers of two, so every q is exact; halves that
# round to even), the edge groups (all positive, all negative, all zero), the nibble order of the
# packing, the defaults (group_size 32), what QuantizedLinear and quantize_model keep and replace,
# the bytes counted, and every error message read in full.

U8 = torch.uint8


def test_int8_by_hand():
    w = torch.tensor([[127.0, -63.5, 0.5, 1.5],     # scale 1: halves round to even
                      [0.0, 0.0, 0.0, 0.0],        # an all-zero row: scale 1, q 0
                      [-254.0, 3.0, 2.0, 1.0]])    # scale 2, from the largest magnitude
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.tolist() == [1.0, 1.0, 2.0]
    assert q.tolist() == [[127, -64, 0, 2], [0, 0, 0, 0], [-127, 2, 1, 0]]
    assert dequantize_int8(q, scale).tolist() == [[127, -64, 0, 2], [0, 0, 0, 0], [-254, 4, 2, 0]]


def test_int8_scale_is_float32_for_a_float64_weight():
    q, scale = quantize_int8(torch.tensor([[254.0, 1.0]], dtype=torch.float64))
    assert scale.dtype == torch.float32 and scale.tolist() == [2.0] and q.tolist() == [[127, 0]]
    assert dequantize_int8(q, scale).dtype == torch.float32


@pytest.mark.parametrize("q, scale, message", [
    (torch.zeros(2, 3, dtype=torch.int16), torch.ones(2),
     "q is torch.int16 (2, 3) and scale (2,), expected int8 (out, in) and (out,)"),
    (torch.zeros(2, 3, dtype=torch.int8), torch.ones(3),
     "q is torch.int8 (2, 3) and scale (3,), expected int8 (out, in) and (out,)"),
])
def test_dequantize_int8_errors_in_full(q, scale, message):
    with pytest.raises(ValueError, match=full(message)):
        dequantize_int8(q, scale)


def test_pack_puts_the_even_value_in_the_low_nibble():
    q = torch.tensor([[1, 2, 15, 0], [0, 15, 7, 8]], dtype=U8)
    packed = pack_int4(q)
    assert packed.dtype == U8 and packed.tolist() == [[0x21, 0x0F], [0xF0, 0x87]]
    assert unpack_int4(packed).tolist() == q.tolist()
    assert unpack_int4(torch.tensor([0xAB], dtype=U8)).tolist() == [0xB, 0xA]
    assert pack_int4(torch.zeros(3, 0, dtype=U8)).shape == (3, 0)


@pytest.mark.parametrize("q", [torch.tensor([[1, 2, 3]], dtype=U8), torch.tensor([[1, 16]], dtype=U8),
                               torch.tensor([[1, 2]], dtype=torch.int8)])
def test_pack_refuses_in_full(q):
    with pytest.raises(ValueError, match=full(f"q is {q.dtype} {tuple(q.shape)}, expected uint8 "
                                              "values in [0, 15] with an even last size")):
        pack_int4(q)


def test_unpack_refuses_in_full():
    with pytest.raises(ValueError, match=full("packed is torch.int8, expected uint8")):
        unpack_int4(torch.zeros(2, dtype=torch.int8))


def test_int4_by_hand():
    """Groups of 4: [-1.5, 6]: scale 0.5, zero 3; all positive: low is 0, zero 0; all negative:
    high is 0, zero 15; all zero: scale 1, zero 0."""
    w = torch.tensor([[-1.5, 0.0, 2.0, 6.0, 7.5, 1.5, 3.0, 0.25],
                      [-7.5, -0.5, -1.0, -3.0, 0.0, 0.0, 0.0, 0.0]])
    packed, scale, zero = quantize_int4(w, group_size=4)
    assert scale.tolist() == [[0.5, 0.5], [0.5, 1.0]]
    assert zero.tolist() == [[3.0, 0.0], [15.0, 0.0]]
    q = unpack_int4(packed)
    assert q.tolist() == [[0, 3, 7, 15, 15, 3, 6, 0], [0, 14, 13, 9, 0, 0, 0, 0]]
    assert dequantize_int4(packed, scale, zero).tolist() == [
        [-1.5, 0.0, 2.0, 6.0, 7.5, 1.5, 3.0, 0.0], [-7.5, -0.5, -1.0, -3.0, 0.0, 0.0, 0.0, 0.0]]


def test_int4_groups_default_to_32():
    w = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    packed, scale, zero = quantize_int4(w)
    assert packed.shape == (3, 32) and scale.shape == zero.shape == (3, 2)
    assert scale.dtype == torch.float32
    assert torch.equal(scale, quantize_int4(w, group_size=32)[1])


def test_int4_of_a_float64_weight_is_float32():
    w = torch.tensor([[-1.5, 6.0]], dtype=torch.float64)
    packed, scale, zero = quantize_int4(w, group_size=2)
    assert scale.dtype == torch.float32 and dequantize_int4(packed, scale, zero).dtype == torch.float32
    assert dequantize_int4(packed, scale, zero).tolist() == [[-1.5, 6.0]]


@pytest.mark.parametrize("weight, group_size, error, message", [
    (torch.ones(2, 10), 4, ValueError,
     "weight has 10 inputs, expected a multiple of group_size = 4, and group_size even (two "
     "values per byte)"),
    (torch.ones(2, 9), 3, ValueError,
     "weight has 9 inputs, expected a multiple of group_size = 3, and group_size even (two "
     "values per byte)"),
    (torch.ones(2, 8), 0, ValueError, "group_size is 0, expected a positive int"),
    (torch.ones(2, 8), 2.0, TypeError, "group_size is 2.0 (a float), expected a positive int"),
])
def test_quantize_int4_errors_in_full(weight, group_size, error, message):
    with pytest.raises(error, match=full(message)):
        quantize_int4(weight, group_size)


@pytest.mark.parametrize("scale, zero, message", [
    (torch.ones(2, 2), torch.ones(2, 1), "scale (2, 2) and zero (2, 1) do not fit 2 rows of 8 values"),
    (torch.ones(3, 2), torch.ones(3, 2), "scale (3, 2) and zero (3, 2) do not fit 2 rows of 8 values"),
    (torch.ones(2, 3), torch.ones(2, 3), "scale (2, 3) and zero (2, 3) do not fit 2 rows of 8 values"),
])
def test_dequantize_int4_errors_in_full(scale, zero, message):
    with pytest.raises(ValueError, match=full(message)):
        dequantize_int4(torch.zeros(2, 4, dtype=U8), scale, zero)


@pytest.mark.parametrize("weight, shown", [
    (torch.ones(4), "torch.Size([4])"), (torch.ones(1, 2, 2), "torch.Size([1, 2, 2])"),
    (torch.ones(2, 2, dtype=torch.long), "torch.Size([2, 2])"), ([[1.0]], "list"),
])
def test_a_weight_must_be_a_float_matrix(weight, shown):
    message = f"weight is {shown}, expected a floating-point (out, in) matrix"
    for quantize in (quantize_int8, quantize_int4):
        with pytest.raises(ValueError, match=full(message)):
            quantize(weight)


def test_non_finite_weights_are_counted():
    w = torch.tensor([[1.0, float("inf"), float("nan"), 0.0]])
    message = ("weight holds 2 inf or NaN values: a scale computed from them would be inf or NaN, "
               "and every other weight in its row or group would round to 0")
    for quantize in (quantize_int8, lambda x: quantize_int4(x, 2)):
        with pytest.raises(ValueError, match=full(message)):
            quantize(w)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_linear_computes_with_its_dequantized_weight(bits):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 6)
    layer = QuantizedLinear(linear, bits, group_size=4)
    assert (layer.bits, layer.in_features, layer.out_features) == (bits, 8, 6)
    want = dequantize_int8(*quantize_int8(linear.weight.detach())) if bits == 8 else \
        dequantize_int4(*quantize_int4(linear.weight.detach(), 4))
    assert torch.equal(layer.dequantized(), want) and torch.equal(layer.weight, want)
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), F.linear(x, want, linear.bias))
    assert isinstance(layer.bias, torch.nn.Parameter) and layer.bias is not linear.bias
    assert torch.equal(layer.bias, linear.bias)
    buffers = dict(layer.named_buffers())
    assert set(buffers) == ({"q", "scale"} if bits == 8 else {"q", "scale", "zero"})
    if bits == 4:
        assert buffers["q"].shape == (6, 4) and buffers["scale"].shape == (6, 2)


def test_quantized_linear_without_a_bias():
    layer = QuantizedLinear(torch.nn.Linear(4, 2, bias=False), 8)
    assert layer.bias is None and layer(torch.ones(1, 4)).shape == (1, 2)


def test_quantized_linear_bias_is_detached_copy():
    linear = torch.nn.Linear(4, 2)
    layer = QuantizedLinear(linear, 4, group_size=4)
    with torch.no_grad():
        linear.bias.add_(1.0)
    assert not torch.equal(layer.bias, linear.bias)


@pytest.mark.parametrize("bits", [16, "8", 8.0])
def test_bits_are_8_or_4(bits):
    message = f"bits is {bits!r}, expected one of 8, 4"
    with pytest.raises(ValueError, match=full(message)):
        QuantizedLinear(torch.nn.Linear(4, 4), bits)
    with pytest.raises(ValueError, match=full(message)):
        quantize_model(GPT(GPTConfig(vocab_size=8, context_length=4, n_layers=1, n_heads=1,
                                     d_model=8)), bits)


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=24, context_length=8, n_layers=2, n_heads=2, d_model=32))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_model_replaces_every_block_linear_and_nothing_else(bits):
    model = _gpt().train()
    quantized = quantize_model(model, bits, group_size=16)
    assert model.training and not quantized.training
    replaced = {name for name, m in quantized.named_modules() if isinstance(m, QuantizedLinear)}
    linears = {name for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.startswith("blocks.")}
    assert replaced == linears and len(replaced) == 12
    assert isinstance(quantized.lm_head, torch.nn.Linear)
    for name in replaced:
        layer = quantized.get_submodule(name)
        assert layer.bits == bits
        if bits == 4:
            assert layer.scale.shape[1] == layer.in_features // 16
    assert all(not isinstance(m, QuantizedLinear) for m in model.modules())


def test_quantize_model_default_group_size_is_32():
    quantized = quantize_model(_gpt(), 4)
    assert quantized.blocks[0].mlp.down.scale.shape == (32, 4)


def test_weight_bytes_counts_a_tied_matrix_once_and_the_buffers():
    model = _gpt()
    params = sum(p.numel() * 4 for p in model.parameters())  # parameters() already dedups ties
    assert weight_bytes(model) == params + sum(b.numel() * b.element_size() for b in model.buffers())
    layer = QuantizedLinear(torch.nn.Linear(8, 6), 4, group_size=4)
    assert weight_bytes(layer) == 6 * 4 + 6 * 4 * 1 + 6 * 2 * 4 * 2  # bias, q, scale, zero
    layer8 = QuantizedLinear(torch.nn.Linear(8, 6, bias=False), 8)
    assert weight_bytes(layer8) == 6 * 8 + 6 * 4


def test_int4_clamps_a_top_value_that_rounds_to_16():
    """[-11.5, 3.5]: scale 1, zero round(11.5) = 12 (half to even), and round(3.5) + 12 = 16,
    one past the 4 bits: it is clamped to 15 (so it comes back as 3, half a step off)."""
    packed, scale, zero = quantize_int4(torch.tensor([[-11.5, 3.5]]), group_size=2)
    assert scale.tolist() == [[1.0]] and zero.tolist() == [[12.0]]
    assert unpack_int4(packed).tolist() == [[0, 15]]
    assert dequantize_int4(packed, scale, zero).tolist() == [[-12.0, 3.0]]

TINY = 2.0**-149  # the smallest float32 subnormal: scales computed from such weights round a lot


def test_int8_clamps_subnormal_rows():
    """amax = 190 x 2^-149: amax / 127 rounds to 2^-149 itself, so w / scale is +-190: clamped
    to +-127 (without the clamp, int8 would wrap them around)."""
    q, scale = quantize_int8(torch.tensor([[190 * TINY, -190 * TINY, 0.0, 5 * TINY]]))
    assert scale.tolist() == [TINY] and q.tolist() == [[127, -127, 0, 5]]


def test_int4_clamps_a_subnormal_group():
    """[-22 x 2^-149, 0]: the scale rounds to 2^-149, the zero point 22 is clamped to 15 and the
    low weight's q = -22 + 15 to 0."""
    packed, scale, zero = quantize_int4(torch.tensor([[-22 * TINY, 0.0]]), group_size=2)
    assert scale.tolist() == [[TINY]] and zero.tolist() == [[15.0]]
    assert unpack_int4(packed).tolist() == [[0, 15]]


def test_non_finite_count_is_the_non_finite_ones():
    with pytest.raises(ValueError, match="^weight holds 3 inf or NaN values"):
        quantize_int8(torch.tensor([[float("inf"), float("nan"), -float("inf"), 0.0]]))


def test_pack_works_on_any_number_of_dimensions():
    assert pack_int4(torch.tensor([1, 2, 3, 4], dtype=U8)).tolist() == [0x21, 0x43]
    q = torch.arange(12, dtype=U8).view(2, 3, 2)
    assert pack_int4(q).shape == (2, 3, 1) and unpack_int4(pack_int4(q)).tolist() == q.tolist()
    with pytest.raises(ValueError, match=full("q is torch.uint8 (2, 2, 3), expected uint8 values in "
                                              "[0, 15] with an even last size")):
        pack_int4(torch.zeros(2, 2, 3, dtype=U8))


def test_quantized_linear_default_group_size_is_32():
    layer = QuantizedLinear(torch.nn.Linear(64, 2), 4)
    assert layer.scale.shape == (2, 2) and layer.q.shape == (2, 32)


def test_quantize_model_makes_its_integers_with_the_quantizer_it_is_given():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=32))
    calls = []

    def counting_int4(weight, group_size):
        calls.append(tuple(weight.shape))
        return quantize_int4(weight, group_size)

    ours = quantize_model(model, 4, 32, counting_int4)
    assert calls and len(calls) == sum(isinstance(m, torch.nn.Linear) for m in model.blocks.modules())
    plain = quantize_model(model, 4, 32)
    assert all(torch.equal(a, b) for a, b in zip(ours.buffers(), plain.buffers(), strict=True))
    with pytest.raises(TypeError, match="^quantize is int, expected a function like quantize_int8"):
        quantize_model(model, 8, 32, 3)
