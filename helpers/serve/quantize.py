"""Weight-only quantization: int8 per output channel, int4 per group packed two to a byte.

Defined in notebook 14, "Serving the model", section 7, after the plain versions written there:

    quantize_int8 / dequantize_int8     symmetric, one scale per output row: w ~ q * scale,
                                        q in [-127, 127]
    quantize_int4 / dequantize_int4     asymmetric, one scale and zero point per group of
                                        group_size weights: w ~ (q - zero) * scale, q in [0, 15]
    pack_int4 / unpack_int4             two 4-bit values in one byte (low nibble first)
    QuantizedLinear                     a Linear that keeps its weight quantized and
                                        dequantizes it when called
    quantize_model                      a copy of a GPT with every block's Linear quantized
    weight_bytes                        the bytes a model's weights take

The embedding (tied to the output matrix) stays in float32 here, as many int4 formats keep it.
Weights: (out, in), the layout of nn.Linear.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks


def _check_weight(weight: Tensor) -> None:
    if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.dim() != 2:
        raise ValueError(f"weight is {getattr(weight, 'shape', type(weight).__name__)}, expected "
                         "a floating-point (out, in) matrix")
    if weight.numel() == 0:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected at least one row and "
                         "one column (an empty matrix has no scale)")
    if not torch.isfinite(weight).all():
        raise ValueError(f"weight holds {int((~torch.isfinite(weight)).sum())} inf or NaN values: "
                         "a scale computed from them would be inf or NaN, and every other weight "
                         "in its row or group would round to 0")


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(out, in) float -> q (out, in) int8 in [-127, 127] and scale (out,): w ~ q * scale[:, None]."""
    _check_weight(weight)
    scale = weight.abs().amax(dim=1).float() / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: q = 0
    q = torch.round(weight.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: Tensor, scale: Tensor) -> Tensor:
    """q (out, in) int8, scale (out,) -> (out, in) float32."""
    if q.dtype != torch.int8 or scale.shape != q.shape[:1]:
        raise ValueError(f"q is {q.dtype} {tuple(q.shape)} and scale {tuple(scale.shape)}, "
                         "expected int8 (out, in) and (out,)")
    return q.float() * scale[:, None]


def pack_int4(q: Tensor) -> Tensor:
    """(..., 2 m) uint8 values in [0, 15] -> (..., m) uint8: value 2 j in the low 4 bits of byte j,
    value 2 j + 1 in the high 4 bits."""
    if q.dtype != torch.uint8 or q.shape[-1] % 2 or (q > 15).any():
        raise ValueError(f"q is {q.dtype} {tuple(q.shape)}, expected uint8 values in [0, 15] with "
                         "an even last size")
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """(..., m) uint8 -> (..., 2 m) uint8 in [0, 15]; the inverse of pack_int4."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed is {packed.dtype}, expected uint8")
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def quantize_int4(weight: Tensor, group_size: int = 32) -> tuple[Tensor, Tensor, Tensor]:
    """(out, in) float -> packed (out, in / 2) uint8, scale and zero (out, in / group_size).

    Each group of group_size weights of a row maps its [min, max] onto 0 ... 15:
    scale = (max - min) / 15, zero = round(-min / scale), q = clamp(round(w / scale) + zero).
    """
    _check_weight(weight)
    group_size = checks.positive_int("group_size", group_size)
    out, n_in = weight.shape
    if n_in % group_size or group_size % 2:
        raise ValueError(f"weight has {n_in} inputs, expected a multiple of group_size = "
                         f"{group_size}, and group_size even (two values per byte)")
    groups = weight.float().reshape(out, n_in // group_size, group_size)
    low = groups.amin(dim=-1).clamp(max=0)
    high = groups.amax(dim=-1).clamp(min=0)  # 0 always representable exactly
    scale = (high - low) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-low / scale).clamp(0, 15)
    q = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, 15).to(torch.uint8)
    return pack_int4(q.reshape(out, n_in)), scale, zero


def dequantize_int4(packed: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """packed (out, in / 2) uint8, scale and zero (out, groups) -> (out, in) float32."""
    q = unpack_int4(packed).float()
    out, n_in = q.shape
    if scale.shape != zero.shape or scale.shape[0] != out or n_in % scale.shape[1]:
        raise ValueError(f"scale {tuple(scale.shape)} and zero {tuple(zero.shape)} do not fit "
                         f"{out} rows of {n_in} values")
    groups = q.reshape(out, scale.shape[1], -1)
    return ((groups - zero[..., None]) * scale[..., None]).reshape(out, n_in)


class QuantizedLinear(nn.Module):
    """A Linear whose weight is stored as int8 (per channel) or packed int4 (per group)."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int = 32,
                 quantize: Callable[..., tuple[Tensor, ...]] | None = None) -> None:
        """quantize: what makes the integers, quantize_int8(weight) or quantize_int4(weight,
        group_size) by default (a notebook passes the student's own)."""
        super().__init__()
        self.bits = checks.one_of("bits", bits, (8, 4))
        if quantize is not None and not callable(quantize):
            raise TypeError(f"quantize is {type(quantize).__name__}, expected a function like "
                            f"quantize_int{bits} or None")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        if bits == 8:
            q, scale = (quantize or quantize_int8)(weight)
            self.register_buffer("q", q)
            self.register_buffer("scale", scale)
        else:
            q, scale, zero = (quantize or quantize_int4)(weight, group_size)
            self.register_buffer("q", q)
            self.register_buffer("scale", scale)
            self.register_buffer("zero", zero)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def dequantized(self) -> Tensor:
        """The weight this layer computes with, (out, in) float32."""
        if self.bits == 8:
            return dequantize_int8(self.q, self.scale)
        return dequantize_int4(self.q, self.scale, self.zero)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight, so code that reads `.weight` (the fused path) still works."""
        return self.dequantized()

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.dequantized(), self.bias)


@torch.no_grad()
def quantize_model(model: nn.Module, bits: int, group_size: int = 32,
                   quantize: Callable[..., tuple[Tensor, ...]] | None = None) -> nn.Module:
    """A deep copy of `model` with every nn.Linear inside its blocks made a QuantizedLinear
    (whose integers `quantize` makes, the course's quantize_int8 / quantize_int4 by default)."""
    checks.one_of("bits", bits, (8, 4))
    if quantize is not None and not callable(quantize):
        raise TypeError(f"quantize is {type(quantize).__name__}, expected a function like "
                        f"quantize_int{bits} or None")
    quantized = copy.deepcopy(model).eval()
    for block in quantized.blocks:
        for module in list(block.modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, child_name, QuantizedLinear(child, bits, group_size, quantize))
    return quantized


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of `model` (a tied matrix counted once)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())
