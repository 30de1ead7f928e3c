"""Sliding windows, QK-norm and RoPE scaling: the attention of Gemma 3, Qwen3 and Llama 3.

Defined in notebook 12, "The decoder of 2025-2026", sections 3 and 4:

    banded_mask              bool (N, M): query i sees keys j with i - window < j <= i
    RingKVCache              a cache of `window` slots; token t lives in slot t % window, so its
                             memory stays bounded however long the sequence
    ring_slot                the slot of token t (the ring buffer's index)
    layer_kinds              Gemma 3's pattern: five local (sliding) layers, then one global
    pattern_cache_bytes      KV-cache bytes of a local/global stack at a given length
    qk_norm_attention        RMSNorm on every query and key head before the product (Qwen3, Gemma 3)
    llama3_inv_freq          Llama 3.1's RoPE scaling: low frequencies slowed by `factor`
    yarn_inv_freq            YaRN: a ramp between kept and interpolated frequencies, plus
                             the attention factor 0.1 ln(factor) + 1

The window convention is Hugging Face's (Mistral, Gemma 3): a window of W keeps W keys, the
query's own and the W - 1 before it. Model code: imports torch and the course's model modules.
Shapes: B batch, H heads, N queries, M keys, D_H head size, W the window.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from helpers import checks
from helpers.model.modern import rms_norm


def banded_mask(n_q: int, window: int, n_k: int | None = None) -> Tensor:
    """Bool (N, M): True where query i (at position M - N + i) may see key j: causal, and
    fewer than `window` positions back. window=N gives the ordinary causal mask."""
    checks.positive_int("n_q", n_q)
    checks.positive_int("window", window)
    n_k = n_q if n_k is None else checks.positive_int("n_k", n_k)
    if n_k < n_q:
        raise ValueError(f"n_k is {n_k}, expected at least n_q = {n_q}")
    q_pos = torch.arange(n_k - n_q, n_k)[:, None]
    k_pos = torch.arange(n_k)[None, :]
    return (k_pos <= q_pos) & (k_pos > q_pos - window)


def ring_slot(position: int, window: int) -> int:
    """The slot of the ring buffer that holds token `position`: position mod window."""
    checks.non_negative_int("position", position)
    checks.positive_int("window", window)
    return position % window


class RingKVCache:
    """Keys and values of the last `window` tokens of one layer: (B, H, W, D_H) each.

    `append(k, v)` writes one token in slot t % W (overwriting token t - W, which no query
    will see again) and returns the keys and values to attend to, oldest first. Memory: W
    slots, whatever the length.
    """

    def __init__(self, batch: int, n_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype = torch.float32) -> None:
        for name, value in (("batch", batch), ("n_heads", n_heads), ("window", window),
                            ("head_dim", head_dim)):
            checks.positive_int(name, value)
        self.window, self.length = window, 0
        self.keys = torch.zeros(batch, n_heads, window, head_dim, dtype=dtype)
        self.values = torch.zeros_like(self.keys)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (B, H, 1, D_H) for the next token -> keys, values (B, H, min(t+1, W), D_H)."""
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dtype != self.keys.dtype:
                got = t.dtype if isinstance(t, Tensor) else type(t).__name__
                raise TypeError(f"{name} is {got}, expected a tensor of the cache's dtype {self.keys.dtype}")
        if k.shape != v.shape or k.shape[2] != 1 or k.shape[:2] + k.shape[3:] != \
                self.keys.shape[:2] + self.keys.shape[3:]:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)}, expected both "
                             f"({self.keys.shape[0]}, {self.keys.shape[1]}, 1, {self.keys.shape[3]})")
        slot = ring_slot(self.length, self.window)
        self.keys[:, :, slot], self.values[:, :, slot] = k[:, :, 0], v[:, :, 0]
        self.length += 1
        n = min(self.length, self.window)
        order = [ring_slot(t, self.window) for t in range(self.length - n, self.length)]
        return self.keys[:, :, order], self.values[:, :, order]

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2


def layer_kinds(n_layers: int, local_per_global: int = 5) -> list[str]:
    """Gemma 3's stack: `local_per_global` sliding layers, then one global, repeated."""
    checks.positive_int("n_layers", n_layers)
    checks.non_negative_int("local_per_global", local_per_global)
    period = local_per_global + 1
    return ["global" if (i + 1) % period == 0 else "local" for i in range(n_layers)]


def pattern_cache_bytes(kinds: list[str], n_tokens: int, window: int, n_kv_heads: int,
                        head_dim: int, bytes_per_value: int = 2) -> int:
    """KV-cache bytes of one sequence of n_tokens: a global layer keeps every token, a local one
    min(n_tokens, window); each token is 2 (K, V) x H_KV x D_H values."""
    for name, value in (("n_tokens", n_tokens), ("window", window), ("n_kv_heads", n_kv_heads),
                        ("head_dim", head_dim), ("bytes_per_value", bytes_per_value)):
        checks.positive_int(name, value)
    bad = [kind for kind in kinds if kind not in ("local", "global")]
    if bad or not kinds:
        raise ValueError(f"kinds is {kinds!r}, expected a non-empty list of 'local' / 'global'")
    per_token = 2 * n_kv_heads * head_dim * bytes_per_value
    return sum(per_token * (n_tokens if kind == "global" else min(n_tokens, window)) for kind in kinds)


def qk_norm_attention(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor,
                      mask: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Attention with QK-norm: q (B, H, N, D_H), k, v (B, H, M, D_H), mask bool (N, M) ->
    (output (B, H, N, D_H), the largest |score|). Each query and key head is RMS-normalised (with
    a learned gain (D_H,)) so |q . k| / sqrt(D_H) is bounded by the gains, not by the weights."""
    _check_qk_norm_inputs(q, k, v, q_weight, k_weight, mask)
    checks.positive_float("eps", eps)
    q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    largest = scores.detach().abs().max()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, largest


def _check_qk_norm_inputs(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor,
                          mask: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("q_weight", q_weight), ("k_weight", k_weight), ("mask", mask)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}, expected a torch.Tensor")
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, "
                         "expected (B, H, N, D_H) and (B, H, M, D_H) twice")
    for name, weight in (("q_weight", q_weight), ("k_weight", k_weight)):
        if weight.shape != (q.shape[-1],):
            raise ValueError(f"{name} has shape {tuple(weight.shape)}, expected ({q.shape[-1]},): "
                             "one gain per feature of a head")
    if mask.dtype != torch.bool or mask.shape != (q.shape[2], k.shape[2]):
        raise ValueError(f"mask is {mask.dtype} of shape {tuple(mask.shape)}, expected bool "
                         f"({q.shape[2]}, {k.shape[2]}): True where a query may see a key")


# --- RoPE scaling ---------------------------------------------------------------------------

def _inv_freq(head_dim: int, base: float) -> Tensor:
    checks.positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim is {head_dim}, expected an even number for RoPE")
    checks.positive_float("base", base)
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def llama3_inv_freq(head_dim: int, base: float, factor: float, original_context: int,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> Tensor:
    """(D_H/2,) Llama 3.1's frequencies: wavelengths shorter than original_context /
    high_freq_factor kept, longer than original_context / low_freq_factor divided by `factor`,
    a smooth blend between."""
    checks.number_in("factor", factor, 1.0, math.inf, high_open=True)
    checks.positive_int("original_context", original_context)
    checks.positive_float("low_freq_factor", low_freq_factor)
    checks.positive_float("high_freq_factor", high_freq_factor)
    if high_freq_factor <= low_freq_factor:
        raise ValueError(f"high_freq_factor is {high_freq_factor}, expected more than "
                         f"low_freq_factor = {low_freq_factor}")
    inv = _inv_freq(head_dim, base)
    wavelength = 2 * math.pi / inv
    smooth = ((original_context / wavelength - low_freq_factor)
              / (high_freq_factor - low_freq_factor)).clamp(0, 1)  # 0: slow down, 1: keep
    return (1 - smooth) * inv / factor + smooth * inv


def yarn_inv_freq(head_dim: int, base: float, factor: float, original_context: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> tuple[Tensor, float]:
    """(D_H/2,) YaRN's frequencies and its attention factor 0.1 ln(factor) + 1.

    A pair that turns more than beta_fast times over the original context keeps its frequency,
    one that turns fewer than beta_slow times is interpolated (divided by `factor`), a linear
    ramp between; Hugging Face's rounding of the ramp's ends (floor, ceil) is kept."""
    checks.number_in("factor", factor, 1.0, math.inf, high_open=True)
    checks.positive_int("original_context", original_context)
    inv = _inv_freq(head_dim, base)

    def dim_of(turns: float) -> float:  # the feature index at which a pair turns `turns` times
        return head_dim * math.log(original_context / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_of(beta_fast)), 0)
    high = min(math.ceil(dim_of(beta_slow)), head_dim - 1)
    ramp = (torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)
    keep = 1 - ramp.clamp(0, 1)                      # 1: keep the frequency, 0: interpolate
    return inv / factor * (1 - keep) + inv * keep, 0.1 * math.log(factor) + 1.0
