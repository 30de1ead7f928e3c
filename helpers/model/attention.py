"""Scaled dot-product attention, written from scratch: softmax, attention itself, and masks.

    softmax(x, dim)                                  stable softmax; an all -inf row gives zeros
    softmax_jacobian(a)                              d softmax / d logits = diag(a) - a a^T
    scaled_dot_product_attention(q, k, v, mask, scale)   returns (output, weights)
    AttentionLayer(d_in, d_k, d_v)                   learned W_Q, W_K, W_V; layer(x_query, x_data)
    causal_mask(n_q, n_k)                            True on and below the (end-aligned) diagonal
    bidirectional_mask(n_q, n_k)                     all True: encoder self-attention
    padding_mask(lengths, n_k)                       True on real tokens, shape (B, 1, 1, n_k)
    local_mask / strided_mask / global_mask          the sparse patterns of efficient attention

Mask convention (the same as `torch.nn.functional.scaled_dot_product_attention` with a boolean
`attn_mask`): True means "this query may attend to this key". Combine masks with `&`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from helpers import checks

__all__ = [
    "softmax",
    "softmax_jacobian",
    "scaled_dot_product_attention",
    "AttentionLayer",
    "causal_mask",
    "padding_mask",
    "local_mask",
    "strided_mask",
    "global_mask",
    "bidirectional_mask",
]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along `dim`, computed without overflow.

    Subtracting the row maximum first keeps every exponent <= 0, so exp never overflows. A row
    that is entirely -inf (a query allowed to see nothing) gives all zeros instead of 0/0 = NaN.
    Shape: same as `x`.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x is a {type(x).__name__}, expected a torch.Tensor")
    if not x.is_floating_point():
        raise TypeError(f"x has dtype {x.dtype}, expected a floating-point tensor")
    row_max = x.detach().amax(dim=dim, keepdim=True)  # a constant shift: softmax ignores it
    # An all -inf row has max -inf; shifting by it would give -inf - -inf = NaN, so shift by 0.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exps = torch.exp(x - row_max)
    total = exps.sum(dim=dim, keepdim=True)
    return exps / torch.where(total > 0, total, torch.ones_like(total))


def softmax_jacobian(a: Tensor) -> Tensor:
    """The Jacobian of softmax at output `a`: J[..., i, j] = d a_i / d s_j = a_i (delta_ij - a_j).

    a: (..., n), probabilities along the last dim. Returns (..., n, n) = diag(a) - a a^T.
    When `a` is nearly one-hot every entry is nearly 0: a saturated softmax passes no gradient.
    """
    if not isinstance(a, Tensor) or a.dim() < 1:
        got = tuple(a.shape) if isinstance(a, Tensor) else type(a).__name__
        raise ValueError(f"a is {got}, expected a tensor of probabilities of shape (..., n)")
    return torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise a ValueError naming the shapes if q, k, v cannot be attended together.

    Shared with helpers.flash.tiled, whose tiled attention takes the same arguments.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}, expected a torch.Tensor")
        if t.dim() < 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected (..., N, d) with 2+ dims")
        if not t.is_floating_point():
            raise TypeError(f"{name} has dtype {t.dtype}, expected a floating-point tensor")
    check_same_device(q, k, v)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; expected one dtype for all three")
    if q.shape[-1] == 0:
        raise ValueError(f"q has shape {tuple(q.shape)}: d_k is 0, expected d_k >= 1")
    if k.shape[-2] == 0:
        raise ValueError(f"k has shape {tuple(k.shape)}: N_k is 0, expected at least one key")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q has shape {tuple(q.shape)} and k has shape {tuple(k.shape)}: "
            f"their last dimensions (d_k) must match, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k has shape {tuple(k.shape)} and v has shape {tuple(v.shape)}: "
            f"they must have the same number of keys N_k, got {k.shape[-2]} and {v.shape[-2]}"
        )
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"q has shape {tuple(q.shape)}, k has shape {tuple(k.shape)} and v has shape "
            f"{tuple(v.shape)}: their leading (batch, head) dimensions do not broadcast"
        ) from None


def check_same_device(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise a ValueError unless q, k and v live on one device."""
    if not q.device == k.device == v.device:
        raise ValueError(f"q is on {q.device}, k on {k.device} and v on {v.device}: expected all "
                         "three on one device (move them with .to(device))")


def check_mask(mask: Tensor, scores_shape: torch.Size) -> None:
    """Raise if `mask` is not a boolean tensor broadcastable to the (..., N_q, N_k) scores."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask is a {type(mask).__name__}, expected a boolean torch.Tensor")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask has dtype {mask.dtype}, expected torch.bool (True = may attend); "
            "for a 0/1 mask use mask.bool()"
        )
    n_q, n_k = scores_shape[-2], scores_shape[-1]
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected a shape broadcastable to "
            f"(..., {n_q}, {n_k}) to match scores of shape {tuple(scores_shape)}"
        )


def check_scale(scale: float) -> None:
    """Raise unless `scale` is a positive finite number (a numpy scalar is fine):
    TypeError for something that is not a number, ValueError for 0, a negative number, inf or NaN."""
    checks.positive_float("scale", scale, hint=" such as 1/sqrt(d_k)")


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale, masked) v, returning the output and the attention weights.

    q: (..., N_q, d_k)   k: (..., N_k, d_k)   v: (..., N_k, d_v)   (leading dims broadcast)
    mask: bool, broadcastable to (..., N_q, N_k); True = the query may attend to that key.
    scale: defaults to 1 / sqrt(d_k).
    Returns output (..., N_q, d_v) and weights (..., N_q, N_k). A query whose whole row is masked
    gets zero weights and a zero output, never NaN.
    """
    check_qkv(q, k, v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        check_scale(scale)
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., N_q, N_k)
    if mask is not None:
        check_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
    return weights @ v, weights


class AttentionLayer(nn.Module):
    """One attention layer with learned projections, no bias: W_Q, W_K (d_in -> d_k), W_V (d_in -> d_v).

    Notebook 3, section 4 (the exercise `MyAttentionLayer`). The same layer is self-attention,
    layer(x, x), and cross-attention, layer(x_query, x_data): decoder tokens asking the encoder's.
    """

    def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.d_in = checks.positive_int("d_in", d_in)
        self.d_k = checks.positive_int("d_k", d_k)
        self.d_v = checks.positive_int("d_v", d_v)
        self.w_q = nn.Linear(d_in, d_k, bias=False)  # queries: what each token looks for
        self.w_k = nn.Linear(d_in, d_k, bias=False)  # keys: what each token offers
        self.w_v = nn.Linear(d_in, d_v, bias=False)  # values: what each token hands over

    def forward(self, x_query: Tensor, x_data: Tensor) -> tuple[Tensor, Tensor]:
        """x_query (..., N_q, d_in), x_data (..., N_x, d_in), leading dims broadcast.

        Returns output (..., N_q, d_v) and weights (..., N_q, N_x), each row summing to 1.
        """
        for name, x in (("x_query", x_query), ("x_data", x_data)):
            self._check_tokens(name, x)
        try:
            torch.broadcast_shapes(x_query.shape[:-2], x_data.shape[:-2])
        except RuntimeError:
            raise ValueError(f"x_query has shape {tuple(x_query.shape)} and x_data has shape "
                             f"{tuple(x_data.shape)}: their leading (batch) dimensions do not broadcast") from None
        q = self.w_q(x_query)                        # (..., N_q, d_k)
        k, v = self.w_k(x_data), self.w_v(x_data)    # (..., N_x, d_k), (..., N_x, d_v)
        return scaled_dot_product_attention(q, k, v)

    def _check_tokens(self, name: str, x: Tensor) -> None:
        """Raise unless x is a tensor (..., N >= 1, d_in) in the dtype and on the device of the weights."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} is a {type(x).__name__}, expected a torch.Tensor (..., N, {self.d_in})")
        if x.dim() < 2 or x.shape[-1] != self.d_in or x.shape[-2] == 0:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected (..., N, {self.d_in}): at least "
                             f"one token, each with d_in = {self.d_in} features")
        weight = self.w_q.weight
        if x.dtype != weight.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, expected {weight.dtype}, the dtype of the layer's "
                            f"weights: convert {name} with .to({weight.dtype}) (or the layer with .to({x.dtype}))")
        if x.device != weight.device:
            raise ValueError(f"{name} is on {x.device} and the layer's weights on {weight.device}: "
                             "move them to one device with .to(device)")


def causal_mask(n_q: int, n_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Bool (n_q, n_k): True where query i may see key j, i.e. j <= i + (n_k - n_q).

    With n_k == n_q this is the lower triangle including the diagonal. With n_k > n_q (new queries
    appended after n_k - n_q cached keys) the triangle is aligned to the bottom right, so the last
    query sees every key.
    """
    n_k = n_q if n_k is None else n_k
    _check_positive("n_q", n_q)
    _check_positive("n_k", n_k)
    if n_k < n_q:
        raise ValueError(f"n_k is {n_k}, expected n_k >= n_q = {n_q} (queries are the last n_q keys)")
    query_pos = torch.arange(n_q, device=device).unsqueeze(1) + (n_k - n_q)
    key_pos = torch.arange(n_k, device=device).unsqueeze(0)
    return key_pos <= query_pos


def bidirectional_mask(n_q: int, n_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Bool (n_q, n_k), all True: every query sees every key (encoder self-attention)."""
    n_k = n_q if n_k is None else n_k
    _check_positive("n_q", n_q)
    _check_positive("n_k", n_k)
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device)


def padding_mask(lengths: Tensor, n_k: int) -> Tensor:
    """Bool (B, 1, 1, n_k): True on the first lengths[b] keys of sequence b, False on padding.

    The two singleton dimensions broadcast over heads and queries, so the result can be `&`-ed
    with a (n_q, n_k) causal mask and passed to attention on (B, H, N_q, d) tensors.
    """
    if not isinstance(lengths, Tensor) or lengths.dim() != 1:
        got = tuple(lengths.shape) if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(f"lengths is {got}, expected a 1-D tensor of sequence lengths (B,)")
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths has dtype {lengths.dtype}, expected an integer tensor of token "
                        "counts (a length of 2.5 tokens means nothing): use lengths.long()")
    _check_positive("n_k", n_k)
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > n_k):
        raise ValueError(f"lengths is {lengths.tolist()}, expected values in 0..{n_k} (n_k)")
    key_pos = torch.arange(n_k, device=lengths.device)
    return (key_pos.unsqueeze(0) < lengths.unsqueeze(1))[:, None, None, :]


def local_mask(n: int, window: int, causal: bool = True, device: torch.device | str | None = None) -> Tensor:
    """Bool (n, n): query i sees keys within `window` positions of it (only earlier ones if causal).

    Sliding-window attention: each query sees at most `window` + 1 keys (2 * window + 1 if not
    causal), so the cost grows as n * window instead of n^2.
    """
    _check_positive("n", n)
    checks.non_negative_int("window", window)
    offset = _offsets(n, device)  # offset[i, j] = i - j
    visible = offset.abs() <= window
    return visible & (offset >= 0) if causal else visible


def strided_mask(n: int, stride: int, causal: bool = True, device: torch.device | str | None = None) -> Tensor:
    """Bool (n, n): query i sees keys j with (i - j) a multiple of `stride` (earlier ones if causal).

    The strided half of the Sparse Transformer: combined with a local window of `stride`, every
    key is reachable in two hops.
    """
    _check_positive("n", n)
    _check_positive("stride", stride)
    offset = _offsets(n, device)
    visible = offset.remainder(stride) == 0
    return visible & (offset >= 0) if causal else visible


def global_mask(n: int, global_tokens: list[int] | Tensor, device: torch.device | str | None = None) -> Tensor:
    """Bool (n, n): the global tokens see every key and every query sees them; nothing else.

    Combine with a local mask (`local | global`) for Longformer-style attention.
    """
    _check_positive("n", n)
    idx = torch.as_tensor(global_tokens, dtype=torch.long, device=device).reshape(-1)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ValueError(f"global_tokens is {idx.tolist()}, expected positions in 0..{n - 1}")
    is_global = torch.zeros(n, dtype=torch.bool, device=device)
    is_global[idx] = True
    return is_global.unsqueeze(0) | is_global.unsqueeze(1)


def _offsets(n: int, device: torch.device | str | None) -> Tensor:
    """Long (n, n) with entry [i, j] = i - j (how far key j lies behind query i)."""
    pos = torch.arange(n, device=device)
    return pos.unsqueeze(1) - pos.unsqueeze(0)


_check_positive = checks.positive_int
