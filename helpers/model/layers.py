"""The rest of a transformer block: LayerNorm, the feed-forward network, the Pre-LN block.

Defined in notebook 6, "Layers", in the order it derives them:

    section 1  layer_norm, LayerNorm             per-token standardisation, by hand
    section 3  FeedForward, SwiGLUFeedForward    the position-wise MLP, D -> 4D -> D;
                                                 ACTIVATIONS: relu, gelu, gelu_tanh
    section 6  init_gpt2_                        GPT-2's initialisation, residual projections scaled
    section 7  distance_from_rank_one            how far tokens are from all being equal
    section 8  Block                             the Pre-LN (GPT-2) block, or Post-LN (section 5)

The block's attention is `helpers.model.multihead.MultiHeadAttention` (notebook 5).

Shapes (the legend of `helpers`): B batch, N tokens, D = d_model, L = n_layers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.multihead import KVStore, MultiHeadAttention, check_features, check_sequence

# Names (suffixes) of the projections that write into the residual stream: GPT-2 scales their
# initial weights by 1/sqrt(2 * n_layers).
RESIDUAL_PROJECTIONS = ("out_proj.weight", "down.weight")


# --- notebook 6: LayerNorm -----------------------------------------------------------------

def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """x: (..., D) -> (..., D): each token standardised over its own D features, then gamma, beta.

    The variance is the biased one (divide by D, not D - 1), as in nn.LayerNorm; eps keeps the
    division finite for a token whose features are all equal, so it must be > 0.
    """
    checks.positive_float("eps", eps, hint=" such as 1e-5 (it keeps a constant token finite)")
    if not isinstance(x, Tensor) or x.dim() < 1 or not x.is_floating_point():
        got = (x.dtype, tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x is {got}, expected a floating-point tensor of shape (..., D)")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and tuple(param.shape) != (x.shape[-1],):
            raise ValueError(f"{name} has shape {tuple(param.shape)}, expected ({x.shape[-1]},) "
                             f"to match the last dimension of x, shape {tuple(x.shape)}")
    mean = x.mean(dim=-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    normalised = (x - mean) / torch.sqrt(variance + eps)
    if weight is not None:
        normalised = normalised * weight
    if bias is not None:
        normalised = normalised + bias
    return normalised


class LayerNorm(nn.Module):
    """`layer_norm` with a learned scale gamma (`weight`, starts at 1) and shift beta (`bias`, 0)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.d_model = checks.positive_int("d_model", d_model)
        self.eps = checks.positive_float("eps", eps, hint=" such as 1e-5 (it keeps a constant token finite)")
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D) -> (..., D)."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {tuple(x.shape)}, expected (..., {self.d_model})")
        return layer_norm(x, self.weight, self.bias, self.eps)


# --- notebook 6: feed-forward networks -----------------------------------------------------

# "gelu" is the exact GELU, z * Phi(z) with Phi the normal CDF (erf); "gelu_tanh" is the tanh
# approximation GPT-2 was trained with, 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": functools.partial(nn.GELU, approximate="tanh"),
}


def _check_mlp_sizes(d_model: int, hidden: int, dropout: float, bias: bool) -> None:
    checks.positive_int("d_model", d_model)
    checks.positive_int("hidden", hidden)
    checks.number_in("dropout", dropout, 0.0, 1.0, high_open=True)
    checks.boolean("bias", bias)


class FeedForward(nn.Module):
    """The position-wise MLP: D -> hidden (default 4D) -> activation -> D, then dropout.

    Each token goes through it alone: nothing here mixes positions. activation: a name in
    ACTIVATIONS ("gelu" exact, "gelu_tanh" GPT-2's approximation, "relu").
    """

    def __init__(self, d_model: int, hidden: int | None = None, activation: str = "gelu",
                 dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        checks.one_of("activation", activation, ACTIVATIONS)
        hidden = 4 * d_model if hidden is None else hidden
        _check_mlp_sizes(d_model, hidden, dropout, bias)
        self.d_model = d_model
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.activation = ACTIVATIONS[activation]()
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D) -> (..., D)."""
        check_features("x", x, self.d_model, self.up.weight.dtype)
        return self.dropout(self.down(self.activation(self.up(x))))


def swiglu_hidden_size(d_model: int) -> int:
    """2/3 of 4D, so that SwiGLU's three matrices hold about the 8 D^2 of a two-matrix 4D MLP."""
    return 8 * d_model // 3


class SwiGLUFeedForward(nn.Module):
    """SwiGLU MLP (Llama's): down(silu(gate(x)) * up(x)); three matrices, no biases by default."""

    def __init__(self, d_model: int, hidden: int | None = None, dropout: float = 0.0,
                 bias: bool = False) -> None:
        super().__init__()
        checks.positive_int("d_model", d_model)
        hidden = swiglu_hidden_size(d_model) if hidden is None else hidden
        _check_mlp_sizes(d_model, hidden, dropout, bias)
        self.d_model = d_model
        self.gate = nn.Linear(d_model, hidden, bias=bias)
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D) -> (..., D)."""
        check_features("x", x, self.d_model, self.gate.weight.dtype)
        return self.dropout(self.down(F.silu(self.gate(x)) * self.up(x)))


# --- notebook 6: the block -----------------------------------------------------------------

class Block(nn.Module):
    """One transformer block. Pre-LN (GPT-2, the default): x + attn(ln1(x)), then x + mlp(ln2(x)).

    pre_norm=False gives the 2017 Post-LN order: ln1(x + attn(x)), then ln2(x + mlp(x)).
    The MLP is D -> 4D -> D with `activation` (exact GELU by default; GPT-2 used "gelu_tanh");
    dropout follows both branches.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0,
                 n_kv_heads: int | None = None, bias: bool = True, pre_norm: bool = True,
                 activation: str = "gelu") -> None:
        super().__init__()
        self.pre_norm = checks.boolean("pre_norm", pre_norm)
        self.ln1 = LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias, dropout)
        self.ln2 = LayerNorm(d_model)
        self.mlp = FeedForward(d_model, 4 * d_model, activation, dropout, bias)

    def forward(self, x: Tensor, causal: bool = True, mask: Tensor | None = None,
                kv_store: KVStore | None = None) -> Tensor:
        """x: (B, N, D) -> (B, N, D). kv_store: see `MultiHeadAttention.forward`."""
        check_sequence("x", x, self.ln1.d_model, self.attn.q_proj.weight.dtype)
        if self.pre_norm:
            x = x + self.attn(self.ln1(x), mask=mask, causal=causal, kv_store=kv_store)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, mask=mask, causal=causal, kv_store=kv_store))
        return self.ln2(x + self.mlp(x))


@torch.no_grad()
def init_gpt2_(model: nn.Module, n_layers: int, std: float = 0.02) -> nn.Module:
    """GPT-2's initialisation, in place: every Linear and Embedding weight ~ N(0, std), biases 0,
    and the projections that write into the residual stream ~ N(0, std / sqrt(2 * n_layers)).

    Each block adds two branches to the stream (attention, MLP); with 2 * n_layers additions of
    variance std^2 / (2 * n_layers) each, the stream's variance gains std^2 in total, whatever the
    depth. Returns `model`.
    """
    checks.positive_int("n_layers", n_layers)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    for name, param in model.named_parameters():
        if name.endswith(RESIDUAL_PROJECTIONS):
            nn.init.normal_(param, mean=0.0, std=std / math.sqrt(2 * n_layers))
    return model


def distance_from_rank_one(x: Tensor) -> Tensor:
    """How far the N token vectors are from being one and the same vector: x (..., N, D) -> (...).

    ||x - 1 mean^T||_F / ||x||_F, where mean is the average token: 0 when every token carries the
    same vector (rank collapse), and unchanged when x is scaled.
    """
    if not isinstance(x, Tensor) or x.dim() < 2 or not x.is_floating_point():
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x is {got}, expected a floating-point tensor (..., N, D)")
    residual = x - x.mean(dim=-2, keepdim=True)
    return torch.linalg.matrix_norm(residual) / torch.linalg.matrix_norm(x)
